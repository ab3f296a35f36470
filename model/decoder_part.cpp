// A DecoderPart's construction (its layout, plan and buffers, allocated once), the accessors of a
// block's weights, gradients and activations, the split backward's stash, and the tp (and sp)
// conjugate pairs around the linears. Not here: what a block computes (decoder_part_block.cpp),
// the passes over the units (decoder_part_passes.cpp).
#include "model/decoder_part.h"

#include <algorithm>
#include <cmath>

#include "model/decoder_part_bufs.h"
#include "model/tensor_parallel.h"
#include "runtime/exact_digits.h"

namespace loom {

// Reads and writes the chunk's own flat buffers.
class DecoderPart::FlatAccess final : public UnitAccess {
 public:
  explicit FlatAccess(DecoderPart& c) : c_(c) {}
  Ptr params(int u, Pass) override { return c_.params() + c_.layout_.unit_lo(c_.layout_.local(u)); }
  float* grads(int u) override { return c_.grads() + c_.layout_.unit_lo(c_.layout_.local(u)); }

 private:
  DecoderPart& c_;
};

DecoderPart::DecoderPart(const ModelDims& dims, const PartSpec& spec, Backend& backend, ProcessGroup& tp, Trace& trace,
                         StepClock* clock, bool full_params, bool full_grads, ProcessGroup* ep, ProcessGroup* cp)
    : dims_(dims),
      be_(backend),
      tp_(tp),
      trace_(trace),
      clock_(clock),
      llama_(dims.arch == Arch::llama),
      B_(dims.B),
      T_(dims.T_local()),
      C_(dims.C),
      H_(dims.H / dims.tp),
      KV_(dims.KV / dims.tp),
      D_(dims.D),
      F_(dims.F / dims.tp),
      V_(int(dims.V_padded() / dims.tp)),
      L_(dims.L),
      policy_(dims.recompute),
      names_(head_names(dims)) {
  const int ep_size = ep ? ep->size() : 1;
  LOOM_CHECK(ep_size == dims.ep, "the ep group has {} ranks but parallel.ep = {}", ep_size, dims.ep);
  tp_size_ = tp_.size();
  tp_rank_ = tp_.rank();
  LOOM_CHECK(tp_size_ == dims.tp, "the tp group has {} ranks but parallel.tp = {}", tp_size_, dims.tp);
  v0_ = tp_rank_ * V_;
  valid_ = std::clamp(dims.vocab - v0_, 0, V_);
  sp_ = dims.sp && tp_size_ > 1;
  Ns_ = sp_ ? B_ * T_ / tp_size_ : B_ * T_;
  layout_ = model_layout(dims, tp_rank_, chunk_runs(spec), ep ? ep->rank() : 0);
  if (spec.pieces.back().unit_hi < 0 || spec.pieces.back().unit_hi == L_ + 2)
    lm_unit_ = layout_.unit_of(names_.lm_head);  // the tied copy sits in the head unit
  flat_ = std::make_unique<FlatAccess>(*this);
  Allocator& alloc = be_.alloc();
  const int64_t n = int64_t(layout_.reg.numel());
  if (full_params) params_ = alloc.empty({n}, be_.dtype(), Mem::params);
  if (full_grads) grads_ = alloc.empty({n}, DType::f32, Mem::grads);
  ChunkPlan plan = chunk_plan(dims, spec, be_.traits());
  for (size_t j = 0; j < spec.pieces.size(); ++j) {
    const ChunkPiece& cp = spec.pieces[j];
    const int hi = cp.unit_hi < 0 ? L_ + 2 : cp.unit_hi;
    LOOM_ASSERT(cp.unit_lo >= 0 && cp.unit_lo < hi && hi <= L_ + 2 && cp.slots >= 1);
    Piece pc{std::max(cp.unit_lo, 1) - 1,
             std::min(hi, L_ + 1) - 1,
             cp.unit_lo == 0,
             hi == L_ + 2,
             cp.slots,
             std::move(plan.pieces[j]),
             {}};
    for (int l = pc.b0, dense = 0; l < pc.b1; ++l) pc.kind_index.push_back(dims.moe_block(l) ? pc.moe++ : dense++);
    pc.routes.resize(size_t(pc.moe * pc.slots));
    for (auto& b : pc.plan.buffers)
      pc.acts.push_back(alloc.empty({b.numel * b.copies * pc.slots}, b.dtype, Mem::activations));
    pieces_.push_back(std::move(pc));
  }
  for (auto& b : plan.scratch) scratch_.push_back(alloc.empty({b.numel}, b.dtype, b.comm ? Mem::comm : Mem::workspace));
  set_piece(0);
  if (llama_) {
    std::vector<float> cs(size_t(dims.T) * D_ / 2), sn(cs.size());  // every global position
    cpu::rope_table(cs.data(), sn.data(), dims.T, D_, float(dims.rope_theta));
    rope_cos_ = alloc.empty({int64_t(cs.size())}, DType::f32, Mem::workspace);
    rope_sin_ = alloc.empty({int64_t(sn.size())}, DType::f32, Mem::workspace);
    be_.upload(Buf(rope_cos_), cs.data());
    be_.upload(Buf(rope_sin_), sn.data());
  }
  if (dims.cp > 1) {
    LOOM_CHECK(cp, "parallel.cp = {} but the chunk was given no cp group", dims.cp);
    cp_ = std::make_unique<ContextParallel>(dims, be_, *cp, trace_, clock_);
  }
  loss_sum_ = alloc.empty({kExactDigits}, DType::f64, Mem::workspace);
  be_.zero(Buf(loss_sum_));
  if (dims.moe_layers()) moe_ = std::make_unique<MoeLayer>(dims, be_, ep, cp_ ? cp : nullptr, tp_rank_, trace_, clock_);
}

DecoderPart::~DecoderPart() = default;

std::vector<std::pair<int, int>> chunk_runs(const PartSpec& spec) {
  std::vector<std::pair<int, int>> runs;
  for (const ChunkPiece& p : spec.pieces) runs.push_back({p.unit_lo, p.unit_hi});
  return runs;
}

ChunkPlan chunk_plan(const ModelDims& dims, const PartSpec& spec, const BackendTraits& traits) {
  ChunkPlan out;
  for (const ChunkPiece& p : spec.pieces)
    out.pieces.push_back(act_plan(dims, dims.B, dims.recompute, traits, p.unit_lo, p.unit_hi));
  out.scratch = out.pieces.front().scratch;
  for (const ActPlan& a : out.pieces)
    for (size_t k = 0; k < a.scratch.size(); ++k)
      out.scratch[k].numel = std::max(out.scratch[k].numel, a.scratch[k].numel);
  return out;
}

void DecoderPart::set_piece(int piece) {
  LOOM_ASSERT(piece >= 0 && piece < int(pieces_.size()));
  const Piece& p = pieces_[size_t(piece)];
  piece_ = piece;
  b0_ = p.b0, b1_ = p.b1, emb_here_ = p.emb, head_here_ = p.head;
}

Ptr DecoderPart::act(int buf, int copy) {
  const Piece& p = pieces_[size_t(piece_)];
  const ActBuffer& b = p.plan.buffers[size_t(buf)];
  return ptr_of(p.acts[size_t(buf)]) + (int64_t(slot_) * b.copies + (b.copies == 1 ? 0 : copy)) * b.numel;
}
float* DecoderPart::actf(int buf, int copy) {
  return act(buf, copy).as<float>();
}
Ptr DecoderPart::scr(int buf) {
  return ptr_of(scratch_[size_t(buf)]);
}
float* DecoderPart::scrf(int buf) {
  return scratch_[size_t(buf)].f32();
}
Buf DecoderPart::rows(Ptr p, int64_t n) const {
  return Buf(p.p, n, be_.dtype(), be_.device());
}

// Where each field of block l sits, relative to its unit's base (SIZE_MAX: absent).
template <class P>
void DecoderPart::layer_fields(P* out, P unit_base, int l) const {
  const auto& offs = layout_.layer_offsets[size_t(l)];
  const int64_t lo = layout_.unit_lo(layout_.local(l + 1));
  for (int f = 0; f < NUM_W; ++f)
    if (offs[size_t(f)] != SIZE_MAX) out[f] = unit_base + (int64_t(offs[size_t(f)]) - lo);
}

DecoderPart::LayerW DecoderPart::layer_w(Ptr unit_base, int l) const {
  LayerW w{};
  layer_fields(w.w, unit_base, l);
  return w;
}

DecoderPart::LayerW DecoderPart::layer_g(float* unit_base, int l) const {
  LayerW g{};
  layer_fields(g.g, unit_base, l);
  return g;
}

DecoderPart::LayerA DecoderPart::layer_a(int i) {
  // Dense MLP and MoE buffers are numbered among the blocks of their kind.
  const int l = b0_ + i, same = pieces_[size_t(piece_)].kind_index[size_t(i)];
  const bool moe = dims_.moe_block(l);
  return {act(LN1, i),
          act(QKV, i),
          act(ATTN_STATS, i),
          act(ATTY, i),
          act(RES2, i),
          act(LN2, i),
          moe ? Ptr() : act(FC, same),
          moe ? Ptr() : act(ACT, same),
          actf(LN1_MEAN, i),
          actf(LN1_RSTD, i),
          actf(LN2_MEAN, i),
          actf(LN2_RSTD, i),
          moe ? same : -1,
          l};
}

Ptr DecoderPart::at(Ptr unit_base, int unit, const char* name) const {
  if (!name) return Ptr();
  return unit_base + (int64_t(layout_.reg.at(name).offset) - layout_.unit_lo(layout_.local(unit)));
}
float* DecoderPart::at(float* unit_base, int unit, const char* name) const {
  if (!name) return nullptr;
  return unit_base + (int64_t(layout_.reg.at(name).offset) - layout_.unit_lo(layout_.local(unit)));
}

Ptr DecoderPart::input() {
  return act(RESIDUAL, 0);
}
Ptr DecoderPart::output() {
  return act(RESIDUAL, b1_ - b0_);
}
Ptr DecoderPart::grad_output() {
  return scr(D_RES);
}
Ptr DecoderPart::grad_input() {
  return scr(D_RES);
}

Ptr DecoderPart::stash_next(int64_t n) {
  const ActBuffer& b = pieces_[size_t(piece_)].plan.buffers[WGRAD_STASH];
  LOOM_ASSERT(stash_used_ + n <= b.numel);  // the plan holds a split backward's stash
  const Ptr p = act(WGRAD_STASH) + stash_used_;
  stash_used_ += n;
  return p;
}

Ptr DecoderPart::stash_keep(Ptr src, int64_t n) {
  const Ptr p = stash_next(n);
  be_.copy(rows(p, n), rows(src, n));
  return p;
}

void DecoderPart::zero_grad() {
  if (grads_.defined()) be_.zero(Buf(grads_));
}

void DecoderPart::row_parallel_exit(Ptr partial, Ptr out) {
  const Stream& s = be_.stream();
  if (sp_)
    tp_comm("scatter_to_sp",
            [&] { scatter_to_sp_forward(tp_, rows(partial, int64_t(B_) * T_ * C_), rows(out, int64_t(Ns_) * C_), s); });
  else if (tp_size_ > 1)
    tp_comm("reduce_from_tp", [&] { reduce_from_tp_forward(tp_, rows(out, int64_t(Ns_) * C_), s); });
}

Ptr DecoderPart::column_parallel_input(Ptr normed, Ptr full) {
  if (!sp_) return normed;  // copy_to_tp: identity forward
  tp_comm("gather_from_sp", [&] {
    gather_from_sp_forward(tp_, rows(normed, int64_t(Ns_) * C_), rows(full, int64_t(B_) * T_ * C_), be_.stream());
  });
  return full;
}

Ptr DecoderPart::column_parallel_grad(Ptr dfull) {
  if (sp_) {
    Ptr shard = scr(D_SHARD);
    tp_comm("gather_from_sp_backward", [&] {
      gather_from_sp_backward(tp_, rows(dfull, int64_t(B_) * T_ * C_), rows(shard, int64_t(Ns_) * C_), be_.stream());
    });
    return shard;
  }
  if (tp_size_ > 1)
    tp_comm("copy_to_tp_backward", [&] { copy_to_tp_backward(tp_, rows(dfull, int64_t(B_) * T_ * C_), be_.stream()); });
  return dfull;
}

Ptr DecoderPart::row_parallel_grad(Ptr drows, Ptr full) {
  if (!sp_) return drows;  // reduce_from_tp: identity backward
  tp_comm("scatter_to_sp_backward", [&] {
    scatter_to_sp_backward(tp_, rows(drows, int64_t(Ns_) * C_), rows(full, int64_t(B_) * T_ * C_), be_.stream());
  });
  return full;
}

void DecoderPart::sp_param_grads_reduce(float* scratch, std::initializer_list<float*> grads, int64_t each) {
  const int64_t n = int64_t(grads.size()) * each;
  const DeviceKind d = be_.device();
  tp_comm("sp_param_grads_all_reduce",
          [&] { tp_.all_reduce(Buf(scratch, n, DType::f32, d), ReduceOp::sum, be_.stream()).wait_on(be_.stream()); });
  int i = 0;
  for (float* g : grads) {
    if (g) be_.add(Buf(g, each, DType::f32, d), Buf(scratch + i * each, each, DType::f32, d));
    ++i;
  }
}

}  // namespace loom
