// Helpers shared by the unit tests: seeded random data and finite differences in double.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/tensor.h"

namespace loom::test {

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

// Central differences of J at x, in double, for every element.
inline std::vector<double> fd_grad(const std::function<double(const std::vector<double>&)>& J, std::vector<double> x,
                                   double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double keep = x[i];
    x[i] = keep + h;
    double up = J(x);
    x[i] = keep - h;
    double down = J(x);
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

inline double dot(const std::vector<double>& a, const std::vector<float>& r) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * r[i];
  return s;
}

// max |got - want| relative to max |want| (or 1 when want is tiny); a NaN or infinity in
// either is an infinite error, never a pass.
template <class A, class B>
double rel_err(const A& got, const B& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = double(got[i]), w = double(want[i]);
    if (!std::isfinite(g) || !std::isfinite(w)) return INFINITY;
    num = std::max(num, std::abs(g - w));
    den = std::max(den, std::abs(w));
  }
  return num / std::max(den, 1e-3);
}

// Causal attention with grouped-query heads in double, the kernels' reference: packed qkv
// [B,T,(H+2KV)*D] (q heads, then KV k heads, then KV v heads) -> out [B,T,H*D].
// pos [B,T] (data.doc_mask): query t attends to keys t - pos[b,t] .. t; null: 0 .. t.
inline std::vector<double> attention_ref(const std::vector<double>& qkv, int B, int T, int H, int KV, int D,
                                         const int32_t* pos = nullptr) {
  const int row = (H + 2 * KV) * D, group = H / KV;
  std::vector<double> out(size_t(B) * T * H * D, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t) {
        const double* q = &qkv[size_t((b * T + t) * row + h * D)];
        const int u0 = pos ? t - pos[b * T + t] : 0;
        std::vector<double> s(size_t(t) + 1, -1e300);
        double mx = -1e300, sum = 0;
        for (int u = u0; u <= t; ++u) {
          const double* k = &qkv[size_t((b * T + u) * row + (H + h / group) * D)];
          double a = 0;
          for (int d = 0; d < D; ++d) a += q[d] * k[d];
          s[size_t(u)] = a / std::sqrt(double(D));
          mx = std::max(mx, s[size_t(u)]);
        }
        for (auto& x : s) sum += (x = std::exp(x - mx));  // the masked ones are 0
        for (int u = u0; u <= t; ++u) {
          const double* v = &qkv[size_t((b * T + u) * row + (H + KV + h / group) * D)];
          for (int d = 0; d < D; ++d) out[size_t((b * T + t) * H * D + h * D + d)] += s[size_t(u)] / sum * v[d];
        }
      }
  return out;
}

// Values rounded to bf16 and back: inputs both storage types hold exactly.
inline std::vector<float> bf16_exact(std::vector<float> v) {
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}
inline std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i].bits = f32_to_bf16(v[i]);
  return o;
}
inline std::vector<float> from_bf16(const std::vector<bf16>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = bf16_to_f32(v[i].bits);
  return o;
}

// The message of the loom::Error that `f` throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Base64 (RFC 4648, padded).
inline std::string b64(const std::string& raw) {
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < raw.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(raw[i])) << 16 | uint32_t(uint8_t(raw[i + 1])) << 8 | uint8_t(raw[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += a[(v >> s) & 63];
  }
  if (raw.size() - i == 1) {
    const uint32_t v = uint32_t(uint8_t(raw[i])) << 16;
    out += std::string{a[v >> 18], a[(v >> 12) & 63], '=', '='};
  } else if (raw.size() - i == 2) {
    const uint32_t v = uint32_t(uint8_t(raw[i])) << 16 | uint32_t(uint8_t(raw[i + 1])) << 8;
    out += std::string{a[v >> 18], a[(v >> 12) & 63], a[(v >> 6) & 63], '='};
  }
  return out;
}
// A tiktoken ranks file of LLaMA-3's size (128000 ranks): "he", "ll", "hell", "hello" at ranks
// 0-3, the 256 bytes at 4-259, then filler; `bad_line` goes after the bytes.
inline void ranks_write(const std::string& path, const std::string& bad_line = "") {
  std::ofstream out(path);
  int rank = 0;
  for (const std::string& t : {std::string("he"), std::string("ll"), std::string("hell"), std::string("hello")})
    out << b64(t) << ' ' << rank++ << '\n';
  for (int b = 0; b < 256; ++b) out << b64(std::string(1, char(b))) << ' ' << rank++ << '\n';
  if (!bad_line.empty()) out << bad_line << '\n';
  for (int i = 0; rank < 128000; ++i) out << b64("\x01\x02" + std::to_string(i)) << ' ' << rank++ << '\n';
}
}  // namespace loom::test
