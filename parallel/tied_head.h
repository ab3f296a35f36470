// parallel.invariant with tied embeddings, on a chunk that holds both the embedding and the head
// (one pipeline stage, or the first rank of a V-shaped schedule): the head's gradient of the
// shared matrix (H) goes to a buffer of its own, is summed over micro-batches and ranks in the
// canonical tree, and is added to the embedding's (E) once, after the reduction: E + H, the sum
// the first and the last stage of a pipeline form when the two sit on different ranks. Joined
// inside each micro-batch instead, the same terms would meet in another order.
// Not here: the pipeline's exchange of the two stages' sums (train/step.cpp).
#pragma once
#include <memory>

#include "model/layout.h"
#include "parallel/grad_tree.h"

namespace loom {

// Whether a chunk of `layout` keeps the head's part apart (see above).
bool tied_head_apart(const ModelLayout& layout, const ModelDims& dims, bool invariant);

class TiedHeadGrad {
 public:
  // `numel`: the matrix's elements (this tp rank's rows). shard > 0 (ZeRO-2/3): each
  // micro-batch's H is reduce-scattered over dp ranks at once, padded to shard x dp elements,
  // the rank keeping `shard` (the same elements as its shard of the embedding's unit, which
  // the matrix opens); shard = 0: the whole H is kept and summed over dp after the step.
  // cp > 1 (with shard > 0; dp counts the dp x cp ranks, cp innermost): as ZeRO's units, each
  // micro-batch over the dp ranks only into a cp-fold shard, the cp parts apart through the
  // tree, then once a step over the cp ranks.
  TiedHeadGrad(Backend& be, int64_t numel, int micro_batches, int64_t shard, int dp, int cp = 1);
  // What it allocates, for `plan memory`.
  static std::vector<PlanItem> plan(int64_t numel, int micro_batches, int64_t shard, int dp, int cp = 1);

  float* grads() { return buf_.f32(); }  // the head adds this micro-batch's H here
  // The next micro-batch's H is complete: into the tree (the step's last, by the count).
  void micro_batch_done(ProcessGroup& dp, Buf half);
  // dst += the step's H, from element `from` of what this rank keeps (the whole matrix, or its
  // shard) for dst.count elements; then H starts over. Whole: sums over dp first (2 ranks add
  // a + b in any all-reduce; more, in the tree with `half`, pairing from `first_bit`); a
  // cp-fold shard: its cp parts first, in the tree reduce-scatter over the cp ranks.
  // `summed`: the whole H was summed over dp already (started in the caller's TreeAllReduce).
  void add_to(ProcessGroup& dp, Buf half, int first_bit, Buf dst, int64_t from, bool summed = false);
  // The whole H (shard = 0), the step's sum over this rank's micro-batches once the head's last
  // backward of the step has folded it: for the caller's tree all-reduce to start early.
  Buf whole() { return Buf(buf_).slice(0, numel_); }
  void reset();  // a step abandoned halfway

 private:
  Backend& be_;
  int64_t numel_, shard_;
  int cp_;
  // kept_: the shard (shard > 0; cp-fold with cp > 1); else buf_ is kept whole. With cp > 1 the
  // padded buf_, zero between steps, takes the shard the cp parts' reduce-scatter leaves.
  Tensor buf_, kept_;
  std::unique_ptr<GradTree> tree_;
};

}  // namespace loom
