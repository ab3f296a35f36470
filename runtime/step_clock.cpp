#include "runtime/step_clock.h"

namespace loom {

double StepTimes::total_ms() const {
  double s = 0;
  for (double m : ms) s += m;
  return s;
}

StepClock::StepClock(const Stream& stream) : stream_(stream) {}

Event& StepClock::mark() {
  if (used_ == events_.size()) events_.emplace_back(stream_.kind);
  Event& e = events_[used_++];
  e.record(stream_);
  return e;
}

void StepClock::begin(Phase p) {
  used_ = 0;
  phases_.clear();
  mark();
  phase_ = p;
}

Phase StepClock::enter(Phase p) {
  const Phase left = phase_;
  if (p == phase_) return left;
  phases_.push_back(phase_);
  mark();
  phase_ = p;
  return left;
}

StepTimes StepClock::end() {
  phases_.push_back(phase_);
  mark();
  StepTimes t;
  for (size_t i = 0; i + 1 < used_; ++i) t.ms[size_t(phases_[i])] += Event::elapsed_ms(events_[i], events_[i + 1]);
  return t;
}

}  // namespace loom
