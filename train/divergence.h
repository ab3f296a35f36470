// A run whose updates keep failing (docs/faults-and-drills.md, "When a run diverges"): it ends
// with a status of its own, naming the last checkpoint whose weights gave a finite loss, and
// writes no export. Not here: the guard that skips updates (train/fault.h) and the rollback
// (train/recovery.cpp), which this ends when a rollback would replay the same divergence.
#pragma once
#include "runtime/error.h"

namespace loom {

// The run diverged: every rank ends with kExitDiverged, which `loom supervise` does not restart
// (the same config and data diverge the same way again).
struct Diverged : Error {
  using Error::Error;
};
constexpr int kExitDiverged = 5;

}  // namespace loom
