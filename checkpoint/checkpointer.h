// Checkpoints of a training run (docs/checkpoints.md). A save: every rank copies the state it writes
// (DataParallel::state_runs(write): each element of the model's state once over dp and tp, no
// gather) and writes it into its own HDF5 file of <checkpoint.dir>/step-N/; once every rank's
// file is on disk, rank 0 commits manifest.json (tmp, fsync, rename, directory fsync) and
// removes what checkpoint.keep no longer keeps. With checkpoint.async the write runs on a
// thread while training goes on, and the commit comes at a later step boundary (settle), at
// the next save, or at the end (flush). On the CPU a reader copies the live state through a
// bounded staging area the writer writes from (checkpoint/staged_writer.h), so the next optimizer
// step waits only until it has read it all (wait_reads); on CUDA the state is first
// downloaded. Collective: every rank calls the same methods at the same steps.
#pragma once
#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/pieces.h"
#include "checkpoint/staged_writer.h"
#include "parallel/data_parallel.h"
#include "runtime/comm/process_group.h"
#include "runtime/config.h"
#include "runtime/file.h"

namespace loom {

class Checkpointer {
 public:
  // layout: what the manifest records of the run (world, dp, tp, zero, dtype, ...).
  Checkpointer(const Config& cfg, ProcessGroup& world, nlohmann::json layout, bool quiet);
  ~Checkpointer();  // waits for a write in flight (never commits it)
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // A save is due after `steps_done` steps: every checkpoint.every, and at train.steps.
  bool due(int64_t steps_done) const;
  // Saves the state after `steps_done` steps. Blocks for the save in flight (which it then
  // commits) and, on CUDA, the download of the state; the write runs on, unless
  // checkpoint.async = false, when it is written and committed before this returns.
  void save(int64_t steps_done, DataParallel& dp);
  // Before the state changes (the optimizer step): waits until a write in flight has read it.
  void wait_reads();
  // This rank's write: 0 none or written, 1 still writing, 2 failed.
  int32_t write_state() const;
  // Given the world's max of write_state(): commits a written save, or (2) ends the run with
  // the failing rank's error; the last committed checkpoint stays as it was. A save whose state
  // holds a NaN or an infinite value is not committed (its files are removed, with an error).
  void settle(int32_t world_state);
  // Waits for the save in flight and commits it.
  void flush();
  int64_t last_saved() const { return saved_step_; }
  // Milliseconds spent committing since the last call (the manifest, pruning): the step that
  // follows a commit charges them to ckpt_block_ms.
  double take_commit_ms();

  // Fault drills (train/fault.h), unset when none. in_write: called by the writer halfway
  // through this rank's file of `step` (a kill or an exit there); enospc: whether the write
  // of `step` fails as on a full disk; after_commit: on rank 0, once `step` committed in `dir`.
  std::function<void(int64_t step)> fault_in_write;
  std::function<bool(int64_t step)> fault_enospc;
  std::function<void(int64_t step, const std::string& dir)> fault_after_commit;
  // The 1-based step whose update the run applied last: the weights of every checkpoint before
  // it gave a finite loss and gradient norm, and pruning keeps the newest such one whatever
  // checkpoint.keep says (checkpoints_prune). Unset: none is known good.
  std::function<int64_t()> proven;

 private:
  void write(int64_t step);  // this rank's file of the pending save; throws
  void commit();

  const Config& cfg_;
  ProcessGroup& world_;
  nlohmann::json layout_;
  bool quiet_;
  int64_t saved_step_ = -1;         // the save in flight or committed last
  bool pending_ = false;            // saved, not yet committed
  std::vector<StagedShard> items_;  // the pending save's shards
  bool live_ = false;               // they point into the training state (not a copy of it)
  Stager stager_;                   // blocks the writer writes from, kept between saves
  HostBuffer keep_;                 // the state downloaded from the device (CUDA): page-locked, kept between saves
  std::mutex mu_;
  std::condition_variable cv_;
  bool reading_ = false;  // the writer still reads the state
  std::thread thread_;
  std::atomic<int32_t> state_{0};  // write_state()
  std::string error_;              // why this rank's write failed
  std::unique_ptr<DirLock> lock_;  // rank 0: checkpoint.dir is this job's while it runs
  double write_s_ = 0;
  double commit_ms_ = 0;
  pid_t launcher_ = 0;  // a rank of several: its parent at start, which commits check is still there
};

// Loads the checkpoint in `dir` into `dp`: its weights (through weights_from) and moments,
// read as this rank's layout needs them whatever layout wrote them, every shard it reads
// verified. The model.* keys must equal those of the run that wrote it (an Error names the
// ones that differ); train.* and data.* keys that change the data order or the schedule are
// named in a warning. Returns the step. An Error names the tensor, shard or shape that is wrong;
// a checkpoint of another model is an OtherModel (a config error, not damage).
struct OtherModel : Error {
  using Error::Error;
};
int64_t checkpoint_load(const std::string& dir, const Config& cfg, const ParamRegistry& reg, DataParallel& dp,
                        bool warn);

// checkpoint.resume: none (0); a checkpoint directory (its step; an Error if it does not load);
// latest: the newest under checkpoint.dir that loads on every rank, falling back past damaged
// ones (set aside as STEP.unusable, never deleted) with a warning naming the damage, and 0
// when there is none yet. A checkpoint of another model (OtherModel) is refused at once and
// nothing is moved: the config is what is wrong. Collective.
// *from gets the directory loaded. `before`: only checkpoints of earlier steps are candidates
// (a rollback's).
int64_t checkpoint_resume(const Config& cfg, ProcessGroup& world, const ParamRegistry& reg, DataParallel& dp,
                          bool quiet, std::string* from, int64_t before = INT64_MAX);

}  // namespace loom
