// Fault drills and fault handling for one rank: the injector of the fault.* keys, the guard
// that skips updates with non-finite or spiking gradient norms, and the straggler watch.
// Each drill fires once per job: a run restarted by `loom supervise` (LOOM_RESTART > 0) or by
// Slurm (SLURM_RESTART_COUNT > 0) fires none, and one that fired does not fire again when a
// rollback replays its step. Every firing is logged and appended to <log.dir>/faults.jsonl,
// which drill reports read.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "runtime/config.h"

namespace loom {

class Backend;
struct Tensor;

// The xxh64 of a tensor's bytes, read on the host (the SDC check's comparison).
uint64_t tensor_hash(Backend& be, const Tensor& t);
// Flips the top mantissa bit of element `index` of `t` (fp32 or bf16): a silent corruption,
// undone by flipping it again.
void tensor_bit_flip(Backend& be, Tensor& t, int64_t index);

// Whether this process is a restart of the job (the supervisor's or Slurm's count is above 0).
bool run_restarted();

class FaultInjector {
 public:
  FaultInjector(const Config& cfg, int world_rank, bool restarted);
  bool armed() const { return armed_; }
  // fault.kill / fault.exit due at 1-based `step` in `phase` ("" is the step's start; forward,
  // backward, optimizer, checkpoint): this rank SIGKILLs itself or exits with status 3.
  void at(int64_t step, const char* phase);
  // The drills that change what a step computes; each returns true once, at its step.
  bool hang(int64_t step);
  bool nan(int64_t step);
  bool bitflip(int64_t step);
  bool ckpt_corrupt(int64_t step);  // on rank 0
  bool enospc(int64_t step);        // on rank 0
  double slow_ms();                 // extra milliseconds this rank spends every step (noted once)
  // Logs the firing and appends it to faults.jsonl.
  void note(const char* kind, int64_t step, const std::string& what) const;

 private:
  struct Drill {
    FaultAt at;
    bool fired = false;
  };
  bool take(Drill& d, int64_t step, bool any_rank = false);
  const Config& cfg_;
  int rank_;
  bool armed_;
  Drill kill_, exit_, hang_, nan_, bitflip_, corrupt_, enospc_;
  double slow_ms_ = 0;
  bool slow_noted_ = false;
};

// fault.ckpt_corrupt: flips a byte inside the first shard of the committed checkpoint `dir`
// (what a later hash check must find).
void checkpoint_corrupt(const FaultInjector& fi, int64_t step, const std::string& dir);

// The update guard: a non-finite loss or gradient norm, or a norm above fault.spike_factor
// times the median of the last accepted ones, skips the update. Fed the same values on
// every rank (the loss and norm are reduced over the whole job), it decides the same.
class UpdateGuard {
 public:
  explicit UpdateGuard(const FaultConfig& f) : spike_factor_(f.spike_factor), max_skips_(f.max_skips) {}
  // Why this step's update must be skipped ("" to apply it); counts skips in a row.
  std::string check(double loss, double norm);
  int skips_in_a_row() const { return in_a_row_; }
  // Whether the last update was skipped for a non-finite loss or gradient norm (not a spike).
  bool last_nonfinite() const { return last_nonfinite_; }
  int64_t skips_total() const { return total_; }
  bool rollback_due() const { return in_a_row_ > max_skips_; }
  void rolled_back() { in_a_row_ = 0; }

 private:
  double spike_factor_;
  int max_skips_;
  std::deque<double> recent_;  // accepted norms, newest last
  int in_a_row_ = 0;
  int64_t total_ = 0;
  bool last_nonfinite_ = false;
};

// Per-rank compute times, gathered every step: a rank slower than the median of all by
// more than `margin` (relative) and 2 ms for `steps` steps in a row is a straggler.
class StragglerWatch {
 public:
  StragglerWatch(int ranks, double margin = 0.2, int steps = 5)
      : slow_(size_t(ranks)), median_(size_t(ranks)), margin_(margin), steps_(steps) {}
  // This step's compute_ms of every rank; returns the stragglers, and in *fresh those named
  // for the first time in their current streak.
  // group[r] (if given): the ranks compared with each other (a pipeline's stages differ by
  // design, so each stage's ranks are compared among themselves; a group of one never is).
  std::vector<int> update(const std::vector<double>& compute_ms, std::vector<int>* fresh,
                          const std::vector<int>& group = {});
  // The median rank r was measured against in the last update.
  double median(int r) const { return median_[size_t(r)]; }

 private:
  std::vector<int> slow_;  // steps in a row each rank was slow
  std::vector<double> median_;
  double margin_;
  int steps_;
};

}  // namespace loom
