#include "model/flops.h"

#include "runtime/error.h"

namespace loom {

// In doubles: exact below 2^53 parameters, and a shape whose count overflows int64 still gets
// a number to be refused with.
double param_count_f64(const ModelDims& dims) {
  const ModelDims& m = dims;
  const double C = m.C, F = m.F, V = m.vocab, D = double(m.C / m.H);
  const double qkv = (m.H + 2.0 * m.KV) * D;
  double per_layer, rest;
  if (m.arch == Arch::gpt2) {
    per_layer = 4 * C + C * qkv + qkv + C * C + C + C * F + F + F * C + C;
    rest = V * C + double(m.T) * C + 2 * C;
  } else {
    per_layer = 2 * C + C * qkv + C * C + 3 * C * F;
    rest = V * C + C;
  }
  if (!m.tied) rest += V * C;
  // MoE blocks: the router and every expert instead of the MLP.
  const double moe = dims.moe_layers(), E = m.moe.num_experts;
  return per_layer * m.L + moe * (E * C + (E - 1) * 3 * C * F) + rest;
}

int64_t param_count(const ModelDims& dims) {
  const double n = param_count_f64(dims);
  LOOM_CHECK(n < 0x1p62, "the model has {:.3g} parameters, more than loom counts; check the model.* keys", n);
  return int64_t(n);
}

int64_t active_param_count(const ModelDims& dims) {
  const ModelDims& m = dims;
  const int64_t C = m.C, F = m.F, E = m.moe.num_experts, k = m.moe.top_k;
  return param_count(dims) - dims.moe_layers() * (E - k) * 3 * C * F;  // a token meets top_k experts
}

FlopsPerToken flops_per_token(const ModelDims& dims, bool attention_probs) {
  const ModelDims& m = dims;
  const int64_t C = m.C, V = m.vocab, T = m.T, L = m.L;
  int64_t n = active_param_count(dims);
  if (m.arch == Arch::gpt2) n -= T * C;  // position table: a lookup
  if (!m.tied) n -= V * C;               // the input embedding is a lookup; lm_head is a matmul
  FlopsPerToken f;
  f.matmul_params = n;
  const double attn = 12.0 * L * C * T;  // forward 4 L C T, backward twice that
  f.model = 6.0 * double(n) + attn;
  f.hardware = f.model;
  // Full recompute reruns every block forward (not the lm_head) but its down projection: 2
  // FLOPs per block weight. The CPU's selective policy reruns attention's scores.
  // (A MoE block's recompute reruns its experts whole: their outputs are saved for backward.)
  const double down = double(L - dims.moe_layers()) * double(m.F) * double(C);
  if (dims.recompute == Recompute::full) f.hardware += 2.0 * (double(n - V * C) - down) + attn / 3.0;
  if (dims.recompute == Recompute::selective && attention_probs) f.hardware += attn / 3.0;
  return f;
}

BlockFlops block_flops(const ModelDims& dims, int layer) {
  const ModelDims& m = dims;
  const double C = m.C, T = m.T, D = m.D, H = m.H, KV = m.KV;
  const double F = m.F > 0 ? m.F : 4 * C;
  const bool moe = dims.moe_block(layer);
  BlockFlops b;
  b.attn_proj = 2 * C * (H + 2 * KV) * D + 2 * H * D * C;
  b.core = 4 * T * H * D;
  b.mlp = 2 * C * F * (m.arch == Arch::llama ? 3 : 2) * (moe ? m.moe.top_k : 1);
  b.router = moe ? 2 * C * m.moe.num_experts : 0;
  return b;
}

double head_flops(const ModelDims& dims) {
  return 2.0 * dims.C * double(dims.V_padded()) + 5.0 * double(dims.V_padded());
}

}  // namespace loom
