// AdamW with torch.optim.AdamW's arithmetic (decoupled decay, bias correction folded into
// the step size and denominator as PyTorch does), over the flat parameter buffer. Weight
// decay applies to tensors of two or more dims only. Also: global-norm clipping like
// torch.nn.utils.clip_grad_norm_, and the learning-rate schedules.
// Not here: sharded state (ZeRO) and master weights for bf16 (CUDA backend).
#pragma once
#include "model/registry.h"
#include "optim/clip.h"
#include "runtime/allocator.h"
#include "runtime/config.h"

namespace loom {

struct AdamWHyper {
  double lr, beta1, beta2, eps, weight_decay;
};

// A range of the optimizer's index space and whether weight decay applies to it.
// Weights and gradients may live in other index spaces than the state: segment element i
// (lo <= i < hi) reads params[p_lo + i - lo] and grads[g_lo + i - lo] (ZeRO keeps moments
// for its shard while weights or gradients stay in the full buffer).
struct AdamSegment {
  int64_t lo, hi;
  bool decay;
  int64_t p_lo, g_lo;
  bool in_norm = true;  // counted in the global norm on this rank (replicated tensors: one tp rank)
};
// One segment per registered tensor, over the flat buffer.
std::vector<AdamSegment> adam_segments(const ParamRegistry& reg);

class AdamW {
 public:
  // State for `n` elements (the whole model, or the shard this rank owns); `segments` cover
  // the elements to update (padding between them is left alone).
  AdamW(std::vector<AdamSegment> segments, int64_t n, Allocator& alloc);
  // One update of every segment; `step` counts from 1.
  void update(float* params, const float* grads, const AdamWHyper& h, int64_t step);
  float* m() { return m_.f32(); }
  float* v() { return v_.f32(); }

 private:
  std::vector<AdamSegment> segments_;
  Tensor m_, v_;
};

// Sum of squares of the gradients the segments cover (their g_lo space, in_norm only), in double.
double segments_sum_squares(const std::vector<AdamSegment>& segs, const float* grads);
void segments_scale(const std::vector<AdamSegment>& segs, float* grads, float s);

// The global gradient norm when tensor parallelism splits the model over `tp`: sharded
// tensors count on every tp rank, replicated ones on tp rank 0 only; then clips like
// clip_grad_norm. With one tp rank it is clip_grad_norm over the whole buffer.
class ProcessGroup;
double clip_grad_norm_tp(const ParamRegistry& reg, float* grads, double max_norm, ProcessGroup& tp);

// Global L2 norm of `n` gradients; scales them by max_norm / (norm + 1e-6) when that is
// below 1 (max_norm 0: no clipping). Returns the norm before clipping.
double clip_grad_norm(float* grads, int64_t n, double max_norm);

// Learning rate at optimizer step `step` (0-based): linear warmup over warmup_steps, then
// constant, cosine or linear decay to min_lr, or wsd: stable, then linear decay to min_lr
// over the last 20% of the steps.
double lr_at(const TrainConfig& t, int64_t step);

}  // namespace loom
