// The arithmetic under ExactSum (runtime/exact_sum.h), on the host and in CUDA kernels alike: a
// double as the integer it is, cut into the three 32-bit digits it adds to, and the digits'
// value rounded back to a double. Digit i weighs 2^(32 i - kExactBias).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define LOOM_EXACT_FN __host__ __device__ inline
#else
#define LOOM_EXACT_FN inline
#endif

namespace loom {

constexpr int kExactDigits = 68;  // the smallest subnormal to the largest double, and carries
constexpr int kExactBias = 1074;

// Whether x is finite (by its bits: the same test on the host and in a kernel).
LOOM_EXACT_FN bool exact_finite(double x) {
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return ((bits >> 52) & 0x7ff) != 0x7ff;
}

// x (finite, not zero) adds parts[0..2] to digits k, k+1, k+2.
struct ExactParts {
  int k;
  int64_t parts[3];
};
LOOM_EXACT_FN ExactParts exact_parts(double x) {
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const int e = int((bits >> 52) & 0x7ff);
  uint64_t m = bits & ((uint64_t(1) << 52) - 1);
  if (e) m |= uint64_t(1) << 52;
  // x = m * 2^(max(e, 1) - 1075): its lowest bit sits max(e, 1) - 1 bits above 2^-1074.
  const int p = (e ? e : 1) - 1, s = p % 32;
  const uint64_t lo = m << s, hi = s ? m >> (64 - s) : 0;  // m << s as 128 bits
  ExactParts out{p / 32, {int64_t(lo & 0xffffffffu), int64_t(lo >> 32), int64_t(hi)}};
  if (bits >> 63)
    for (int i = 0; i < 3; ++i) out.parts[i] = -out.parts[i];
  return out;
}

// Every digit but the top back in [0, 2^32) (floor division carries the sign up).
LOOM_EXACT_FN void exact_normalize(int64_t* d) {
  for (int i = 0; i + 1 < kExactDigits; ++i) {
    const int64_t carry = d[i] >> 32;
    d[i] -= carry * (int64_t(1) << 32);
    d[i + 1] += carry;
  }
}

// The value of normalized digits (they are changed: a negative sum is negated in place),
// summed from the smallest digit up: a fixed order, so a function of the exact sum alone.
LOOM_EXACT_FN double exact_value(int64_t* d) {
  const bool negative = d[kExactDigits - 1] < 0;  // the top digit holds the sign
  if (negative) {
    for (int i = 0; i < kExactDigits; ++i) d[i] = -d[i];
    exact_normalize(d);
  }
  double r = 0;
  for (int i = 0; i < kExactDigits; ++i)
    if (d[i]) r += double(d[i]) * exp2(double(32 * i - kExactBias));
  return negative ? -r : r;
}

// digits[kExactDigits] (normalized, held as doubles: the form ranks all-reduce) += x, exactly;
// a non-finite x, or digits already NaN, leave every digit NaN. For accumulators that live on
// a device between steps (the loss), one term at a time.
LOOM_EXACT_FN void exact_accumulate(double* digits, double x) {
  bool finite = exact_finite(x);
  int64_t d[kExactDigits];
  for (int i = 0; i < kExactDigits; ++i) {
    finite = finite && exact_finite(digits[i]);
    d[i] = finite ? int64_t(digits[i]) : 0;
  }
  if (finite && x != 0) {
    const ExactParts p = exact_parts(x);
    for (int i = 0; i < 3; ++i) d[p.k + i] += p.parts[i];
    exact_normalize(d);
  }
  for (int i = 0; i < kExactDigits; ++i) digits[i] = finite ? double(d[i]) : NAN;
}

}  // namespace loom
