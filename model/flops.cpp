#include "model/flops.h"

#include "runtime/error.h"

namespace loom {

// In doubles: exact below 2^53 parameters, and a shape whose count overflows int64 still gets
// a number to be refused with.
double param_count_f64(const Config& cfg) {
  const auto& m = cfg.model;
  const double C = m.d_model, F = m.d_ff, V = m.vocab_size, D = double(m.d_model / m.n_head);
  const double qkv = (m.n_head + 2.0 * cfg.kv_heads()) * D;
  double per_layer, rest;
  if (m.arch == Arch::gpt2) {
    per_layer = 4 * C + C * qkv + qkv + C * C + C + C * F + F + F * C + C;
    rest = V * C + double(m.seq_len) * C + 2 * C;
  } else {
    per_layer = 2 * C + C * qkv + C * C + 3 * C * F;
    rest = V * C + C;
  }
  if (!m.tie_embeddings) rest += V * C;
  // MoE blocks: the router and every expert instead of the MLP.
  const double moe = cfg.moe_layers(), E = m.moe.num_experts;
  return per_layer * m.n_layer + moe * (E * C + (E - 1) * 3 * C * F) + rest;
}

int64_t param_count(const Config& cfg) {
  const double n = param_count_f64(cfg);
  LOOM_CHECK(n < 0x1p62, "the model has {:.3g} parameters, more than loom counts; check the model.* keys", n);
  return int64_t(n);
}

int64_t active_param_count(const Config& cfg) {
  const auto& m = cfg.model;
  const int64_t C = m.d_model, F = m.d_ff, E = m.moe.num_experts, k = m.moe.top_k;
  return param_count(cfg) - cfg.moe_layers() * (E - k) * 3 * C * F;  // a token meets top_k experts
}

FlopsPerToken flops_per_token(const Config& cfg, bool attention_probs) {
  const auto& m = cfg.model;
  const int64_t C = m.d_model, V = m.vocab_size, T = m.seq_len, L = m.n_layer;
  int64_t n = active_param_count(cfg);
  if (m.arch == Arch::gpt2) n -= T * C;  // position table: a lookup
  if (!m.tie_embeddings) n -= V * C;     // the input embedding is a lookup; lm_head is a matmul
  FlopsPerToken f;
  f.matmul_params = n;
  const double attn = 12.0 * L * C * T;  // forward 4 L C T, backward twice that
  f.model = 6.0 * double(n) + attn;
  f.hardware = f.model;
  // Full recompute reruns every block forward (not the lm_head) but its down projection: 2
  // FLOPs per block weight. The CPU's selective policy reruns attention's scores.
  // (A MoE block's recompute reruns its experts whole: their outputs are saved for backward.)
  const double down = double(L - cfg.moe_layers()) * double(m.d_ff) * double(C);
  if (cfg.train.recompute == Recompute::full) f.hardware += 2.0 * (double(n - V * C) - down) + attn / 3.0;
  if (cfg.train.recompute == Recompute::selective && attention_probs) f.hardware += attn / 3.0;
  return f;
}

BlockFlops block_flops(const Config& cfg, int layer) {
  const auto& m = cfg.model;
  const double C = m.d_model, T = m.seq_len, D = cfg.head_dim(), H = m.n_head, KV = cfg.kv_heads();
  const double F = m.d_ff > 0 ? m.d_ff : 4 * C;
  const bool moe = cfg.moe_block(layer);
  BlockFlops b;
  b.attn_proj = 2 * C * (H + 2 * KV) * D + 2 * H * D * C;
  b.core = 4 * T * H * D;
  b.mlp = 2 * C * F * (m.arch == Arch::llama ? 3 : 2) * (moe ? m.moe.top_k : 1);
  b.router = moe ? 2 * C * m.moe.num_experts : 0;
  return b;
}

double head_flops(const Config& cfg) {
  return 2.0 * cfg.model.d_model * double(cfg.vocab_padded()) + 5.0 * double(cfg.vocab_padded());
}

}  // namespace loom
