// A step's drills at the named points where they attach (the fault.* keys; train/fault.h's
// FaultInjector decides which fire, and when). Trainer::step reaches the points in this order:
//   begin           fault.kill / fault.exit at the step's start, fault.hang (the step's next
//                   collective never returns), fault.slow (this rank sleeps)
//   gradients       fault.bitflip: one weight's bit flipped while the step's gradients compute
//   forward         fault.kill / fault.exit before each forward of the stage's op list
//   backward        ... before each backward
//   gradients_done  the flipped bit flipped back (the SDC check recomputes on clean weights)
//   optimizer       fault.kill / fault.exit before the update
// and fault.nan seeds the step's backward with NaN (dloss). The drills inside a checkpoint's
// write are the checkpointer's own hooks. Not here: what recovers (train/recovery.cpp).
#pragma once
#include <cstdint>

#include "train/fault.h"

namespace loom {

class Backend;
class DecoderPart;
class DeviceMesh;

enum class StepPoint { begin, gradients, forward, backward, gradients_done, optimizer };

class StepDrills {
 public:
  StepDrills(FaultInjector& faults, DeviceMesh& mesh, Backend& backend, DecoderPart& chunk);
  // The drills due at `point` of 1-based step s1.
  void at(StepPoint point, int64_t s1);
  // The seed of step s1's backward: `dloss`, or NaN where fault.nan fires on this rank.
  float dloss(int64_t s1, float dloss);

 private:
  FaultInjector& faults_;
  DeviceMesh& mesh_;
  Backend& backend_;
  DecoderPart& chunk_;
  bool flipped_ = false;  // fault.bitflip's bit is flipped now
};

}  // namespace loom
