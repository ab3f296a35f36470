#include "runtime/exact_sum.h"

#include <cmath>

namespace loom {

void ExactSum::add(double x) {
  if (!std::isfinite(x)) {
    finite_ = false;
    return;
  }
  if (x == 0) return;
  const ExactParts e = exact_parts(x);
  for (int i = 0; i < 3; ++i) d_[size_t(e.k + i)] += e.parts[i];
  if (++adds_ == (int64_t(1) << 30)) normalize();  // long before a digit could overflow
}

void ExactSum::add(const ExactSum& o) {
  finite_ = finite_ && o.finite_;
  for (int i = 0; i < kDigits; ++i) d_[size_t(i)] += o.d_[size_t(i)];
}

void ExactSum::normalize() {
  adds_ = 0;
  exact_normalize(d_.data());
}

double ExactSum::value() const {
  if (!finite_) return std::nan("");
  ExactSum n = *this;
  n.normalize();
  return exact_value(n.d_.data());
}

void ExactSum::digits_to(double* out) {
  normalize();
  for (int i = 0; i < kDigits; ++i) out[i] = finite_ ? double(d_[size_t(i)]) : std::nan("");
}

void ExactSum::digits_from(const double* in) {
  for (int i = 0; i < kDigits; ++i) {
    if (!std::isfinite(in[i])) {
      finite_ = false;
      continue;
    }
    d_[size_t(i)] = int64_t(in[i]);
  }
}

double ExactSum::value_of(const double* digits) {
  ExactSum s;
  s.digits_from(digits);
  return s.value();
}

double exact_sum(const double* v, int64_t n) {
  ExactSum s;
  for (int64_t i = 0; i < n; ++i) s.add(v[i]);
  return s.value();
}

}  // namespace loom
