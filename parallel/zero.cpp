#include "parallel/zero.h"

#include <chrono>
#include <cstring>

#include "kernels/ops.h"

namespace loom {

namespace {

struct Geometry {
  std::vector<int64_t> s;  // per unit shard size
  int64_t shard = 0, max_unit = 0, max_s = 0, edges = 0, max_layer = 0;
  int64_t bounce() const { return max_unit + max_s; }  // a padded unit and one shard
};

Geometry geometry(const ModelLayout& layout, int n) {
  Geometry g;
  const int last = layout.num_units() - 1;
  for (int u = 0; u <= last; ++u) {
    int64_t s = (layout.unit_len(u) + n - 1) / n;
    g.s.push_back(s);
    g.shard += s;
    g.max_unit = std::max(g.max_unit, s * n);
    g.max_s = std::max(g.max_s, s);
    if (u == 0 || u == last)
      g.edges += s * n;
    else
      g.max_layer = std::max(g.max_layer, s * n);
  }
  return g;
}

// Allocator rounds every tensor to 64 bytes; the plan does too, so it matches the ledger.
int64_t rounded(int64_t elems) {
  return std::max<int64_t>(64, (elems * 4 + 63) / 64 * 64);
}

}  // namespace

ZeroBytes zero_bytes(const ModelLayout& layout, int n, int stage) {
  const Geometry g = geometry(layout, n);
  const int64_t N = int64_t(layout.reg.numel());
  const int last = layout.num_units() - 1;
  ZeroBytes b;
  b.shard_elems = g.shard;
  b.params = stage >= 3 ? rounded(g.shard) : rounded(N);
  b.grads = stage >= 2 ? rounded(g.shard) : rounded(N);
  b.optim = stage >= 1 ? 2 * rounded(g.shard) : 2 * rounded(N);
  if (stage == 1) b.comm = rounded(g.bounce());  // the bounce buffer for reduce-scatter and all-gather
  if (stage >= 2) {  // gradient slots: both edges, two blocks; each with its shard-sized result
    b.comm = rounded(g.s[0] * n) + rounded(g.s[size_t(last)] * n) + 2 * rounded(g.max_layer) + rounded(g.s[0]) +
             rounded(g.s[size_t(last)]) + 2 * rounded(g.max_layer / n);
    if (stage == 2) b.comm += rounded(g.bounce());  // bounce buffer for the weight all-gather
  }
  if (stage >= 3)  // gathered weights: both edges, two blocks (one computing, one prefetched)
    b.comm += rounded(g.s[0] * n) + rounded(g.s[size_t(last)] * n) + 2 * rounded(g.max_layer);
  return b;
}

struct Zero::Slot {
  Tensor buf, result;  // buf: a whole padded unit; result: this rank's reduced shard
  int unit = -1;
  Pass pass = Pass::forward;
  bool in_use = false, pending = false;
  Work work;
};

Zero::Zero(int stage, Model& model, ProcessGroup& dp, ProcessGroup& tp, Allocator& alloc)
    : stage_(stage), model_(model), dp_(dp), tp_(tp), n_(dp.size()), r_(dp.rank()) {
  LOOM_CHECK(stage >= 1 && stage <= 3, "parallel.zero = {} is not one of 0|1|2|3", stage);
  const ModelLayout& layout = model.layout();
  const Geometry g = geometry(layout, n_);
  int64_t off = 0;
  for (int u = 0; u < layout.num_units(); ++u) {
    units_.push_back({layout.units[size_t(u)].first, layout.unit_len(u), g.s[size_t(u)], off});
    off += g.s[size_t(u)];
  }
  // Segments: this rank's slice of every unit, cut at tensor boundaries for weight decay.
  for (const auto& unit : units_) {
    const int64_t a = unit.lo + std::min(unit.len, r_ * unit.s), b = unit.lo + std::min(unit.len, (r_ + 1) * unit.s);
    for (auto& spec : layout.reg.all()) {
      const int64_t lo = std::max(a, int64_t(spec.offset)), hi = std::min(b, int64_t(spec.offset) + spec.numel());
      if (lo >= hi) continue;
      const int64_t state = unit.shard_off + (lo - a);
      segments_.push_back({state, state + (hi - lo), spec.decay, stage_ >= 3 ? state : lo, stage_ >= 2 ? state : lo,
                           !spec.replicated() || tp_.rank() == 0});
    }
  }
  adam_ = std::make_unique<AdamW>(segments_, g.shard, alloc);
  if (stage_ >= 3) shard_params_ = alloc.empty({g.shard}, DType::f32, Mem::params);
  if (stage_ >= 2) shard_grads_ = alloc.empty({g.shard}, DType::f32, Mem::grads);
  if (stage_ <= 2) bounce_ = alloc.empty({g.bounce()}, DType::f32, Mem::comm);
  max_unit_ = g.max_unit;
  const int last = layout.num_units() - 1;
  auto slot = [&](int64_t elems) {
    auto s = std::make_unique<Slot>();
    s->buf = alloc.empty({elems}, DType::f32, Mem::comm);
    return s;
  };
  if (stage_ >= 2) {  // slots 0 and 1: the edges; 2 and 3: blocks in turn
    for (int64_t elems : {g.s[0] * n_, g.s[size_t(last)] * n_, g.max_layer, g.max_layer}) {
      grad_slots_.push_back(slot(elems));
      grad_slots_.back()->result = alloc.empty({std::max<int64_t>(1, elems / n_)}, DType::f32, Mem::comm);
    }
  }
  if (stage_ >= 3)
    for (int64_t elems : {g.s[0] * n_, g.s[size_t(last)] * n_, g.max_layer, g.max_layer})
      param_slots_.push_back(slot(elems));
}

Zero::~Zero() {
  for (auto& s : grad_slots_) s->work.wait();
  for (auto& s : param_slots_) s->work.wait();
}

void Zero::wait(const Work& w) {
  const auto t0 = std::chrono::steady_clock::now();
  w.wait();
  wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double Zero::take_wait_ms() {
  double w = wait_ms_;
  wait_ms_ = 0;
  return w;
}

void Zero::shard_from(const float* full) {
  for (const auto& u : units_) {
    const int64_t a = std::min(u.len, r_ * u.s), b = std::min(u.len, (r_ + 1) * u.s);
    if (stage_ >= 3) {
      float* dst = shard_params_.f32() + u.shard_off;
      std::memset(dst, 0, size_t(u.s) * 4);
      std::memcpy(dst, full + u.lo + a, size_t(b - a) * 4);
    }
  }
  // Stages 1-2 update the full buffer in place: nothing to copy.
}

void Zero::gather_to(float* full) {
  for (const auto& u : units_) {
    if (stage_ <= 2) {
      std::memcpy(full + u.lo, model_.params() + u.lo, size_t(u.len) * 4);
      continue;
    }
    std::vector<float> tmp(size_t(u.s * n_));
    dp_.all_gather(Buf(shard_params_.f32() + u.shard_off, u.s), Buf(tmp.data(), u.s * n_)).wait();
    std::memcpy(full + u.lo, tmp.data(), size_t(u.len) * 4);
  }
}

// Unit u's slot among four: the edges have their own (the embeddings are used at both ends
// of a pass); blocks alternate between two, so one transfers while the next computes.
Zero::Slot& Zero::slot_of(std::vector<std::unique_ptr<Slot>>& slots, int u) const {
  const int last = int(units_.size()) - 1;
  if (u == 0) return *slots[0];
  if (u == last) return *slots[1];
  return *slots[size_t(2 + u % 2)];
}

void Zero::drain(Slot& slot) {
  if (!slot.pending) return;
  wait(slot.work);
  const Unit& u = units_[size_t(slot.unit)];
  cpu::add_inplace(shard_grads_.f32() + u.shard_off, slot.result.f32(), u.s);
  slot.pending = false;
}

float* Zero::grads(int u) {
  if (stage_ < 2) return model_.grads() + units_[size_t(u)].lo;
  Slot& s = slot_of(grad_slots_, u);
  if (!(s.in_use && s.unit == u)) {
    drain(s);
    std::memset(s.buf.f32(), 0, size_t(units_[size_t(u)].s * n_) * 4);  // padding stays zero
    s.unit = u;
    s.in_use = true;
  }
  return s.buf.f32();
}

void Zero::backward_done(int u) {
  if (stage_ >= 3) {
    Slot& p = slot_of(param_slots_, u);
    p.in_use = false;
  }
  if (stage_ < 2) return;
  Slot& s = slot_of(grad_slots_, u);
  if (!(s.in_use && s.unit == u)) return;  // no gradients were asked for
  const Unit& unit = units_[size_t(u)];
  s.work = dp_.reduce_scatter(Buf(s.buf.f32(), unit.s * n_), Buf(s.result.f32(), unit.s));
  s.pending = true;
  s.in_use = false;
}

void Zero::gather_into(Slot& slot, int u, Pass pass) {
  const Unit& unit = units_[size_t(u)];
  slot.unit = u;
  slot.pass = pass;
  slot.work = dp_.all_gather(Buf(shard_params_.f32() + unit.shard_off, unit.s), Buf(slot.buf.f32(), unit.s * n_));
}

const float* Zero::params(int u, Pass pass) {
  if (stage_ < 3) return model_.params() + units_[size_t(u)].lo;
  Slot& s = slot_of(param_slots_, u);
  if (!(s.unit == u && s.pass == pass)) {  // not prefetched: gather now
    LOOM_ASSERT(!s.in_use);
    wait(s.work);
    gather_into(s, u, pass);
  }
  wait(s.work);
  s.in_use = true;
  // Prefetch the block that comes next while this one computes.
  const int last = int(units_.size()) - 1;
  const int next = pass == Pass::forward ? u + 1 : u - 1;
  if (u != 0 && u != last && next >= 1 && next < last) {
    Slot& n = slot_of(param_slots_, next);
    if (!n.in_use && !(n.unit == next && n.pass == pass)) {
      wait(n.work);
      gather_into(n, next, pass);
    }
  }
  return s.buf.f32();
}

void Zero::forward_done(int u) {
  if (stage_ >= 3) slot_of(param_slots_, u).in_use = false;
}

double Zero::step(const AdamWHyper& h, int64_t step, double grad_clip) {
  float* grads = nullptr;
  if (stage_ == 1) {
    // Reduce-scatter each unit; this rank's reduced slice goes back into the full buffer,
    // where the segments read it.
    float* full = model_.grads();
    float* tmp = bounce_.f32();
    float* mine = tmp + max_unit_;
    for (const auto& u : units_) {
      std::memset(tmp, 0, size_t(u.s * n_) * 4);
      std::memcpy(tmp, full + u.lo, size_t(u.len) * 4);
      wait(dp_.reduce_scatter(Buf(tmp, u.s * n_), Buf(mine, u.s)));
      const int64_t a = std::min(u.len, r_ * u.s), b = std::min(u.len, (r_ + 1) * u.s);
      std::memcpy(full + u.lo + a, mine, size_t(b - a) * 4);
    }
    grads = full;
  } else {
    for (auto& s : grad_slots_) drain(*s);
    grads = shard_grads_.f32();
  }
  float ss = float(segments_sum_squares(segments_, grads));
  wait(dp_.all_reduce(Buf(&ss, 1)));
  if (tp_.size() > 1) wait(tp_.all_reduce(Buf(&ss, 1)));
  const double norm = std::sqrt(double(ss));
  const double coef = clip_coef(norm, grad_clip);
  if (coef < 1.0) segments_scale(segments_, grads, float(coef));
  adam_->update(stage_ >= 3 ? shard_params_.f32() : model_.params(), grads, h, step);
  if (stage_ <= 2) {  // all-gather the updated weights into the full buffer
    float* full = model_.params();
    float* tmp = bounce_.f32();
    for (const auto& u : units_) {
      const int64_t a = std::min(u.len, r_ * u.s), b = std::min(u.len, (r_ + 1) * u.s);
      std::memset(tmp + r_ * u.s, 0, size_t(u.s) * 4);
      std::memcpy(tmp + r_ * u.s, full + u.lo + a, size_t(b - a) * 4);
      wait(dp_.all_gather(Buf(tmp + r_ * u.s, u.s), Buf(tmp, u.s * n_)));
      std::memcpy(full + u.lo, tmp, size_t(u.len) * 4);
    }
  }
  if (stage_ >= 2) std::memset(shard_grads_.f32(), 0, shard_grads_.nbytes());
  for (auto& slot : param_slots_) {  // gathered weights are stale now
    wait(slot->work);
    slot->unit = -1;
  }
  return norm;
}

}  // namespace loom
