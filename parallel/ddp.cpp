#include "parallel/ddp.h"

#include <algorithm>

#include "parallel/zero.h"

namespace loom {

DataParallelOptions data_parallel_options(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  DataParallelOptions o;
  o.zero = p.zero;
  o.bucket_mb = p.bucket_mb;
  o.reduce = p.grad_reduce_dtype == GradReduce::bf16 ? DType::bf16 : DType::f32;
  o.invariant = p.invariant;
  o.micro_batches = cfg.accum_steps();
  o.ranks = p.dp * p.cp;
  o.cp = p.cp;
  o.ep = p.ep;
  o.keep_gathered = p.zero == 3 && p.zero3_reshard == Zero3Reshard::after_step;
  o.tied_across = cfg.pp_tied_across();
  return o;
}

std::vector<PlanItem> Ddp::plan(const DataParallelOptions& o, const ModelDims& dims, const ModelLayout& layout,
                                DType dtype, DeviceKind device) {
  const ParamRegistry& reg = layout.reg;
  const int64_t n = int64_t(reg.numel());
  std::vector<PlanItem> p;
  if (o.ranks > 1 && o.reduce == DType::bf16) p.push_back({"grad_reduce_bf16", n, DType::bf16, Mem::comm});
  size_t n_chunks = 0;
  const std::vector<int64_t> units = unit_starts(layout);
  const int64_t block = norm_block(dims);
  for (auto& spec : reg.all()) {
    const int64_t lo = int64_t(spec.offset), unit = *(std::upper_bound(units.begin(), units.end(), lo) - 1);
    n_chunks += opt_chunks_count(int64_t(spec.numel()), lo - unit, block);
  }
  for (auto& item : AdamW::plan(n, dtype != DType::f32, n_chunks, device)) p.push_back(item);
  const bool tied = tied_head_apart(layout, dims, o.invariant);
  const int64_t tied_n = tied ? reg.at(head_names(dims).wte).numel() : 0;
  if (o.invariant)  // (the tied head's H in flight with the units: its half too)
    for (auto item : grad_tree_plan(o.micro_batches, o.ranks, n, int(units.size()))) {
      if (item.name == "grad_tree_half") item.numel += (tied_n + 1) / 2;
      p.push_back(item);
    }
  if (tied)
    for (auto& item : TiedHeadGrad::plan(tied_n, o.micro_batches, 0, 1)) p.push_back(item);
  return p;
}

std::vector<BucketRange> ddp_buckets(const ParamRegistry& reg, int64_t numel, int64_t per, bool experts_apart) {
  // Runs of tensors of one kind (experts or not), from the end; buckets within each.
  std::vector<std::pair<int64_t, bool>> runs;  // (lo, experts) of each run, from the end
  const auto& specs = reg.all();
  for (size_t i = specs.size(); i-- > 0;) {
    const bool experts = experts_apart && expert_param(specs[i].name);
    if (runs.empty() || runs.back().second != experts)
      runs.push_back({int64_t(specs[i].offset), experts});
    else
      runs.back().first = int64_t(specs[i].offset);
  }
  std::vector<BucketRange> out;
  int64_t hi = numel;
  for (auto [lo, experts] : runs) {
    for (; hi > lo; hi -= per) out.push_back({std::max(lo, hi - per), hi, experts});
    hi = lo;
  }
  return out;
}

Ddp::Ddp(const DataParallelOptions& o, DecoderPart& chunk, const DataParallelGroups& groups, StepClock* clock)
    : chunk_(chunk),
      be_(chunk.backend()),
      dp_(groups.dp),
      tp_(groups.tp),
      ep_(groups.ep),
      edp_(groups.edp),
      clock_(clock),
      bucket_mb_(o.bucket_mb),
      first_bit_(o.tree_first_bit()) {
  const int64_t numel = int64_t(chunk.num_params());
  const int64_t per = std::max<int64_t>(1, int64_t(bucket_mb_ * 1024 * 1024 / sizeof(float)));
  for (const BucketRange& b : ddp_buckets(chunk.registry(), numel, per, edp_ != nullptr))
    buckets_.push_back({b.lo, b.hi, b.experts ? edp_ : &dp_, {}});
  for (const PlanItem& item : plan(o, chunk.dims(), chunk.layout(), be_.dtype(), be_.device())) {
    if (item.name == "grad_reduce_bf16") low_ = be_.alloc().empty(item);
    if (item.name == "grad_tree_half") half_ = be_.alloc().empty(item);
  }
  if (o.invariant)  // (its levels: GradTree allocates them)
    tree_ = std::make_unique<GradTree>(be_, unit_starts(chunk.layout()), numel, o.micro_batches);
  if (tree_reduce()) tree_sum_ = std::make_unique<TreeAllReduce>(dp_, be_, Buf(half_), first_bit_);
  if (tied_head_apart(chunk.layout(), chunk.dims(), o.invariant))
    tied_ = std::make_unique<TiedHeadGrad>(be_, chunk.registry().at(head_names(chunk.dims()).wte).numel(),
                                           o.micro_batches, 0, dp_.size());
  adam_ = std::make_unique<AdamW>(
      be_,
      opt_chunks(chunk.registry(), unit_starts(chunk.layout()), norm_block(chunk.dims()), tp_.rank(),
                 chunk.holds_tied_copy() ? head_names(chunk.dims()).wte : nullptr, ep_ ? ep_->rank() : 0),
      numel, be_.dtype() != DType::f32);
}

std::string Ddp::describe() const {
  if (tree_reduce())
    return fmt::format(
        "dp {}, gradients summed in the canonical tree (parallel.invariant): micro-batches, then "
        "ranks by recursive halving, each unit's as its backward ends",
        dp_.size());
  return fmt::format("{} {}, {} of {} MB, reduced in {}{}", chunk_.dims().cp > 1 ? "dp x cp" : "dp", dp_.size(),
                     plural(buckets_.size(), "gradient bucket"), bucket_mb_, low_.defined() ? "bf16" : "f32",
                     tree_ ? ", micro-batches summed in the canonical tree (parallel.invariant)" : "");
}

void Ddp::backward_done(int u) {
  const int i = chunk_.layout().local(u);
  if (tree_) tree_->fold(i, chunk_.grads(), last_);
  const bool head = tied_ && i == chunk_.layout().num_units() - 1;
  if (head) tied_->micro_batch_done(dp_, half());
  if (last_ && tree_sum_) {  // the unit's step sum is final: its tree all-reduce starts (and H's with the head's)
    StepClock::Scope c(clock_, Phase::comm);
    tree_sum_->poll();
    tree_start(i);
    if (head) tree_sum_->start(tied_->whole()), tied_started_ = true;
  }
  if (last_) grads_ready_from(lo(u));
}

void Ddp::tree_start(int i) {
  const ModelLayout& layout = chunk_.layout();
  const int64_t hi = i + 1 < layout.num_units() ? layout.unit_lo(i + 1) : int64_t(chunk_.num_params());
  if (tree_started_.empty()) tree_started_.assign(size_t(layout.num_units()), false);
  LOOM_ASSERT(!tree_started_[size_t(i)]);
  tree_started_[size_t(i)] = true;
  tree_sum_->start(Buf(chunk_.grads_tensor()).slice(layout.unit_lo(i), hi - layout.unit_lo(i)));
}

void Ddp::grads_ready_from(int64_t offset) {
  const Stream& s = be_.stream();
  const Buf grads(chunk_.grads_tensor());
  if (tree_reduce()) return;  // all at once in reduce_grads
  while (next_ < buckets_.size() && buckets_[next_].lo >= offset) {
    Bucket& b = buckets_[next_++];
    if (b.group->size() == 1) continue;
    Buf g = grads.slice(b.lo, b.hi - b.lo);
    if (low_.defined()) {
      Buf l = Buf(low_).slice(b.lo, b.hi - b.lo);
      be_.copy(l, g);
      g = l;
    }
    b.work = b.group->all_reduce(g, ReduceOp::sum, s);
  }
}

void Ddp::weights_from(const float* host) {
  const int64_t n = int64_t(chunk_.num_params());
  if (float* master = adam_->master()) {
    be_.upload(Buf(master, n, DType::f32, be_.device()), host);
    be_.copy(Buf(chunk_.params_tensor()), Buf(master, n, DType::f32, be_.device()));
  } else {
    be_.upload(Buf(chunk_.params_tensor()), host);
  }
}

void Ddp::weights_to(float* host) {
  const int64_t n = int64_t(chunk_.num_params());
  if (float* master = adam_->master())
    be_.download(host, Buf(master, n, DType::f32, be_.device()));
  else
    be_.download(host, Buf(chunk_.params_tensor()));
}

void Ddp::reduce_grads(const std::function<void(Buf)>& tied) {
  const Stream& s = be_.stream();
  grads_ready_from(0);
  {
    StepClock::Scope c(clock_, Phase::comm);
    for (auto& b : buckets_) b.work.wait_on(s);
    if (tree_sum_) {  // units whose backward did not report (none in a step's usual course), then the rest
      for (int i = chunk_.layout().num_units(); i-- > 0;)
        if (tree_started_.empty() || !tree_started_[size_t(i)]) tree_start(i);
      tree_sum_->finish();
      tree_started_.assign(tree_started_.size(), false);
    }
  }
  if (low_.defined())
    for (auto& b : buckets_)
      if (b.group->size() > 1)
        be_.copy(Buf(chunk_.grads_tensor()).slice(b.lo, b.hi - b.lo), Buf(low_).slice(b.lo, b.hi - b.lo));
  next_ = 0;
  if (tied_) {  // E + H, once the two are summed over dp
    const ParamSpec& w = chunk_.registry().at(head_names(chunk_.dims()).wte);
    StepClock::Scope c(clock_, Phase::comm);
    tied_->add_to(dp_, half(), first_bit_, Buf(chunk_.grads_tensor()).slice(int64_t(w.offset), w.numel()), 0,
                  tied_started_);
    tied_started_ = false;
  }
  if (tied) {
    const ParamSpec& w = chunk_.registry().at(head_names(chunk_.dims()).wte);
    tied(Buf(chunk_.grads_tensor()).slice(int64_t(w.offset), w.numel()));
  }
  adam_->norm_squares(chunk_.grads());
  if (tp_.size() > 1) {
    StepClock::Scope c(clock_, Phase::comm);
    tp_.all_reduce(Buf(adam_->sum_squares()), ReduceOp::sum, s).wait_on(s);
  }
  if (ep_ && ep_->size() > 1) {
    StepClock::Scope c(clock_, Phase::comm);
    ep_->all_reduce(Buf(adam_->sum_squares()), ReduceOp::sum, s).wait_on(s);
  }
}

void Ddp::apply(const AdamWHyper& h, int64_t step, double max_norm) {
  adam_->update(chunk_.params(), chunk_.grads(), h, step, max_norm);
}

void Ddp::discard() {  // the next step's zero_grad clears the full gradient buffer
  if (tree_) tree_->reset();
  if (tied_) tied_->reset();
}

std::unique_ptr<DataParallel> data_parallel_make(const DataParallelOptions& o, DecoderPart& chunk,
                                                 const DataParallelGroups& groups, StepClock* clock) {
  if (o.zero == 0) return std::make_unique<Ddp>(o, chunk, groups, clock);
  return std::make_unique<Zero>(o, chunk, groups, clock);
}

std::vector<StateRun> Ddp::state_runs(StateUse use) const {
  // Every dp rank holds everything; for writing, each takes a 1/dp share of every tensor (so
  // the ranks write in parallel and every element once), and tensors replicated over tp are
  // written by tp rank 0.
  std::vector<StateRun> runs;
  for (auto& spec : chunk_.registry().all()) {
    const int64_t off = int64_t(spec.offset), numel = spec.numel();
    // Experts under expert parallelism: shared out over the ranks that hold the same ones.
    const ProcessGroup& g = edp_ && expert_param(spec.name) ? *edp_ : dp_;
    const int64_t n = g.size(), r = g.rank();
    if (use != StateUse::write) {
      runs.push_back({&spec, off, off, numel});
      continue;
    }
    if (spec.replicated() && tp_.rank() != 0) continue;
    if (chunk_.holds_tied_copy() && spec.name == head_names(chunk_.dims()).wte) continue;  // the first stage's
    const int64_t lo = numel * r / n, hi = numel * (r + 1) / n;
    if (lo < hi) runs.push_back({&spec, off + lo, off + lo, hi - lo});
  }
  return runs;
}

StateHost Ddp::state_host(HostBuffer& keep) {
  float* master = adam_->master();
  if (be_.device() == DeviceKind::cpu)
    return {master ? master : chunk_.params_tensor().f32(), true, adam_->m(), adam_->v()};
  // Every dp rank holds the whole state but writes 1/dp of it: only that comes down, packed
  // run after run (12 bytes per parameter over dp, not 12 on every rank).
  LOOM_CHECK(master, "a CUDA run keeps fp32 master weights");
  const std::vector<StateRun> runs = state_runs(StateUse::write);
  int64_t total = 0;
  for (const StateRun& r : runs) total += r.n;
  keep.resize(size_t(std::max<int64_t>(3 * total, 1)), be_.device());
  StateHost h{keep.data(), true, keep.data() + total, keep.data() + 2 * total, {}};
  h.run_at.reserve(runs.size());
  const Stream& s = be_.stream();
  int64_t at = 0;
  for (const StateRun& r : runs) {
    const size_t bytes = size_t(r.n) * sizeof(float);
    stream_copy(s, keep.data() + at, master + r.flat, bytes);
    stream_copy(s, keep.data() + total + at, adam_->m() + r.state, bytes);
    stream_copy(s, keep.data() + 2 * total + at, adam_->v() + r.state, bytes);
    h.run_at.push_back(at);
    at += r.n;
  }
  s.synchronize();
  return h;
}

void Ddp::moments_from(const float* m, const float* v) {
  const int64_t n = state_size();
  be_.upload(Buf(adam_->m(), n, DType::f32, be_.device()), m);
  be_.upload(Buf(adam_->v(), n, DType::f32, be_.device()), v);
}

}  // namespace loom
