// ExactSum: the same bits whatever the order and grouping of the terms, against an exact
// reference (long sums of doubles whose exact total is known), and across "ranks" whose digits
// are summed as doubles.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "runtime/exact_sum.h"
#include "testing.h"

using loom::ExactSum;

namespace {
// Terms whose exact sum is known: pairs x, -x cancel, plus `rest`.
std::vector<double> cancelling(size_t n, double rest, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::uniform_int_distribution<int> e(-300, 300);
  std::vector<double> v;
  for (size_t i = 0; i < n; ++i) {
    const double x = std::ldexp(u(g), e(g));
    v.push_back(x);
    v.push_back(-x);
  }
  v.push_back(rest);
  std::shuffle(v.begin(), v.end(), g);
  return v;
}
}  // namespace

TEST(ExactSum, OrderAndGroupingDoNotChangeTheBits) {
  // Squares of gradients: positive, of every magnitude; a plain double sum depends on the order.
  std::mt19937_64 g(7);
  std::normal_distribution<double> d(0, 1);
  std::vector<double> v(20000);
  for (double& x : v) x = std::ldexp(d(g) * d(g), int(g() % 60) - 30);
  double plain_fwd = 0, plain_rev = 0;
  for (double x : v) plain_fwd += x;
  for (size_t i = v.size(); i-- > 0;) plain_rev += v[i];
  ASSERT_NE(plain_fwd, plain_rev);  // the test has teeth: a plain sum's bits depend on the order
  const double exact = loom::exact_sum(v.data(), int64_t(v.size()));
  std::vector<double> r = v;
  std::reverse(r.begin(), r.end());
  EXPECT_EQ(loom::exact_sum(r.data(), int64_t(r.size())), exact);
  // Four "ranks" holding interleaved terms, their digits summed as an all-reduce sums them.
  std::vector<double> total(ExactSum::kDigits, 0.0);
  for (int rank = 0; rank < 4; ++rank) {
    ExactSum s;
    for (size_t i = size_t(rank); i < v.size(); i += 4) s.add(v[i]);
    std::vector<double> digits(ExactSum::kDigits);
    s.digits_to(digits.data());
    for (int k = 0; k < ExactSum::kDigits; ++k) total[size_t(k)] += digits[size_t(k)];
  }
  ExactSum all;
  all.digits_from(total.data());
  EXPECT_EQ(all.value(), exact);
  EXPECT_NEAR(exact, plain_fwd, 1e-12 * std::abs(exact));
}

TEST(ExactSum, CancellationLeavesTheExactRest) {
  for (double rest : {1.0, 3.0e-300, -2.5e300, 0.1, 5e-324}) {
    const std::vector<double> v = cancelling(5000, rest, 11);
    EXPECT_EQ(loom::exact_sum(v.data(), int64_t(v.size())), rest) << rest;
  }
  // 1 + 2^-80 - 1: a double sum loses the 2^-80; the exact one keeps it.
  ExactSum s;
  s.add(1.0);
  s.add(std::ldexp(1.0, -80));
  s.add(-1.0);
  EXPECT_EQ(s.value(), std::ldexp(1.0, -80));
  EXPECT_EQ(loom::exact_sum(nullptr, 0), 0.0);
}

TEST(ExactSum, ANonFiniteTermPoisonsTheSum) {
  ExactSum s;
  s.add(1.0);
  s.add(std::nan(""));
  EXPECT_TRUE(std::isnan(s.value()));
  std::vector<double> digits(ExactSum::kDigits);
  s.digits_to(digits.data());
  ExactSum back;
  back.digits_from(digits.data());
  EXPECT_FALSE(back.finite());
  ExactSum inf;
  inf.add(INFINITY);
  EXPECT_TRUE(std::isnan(inf.value()));
}
