#include "model/decoder_part.h"

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

template <class F>
void DecoderPart::tp_comm(const char* name, F&& f) {
  auto s = trace_.scope(name);
  StepClock::Scope c(clock_, Phase::comm);
  f();
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

void DecoderPart::block_forward(const LayerW& lw, const LayerA& a, Ptr in, Ptr pending, Ptr out, bool recomputing) {
  const int N = B_ * T_, qkv = (H_ + 2 * KV_) * D_;
  const Ptr* W = lw.w;
  const float eps = float(dims_.norm_eps);
  const WLayout lay = llama_ ? WLayout::out_in : WLayout::in_out;
  // A row-parallel bias is added once: by tp rank 0, before the partial sums are reduced.
  auto row_bias = [&](Ptr b) { return tp_rank_ == 0 ? b : Ptr(); };
  const Ptr partial = sp_ ? scr(FULL_B) : Ptr();  // [N, C] before scatter_to_sp
  const Ptr gathered = scr(FULL_A);
  {
    auto s = trace_.scope("norm1_forward");  // in += pending: the previous block's MLP branch
    be_.norm_forward(llama_, a.ln1, a.ln1_mean, a.ln1_rstd, in, pending, W[NORM1_W], W[NORM1_B], Ns_, C_, eps);
  }
  const Ptr in1 = column_parallel_input(a.ln1, gathered);
  {
    auto s = trace_.scope("qkv_forward");
    be_.linear_forward(a.qkv, in1, W[QKV_W], W[QKV_B], N, C_, qkv, lay);
  }
  if (llama_) {
    auto s = trace_.scope("rope_forward");
    be_.rope(false, a.qkv, rope_cos_.f32(), rope_sin_.f32(), B_, T_, H_, KV_, D_, pos_);
  }
  if (cp_) {
    // Under cp the inputs' positions are the documents' with data.doc_mask (RoPE and the mask
    // read them), else the sequence's (the block kernels have those from cp_positions).
    cp_->forward(a.atty, a.stats.as<float>(), a.qkv, dims_.doc_mask ? pos_ : nullptr, cp_buffers(), H_, KV_, D_);
  } else {
    auto s = trace_.scope("attention_forward");
    be_.attention_forward(a.atty, a.stats, a.qkv, attention_shape());
  }
  {
    auto s = trace_.scope("attn_proj_forward");
    be_.linear_forward(sp_ ? partial : a.res2, a.atty, W[PROJ_W], row_bias(W[PROJ_B]), N, H_ * D_, C_, lay);
  }
  row_parallel_exit(partial, a.res2);
  {
    auto s = trace_.scope("norm2_forward");  // res2 += in: the attention branch joins the stream
    be_.norm_forward(llama_, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, in, W[NORM2_W], W[NORM2_B], Ns_, C_, eps);
  }
  const Ptr in2 = column_parallel_input(a.ln2, gathered);
  if (a.moe >= 0) return moe_->forward(moe_block(lw, LayerW{}, a), in2, out, moe_training_, recomputing);
  {
    auto s = trace_.scope("fc_forward");
    be_.linear_forward(a.fc, in2, W[FC_W], W[FC_B], N, C_, llama_ ? 2 * F_ : F_, lay);
  }
  {
    auto s = trace_.scope("act_forward");
    be_.act_forward(llama_, a.act, a.fc, N, F_);
  }
  if (recomputing) return;
  {
    auto s = trace_.scope("down_forward");
    be_.linear_forward(sp_ ? partial : out, a.act, W[DOWN_W], row_bias(W[DOWN_B]), N, F_, C_, lay);
  }
  row_parallel_exit(partial, out);
}

CpBuffers DecoderPart::cp_buffers() {
  return {scr(CP_KV), scrf(CP_ACC), scrf(CP_ML), scrf(CP_DKV), scrf(CP_SCORES)};
}

MoeBlock DecoderPart::moe_block(const LayerW& lw, const LayerW& lg, const LayerA& a) {
  const int mi = a.moe;
  Piece& p = pieces_[size_t(piece_)];
  MoeBlock b;
  b.layer = a.layer;
  b.gate = lw.w[MOE_GATE], b.experts = lw.w[MOE_EXPERTS];
  b.g_gate = lg.g[MOE_GATE], b.g_experts = lg.g[MOE_EXPERTS];
  b.route = &p.routes[size_t(slot_ * p.moe + mi)];
  b.probs = actf(MOE_PROBS, mi), b.w = actf(MOE_W, mi);
  b.idx = act(MOE_IDX, mi).as<int32_t>(), b.row_of = act(MOE_ROW_OF, mi).as<int32_t>();
  b.token = act(MOE_TOKEN, mi).as<int32_t>(), b.counts = act(MOE_COUNTS, mi).as<int32_t>();
  b.x = act(MOE_X, mi), b.fc = act(MOE_FC, mi), b.act = act(MOE_ACT, mi), b.y = act(MOE_Y, mi);
  b.map_in = act(MOE_MAP_IN, mi).as<int32_t>(), b.map_out = act(MOE_MAP_OUT, mi).as<int32_t>();
  b.logits = scr(MOE_LOGITS), b.drows = scr(MOE_DROWS), b.dfc = scr(MOE_DFC), b.dact = scr(MOE_DACT);
  b.dx = scr(MOE_DX), b.send = scr(MOE_SEND), b.recv = scr(MOE_RECV);
  b.plan = scr(MOE_PLAN).as<int32_t>(), b.cp_counts = scr(MOE_CP_COUNTS).as<int32_t>();
  b.dw = scrf(MOE_DW), b.aux = scrf(MOE_AUX);
  return b;
}

void DecoderPart::block_backward(const LayerW& lw, const LayerW& lg, const LayerA& a, Ptr in, Ptr dres, bool keep) {
  const int N = B_ * T_, qkv = (H_ + 2 * KV_) * D_;
  const Ptr* W = lw.w;
  float* const* G = lg.g;
  const Ptr dln = scr(D_LN), datty = scr(D_ATTY), dqkv = scr(D_QKV), dfc = scr(D_FC), dact = scr(D_ACT);
  const Ptr full_a = scr(FULL_A), full_b = scr(FULL_B);
  // Sequence parallel: norm gains and biases see only this rank's rows; their gradients go to
  // a scratch that is reduced over tp once the block is done.
  float* normw = scrf(D_NORMW);
  // Under sp the norms' parameter gradients collect here, then one all-reduce sums them over
  // tp; RMSNorm has no bias, so its two gains sit back to back and half as much travels.
  const int64_t per_norm = llama_ ? 1 : 2;
  const bool sp_norms = sp_ && !keep;
  if (sp_norms) be_.zero(Buf(normw, 2 * per_norm * C_, DType::f32, be_.device()));
  float* g_n1w = sp_norms ? normw : G[NORM1_W];
  float* g_n1b = sp_norms && !llama_ ? normw + C_ : G[NORM1_B];
  float* g_n2w = sp_norms ? normw + per_norm * C_ : G[NORM2_W];
  float* g_n2b = sp_norms && !llama_ ? normw + 3 * C_ : G[NORM2_B];
  const WLayout lay = llama_ ? WLayout::out_in : WLayout::in_out;
  const int fc = llama_ ? 2 * F_ : F_;
  Ptr dout = row_parallel_grad(dres, full_a);
  Ptr dln2;
  if (a.moe >= 0) {
    // Every tp rank runs the whole MoE layer on every row: its input gradient is whole there,
    // nothing to reduce; sequence parallel keeps this rank's rows.
    LOOM_ASSERT(!keep);  // the config refuses zb with MoE
    moe_->backward(moe_block(lw, lg, a), column_parallel_input(a.ln2, full_b), dout, dln);
    dln2 = dln + (sp_ ? int64_t(tp_rank_) * Ns_ * C_ : 0);
  } else {
    {
      auto s = trace_.scope("down_act_backward");
      be_.down_act_backward(llama_, dfc, G[DOWN_W], G[DOWN_B], dout, a.act, a.fc, W[DOWN_W], dact, N, F_, C_, lay);
    }
    if (keep) stash_keep(dout, int64_t(N) * C_);
    {
      auto s = trace_.scope("fc_backward");
      // The weight gradient reads the normed input, gathered under sp; the input gradient does not.
      const Ptr in2 = keep ? Ptr() : column_parallel_input(a.ln2, full_b);
      be_.linear_backward(dln, G[FC_W], G[FC_B], dfc, in2, W[FC_W], N, C_, fc, lay);
    }
    if (keep) stash_keep(dfc, int64_t(N) * fc);
    dln2 = column_parallel_grad(dln);
  }
  {
    auto s = trace_.scope("norm2_backward");  // dres += : the residual adds its own path
    be_.norm_backward(llama_, dres, g_n2w, g_n2b, dln2, a.res2, W[NORM2_W], a.ln2_mean, a.ln2_rstd, Ns_, C_);
  }
  if (keep) stash_keep(dln2, int64_t(Ns_) * C_);
  dout = row_parallel_grad(dres, full_a);
  {
    auto s = trace_.scope("attn_proj_backward");
    be_.linear_backward(datty, G[PROJ_W], G[PROJ_B], dout, a.atty, W[PROJ_W], N, H_ * D_, C_, lay);
  }
  if (keep) stash_keep(dout, int64_t(N) * C_);
  if (cp_) {
    cp_->backward(dqkv, datty, a.atty, a.qkv, a.stats.as<float>(), dims_.doc_mask ? pos_ : nullptr, cp_buffers(), H_,
                  KV_, D_);
  } else {
    auto s = trace_.scope("attention_backward");
    be_.attention_backward(dqkv, datty, a.atty, a.qkv, a.stats, scrf(ATTN_SCRATCH), attention_shape());
  }
  if (llama_) {
    auto s = trace_.scope("rope_backward");
    be_.rope(true, dqkv, rope_cos_.f32(), rope_sin_.f32(), B_, T_, H_, KV_, D_, pos_);
  }
  {
    auto s = trace_.scope("qkv_backward");
    const Ptr in1 = keep ? Ptr() : column_parallel_input(a.ln1, full_b);
    be_.linear_backward(dln, G[QKV_W], G[QKV_B], dqkv, in1, W[QKV_W], N, C_, qkv, lay);
  }
  if (keep) stash_keep(dqkv, int64_t(N) * qkv);
  const Ptr dln1 = column_parallel_grad(dln);
  {
    auto s = trace_.scope("norm1_backward");
    be_.norm_backward(llama_, dres, g_n1w, g_n1b, dln1, in, W[NORM1_W], a.ln1_mean, a.ln1_rstd, Ns_, C_);
  }
  if (keep) stash_keep(dln1, int64_t(Ns_) * C_);
  if (sp_norms && llama_) sp_param_grads_reduce(normw, {G[NORM1_W], G[NORM2_W]}, C_);
  if (sp_norms && !llama_) sp_param_grads_reduce(normw, {G[NORM1_W], G[NORM1_B], G[NORM2_W], G[NORM2_B]}, C_);
}

void DecoderPart::block_weight_backward(const LayerW& lg, const LayerA& a, Ptr in) {
  const int N = B_ * T_, qkv = (H_ + 2 * KV_) * D_, fc = llama_ ? 2 * F_ : F_;
  float* const* G = lg.g;
  const Ptr full_b = scr(FULL_B);
  float* normw = scrf(D_NORMW);
  const int64_t per_norm = llama_ ? 1 : 2;
  if (sp_) be_.zero(Buf(normw, 2 * per_norm * C_, DType::f32, be_.device()));
  const WLayout lay = llama_ ? WLayout::out_in : WLayout::in_out;
  // In B's order: down, fc, norm2, proj, qkv, norm1.
  const Ptr d_down = stash_next(int64_t(N) * C_), d_fc = stash_next(int64_t(N) * fc);
  const Ptr d_n2 = stash_next(int64_t(Ns_) * C_), d_proj = stash_next(int64_t(N) * C_);
  const Ptr d_qkv = stash_next(int64_t(N) * qkv), d_n1 = stash_next(int64_t(Ns_) * C_);
  auto s = trace_.scope("weight_backward");
  // Selective recompute shares the activation output between blocks: recomputed here, the
  // same bits again.
  if (policy_ == Recompute::selective) be_.act_forward(llama_, a.act, a.fc, N, F_);
  be_.linear_backward(Ptr(), G[DOWN_W], G[DOWN_B], d_down, a.act, Ptr(), N, F_, C_, lay);
  be_.linear_backward(Ptr(), G[FC_W], G[FC_B], d_fc, column_parallel_input(a.ln2, full_b), Ptr(), N, C_, fc, lay);
  be_.norm_backward(llama_, Ptr(), sp_ ? normw + per_norm * C_ : G[NORM2_W],
                    sp_ && !llama_ ? normw + 3 * C_ : G[NORM2_B], d_n2, a.res2, Ptr(), a.ln2_mean, a.ln2_rstd, Ns_, C_);
  be_.linear_backward(Ptr(), G[PROJ_W], G[PROJ_B], d_proj, a.atty, Ptr(), N, H_ * D_, C_, lay);
  be_.linear_backward(Ptr(), G[QKV_W], G[QKV_B], d_qkv, column_parallel_input(a.ln1, full_b), Ptr(), N, C_, qkv, lay);
  be_.norm_backward(llama_, Ptr(), sp_ ? normw : G[NORM1_W], sp_ && !llama_ ? normw + C_ : G[NORM1_B], d_n1, in, Ptr(),
                    a.ln1_mean, a.ln1_rstd, Ns_, C_);
  if (sp_ && llama_) sp_param_grads_reduce(normw, {G[NORM1_W], G[NORM2_W]}, C_);
  if (sp_ && !llama_) sp_param_grads_reduce(normw, {G[NORM1_W], G[NORM1_B], G[NORM2_W], G[NORM2_B]}, C_);
}

void DecoderPart::embedding_forward(const Inputs& in, UnitAccess& acc) {
  // Vocab-parallel under tp: each rank fills the rows of its tokens, zeros elsewhere, and rank
  // 0 adds the positions; the sum over tp (reduce_from_tp or scatter_to_sp) is exact.
  const Ptr emb = acc.params(0, Pass::forward);
  const Ptr residual = act(RESIDUAL, 0);
  const Ptr full = sp_ ? scr(FULL_B) : residual;
  {
    auto s = trace_.scope("embedding_forward");
    be_.embedding_forward(full, in, at(emb, 0, names_.wte), v0_, V_, tp_rank_ == 0 ? at(emb, 0, names_.wpe) : Ptr(), B_,
                          T_, C_);
  }
  row_parallel_exit(full, residual);
  acc.forward_done(0);
}

void DecoderPart::head_forward(const Inputs& in, float dloss, Ptr pending, UnitAccess& acc) {
  const int N = B_ * T_, head = L_ + 1;
  const Ptr hw = acc.params(head, Pass::forward);
  const Ptr x = act(RESIDUAL, b1_ - b0_);
  {
    auto s = trace_.scope("normf_forward");  // x += pending: the last block's MLP branch
    be_.norm_forward(llama_, act(LNF), actf(LNF_MEAN), actf(LNF_RSTD), x, pending, at(hw, head, names_.norm_w),
                     at(hw, head, names_.norm_b), Ns_, C_, float(dims_.norm_eps));
  }
  const Ptr lnf = column_parallel_input(act(LNF), act(LNF_FULL));
  // The output projection is the tensor named lm_head, in whichever unit holds it (the
  // embedding's, when the embeddings are tied).
  const Ptr lm = lm_unit_ == head ? hw : acc.params(lm_unit_, Pass::forward);
  {
    auto s = trace_.scope("lm_head_forward");
    be_.linear_forward(act(LOGITS), lnf, at(lm, lm_unit_, names_.lm_head), Ptr(), N, C_, V_, WLayout::out_in);
  }
  if (lm_unit_ != head) acc.forward_done(lm_unit_);
  acc.forward_done(head);
  if (tp_size_ == 1) {
    auto s = trace_.scope("crossentropy_forward_backward");
    be_.crossentropy(act(LOGITS), actf(LOSSES), in, N, V_, valid_, dloss);
  } else {
    // Vocab-parallel cross-entropy: no rank ever holds logits for the whole vocabulary.
    auto s = trace_.scope("crossentropy_vocab_parallel");
    float* st = scrf(CE_STATS);
    float *rowmax = st, *sumexp = st + N, *target = st + 2 * N;
    const DeviceKind d = be_.device();
    const Stream& stream = be_.stream();
    be_.ce_stats(act(LOGITS), in, N, V_, valid_, v0_, rowmax, target);
    tp_comm("ce_all_reduce",
            [&] { tp_.all_reduce(Buf(rowmax, N, DType::f32, d), ReduceOp::max, stream).wait_on(stream); });
    be_.ce_sumexp(act(LOGITS), rowmax, N, V_, valid_, sumexp);
    tp_comm("ce_all_reduce", [&] {  // sumexp and target, adjacent
      tp_.all_reduce(Buf(sumexp, 2 * int64_t(N), DType::f32, d), ReduceOp::sum, stream).wait_on(stream);
    });
    be_.ce_finish(act(LOGITS), actf(LOSSES), in, N, V_, valid_, v0_, rowmax, sumexp, target, dloss);
  }
  be_.loss_accumulate(loss_sum_.data<double>(), actf(LOSSES), N);
}

void DecoderPart::forward(const Inputs& in, float dloss, UnitAccess& acc) {
  pos_ = in.pos;
  LOOM_CHECK(!cp_ || pos_, "context parallel: the inputs carry no positions (stage them with the cp positions)");
  moe_training_ = dloss != 0.0f;  // validation's forward counts no MoE statistics
  if (emb_here_) embedding_forward(in, acc);
  // Each block's MLP branch is `pending` until the next norm adds it into the stream.
  Ptr pending;
  for (int l = b0_; l < b1_; ++l) {
    const int i = l - b0_;
    const LayerA a = layer_a(i);
    block_forward(layer_w(acc.params(l + 1, Pass::forward), l), a, act(RESIDUAL, i), pending, act(RESIDUAL, i + 1),
                  false);
    acc.forward_done(l + 1);
    pending = a.res2;
  }
  if (head_here_) {
    head_forward(in, dloss, pending, acc);
  } else if (pending) {
    auto s = trace_.scope("residual_add");  // the output a next chunk starts from is the full sum
    be_.add_act(output(), pending, int64_t(Ns_) * C_);
  }
}

void DecoderPart::head_backward(UnitAccess& acc, Grads part) {
  const int N = B_ * T_, head = L_ + 1;
  const Ptr dres = scr(D_RES), dln = scr(D_LN);
  const bool input = part != Grads::weight, weight = part != Grads::input;
  const Ptr hw = input ? acc.params(head, Pass::backward) : Ptr();
  float* hg = weight ? acc.grads(head) : nullptr;
  // The embedding's unit (tied) finishes its backward with the embedding, not here.
  const Ptr lm_w = !input ? Ptr() : lm_unit_ == head ? hw : acc.params(lm_unit_, Pass::backward);
  float* const apart = weight && lm_unit_ != head ? acc.tied_head_grads() : nullptr;
  float* lm_g = !weight || apart ? nullptr : lm_unit_ == head ? hg : acc.grads(lm_unit_);
  const Ptr lnf = sp_ ? act(LNF_FULL) : act(LNF);
  {
    auto s = trace_.scope("lm_head_backward");  // the logits hold their gradient
    float* lm_wg = apart ? apart : weight ? at(lm_g, lm_unit_, names_.lm_head) : nullptr;
    be_.linear_backward(input ? dln : Ptr(), lm_wg, nullptr, act(LOGITS), lnf,
                        input ? at(lm_w, lm_unit_, names_.lm_head) : Ptr(), N, C_, V_, WLayout::out_in);
  }
  const Ptr dlnf = input ? column_parallel_grad(dln) : stash_next(int64_t(Ns_) * C_);
  if (part == Grads::input) stash_keep(dlnf, int64_t(Ns_) * C_);
  if (input) be_.zero(rows(dres, int64_t(Ns_) * C_));
  float* normw = scrf(D_NORMW);
  if (sp_ && weight) be_.zero(Buf(normw, (llama_ ? 1 : 2) * int64_t(C_), DType::f32, be_.device()));
  float* gw = !weight ? nullptr : sp_ ? normw : at(hg, head, names_.norm_w);
  float* gb = !weight ? nullptr : sp_ && !llama_ ? normw + C_ : at(hg, head, names_.norm_b);
  {
    auto s = trace_.scope("normf_backward");
    be_.norm_backward(llama_, input ? dres : Ptr(), gw, gb, dlnf, act(RESIDUAL, b1_ - b0_),
                      input ? at(hw, head, names_.norm_w) : Ptr(), actf(LNF_MEAN), actf(LNF_RSTD), Ns_, C_);
  }
  if (!weight) {
    if (lm_unit_ != head) acc.weights_done(lm_unit_);
    return acc.weights_done(head);
  }
  if (sp_ && llama_) sp_param_grads_reduce(normw, {at(hg, head, names_.norm_w)}, C_);
  if (sp_ && !llama_) sp_param_grads_reduce(normw, {at(hg, head, names_.norm_w), at(hg, head, names_.norm_b)}, C_);
  acc.backward_done(head);  // the final norm and an untied lm_head sit after every block
}

void DecoderPart::backward(const Inputs& in, UnitAccess& acc, Grads part) {
  pos_ = in.pos;
  LOOM_CHECK(!cp_ || pos_ || part == Grads::weight,
             "context parallel: the inputs carry no positions (stage them with the cp positions)");
  const int N = B_ * T_;
  const Ptr dres = scr(D_RES);
  stash_used_ = 0;
  if (head_here_) head_backward(acc, part);  // else grad_output() holds d(output)
  for (int l = b1_ - 1; l >= b0_; --l) {
    const int i = l - b0_;
    const LayerA a = layer_a(i);
    const Ptr x = act(RESIDUAL, i);
    if (part == Grads::weight) {
      block_weight_backward(layer_g(acc.grads(l + 1), l), a, x);
      acc.backward_done(l + 1);
      continue;
    }
    const LayerW w = layer_w(acc.params(l + 1, Pass::backward), l);
    // Recompute what the policy did not keep; the kernels are deterministic, so the
    // recomputed values are the same bits the forward produced.
    if (policy_ == Recompute::full) {
      auto s = trace_.scope("recompute_block");
      block_forward(w, a, x, Ptr(), Ptr(), true);  // x already holds the summed stream
    } else if (policy_ == Recompute::selective) {
      auto s = trace_.scope("recompute_selective");
      if (be_.traits().attention_probs) be_.attention_forward(a.atty, a.stats, a.qkv, attention_shape());
      // B does not read it (W recomputes it); a MoE block recomputes its experts' in MoeLayer::backward.
      if (part == Grads::all && a.moe < 0) be_.act_forward(llama_, a.act, a.fc, N, F_);
    }
    const bool keep = part == Grads::input;
    block_backward(w, keep ? LayerW{} : layer_g(acc.grads(l + 1), l), a, x, dres, keep);
    if (keep)
      acc.weights_done(l + 1);
    else
      acc.backward_done(l + 1);
  }
  if (!emb_here_) return;  // grad_input() holds d(input)
  Ptr demb;
  if (part == Grads::weight) {
    demb = stash_next(int64_t(N) * C_);
  } else {
    demb = row_parallel_grad(dres, scr(FULL_A));  // every row, for the lookup
    if (part == Grads::input) return void(stash_keep(demb, int64_t(N) * C_));
  }
  float* embg = acc.grads(0);
  {
    auto s = trace_.scope("embedding_backward");
    be_.embedding_backward(at(embg, 0, names_.wte), at(embg, 0, names_.wpe), demb, in, v0_, V_, B_, T_, C_);
  }
  acc.backward_done(0);
}

}  // namespace loom
