// The parts of one rank's Trainer (train/trainer.h), shared by the files that implement it:
// trainer.cpp (construction, init), step.cpp (the step top to bottom, the step boundary,
// validation), step_log.cpp (a step's metrics), recovery.cpp (the SDC check, skipped updates and
// rollback, stragglers), drills.cpp (the drills at a step's named points) and finish.cpp
// (start-up log, export, summary). Internal.
#pragma once
#include <spdlog/spdlog.h>

#include <climits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "data/batches.h"
#include "model/backend.h"
#include "model/backend_profile.h"
#include "model/decoder_part.h"
#include "model/flops.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/pipeline_schedule.h"
#include "plan/memory.h"
#include "runtime/file.h"
#include "runtime/launch_env.h"
#include "runtime/mesh.h"
#include "runtime/step_clock.h"
#include "train/drills.h"
#include "train/fault.h"
#include "train/stop.h"
#include "train/trainer.h"
#if LOOM_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/comm/nccl_group.h"
#endif
#if LOOM_HAVE_MPI
#include "runtime/comm/mpi_group.h"
#endif

namespace loom {

struct Trainer::Parts {
  Config cfg;
  TrainOptions opt;
  DeviceKind device = DeviceKind::cpu;  // train.device, resolved
  std::string why, threads_why;
  DType dtype = DType::f32;
  bool lead = true;
  int threads = 1;
  MemoryAvailable memory;  // what this rank may fill: its plan is checked against it
  DataStreams data;
  Trace trace;
  int64_t trace_from = 1, trace_to = INT64_MAX;  // log.trace_steps, 1-based and inclusive
  std::unique_ptr<DeviceMesh> mesh;
  Stream stream;
  std::unique_ptr<Allocator> alloc;
  std::unique_ptr<Backend> backend;
  ProfiledBackend* profiler = nullptr;               // log.profile_steps: the backend, wrapped
  int64_t profile_from = 1, profile_to = INT64_MAX;  // its steps, 1-based and inclusive
  std::unique_ptr<StepClock> clock;
  ModelLayout whole;  // the whole model (this tp rank's shards): names and places for export
  std::unique_ptr<DecoderPart> chunk;
  std::unique_ptr<DataParallel> dpar;
  PipeSchedule pipe_schedule;           // parallel.pp > 1
  std::vector<PipeOp> pipe_ops;         // this stage's list of a step (at pp 1: F0 B0 F1 B1 ...)
  std::vector<PipeOp> pipe_val_ops;     // and of a validation batch (forward only)
  std::unique_ptr<PipelineStage> pipe;  // the executor of both, at every pp
  FlopsPerToken fpt{};
  double peak = 0;
  int64_t tokens_per_step = 0;
  std::vector<int32_t> inputs, targets;
  std::vector<int32_t> positions;              // data.doc_mask: each input's position in its document
  std::vector<int32_t> cp_inputs, cp_targets;  // parallel.cp: this rank's tokens of inputs, targets
  std::vector<int32_t> cp_positions_doc;       // parallel.cp with data.doc_mask: this rank's of positions
  TrainResult result;
  std::unique_ptr<StepLog> log;
  std::unique_ptr<Checkpointer> ckpt;  // checkpoint.every > 0
  int64_t start_step = 0;
  std::string resumed_from;
  std::unique_ptr<FaultInjector> faults;
  std::unique_ptr<StepDrills> drills;
  UpdateGuard guard;
  StragglerWatch straggle;
  std::vector<int> stragglers;  // as of the last step boundary
  double last_compute_ms = 0;
  int64_t next = 0;             // the step to run after this one (a rollback moves it back)
  int64_t rolled_back_to = -1;  // the checkpoint step of the last rollback
  int64_t rolled_back_at = -1;  // and the step it was made at

