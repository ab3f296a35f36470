#include "parallel/tied_head.h"

namespace loom {

bool tied_head_apart(const ModelLayout& layout, const ModelDims& dims, bool invariant) {
  return invariant && dims.tied && !layout.unit_ids.empty() && layout.unit_ids.front() == 0 &&
         layout.unit_ids.back() == dims.L + 1;
}

TiedHeadGrad::TiedHeadGrad(Backend& be, int64_t numel, int micro_batches, int64_t shard, int dp, int cp)
    : be_(be), numel_(numel), shard_(shard), cp_(shard > 0 ? cp : 1) {
  for (const PlanItem& item : plan(numel, micro_batches, shard, dp, cp_)) {
    if (item.name == "grad_tied_head") buf_ = be_.alloc().empty(item);
    if (item.name == "grad_tied_head_shard") kept_ = be_.alloc().empty(item);
  }
  be_.zero(Buf(buf_));  // the head accumulates into it
  if (kept_.defined()) be_.zero(Buf(kept_));
  const int64_t n = shard_ > 0 ? cp_ * shard_ : numel_;
  tree_ = std::make_unique<GradTree>(be_, std::vector<int64_t>{0}, n, micro_batches);
}

std::vector<PlanItem> TiedHeadGrad::plan(int64_t numel, int micro_batches, int64_t shard, int dp, int cp) {
  if (shard == 0) cp = 1;
  std::vector<PlanItem> p{{"grad_tied_head", shard > 0 ? shard * dp : numel, DType::f32, Mem::grads}};
  if (shard > 0) p.push_back({"grad_tied_head_shard", cp * shard, DType::f32, Mem::grads});
  for (const PlanItem& item : grad_tree_plan(micro_batches, 1, shard > 0 ? cp * shard : numel)) p.push_back(item);
  return p;
}

void TiedHeadGrad::micro_batch_done(ProcessGroup& dp, Buf half) {
  if (shard_ == 0) return tree_->fold(0, buf_.f32());
  // ZeRO-2/3: the ranks' micro-batch i meets in the tree first (as their units' gradients do).
  const Buf in = Buf(buf_), out = Buf(kept_);
  if (cp_ > 1) {  // over the dp ranks only (those of this cp index): the cp parts stay apart
    tree_reduce_scatter(dp, be_, in, out, half, cp_, dp.size() / cp_);
  } else if (dp.size() > 2) {
    tree_reduce_scatter(dp, be_, in, out, half);
  } else {
    dp.reduce_scatter(in, out, be_.stream()).wait_on(be_.stream());
  }
  be_.zero(in);
  tree_->fold(0, kept_.f32());
}

void TiedHeadGrad::add_to(ProcessGroup& dp, Buf half, int first_bit, Buf dst, int64_t from, bool summed) {
  Buf kept = shard_ > 0 ? Buf(kept_) : Buf(buf_).slice(0, numel_);
  if (shard_ == 0 && dp.size() > 2 && !summed) tree_all_reduce(dp, be_, kept, half, first_bit);
  if (shard_ == 0 && dp.size() == 2) dp.all_reduce(kept, ReduceOp::sum, be_.stream()).wait_on(be_.stream());
  if (cp_ > 1) {  // the cp parts, after the micro-batches' tree: this rank's shard, into the idle buf_
    const Buf mine = Buf(buf_).slice(0, shard_);
    tree_reduce_scatter(dp, be_, kept, mine, half, 1, cp_);
    if (dst.count > 0) be_.add(dst, mine.slice(from, dst.count));
    be_.zero(mine);
  } else if (dst.count > 0) {
    be_.add(dst, kept.slice(from, dst.count));
  }
  be_.zero(kept);
}

void TiedHeadGrad::reset() {
  be_.zero(Buf(buf_));
  if (kept_.defined()) be_.zero(Buf(kept_));
  tree_->reset();
}

}  // namespace loom
