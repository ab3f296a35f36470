// The parts of one rank's Trainer (train/trainer.h), shared by the files that implement it:
// trainer.cpp (state and construction, init), step.cpp (the step, validation),
// micro_batches.cpp (the passes of a step), recovery.cpp (the drills around the gradients, the
// SDC check, skipped updates and rollback, the step boundary) and finish.cpp (start-up log, export, summary). Internal.
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
  std::string device, why, threads_why;
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
  std::vector<PipeOp> pipe_ops;         // this stage's list (at pp 1: F0 B0 F1 B1 ...)
  std::unique_ptr<PipelineStage> pipe;  // parallel.pp > 1
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
  // The step's gradient reductions: over dp (DDP or ZeRO); with pipeline stages, the tied
  // embedding's two copies summed over the first and last stage (after dp: the whole tensor
  // under DDP, each rank's shard under ZeRO), and the squared norm over all stages, so that
  // clipping and the guard see the whole model's norm.
  void reduce_grads() {
    const Stream& st = backend->stream();
    std::function<void(Buf)> tied;
    if (pipe && cfg.pp_tied_across() && (chunk->has_embedding() || chunk->holds_tied_copy())) {
      tied = [this, &st](Buf g) {
        StepClock::Scope c(clock.get(), Phase::comm);
        mesh->group(Axis::embed).all_reduce(g, ReduceOp::sum, st).wait_on(st);
      };
    }
    dpar->reduce_grads(tied);
    if (pipe) {
      StepClock::Scope c(clock.get(), Phase::comm);
      pp().all_reduce(Buf(dpar->grad_sum_squares()), ReduceOp::sum, st).wait_on(st);
    }
  }
  template <class... A>
  void info(fmt::format_string<A...> f, A&&... a) const {
    if (!opt.quiet && lead) spdlog::info(f, std::forward<A>(a)...);
  }
  // The block that closes a run: steps, losses, tokens and rates, and where its files went.
  std::string summary() const;
  // What only `loom train --verbose` prints.
  template <class... A>
  void detail(fmt::format_string<A...> f, A&&... a) const {
    if (opt.verbose) info(f, std::forward<A>(a)...);
  }
  // Stages micro-batch `micro` of `step` from `stream` and returns where the backend reads it.
  Inputs stage(const Sequences& s, int64_t step, int micro) {
    batch_read(s, cfg, step, mesh->coord().dp, micro, inputs.data(), targets.data());
    if (cfg.data.doc_mask) {  // over whole sequences, before context parallel takes its chunks
      positions.resize(inputs.size());
      doc_positions(inputs.data(), cfg.model.seq_len, int(inputs.size()) / cfg.model.seq_len, cfg.doc_token(),
                    positions.data());
    }
    if (const ContextParallel* cp = chunk->context_parallel()) {  // this rank's 2 chunks of each sequence
      const int B = cfg.train.micro_batch;
      cp_inputs.resize(inputs.size() / size_t(cfg.parallel.cp));
      cp_targets.resize(cp_inputs.size());
      cp_select(cp_inputs.data(), inputs.data(), B, cfg.model.seq_len, cfg.parallel.cp, mesh->coord().cp);
      cp_select(cp_targets.data(), targets.data(), B, cfg.model.seq_len, cfg.parallel.cp, mesh->coord().cp);
      // Positions in the documents with data.doc_mask (the block kernels take the sequence's
      // from cp_positions), else in the sequence.
      if (cfg.data.doc_mask) {
        cp_positions_doc.resize(cp_inputs.size());
        cp_select(cp_positions_doc.data(), positions.data(), B, cfg.model.seq_len, cfg.parallel.cp, mesh->coord().cp);
      }
      return backend->stage_inputs(cp_inputs.data(), cp_targets.data(),
                                   cfg.data.doc_mask ? cp_positions_doc.data() : cp->token_positions().data(),
                                   int(cp_inputs.size()), cfg.model.seq_len, chunk->vocab_lo(), chunk->vocab_rows());
    }
    return backend->stage_inputs(inputs.data(), targets.data(), cfg.data.doc_mask ? positions.data() : nullptr,
                                 int(inputs.size()), cfg.model.seq_len, chunk->vocab_lo(), chunk->vocab_rows());
  }
  // The chunk's loss sum over dp x cp, read on the host and reset.
  double loss_take() {
    Tensor& sum = chunk->loss_sum();
    if (dp().size() > 1) {
      StepClock::Scope c(clock.get(), Phase::comm);
      dp().all_reduce(Buf(sum), ReduceOp::sum, backend->stream()).wait_on(backend->stream());
    }
    if (pipe) {  // the last stage's, to every stage (the others hold 0)
      StepClock::Scope c(clock.get(), Phase::comm);
      pp().all_reduce(Buf(sum), ReduceOp::sum, backend->stream()).wait_on(backend->stream());
    }
    double v = 0.0;
    backend->download(&v, Buf(sum));
    backend->zero(Buf(sum));
    return v;
  }
  // The step's MoE statistics, summed over dp and the pipeline's stages (each layer lives on
  // one), averaged over the micro-batches.
  void moe_metrics(StepMetrics& m) {
    std::vector<double> st = chunk->moe_stats_take();
    if (st.empty()) return;
    mesh->host_group(dp_axis()).all_reduce(Buf(st.data(), int64_t(st.size())), ReduceOp::sum).wait();
    if (pipe) mesh->host_group(Axis::pp).all_reduce(Buf(st.data(), int64_t(st.size())), ReduceOp::sum).wait();
    m.aux_loss = 0;
    for (size_t i = 0; i < st.size() / 4; ++i) {
      const double *v = st.data() + 4 * i, n = std::max(v[3], 1.0);
      m.aux_loss += v[0] / n / double(st.size() / 4);
      m.moe.push_back({int((i + 1) * cfg.model.moe.every - 1), v[1] / n, v[2] / n});
    }
  }
  // Whole validation batches in the data (0: none).
  int64_t val_available() const { return data.val ? data.val->epoch_sequences() / cfg.train.global_batch : 0; }
  void startup_log();
  void facts_write() const;  // config.toml and run.json into log.dir (rank 0)
  // The drills at a step's start: fault.exit/kill at (1-based) s1, and fault.hang.
  void drills_step_begin(int64_t s1);
  // The step's gradients, with the drills that fire around them (fault.slow_ms, nan, bitflip)
  // and fault.sdc_every's recomputation (*sdc_unresolved: no two of three agreed).
  void grads_compute(int64_t step, StepMetrics& m, uint64_t syncs0, bool* sdc_unresolved);
  // Forward and backward over the step's micro-batches from zeroed gradients; reduce: the
  // last backward starts the gradient reductions (else reduce_grads() does); poison: the
  // fault.nan drill.
  void micro_batches(int64_t step, bool reduce, bool poison);
  // fault.sdc_every: the step's gradients computed twice (a third time where they differ);
  // the ranks whose two differ, and *unresolved where no two of three agree on some rank.
  std::vector<int> sdc_check(int64_t step, bool flip, bool poison, bool* unresolved);
  // An update skipped at 1-based step s1: logged, counted, and past fault.max_skips in a row
  // a rollback to the newest checkpoint.
  void skipped(int64_t s1, const std::string& why);
  // The run diverged (train/divergence.cpp): ends it with Diverged on every rank, naming the
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