  Parts(const Config& c, const TrainOptions& o)
      : cfg(c),
        opt(o),
        trace(c.log.trace || !c.log.trace_steps.empty(), o.world_rank),
        guard(c.fault),
        straggle(o.world_size) {
    if (!c.log.trace_steps.empty()) {
      std::tie(trace_from, trace_to) = trace_steps_parse(c.log.trace_steps);
      trace.record(false);  // the set-up is not one of the steps asked for
    }
  }
  ~Parts() {
    drills.reset();
    ckpt.reset();  // a write in flight finishes first (it reads nothing of the buffers below)
    dpar.reset();
    chunk.reset();
    clock.reset();
    backend.reset();
    alloc.reset();
    if (device_is_cuda(stream.kind)) cuda_stream_destroy(stream);
  }
  // The ranks that hold the same weights, dp x cp (the dp group itself without context
  // parallel, so that flight records and verdicts name it "dp"): the gradients, the loss and
  // ZeRO's shards go over it.
  Axis dp_axis() const { return cfg.parallel.cp > 1 ? Axis::dcp : Axis::dp; }
  ProcessGroup& dp() const { return mesh->group(dp_axis()); }
  ProcessGroup& tp() const { return mesh->group(Axis::tp); }
  ProcessGroup& pp() const { return mesh->group(Axis::pp); }
  template <class... A>
  void info(fmt::format_string<A...> f, A&&... a) const {
    if (!opt.quiet && lead) spdlog::info(f, std::forward<A>(a)...);
  }
  // What only `loom train --verbose` prints.
  template <class... A>
  void detail(fmt::format_string<A...> f, A&&... a) const {
    if (opt.verbose) info(f, std::forward<A>(a)...);
  }

  // trainer.cpp, in the order Trainer::Trainer calls them (gpus: the CUDA devices visible).
  // The device and dtype, the export's target, threads and memory, the ranks' agreement on the
  // config and on the files they see, the data: what can fail before anything is allocated.
  void preflight(int gpus);
  // The mesh and its groups, the stream, allocator and backend, this rank's pipeline chunk,
  // DDP or ZeRO over dp, the executor, the step log and the drills.
  void build(int gpus);
  // The checkpointer, with the drills that act on its writes (checkpoint.every > 0).
  void checkpoint_wire();

  // step.cpp, in the order a step calls them.
  struct StepStart {  // what a step's metrics are measured from
    CommCounters dp, tp;
    bool emulated = false;
    uint64_t host_syncs = 0, device_ops = 0, graph_launches = 0;
    Clock::time_point wall;
  };
  // The trace's and profile's windows, the counters, and the step clock started.
  StepStart step_start(int64_t s1);
  // Forward and backward over the step's micro-batches from zeroed gradients, through the
  // executor (the drills at its passes); dloss seeds the backward; reduce: each piece's last
  // backward starts its gradient reductions (else reduce_grads() does).
  void micro_batches(int64_t step, float dloss, bool reduce);
  // Stages micro-batch `micro` of `step` from `s` and returns where the backend reads it.
  Inputs stage(const Sequences& s, int64_t step, int micro);
  // The step's gradient reductions (DDP or ZeRO over dp; with pipeline stages the tied
  // embedding's copies and the squared norm over the stages).
  void reduce_grads();
  // The chunk's loss sum over dp x cp (and from the last stage), read on the host and reset.
  double loss_take();

  // step_log.cpp: the step's metrics, once the step has ended; MoE's part of them.
  void metrics_fill(StepMetrics& m, int64_t step, const StepStart& start, double loss_sum);
  void moe_metrics(StepMetrics& m);

  // recovery.cpp. fault.sdc_every: the step's gradients computed twice (a third time where
  // they differ), the first with the drills and `dloss`; the ranks whose two differ, and
  // *unresolved where no two of three agree on some rank.
  std::vector<int> sdc_check(int64_t step, float dloss, bool* unresolved);
  // An update skipped at 1-based step s1: logged, counted, and past fault.max_skips in a row
  // a rollback to the newest checkpoint.
  void skipped(int64_t s1, const std::string& why);
  // Every rank's compute time of the last step: the stragglers, named once per streak.
  void stragglers_watch(const std::vector<double>& compute_ms);

  // finish.cpp.
  // Whole validation batches in the data (0: none).
  int64_t val_available() const { return data.val ? data.val->epoch_sequences() / cfg.train.global_batch : 0; }
  void startup_log();
  void facts_write() const;  // config.toml and run.json into log.dir (rank 0)
  // The block that closes a run: steps, losses, tokens and rates, and where its files went.
  std::string summary() const;
  // train/divergence.cpp. The run diverged: ends it with Diverged on every rank, naming the
  // last checkpoint whose weights gave a finite loss (the newer ones are removed). Collective.
  [[noreturn]] void diverged(const std::string& why);
  // At the end: non-finite weights, or a last update skipped for a non-finite loss, is diverged.
  void diverged_at_end();
  // The stop signal any rank got (0: none), agreed over the job: collective.
  int stop_agreed();
  // With a pipeline and tied embeddings: the two copies must be the same bits (an Error if not).
  void tied_copies_check();
  // log.grad_norms: every tensor's gradient norm now (step 1, before clipping) into
  // <log.dir>/grad_norms.json, {"name": norm}; one rank holds the whole model.
  void grad_norms_write() const;
};

}  // namespace loom
