// An exact sum of doubles, whatever their order and grouping: the same bits from one rank and
// from many, from one thread and from several. Each double is added as the integer it is (a
// 53-bit mantissa at its exponent) into a fixed-point accumulator wide enough for every double:
// 32-bit digits held in int64 words, so that 2^31 terms add to a digit before it can overflow.
// Ranks combine accumulators by summing their digits (as doubles: a normalized digit is below
// 2^32, so the sum of up to 2^21 ranks' digits is an exact double), and the exact total is
// rounded to a double once, at the end. loom's scalar reductions that must not depend on the
// layout (the gradient norm, the loss, MoE statistics) go through it.
// Not here: sums of vectors (the gradients' canonical tree, parallel/tree_reduce.h).
#pragma once
#include <array>
#include <cstdint>

#include "runtime/exact_digits.h"

namespace loom {

class ExactSum {
 public:
  static constexpr int kDigits = kExactDigits;

  void add(double x);  // finite x only (a NaN or an infinity poisons the sum: is_finite() says)
  void add(const ExactSum& o);
  // Every digit but the top one back in [0, 2^32): the form ranks exchange (digits_to) and the
  // one value() reads. The top digit holds the sign.
  void normalize();
  // The exact sum rounded to a double (a deterministic function of the sum alone); NaN where a
  // non-finite term was added.
  double value() const;
  bool finite() const { return finite_; }
  // The digits as doubles (normalized first), and back: what an all-reduce sums across ranks.
  // A non-finite sum travels as NaN in every digit.
  void digits_to(double* out);
  void digits_from(const double* in);
  // The value of digits (as digits_to writes them, or their sum over ranks).
  static double value_of(const double* digits);

 private:
  std::array<int64_t, kDigits> d_{};
  bool finite_ = true;
  int64_t adds_ = 0;  // since the last normalize()
};

// The exact sum of `n` doubles at `v`, rounded once.
double exact_sum(const double* v, int64_t n);

}  // namespace loom
