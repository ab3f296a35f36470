// ZeRO 1-3 (parallel/zero.h): the slots that gather weights and reduce-scatter gradients, the
// optimizer step. The shards' geometry and the plan are in zero_geometry.cpp; parallel.invariant's
// trees in zero_invariant.cpp.
#include "parallel/zero.h"

#include <algorithm>
#include <map>

#include "parallel/zero_geometry.h"

namespace loom {

using namespace zero_detail;

struct Zero::Slot {
  // buf: a whole padded unit; result: this rank's reduced shard (of both parts); aux: an
  // expert tail, padded for expert-dp.
  Tensor buf, result, buf_low, result_low, aux, aux_low;
  int unit = -1;
  Work tail;           // the expert tail's reduce-scatter or gather
  bool fixup = false;  // a gathered expert tail still to be copied into buf
  Pass pass = Pass::forward;
  bool in_use = false, pending = false;
  bool used = false;  // read since its gather (a tied lm_head reads the embeddings twice)
  Work work;
  int64_t run = -1;  // parallel.invariant: the last of its tree reduce-scatters in flight
};

int64_t Zero::Unit::a() const {
  return std::min(len, int64_t(r) * s);
}
int64_t Zero::Unit::b() const {
  return std::min(len, int64_t(r + 1) * s);
}

Zero::Zero(const DataParallelOptions& o, DecoderPart& chunk, const DataParallelGroups& groups, StepClock* clock)
    : stage_(o.zero),
      chunk_(chunk),
      be_(chunk.backend()),
      dp_(groups.dp),
      tp_(groups.tp),
      host_dp_(groups.host_dp),
      clock_(clock),
      n_(groups.dp.size()),
      r_(groups.dp.rank()),
      edp_(groups.edp),
      host_edp_(groups.host_edp ? groups.host_edp : groups.edp),
      ranks_{zero_ranks(o, chunk.dims(), n_, r_, edp_ ? edp_->rank() : 0)},
      dtype_(be_.dtype()),
      reduce_(o.reduce) {
  LOOM_CHECK(stage_ >= 1 && stage_ <= 3, "parallel.zero = {} is not one of 0|1|2|3", stage_);
  first_bit_ = o.tree_first_bit();
  const ModelLayout& layout = chunk.layout();
  const Geometry g = geometry(layout, ranks_);
  int64_t off = 0;
  for (size_t u = 0; u < g.parts.size(); ++u) {
    const Part& p = g.parts[u];
    if (!p.tail) first_part_.push_back(int(u));
    units_.push_back({p.lo, p.len, g.s[u], off, p.r, p.n, p.expert, p.tail});
    off += g.s[u];
  }
  LOOM_ASSERT(int(first_part_.size()) == layout.num_units());
  shard_ = g.shard;
  max_unit_ = g.max_unit;
  const char* copy = chunk.holds_tied_copy() ? head_names(chunk.dims()).wte : nullptr;  // counted on the first stage
  adam_ = std::make_unique<AdamW>(be_, zero_opt_chunks(layout, ranks_, stage_, tp_.rank(), copy), g.shard,
                                  dtype_ != DType::f32);
  // Everything else zero_plan lists (AdamW allocated its own part).
  std::map<std::string, std::vector<Tensor>> got;
  keep_ = o.keep_gathered;
  gathered_.assign(size_t(layout.num_units()), 0);
  for (auto& item : zero_plan(layout, ranks_, stage_, tp_.rank(), dtype_, reduce_, be_.device(), keep_)) {
    if (item.name.rfind("zero_", 0) != 0) continue;
    got[item.name].push_back(be_.alloc().empty(item));
  }
  if (o.invariant) invariant_setup(o);
  auto take = [&](const char* name, size_t i = 0) { return got.count(name) ? got[name][i] : Tensor(); };
  shard_params_ = take("zero_shard_params");
  shard_grads_ = take("zero_shard_grads");
  grad_bounce_ = take("zero_grad_bounce");
  grad_bounce_low_ = take("zero_grad_bounce_bf16");
  param_bounce_ = take("zero_param_bounce");
  param_full_ = take("zero_param_full");
  for (size_t i = 0; i < got["zero_grad_slot"].size(); ++i) {
    auto s = std::make_unique<Slot>();
    s->buf = take("zero_grad_slot", i);
    s->result = take("zero_grad_result", i);
    s->buf_low = take("zero_grad_slot_bf16", i);
    s->result_low = take("zero_grad_result_bf16", i);
    grad_slots_.push_back(std::move(s));
  }
  for (size_t i = 0; i < got["zero_param_slot"].size(); ++i) {
    auto s = std::make_unique<Slot>();
    s->buf = take("zero_param_slot", i);
    param_slots_.push_back(std::move(s));
  }
  // Expert tails' buffers, for the slots that serve a MoE unit (the blocks' two, in order).
  const std::vector<SlotSize> sizes = slot_sizes(layout, g);
  for (size_t i = 0, k = 0; i < sizes.size(); ++i) {
    if (!sizes[i].aux) continue;
    if (i < grad_slots_.size()) {
      grad_slots_[i]->aux = take("zero_grad_aux", k);
      grad_slots_[i]->aux_low = take("zero_grad_aux_bf16", k);
    }
    if (i < param_slots_.size()) param_slots_[i]->aux = take("zero_param_aux", k);
    ++k;
  }
}

Zero::~Zero() {
  for (auto& s : grad_slots_) s->work.wait(), s->tail.wait();
  for (auto& s : param_slots_) s->work.wait(), s->tail.wait();
}

std::string Zero::describe() const {
  const char* tree = !tree_      ? ""
                     : tree_sum_ ? ", summed in the canonical tree (parallel.invariant): ranks by recursive halving, "
                                   "each unit's as its backward ends"
                                 : ", summed in the canonical tree (parallel.invariant)";
  return fmt::format("{} {}, ZeRO stage {}{}, gradients reduced in {}{}", chunk_.dims().cp > 1 ? "dp x cp" : "dp", n_,
                     stage_, keep_ ? " (weights kept gathered until the step)" : "", dtype_name(reduce_), tree);
}

void Zero::wait(const Work& w) {
  StepClock::Scope c(clock_, Phase::comm);
  w.wait_on(be_.stream());
}

void Zero::weights_from(const float* host) {
  // Master weights (bf16 compute) and stage-3 weights are this rank's slices; below stage 3
  // every rank holds the whole weights in the compute dtype.
  std::vector<float> shard(static_cast<size_t>(shard_), 0.0f);
  for (const auto& u : units_) std::copy(host + u.lo + u.a(), host + u.lo + u.b(), shard.begin() + u.shard_off);
  if (float* master = adam_->master()) be_.upload(dev(master, shard_, DType::f32), shard.data());
  std::fill(gathered_.begin(), gathered_.end(), 0);
  const Buf host_buf(const_cast<float*>(host), int64_t(chunk_.num_params()));
  if (stage_ >= 3) {
    if (dtype_ == DType::f32) {
      be_.upload(Buf(shard_params_), shard.data());
    } else {
      std::vector<bf16> low(shard.size());
      cpu::narrow(low.data(), shard.data(), int64_t(shard.size()));
      be_.upload(Buf(shard_params_), low.data());
    }
  } else if (dtype_ == DType::f32) {
    be_.upload(Buf(chunk_.params_tensor()), host);
  } else {
    std::vector<bf16> low(chunk_.num_params());
    cpu::narrow(low.data(), host, int64_t(low.size()));
    be_.upload(Buf(chunk_.params_tensor()), low.data());
  }
}

void Zero::weights_to(float* host) {
  if (stage_ <= 2 && dtype_ == DType::f32) {  // every rank holds the whole fp32 weights
    be_.download(host, Buf(chunk_.params_tensor()));
    return;
  }
  // The fp32 shard (master weights, or stage 3's own), gathered unit by unit over dp.
  std::vector<float> shard(static_cast<size_t>(shard_));
  be_.download(shard.data(), adam_->master() ? dev(adam_->master(), shard_, DType::f32) : Buf(shard_params_));
  std::vector<float> all;
  for (const auto& u : units_) {
    all.resize(size_t(u.s * u.n));
    ProcessGroup& g = u.expert ? *host_edp_ : host_dp_;
    g.all_gather(Buf(shard.data() + u.shard_off, u.s), Buf(all.data(), u.s * u.n)).wait();
    std::copy_n(all.data(), u.len, host + u.lo);
  }
}

// Unit u's slot among four: the edges have their own (the embeddings are used at both ends
// of a pass); blocks alternate between two, so one transfers while the next computes.
Zero::Slot& Zero::slot_of(std::vector<std::unique_ptr<Slot>>& slots, int u) const {
  const int i = chunk_.layout().local(u), last = chunk_.layout().num_units() - 1;
  if (i == 0) return *slots[0];
  if (i == last) return *slots[1];
  return *slots[size_t(2 + i % 2)];
}

size_t Zero::slot_index(const Slot& slot) const {
  for (size_t i = 0; i < grad_slots_.size(); ++i)
    if (grad_slots_[i].get() == &slot) return i;
  fail_bug("ZeRO: a gradient slot not its own");
}

void Zero::drain(Slot& slot) {
  if (!slot.pending) return;
  if (slot.run >= 0) {  // the tree's runs through this slot's (the earlier ones are further on)
    StepClock::Scope c(clock_, Phase::comm);
    tree_rs_->finish_through(slot.run);
    slot.run = -1;
  }
  wait(slot.work);
  wait(slot.tail);
  const Unit& u = unit(slot.unit);
  const Unit* e = tail(slot.unit);
  const int64_t n = u.s + (e ? e->s : 0);
  if (slot.result_low.defined()) be_.copy(Buf(slot.result).slice(0, n), Buf(slot.result_low).slice(0, n));
  // (cp > 1: the cp-fold shards, the tree's own; the cp parts meet in reduce_grads)
  float* sum = cp_ > 1 ? cp_grads_.f32() : shard_grads_.f32();
  const Buf res = cp_ > 1 ? Buf(cp_results_[slot_index(slot)]) : Buf(slot.result);
  be_.add(dev(sum + cp_ * u.shard_off, cp_ * u.s, DType::f32), res.slice(0, cp_ * u.s));
  if (e) be_.add(dev(sum + cp_ * e->shard_off, cp_ * e->s, DType::f32), res.slice(cp_ * u.s, cp_ * e->s));
  if (tree_) {  // (the shard range was zeroed by the last fold: the add above is a copy)
    tree_->fold(int(&u - units_.data()), sum);
    if (e) tree_->fold(int(e - units_.data()), sum);
  }
  slot.pending = false;
}

float* Zero::grads(int u) {
  if (stage_ < 2) return chunk_.grads() + chunk_.layout().unit_lo(chunk_.layout().local(u));
  Slot& s = slot_of(grad_slots_, u);
  if (!(s.in_use && s.unit == u)) {
    drain(s);
    be_.zero(Buf(s.buf).slice(0, padded(u)));  // padding stays zero
    s.unit = u;
    s.in_use = true;
  }
  return s.buf.f32();
}

void Zero::weights_done(int u) {
  if (stage_ < 3) return;
  Slot& p = slot_of(param_slots_, u);
  if (p.unit == u) p.in_use = false;
}

void Zero::backward_done(int u) {
  weights_done(u);
  if (tree_ && stage_ == 1) tree_->fold(chunk_.layout().local(u), chunk_.grads(), last_);
  const bool head = tied_ && chunk_.layout().local(u) == chunk_.layout().num_units() - 1;
  if (head) {
    StepClock::Scope c(clock_, Phase::comm);
    if (tree_rs_) tree_rs_->finish();  // (its reduce-scatter blocks, in the same half)
    tied_->micro_batch_done(dp_, half());
  }
  if (tree_sum_ && last_) {  // the unit's step sum is final: its tree all-reduce starts
    StepClock::Scope c(clock_, Phase::comm);
    tree_sum_->poll();
    tree_start(chunk_.layout().local(u));
    if (head) tree_sum_->start(tied_->whole()), tied_started_ = true;  // H's step sum is final too
  }
  if (stage_ < 2) return;
  if (tree_rs_) {  // the units' runs in flight, one exchange each
    StepClock::Scope c(clock_, Phase::comm);
    tree_rs_->poll();
  }
  Slot& s = slot_of(grad_slots_, u);
  if (!(s.in_use && s.unit == u)) return;  // no gradients were asked for
  const Unit& d = unit(u);
  const bool low = s.buf_low.defined();
  if (const Unit* e = tail(u)) {
    // The tail moves to its own padded buffer, reduced over its group; the dense part's
    // padding, where the tail was, is zeroed for dp.
    Buf aux = Buf(low ? s.aux_low : s.aux).slice(0, e->s * e->n);
    be_.zero(aux);
    be_.copy(aux.slice(0, e->len), Buf(s.buf).slice(d.len, e->len));
    be_.zero(Buf(s.buf).slice(d.len, padded(u) - d.len));
    Buf out = Buf(low ? s.result_low : s.result).slice(d.s, e->s);
    if (half_.defined()) {  // parallel.invariant (a tied embedding's part: over dp, as the unit)
      s.run = start_tree_scatter(group(*e), aux, out, slot_index(s), SlotPart::tail, d.s);
      s.tail = Work();
    } else {
      s.tail = group(*e).reduce_scatter(aux, out, be_.stream());
    }
  }
  Buf in = Buf(s.buf).slice(0, d.s * d.n), out = Buf(s.result).slice(0, d.s);
  if (low) {
    Buf l = Buf(s.buf_low).slice(0, d.s * d.n);
    be_.copy(l, in);
    in = l;
    out = Buf(s.result_low).slice(0, d.s);
  }
  if (half_.defined()) {  // parallel.invariant over more than 2 ranks or with cp: the tree's own
    s.run = start_tree_scatter(dp_, in, out, slot_index(s), SlotPart::dense, 0);
    s.work = Work();
  } else {
    s.work = dp_.reduce_scatter(in, out, be_.stream());
  }
  s.pending = true;
  s.in_use = false;
}

void Zero::gather_into(Slot& slot, int u, Pass pass) {
  const Unit& un = unit(u);
  slot.unit = u;
  slot.pass = pass;
  slot.used = false;
  slot.work =
      dp_.all_gather(Buf(shard_params_).slice(un.shard_off, un.s), Buf(slot.buf).slice(0, un.s * un.n), be_.stream());
  const Unit* e = tail(u);
  slot.fixup = e != nullptr;
  if (e)  // into its own buffer: the dense part's padding overlaps where it goes
    slot.tail = group(*e).all_gather(Buf(shard_params_).slice(e->shard_off, e->s), Buf(slot.aux).slice(0, e->s * e->n),
                                     be_.stream());
}

Ptr Zero::params(int u, Pass pass) {
  const ModelLayout& layout = chunk_.layout();
  const int i = layout.local(u), last = layout.num_units() - 1;
  if (stage_ < 3) return chunk_.params() + layout.unit_lo(i);
  if (keep_ && gathered_[size_t(i)]) return ptr_of(param_full_) + layout.unit_lo(i);
  Slot& s = slot_of(param_slots_, u);
  if (!(s.unit == u && s.pass == pass)) {  // not prefetched: gather now
    LOOM_ASSERT(!s.in_use);
    wait(s.work);
    wait(s.tail);
    gather_into(s, u, pass);
  }
  wait(s.work);
  wait(s.tail);
  if (s.fixup) {
    const Unit* e = tail(u);
    be_.copy(Buf(s.buf).slice(unit(u).len, e->len), Buf(s.aux).slice(0, e->len));
    s.fixup = false;
  }
  s.in_use = true;
  const bool first_read = !s.used;
  s.used = true;
  // Prefetch the unit that comes next while this one computes (the embeddings and the head
  // have slots of their own, so the first block gathers during the embeddings too); a second
  // read of a unit in the same pass is out of sequence and prefetches nothing.
  const int next = pass == Pass::forward ? i + 1 : i - 1;
  if (first_read && next >= 0 && next <= last && !(keep_ && gathered_[size_t(next)])) {
    const int nu = layout.unit_ids[size_t(next)];
    Slot& nx = slot_of(param_slots_, nu);
    if (!nx.in_use && !(nx.unit == nu && nx.pass == pass)) {
      wait(nx.work);
      wait(nx.tail);
      gather_into(nx, nu, pass);
    }
  }
  if (keep_) {  // into the whole-chunk buffer, where it stays until the step; the slot is free
    const Buf whole(param_full_);
    be_.copy(whole.slice(layout.unit_lo(i), layout.unit_len(i)), Buf(s.buf).slice(0, layout.unit_len(i)));
    gathered_[size_t(i)] = 1;
    s.in_use = false;
    s.unit = -1;
    return ptr_of(param_full_) + layout.unit_lo(i);
  }
  return ptr_of(s.buf);
}

void Zero::forward_done(int u) {
  weights_done(u);
}

const Zero::Unit* Zero::tied_part() const {
  const ParamSpec* w = ranks_.tied.empty() ? nullptr : chunk_.registry().find(ranks_.tied);
  if (w)
    for (const Unit& u : units_)
      if (u.lo == int64_t(w->offset)) return &u;
  fail_bug("ZeRO holds no part for the tied embedding '{}'", ranks_.tied);
}

void Zero::reduce_grads(const std::function<void(Buf)>& tied) {
  const Stream& st = be_.stream();
  float* grads = nullptr;
  if (tree_sum_) {
    // parallel.invariant over more than 2 ranks: the whole buffer summed in the tree, in place,
    // unit by unit from the backward's hooks; the table reads this rank's slice of it.
    StepClock::Scope c(clock_, Phase::comm);
    for (int i = chunk_.layout().num_units(); i-- > 0;)  // units whose backward did not report
      if (tree_started_.empty() || !tree_started_[size_t(i)]) tree_start(i);
    tree_sum_->finish();
    tree_started_.assign(tree_started_.size(), false);
    grads = chunk_.grads();
  } else if (stage_ == 1) {
    // Reduce-scatter each unit; this rank's reduced slice goes back into the full buffer,
    // where the table reads it.
    float* full = chunk_.grads();
    float* tmp = grad_bounce_.f32();
    float* mine = tmp + max_unit_;
    for (const auto& u : units_) {
      ProcessGroup& g = group(u);
      be_.zero(dev(tmp, u.s * u.n, DType::f32));
      be_.copy(dev(tmp, u.len, DType::f32), dev(full + u.lo, u.len, DType::f32));
      if (grad_bounce_low_.defined()) {
        Buf low(grad_bounce_low_);
        be_.copy(low.slice(0, u.s * u.n), dev(tmp, u.s * u.n, DType::f32));
        wait(g.reduce_scatter(low.slice(0, u.s * u.n), low.slice(max_unit_, u.s), st));
        be_.copy(dev(mine, u.s, DType::f32), low.slice(max_unit_, u.s));
      } else {
        wait(g.reduce_scatter(dev(tmp, u.s * u.n, DType::f32), dev(mine, u.s, DType::f32), st));
      }
      be_.copy(dev(full + u.lo + u.a(), u.b() - u.a(), DType::f32), dev(mine, u.b() - u.a(), DType::f32));
    }
    grads = full;
  } else {
    for (auto& s : grad_slots_) drain(*s);
    LOOM_ASSERT(!tree_ || tree_->idle());        // every unit's micro-batches, all folded
    LOOM_ASSERT(!tree_rs_ || tree_rs_->idle());  // no run in flight: the whole half is free again
    if (cp_ > 1) cp_reduce_scatter();
    grads = shard_grads_.f32();
  }
  if (tied_) add_tied_head(grads);
  if (tied) {  // this rank's reduced slice of the tied embedding, where the table reads it
    const Unit& t = *tied_part();
    tied(stage_ == 1 ? dev(grads + t.lo + t.a(), t.b() - t.a(), DType::f32)
                     : dev(grads + t.shard_off, t.b() - t.a(), DType::f32));
  }
  adam_->norm_squares(grads);
  wait(dp_.all_reduce(Buf(adam_->sum_squares()), ReduceOp::sum, st));
  if (tp_.size() > 1) wait(tp_.all_reduce(Buf(adam_->sum_squares()), ReduceOp::sum, st));
  reduced_ = grads;
}

void Zero::discard() {
  if (stage_ >= 2) be_.zero(Buf(shard_grads_));
  if (cp_grads_.defined()) be_.zero(Buf(cp_grads_));
  if (tree_) tree_->reset();
  if (tied_) tied_->reset();
  reduced_ = nullptr;
}

void Zero::apply(const AdamWHyper& h, int64_t step, double max_norm) {
  const Stream& st = be_.stream();
  LOOM_CHECK(reduced_, "ZeRO: apply() without reduce_grads()");
  adam_->update(stage_ >= 3 ? ptr_of(shard_params_) : chunk_.params(), reduced_, h, step, max_norm);
  reduced_ = nullptr;
  if (stage_ <= 2) {  // all-gather the updated weights into the full buffer
    Buf full(chunk_.params_tensor());
    Buf tmp(param_bounce_);
    for (const auto& u : units_) {
      Buf mine = tmp.slice(int64_t(u.r) * u.s, u.s);
      be_.zero(mine);
      be_.copy(mine.slice(0, u.b() - u.a()), full.slice(u.lo + u.a(), u.b() - u.a()));
      wait(group(u).all_gather(mine, tmp.slice(0, u.s * u.n), st));
      be_.copy(full.slice(u.lo, u.len), tmp.slice(0, u.len));
    }
  }
  if (stage_ >= 2) be_.zero(Buf(shard_grads_));
  std::fill(gathered_.begin(), gathered_.end(), 0);
  for (auto& slot : param_slots_) {  // gathered weights are stale now
    wait(slot->work);
    wait(slot->tail);
    slot->unit = -1;
    slot->fixup = false;
  }
}

std::vector<StateRun> Zero::state_runs(StateUse use) const {
  const ModelLayout& layout = chunk_.layout();
  std::vector<StateRun> runs;
  if (use == StateUse::weights && stage_ <= 2) {  // every rank holds the whole weights
    for (auto& spec : layout.reg.all())
      runs.push_back({&spec, int64_t(spec.offset), int64_t(spec.offset), spec.numel()});
    return runs;
  }
  const char* copy = chunk_.holds_tied_copy() ? head_names(chunk_.dims()).wte : nullptr;
  for (const StateRun& run : zero_state_runs(layout, ranks_)) {
    if (use == StateUse::write && run.spec->replicated() && tp_.rank() != 0) continue;
    if (use == StateUse::write && copy && run.spec->name == copy) continue;  // the first stage writes it
    runs.push_back(run);
  }
  return runs;
}

StateHost Zero::state_host(HostBuffer& keep) {
  float* master = adam_->master();
  // Without master weights the fp32 weights are the model's own: the whole buffer below
  // stage 3 (indexed by flat), the shard at stage 3.
  const bool by_flat = !master && stage_ <= 2;
  if (be_.device() == DeviceKind::cpu) {
    const float* w = master ? master : by_flat ? chunk_.params_tensor().f32() : shard_params_.f32();
    return {w, by_flat, adam_->m(), adam_->v()};
  }
  const int64_t nw = by_flat ? int64_t(chunk_.num_params()) : shard_;
  keep.resize(size_t(nw + 2 * shard_), be_.device());
  be_.download(keep.data(), master    ? dev(master, shard_, DType::f32)
                            : by_flat ? Buf(chunk_.params_tensor())
                                      : Buf(shard_params_));
  be_.download(keep.data() + nw, dev(adam_->m(), shard_, DType::f32));
  be_.download(keep.data() + nw + shard_, dev(adam_->v(), shard_, DType::f32));
  return {keep.data(), by_flat, keep.data() + nw, keep.data() + nw + shard_};
}

void Zero::moments_from(const float* m, const float* v) {
  be_.upload(dev(adam_->m(), shard_, DType::f32), m);
  be_.upload(dev(adam_->v(), shard_, DType::f32), v);
}

}  // namespace loom
