// One block of the decoder, forward and backward: norm, qkv, RoPE, attention (whole-sequence or
// context parallel's), the output projection, norm, and the MLP (dense or the MoE layer's), with
// tp's conjugate pairs around each linear. Not here: the walk over the units, the head and the
// buffers (decoder_part_passes.cpp, decoder_part.cpp).
#include "model/decoder_part.h"
#include "model/decoder_part_bufs.h"

namespace loom {

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

}  // namespace loom
