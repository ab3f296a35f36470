// AdamW with torch.optim.AdamW's arithmetic (decoupled decay, bias correction folded into
// the step size and denominator as PyTorch does) over flat fp32 state, and global-norm
// clipping like torch.nn.utils.clip_grad_norm_. One chunk table (OptChunk) drives both the
// squared norm and the update, on every device; the norm and the clipping factor stay on the
// device, so a step never waits for the host. With bf16 compute the fp32 master weights live
// here too (the ZeRO paper's 2 + 4 + 12 bytes per parameter with fp32 main gradients); an
// fp32 run's parameters are their own master. Weight decay applies to tensors of two or more
// dims only. Also: the learning-rate schedules.
// Not here: which slice of the model a rank owns (DDP: all of it; ZeRO: its shard).
#pragma once
#include "kernels/clip.h"
#include "model/backend.h"
#include "model/layout.h"
#include "model/registry.h"
#include "runtime/config.h"

namespace loom {

struct AdamWHyper {
  double lr, beta1, beta2, eps, weight_decay;
};

// The table over a whole flat buffer: state, parameter and gradient indices coincide. A
// replicated tensor counts in the norm on tp rank 0 only (tp ranks hold copies of it).
// `uncounted` (if given) names a tensor left out of the norm: a pipeline's last-stage copy of a
// tied embedding, counted on the first stage.
// ep_rank: under expert parallelism the dense tensors, equal on every ep rank, count on the
// first only (the experts, different on each, count everywhere; the norm is summed over ep).
// Chunks never cross a multiple of `block` elements from their unit's start (model/layout.h's
// norm_block; `units`: the units' first offsets, ascending).
std::vector<OptChunk> opt_chunks(const ParamRegistry& reg, const std::vector<int64_t>& units, int64_t block,
                                 int tp_rank, const char* uncounted = nullptr, int ep_rank = 0);
// The units' first offsets of a layout, as opt_chunks takes them.
std::vector<int64_t> unit_starts(const ModelLayout& layout);
// The chunks of n elements starting `at` elements into their unit (the planner's count).
size_t opt_chunks_count(int64_t n, int64_t at, int64_t block);
// Splits n elements of the three index spaces into table chunks of at most kOptChunk, cut where
// at + k is a multiple of `block` (at: the first element's offset in its unit).
void opt_chunks_add(std::vector<OptChunk>& out, int64_t state, int64_t param, int64_t grad, int64_t n, bool decay,
                    bool norm, int64_t at, int64_t block);

class AdamW {
 public:
  // State for `n` elements (the whole model, or the shard this rank owns); `chunks` cover the
  // elements to update. master: keep fp32 master weights (the parameters are bf16).
  AdamW(Backend& be, std::vector<OptChunk> chunks, int64_t n, bool master);
  // What it allocates: master weights (bf16 compute), moments, the device's copy of the
  // table (CUDA), the norm and the clipping factor.
  static std::vector<PlanItem> plan(int64_t n, bool master, size_t n_chunks, DeviceKind device);
  // The squared norm of the gradients the table counts, into sum_squares() (on the device).
  void norm_squares(const float* grads);
  // f64 [kExactDigits] on the device, the digits of an exact sum (runtime/exact_sum.h): sum it
  // over the ranks that hold other parts before update() (an all-reduce's sum is exact).
  Tensor& sum_squares() { return ss_; }
  // Clips by the norm in sum_squares() and updates; `step` counts from 1.
  void update(Ptr params, const float* grads, const AdamWHyper& h, int64_t step, double max_norm);
  float* master() { return master_.defined() ? master_.f32() : nullptr; }
  float* m() { return m_.f32(); }
  float* v() { return v_.f32(); }
  double norm();  // sqrt of sum_squares(), read on the host (waits for the device)

 private:
  Backend& be_;
  OptTable table_;
  Tensor master_, m_, v_, ss_, scale_;
};

// Learning rate at optimizer step `step` (0-based): linear warmup over warmup_steps, then
// constant, cosine or linear decay to min_lr, or wsd: stable, then linear decay to min_lr
// over the last 20% of the steps.
double lr_at(const TrainConfig& t, int64_t step);

}  // namespace loom
