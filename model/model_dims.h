// What the model computes with, read once from the config: the decoder's whole-model shapes,
// its norm, MLP and attention kinds, and the parallel degrees that change its ops (tp/sp, cp,
// ep). The model, its layout and its backends take this, never the whole Config: they cannot
// read data, optimizer, checkpoint or logging keys, and a test builds one in a line.
#pragma once
#include <cstdint>

#include "runtime/config.h"

namespace loom {

struct ModelDims {
  Arch arch = Arch::gpt2;
  int B = 1;          // sequences per micro-batch
  int T = 1;          // tokens per sequence (the whole sequence)
  int C = 1, H = 1;   // model width, attention heads
  int KV = 1, D = 1;  // key/value heads, head dim
  int F = 1, L = 1;   // MLP width (each expert's under MoE), blocks
  int vocab = 1;      // tokens in the vocabulary
  double norm_eps = 1e-5, rope_theta = 10000.0;
  bool tied = true;  // the lm_head is the token embedding
  MoeConfig moe;
  int tp = 1, cp = 1, ep = 1, dp = 1;
  bool sp = false;
  CpAttentionKind cp_attention = CpAttentionKind::ring;
  bool cp_overlap = true;
  bool doc_mask = false;  // attention and positions stay inside each document
  Recompute recompute = Recompute::none;
  GeluEpilogue gelu_epilogue = GeluEpilogue::fused;
  bool attention_ds = true;     // the CUDA backend may store the flash backward's dS (config.h)
  bool split_backward = false;  // a pipeline schedule splits backward into input and weight halves
  int accum = 1;                // micro-batches per rank and step

  bool llama() const { return arch == Arch::llama; }
  int T_local() const { return T / cp; }  // tokens of each sequence this rank holds
  // The vocabulary padded to 64 * tp rows.
  int64_t V_padded() const { return (int64_t(vocab) + 64 * tp - 1) / (64 * tp) * (64 * tp); }
  bool moe_block(int l) const { return moe.num_experts > 0 && (l + 1) % moe.every == 0; }
  int moe_layers() const { return moe.num_experts > 0 ? L / moe.every : 0; }
};

// The dims of a validated config.
inline ModelDims model_dims(const Config& cfg) {
  ModelDims d;
  d.arch = cfg.model.arch;
  d.B = cfg.train.micro_batch;
  d.T = cfg.model.seq_len;
  d.C = cfg.model.d_model;
  d.H = cfg.model.n_head;
  d.KV = cfg.kv_heads();
  d.D = cfg.head_dim();
  d.F = cfg.model.d_ff;
  d.L = cfg.model.n_layer;
  d.vocab = cfg.model.vocab_size;
  d.norm_eps = cfg.model.norm_eps;
  d.rope_theta = cfg.model.rope_theta;
  d.tied = cfg.model.tie_embeddings;
  d.moe = cfg.model.moe;
  d.tp = cfg.parallel.tp;
  d.cp = cfg.parallel.cp;
  d.ep = cfg.parallel.ep;
  d.dp = cfg.parallel.dp;
  d.sp = cfg.parallel.sp;
  d.cp_attention = cfg.parallel.cp_attention;
  d.cp_overlap = cfg.parallel.cp_overlap;
  d.doc_mask = cfg.data.doc_mask;
  d.recompute = cfg.train.recompute;
  d.gelu_epilogue = cfg.train.gelu_epilogue;
  d.attention_ds = cfg.train.attention_ds;
  d.split_backward = cfg.pp_split_backward();
  d.accum = cfg.accum_steps();
  return d;
}

}  // namespace loom
