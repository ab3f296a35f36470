#include "train/drills.h"

#include <chrono>
#include <cmath>
#include <thread>

#include "model/decoder_part.h"
#include "runtime/mesh.h"

namespace loom {

StepDrills::StepDrills(FaultInjector& faults, DeviceMesh& mesh, Backend& backend, DecoderPart& chunk)
    : faults_(faults), mesh_(mesh), backend_(backend), chunk_(chunk) {}

namespace {
// The weight fault.bitflip flips: one in the middle of the chunk's flat buffer.
int64_t flip_index(DecoderPart& chunk) {
  return int64_t(chunk.num_params() / 2);
}
}  // namespace

void StepDrills::at(StepPoint point, int64_t s1) {
  switch (point) {
    case StepPoint::begin:
      faults_.at(s1, "");
      if (faults_.hang(s1)) {
        faults_.note("hang", s1, "stopping inside this step's next collective");
        mesh_.hang_next_op();
      }
      if (const double ms = faults_.slow_ms(); ms > 0)
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
      return;
    case StepPoint::gradients:
      if (!faults_.bitflip(s1)) return;
      faults_.note("bitflip", s1, "a flipped bit in one weight while this step computes");
      tensor_bit_flip(backend_, chunk_.params_tensor(), flip_index(chunk_));
      flipped_ = true;
      return;
    case StepPoint::forward:
      faults_.at(s1, "forward");
      return;
    case StepPoint::backward:
      faults_.at(s1, "backward");
      return;
    case StepPoint::gradients_done:
      if (flipped_) tensor_bit_flip(backend_, chunk_.params_tensor(), flip_index(chunk_));
      flipped_ = false;
      return;
    case StepPoint::optimizer:
      faults_.at(s1, "optimizer");
      return;
  }
}

float StepDrills::dloss(int64_t s1, float dloss) {
  if (!faults_.nan(s1)) return dloss;
  faults_.note("nan", s1, "a NaN into this rank's gradients");
  return std::nanf("");
}

}  // namespace loom
