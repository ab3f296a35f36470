// ZeRO's side of parallel.invariant (docs/invariant.md): the micro-batches' tree over the rank's
// shards (or, at stage 1, the full buffer and its tree all-reduce), the tree reduce-scatter a
// unit's micro-batch goes through, with cp > 1 split in two halves (the dp ranks each
// micro-batch, the cp ranks once a step), and the tied head's part added once.
// Not here: the sharding itself (zero_geometry.cpp), the slots and their gathers (zero.cpp), the
// trees (grad_tree.h).
#include <algorithm>

#include "parallel/zero.h"
#include "parallel/zero_geometry.h"

namespace loom {

using namespace zero_detail;

int64_t zero_tied_shard(const ModelLayout& layout, const ZeroRanks& z, int stage) {
  if (stage == 1) return 0;
  const Geometry g = geometry(layout, z);
  LOOM_ASSERT(!g.parts.empty() && g.parts[0].lo == 0 && g.parts[0].n == z.dp);  // the matrix opens unit 0
  return g.s[0];
}

namespace {
std::vector<int64_t> scatter_halves(const std::vector<SlotSize>& slots) {
  // Each gradient slot's runs can be in flight together (a unit's, and its tail's), so each has
  // a part of its own: half its unit's buffer, then half its tail's.
  std::vector<int64_t> at{0};
  for (const SlotSize& e : slots) {
    at.push_back(at.back() + (e.buf + 1) / 2);
    at.push_back(at.back() + (e.aux + 1) / 2);
  }
  return at;
}
}  // namespace

std::vector<PlanItem> zero_tree_plan(const ModelLayout& layout, const ZeroRanks& z, int stage, int micro_batches,
                                     int64_t tied_numel, int cp) {
  std::vector<PlanItem> p;
  if (tied_numel > 0) p = TiedHeadGrad::plan(tied_numel, micro_batches, zero_tied_shard(layout, z, stage), z.dp, cp);
  auto add = [&p](const std::vector<PlanItem>& q) { p.insert(p.end(), q.begin(), q.end()); };
  if (stage == 1) {  // (the tied head's H in flight with the units: its half too)
    for (auto item : grad_tree_plan(micro_batches, z.dp, int64_t(layout.reg.numel()), layout.num_units())) {
      if (item.name == "grad_tree_half") item.numel += (tied_numel + 1) / 2;
      p.push_back(item);
    }
    return p;
  }
  const Geometry g = geometry(layout, z);
  add(grad_tree_plan(micro_batches, 1, cp * g.shard));
  if (z.dp > 2 || cp > 1)
    p.push_back({"grad_tree_half", scatter_halves(slot_sizes(layout, g)).back(), DType::f32, Mem::comm});
  if (cp > 1) {  // the cp-fold shards between micro-batches, and each slot's cp-fold result
    p.push_back({"grad_tree_cp", cp * g.shard, DType::f32, Mem::grads});
    for (const SlotSize& e : slot_sizes(layout, g))
      p.push_back({"grad_tree_cp_result", std::max<int64_t>(1, cp * e.result), DType::f32, Mem::comm});
  }
  return p;
}

void Zero::invariant_setup(const DataParallelOptions& o) {
  const ModelLayout& layout = chunk_.layout();
  // Stage 1: the tree over the full gradient buffer; 2 and 3: over this rank's shards, one
  // node a micro-batch (the ranks' micro-batch i, reduce-scattered, is a subtree).
  // With cp > 1 at 2 and 3, over cp-fold shards (the cp parts summed after the tree).
  if (stage_ >= 2) cp_ = o.cp;
  std::vector<int64_t> starts;
  for (const Unit& u : units_) starts.push_back(cp_ * u.shard_off);
  const int64_t n = stage_ == 1 ? int64_t(chunk_.num_params()) : cp_ * shard_;
  tree_ = std::make_unique<GradTree>(be_, stage_ == 1 ? unit_starts(layout) : starts, n, o.micro_batches);
  const bool tied = tied_head_apart(layout, chunk_.dims(), true);
  const int64_t tied_numel = tied ? chunk_.registry().at(head_names(chunk_.dims()).wte).numel() : 0;
  for (const PlanItem& item : zero_tree_plan(layout, ranks_, stage_, o.micro_batches, tied_numel, cp_)) {
    if (item.name == "grad_tree_half") half_ = be_.alloc().empty(item);
    if (item.name == "grad_tree_cp") cp_grads_ = be_.alloc().empty(item), be_.zero(Buf(cp_grads_));
    if (item.name == "grad_tree_cp_result") cp_results_.push_back(be_.alloc().empty(item));
  }
  if (stage_ >= 2 && half_.defined()) {
    tree_rs_ = std::make_unique<TreeReduceScatter>(dp_, be_);
    half_at_ = scatter_halves(slot_sizes(layout, geometry(layout, ranks_)));
  }
  if (stage_ == 1 && half_.defined()) tree_sum_ = std::make_unique<TreeAllReduce>(dp_, be_, Buf(half_), first_bit_);
  if (tied)
    tied_ = std::make_unique<TiedHeadGrad>(be_, tied_numel, o.micro_batches, zero_tied_shard(layout, ranks_, stage_),
                                           n_, cp_);
}

void Zero::tree_start(int i) {
  const ModelLayout& layout = chunk_.layout();
  const int64_t lo = layout.unit_lo(i);
  const int64_t hi = i + 1 < layout.num_units() ? layout.unit_lo(i + 1) : int64_t(chunk_.num_params());
  if (tree_started_.empty()) tree_started_.assign(size_t(layout.num_units()), false);
  LOOM_ASSERT(!tree_started_[size_t(i)]);
  tree_started_[size_t(i)] = true;
  tree_sum_->start(dev(chunk_.grads() + lo, hi - lo, DType::f32));
}

int64_t Zero::start_tree_scatter(ProcessGroup& g, Buf in, Buf out, size_t slot, SlotPart part, int64_t at) {
  StepClock::Scope c(clock_, Phase::comm);
  LOOM_ASSERT(&g == &dp_);                         // (ep is refused: a tail is a tied embedding's part, over dp)
  LOOM_ASSERT(part == SlotPart::tail || at == 0);  // a dense part opens its slot's result
  const size_t k = 2 * slot + (part == SlotPart::tail ? 1 : 0);  // scatter_halves' order
  const Buf half = Buf(half_).slice(half_at_[k], half_at_[k + 1] - half_at_[k]);
  if (cp_ > 1)  // over the dp ranks only: a cp-fold shard, into the slot's cp-fold result
    return tree_rs_->start(in, Buf(cp_results_[slot]).slice(cp_ * at, cp_ * out.count), half, cp_, n_ / cp_);
  return tree_rs_->start(in, out, half);
}

void Zero::cp_reduce_scatter() {
  // The cp ranks' parts, after the micro-batches' tree: each rank its shard.
  StepClock::Scope c(clock_, Phase::comm);
  for (const Unit& u : units_)
    tree_reduce_scatter(group(u), be_, Buf(cp_grads_).slice(cp_ * u.shard_off, cp_ * u.s),
                        Buf(shard_grads_).slice(u.shard_off, u.s), Buf(half_), 1, cp_);
  be_.zero(Buf(cp_grads_));  // (spoiled by the reduce-scatter; the next step adds into it)
}

void Zero::add_tied_head(float* grads) {
  // E + H, once the two are summed over dp: over the matrix's part of this rank's slice.
  StepClock::Scope c(clock_, Phase::comm);
  const ParamSpec& w = chunk_.registry().at(head_names(chunk_.dims()).wte);
  const int64_t wte = w.numel();
  if (stage_ == 1) {
    tied_->add_to(dp_, half(), first_bit_, dev(grads + w.offset, wte, DType::f32), 0, tied_started_);
    tied_started_ = false;
  } else {
    const Unit& u0 = units_[0];
    tied_->add_to(dp_, half(), first_bit_,
                  dev(grads + u0.shard_off, std::max<int64_t>(0, std::min(u0.b(), wte) - u0.a()), DType::f32), 0);
  }
}

}  // namespace loom
