// exp and tanh that the compiler vectorizes: plain arithmetic with no libm calls, so loops
// over them become AVX code without -ffast-math. exp_approx is within 2 ulp of expf over
// the range softmax and GELU use; both are deterministic on every machine.
#pragma once
#include <bit>
#include <cstdint>

namespace loom::cpu {

inline float exp_approx(float x) {
  // exp(x) = 2^n * exp(r), n = round(x / ln2), |r| <= ln2/2; a degree-6 polynomial for exp(r).
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  // Round to nearest by the 1.5 * 2^23 trick: floorf and nearbyintf would stop GCC from
  // vectorizing the loop this is inlined into.
  const float n = (x * 1.44269504088896341f + 0x1.8p23f) - 0x1.8p23f;
  float r = x - n * 0.693359375f;  // ln2 split in two for an exact first product
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((int32_t(n) + 127) << 23);  // 2^n
}

inline float tanh_approx(float x) {
  // tanh(x) = sign(x) * (1 - 2 / (exp(2|x|) + 1)): no cancellation for large |x|; for
  // small |x| the absolute error stays below 1e-7.
  const float a = x < 0 ? -x : x;
  const float t = 1.0f - 2.0f / (exp_approx(2.0f * a) + 1.0f);
  return x < 0 ? -t : t;
}

}  // namespace loom::cpu
