// The step-time split of metrics.jsonl, measured: the step's timeline on the compute stream is
// cut at every phase change (compute, exposed communication, pipeline bubble, optimizer, data,
// checkpoint blocking), and each piece is charged to the phase it was in. The pieces are
// measured, none is a remainder, and they add up to the step time exactly. On the CPU a mark
// is the host clock; on CUDA it is an event on the compute stream, so a phase is what the GPU
// spent in it: a host that prepares data while the GPU still computes charges nothing to data,
// and a stream stalled on a collective charges the stall to communication.
#pragma once
#include <array>
#include <vector>

#include "runtime/device.h"

namespace loom {

enum class Phase { compute, comm, bubble, optimizer, data, ckpt };
constexpr int kPhases = 6;

struct StepTimes {
  std::array<double, kPhases> ms{};
  double total_ms() const;
  double of(Phase p) const { return ms[size_t(p)]; }
};

class StepClock {
 public:
  explicit StepClock(const Stream& stream);
  // Starts a step in phase `p`. On CUDA the previous step's end waited for the device, so the
  // step's first mark is where the host starts it.
  void begin(Phase p);
  // Switches to `p`; returns the phase left.
  Phase enter(Phase p);
  // Ends the step (on CUDA, waits for its marks) and returns the time per phase.
  StepTimes end();
  Phase phase() const { return phase_; }

  // Enters `p` for a scope and returns to the phase it found.
  class Scope {
   public:
    Scope(StepClock* c, Phase p) : c_(c), back_(c ? c->enter(p) : p) {}
    ~Scope() {
      if (c_) c_->enter(back_);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StepClock* c_;
    Phase back_;
  };

 private:
  Event& mark();
  const Stream& stream_;
  std::vector<Event> events_;  // reused every step
  std::vector<Phase> phases_;  // phase of the interval that ends at events_[i + 1]
  size_t used_ = 0;
  Phase phase_ = Phase::compute;
};

}  // namespace loom
