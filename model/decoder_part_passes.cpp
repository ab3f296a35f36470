// The passes over a part's units: forward from the embedding (or input()) through the blocks to
// the head's loss (or output()), and backward in reverse, with the recompute policy's refills and
// the split backward's two halves (the zb schedule). Not here: what one block computes
// (decoder_part_block.cpp), the buffers and the tp wiring (decoder_part.cpp).
#include "model/decoder_part.h"
#include "model/decoder_part_bufs.h"

namespace loom {

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
