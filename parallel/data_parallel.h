// The data-parallel side of a rank: how its chunk reaches weights and gradients (UnitAccess),
// where the fp32 weights live, and the optimizer step. Two kinds: DDP (parallel/ddp.h:
// every rank holds everything, gradients all-reduced in buckets during backward) and ZeRO
// (parallel/zero.h: state sharded over dp). With one dp rank DDP is plain training.
// Everything here runs on the chunk's backend and stream, so it never asks the device: the
// same code reduces host buffers over MPI and CUDA buffers over NCCL.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "model/decoder_part.h"
#include "optim/adamw.h"
#include "runtime/step_clock.h"

namespace loom {

// A run of a rank's optimizer state, for checkpoints: n elements from `flat` in the chunk's
// flat registry (inside one tensor, `spec`) and from `state` in the state arrays.
struct StateRun {
  const ParamSpec* spec;
  int64_t flat, state, n;
};
// write: what this rank writes (each element of the model's state once over dp and tp);
// moments: the Adam moments it holds; weights: the weights it needs to hold.
enum class StateUse { write, moments, weights };
// The state on the host: fp32 weights (the master weights where they exist), exp_avg and
// exp_avg_sq. Weights are indexed by `flat` when weights_by_flat, else by `state`.
// Packed (run_at not empty): only the write runs came down, run i's weights, m and v at
// weights + run_at[i], m + run_at[i] and v + run_at[i].
struct StateHost {
  const float* weights = nullptr;
  bool weights_by_flat = false;
  const float* m = nullptr;
  const float* v = nullptr;
  std::vector<int64_t> run_at;
};

class DataParallel : public UnitAccess {
 public:
  // The chunk's fp32 weights in this rank's (tensor-parallel) layout, on the host; every dp
  // rank passes the same values.
  virtual void weights_from(const float* host) = 0;
  // The fp32 weights back (master values where they exist); collective over dp.
  virtual void weights_to(float* host) = 0;
  // The micro-batch whose backward runs next is the step's last (DDP communicates only then).
  virtual void set_last(bool last) { (void)last; }
  // The optimizer step in two halves, so that the trainer can look at the gradients' global
  // norm (over dp and tp: the same on every rank) before it decides to update:
  // reduce_grads() finishes the gradient reductions and computes the norm; then either
  // apply() clips by it and updates, or discard() drops the step's gradients. Waits for
  // communication are charged to the clock's comm phase.
  // tied(g): runs once the gradients are reduced over dp and before their norm, on the part of
  // the tied embedding's reduced gradient this rank holds (the whole tensor under DDP, the
  // rank's shard under ZeRO, the same elements on the first and the last pipeline stage), for
  // the pipeline to sum the two stages' copies.
  virtual void reduce_grads(const std::function<void(Buf)>& tied = {}) = 0;
  // f64 [1] on the device: the squared gradient norm reduce_grads() leaves for apply(); the
  // pipeline sums it over the stages in between.
  virtual Tensor& grad_sum_squares() = 0;
  virtual void apply(const AdamWHyper& h, int64_t step, double max_norm) = 0;
  virtual void discard() = 0;
  void step(const AdamWHyper& h, int64_t step, double max_norm) {
    reduce_grads();
    apply(h, step, max_norm);
  }
  virtual double grad_norm() = 0;  // the last step's, before clipping (read on the host)
  virtual std::string describe() const = 0;

  // Checkpoints (see StateRun).
  virtual std::vector<StateRun> state_runs(StateUse use) const = 0;
  virtual int64_t state_size() const = 0;
  // The state as it is now, valid until the next step: the buffers themselves on the CPU;
  // on CUDA, copies downloaded into `keep` (of what this rank writes only, where it holds more).
  virtual StateHost state_host(HostBuffer& keep) = 0;
  // Moments indexed by state, state_size() each (weights load through weights_from).
  virtual void moments_from(const float* m, const float* v) = 0;
};

struct DataParallelGroups {
  ProcessGroup& dp;       // carries the chunk's buffers
  ProcessGroup& tp;       // carries the chunk's buffers
  ProcessGroup& host_dp;  // host buffers (weights in and out)
  // Expert parallel (parallel.ep > 1): the ep group, over which the experts are split, and the
  // expert-data-parallel group (dp / ep ranks holding the same experts), over which expert
  // gradients are reduced; dense ones are reduced over dp.
  ProcessGroup* ep = nullptr;
  ProcessGroup* edp = nullptr;
  ProcessGroup* host_edp = nullptr;  // host buffers over expert-dp (weights out)
};

// What the data-parallel side takes from a run's config, read once (data_parallel_options):
// parallel/ reads no other key.
struct DataParallelOptions {
  int zero = 0;               // parallel.zero: 0 is DDP, 1-3 ZeRO's stage
  double bucket_mb = 25;      // DDP's gradient buckets (parallel.bucket_mb)
  DType reduce = DType::f32;  // the dtype gradients are reduced in (parallel.grad_reduce_dtype)
  bool invariant = false;     // parallel.invariant: gradients summed in the canonical tree
  int micro_batches = 1;      // a rank's micro-batches a step
  int ranks = 1;              // dp x cp: the ranks a gradient is summed over
  int cp = 1;                 // of which the cp ranks, innermost
  // Where the canonical tree over dp x cp starts pairing (tree_all_reduce): at the dp bits.
  int tree_first_bit() const {
    int b = 0;
    while ((1 << b) < cp) ++b;
    return b;
  }
  int ep = 1;                  // expert parallel: the experts' gradients sum over dp / ep ranks
  bool keep_gathered = false;  // ZeRO-3 keeps gathered weights until the step (zero3_reshard)
  bool tied_across = false;    // a pipeline's tied embedding, a copy on the first and last stage
};
DataParallelOptions data_parallel_options(const Config& cfg);

// DDP at zero = 0, else ZeRO of that stage; the optimizer over what this rank owns.
std::unique_ptr<DataParallel> data_parallel_make(const DataParallelOptions& o, DecoderPart& chunk,
                                                 const DataParallelGroups& groups, StepClock* clock);

}  // namespace loom
