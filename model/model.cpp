#include "model/model.h"

#include <cmath>

#include "kernels/ops.h"

namespace loom {

using namespace cpu;

Recompute recompute_from(const std::string& s) {
  if (s == "selective") return Recompute::selective;
  if (s == "full") return Recompute::full;
  LOOM_CHECK(s == "none", "train.recompute = '{}' is not one of none|selective|full", s);
  return Recompute::none;
}

// Order of the stored buffers; LayerA and act_plan agree on it.
enum Buf { RESIDUAL, LN1, LN1_MEAN, LN1_RSTD, QKV, PROBS, ATTY, RES2, LN2, LN2_MEAN, LN2_RSTD, FC, ACT,
           LNF, LNF_MEAN, LNF_RSTD, LOGITS, LOSSES, NUM_BUF };
enum Scr { D_RES, D_LN, D_ATTY, D_QKV, D_FC, D_ACT, NUM_SCR };

ActPlan act_plan(const Config& cfg, int B, Recompute policy) {
  const int64_t T = cfg.model.seq_len, C = cfg.model.d_model, H = cfg.model.n_head, KV = cfg.kv_heads();
  const int64_t D = C / H, F = cfg.model.d_ff, V = cfg.model.vocab_size, N = B * T;
  const int L = cfg.model.n_layer;
  const bool llama = cfg.model.arch == "llama";
  const int64_t qkv = (H + 2 * KV) * D, fc = llama ? 2 * F : F;
  // Copies: every layer's own (L), or one shared buffer that backward refills (1).
  const int keep = policy == Recompute::full ? 1 : L;
  const int keep_sel = policy == Recompute::none ? L : 1;
  ActPlan p;
  p.buffers = {
      {"residual", N * C, L + 1},  // block inputs and the final output: kept by every policy
      {"ln1", N * C, keep},
      {"ln1_mean", llama ? 0 : N, keep},
      {"ln1_rstd", N, keep},
      {"qkv", N * qkv, keep},
      {"probs", B * H * T * T, keep_sel},  // attention core: selective recomputes it
      {"atty", N * C, keep},
      {"res2", N * C, keep},
      {"ln2", N * C, keep},
      {"ln2_mean", llama ? 0 : N, keep},
      {"ln2_rstd", N, keep},
      {"fc", N * fc, keep},
      {"act", N * F, keep_sel},  // activation function output: selective recomputes it
      {"lnf", N * C, 1},
      {"lnf_mean", llama ? 0 : N, 1},
      {"lnf_rstd", N, 1},
      {"logits", N * V, 1},
      {"losses", N, 1},
  };
  p.scratch = {{"d_residual", N * C, 1}, {"d_norm", N * C, 1}, {"d_atty", N * C, 1},
               {"d_qkv", N * qkv, 1},    {"d_fc", N * fc, 1},   {"d_act", N * F, 1}};
  return p;
}

int64_t ActPlan::activation_bytes() const {
  int64_t s = 0;
  for (auto& b : buffers) s += b.bytes();
  return s;
}
int64_t ActPlan::scratch_bytes() const {
  int64_t s = 0;
  for (auto& b : scratch) s += b.bytes();
  return s;
}
std::string ActPlan::table() const {
  std::string out = fmt::format("{:<12} {:>8} {:>12}\n", "activation", "copies", "MiB");
  for (auto& b : buffers)
    if (b.numel) out += fmt::format("{:<12} {:>8} {:>12.2f}\n", b.name, b.copies, b.bytes() / 1048576.0);
  out += fmt::format("{:<12} {:>8} {:>12.2f}\n", "(saved)", "", activation_bytes() / 1048576.0);
  out += fmt::format("{:<12} {:>8} {:>12.2f}", "(backward)", "", scratch_bytes() / 1048576.0);
  return out;
}

// Fields of one block. gpt2 uses all; llama has no biases and no norm biases.
enum WField { NORM1_W, NORM1_B, QKV_W, QKV_B, PROJ_W, PROJ_B, NORM2_W, NORM2_B, FC_W, FC_B, DOWN_W,
              DOWN_B, NUM_W };
struct Model::LayerW {
  float* f[NUM_W];
};
struct Model::LayerA {
  float* b[NUM_BUF];
};

ModelLayout model_layout(const Config& cfg) {
  using I = ParamSpec::Init;
  const bool llama = cfg.model.arch == "llama";
  const int L = cfg.model.n_layer, H = cfg.model.n_head, KV = cfg.kv_heads(), D = cfg.head_dim();
  const int64_t C = cfg.model.d_model, F = cfg.model.d_ff, V = cfg.model.vocab_size, T = cfg.model.seq_len;
  const float resid_std = 0.02f / std::sqrt(2.0f * L);  // GPT-2: scale residual projections
  ModelLayout m;
  auto& reg = m.reg;
  m.layer_offsets.assign(size_t(L), std::vector<size_t>(NUM_W, SIZE_MAX));
  auto at = [&](int l, WField f, const ParamSpec& s) { m.layer_offsets[size_t(l)][f] = s.offset; };
  auto unit_end = [&] {
    int64_t lo = m.units.empty() ? 0 : m.units.back().second;
    m.units.push_back({lo, int64_t(reg.numel())});
  };
  if (!llama) {
    reg.add("transformer.wte.weight", {V, C}, I::normal);
    reg.add("transformer.wpe.weight", {T, C}, I::normal, 0.01f);
    unit_end();
    for (int l = 0; l < L; ++l) {
      std::string p = fmt::format("transformer.h.{}.", l);
      at(l, NORM1_W, reg.add(p + "ln_1.weight", {C}, I::ones));
      at(l, NORM1_B, reg.add(p + "ln_1.bias", {C}, I::zeros));
      at(l, QKV_W, reg.add(p + "attn.c_attn.weight", {C, 3 * C}, I::normal));
      at(l, QKV_B, reg.add(p + "attn.c_attn.bias", {3 * C}, I::zeros));
      at(l, PROJ_W, reg.add(p + "attn.c_proj.weight", {C, C}, I::normal, resid_std));
      at(l, PROJ_B, reg.add(p + "attn.c_proj.bias", {C}, I::zeros));
      at(l, NORM2_W, reg.add(p + "ln_2.weight", {C}, I::ones));
      at(l, NORM2_B, reg.add(p + "ln_2.bias", {C}, I::zeros));
      at(l, FC_W, reg.add(p + "mlp.c_fc.weight", {C, F}, I::normal));
      at(l, FC_B, reg.add(p + "mlp.c_fc.bias", {F}, I::zeros));
      at(l, DOWN_W, reg.add(p + "mlp.c_proj.weight", {F, C}, I::normal, resid_std));
      at(l, DOWN_B, reg.add(p + "mlp.c_proj.bias", {C}, I::zeros));
      unit_end();
    }
    reg.add("transformer.ln_f.weight", {C}, I::ones);
    reg.add("transformer.ln_f.bias", {C}, I::zeros);
  } else {
    reg.add("model.embed_tokens.weight", {V, C}, I::normal);
    unit_end();
    for (int l = 0; l < L; ++l) {
      std::string p = fmt::format("model.layers.{}.", l);
      // q, k, v (and gate, up) are registered back to back so that each pair forms one
      // contiguous [out, in] matrix and one GEMM computes them together.
      at(l, NORM1_W, reg.add(p + "input_layernorm.weight", {C}, I::ones));
      at(l, QKV_W, reg.add(p + "self_attn.q_proj.weight", {int64_t(H) * D, C}, I::normal));
      reg.add(p + "self_attn.k_proj.weight", {int64_t(KV) * D, C}, I::normal);
      reg.add(p + "self_attn.v_proj.weight", {int64_t(KV) * D, C}, I::normal);
      at(l, PROJ_W, reg.add(p + "self_attn.o_proj.weight", {C, int64_t(H) * D}, I::normal, resid_std));
      at(l, NORM2_W, reg.add(p + "post_attention_layernorm.weight", {C}, I::ones));
      at(l, FC_W, reg.add(p + "mlp.gate_proj.weight", {F, C}, I::normal));
      reg.add(p + "mlp.up_proj.weight", {F, C}, I::normal);
      at(l, DOWN_W, reg.add(p + "mlp.down_proj.weight", {C, F}, I::normal, resid_std));
      unit_end();
    }
    reg.add("model.norm.weight", {C}, I::ones);
  }
  if (!cfg.model.tie_embeddings) reg.add("lm_head.weight", {V, C}, I::normal);
  unit_end();
  return m;
}

// Reads and writes the model's own flat buffers.
class Model::FlatAccess final : public UnitAccess {
 public:
  FlatAccess(Model& m) : m_(m) {}
  const float* params(int u, Pass) override { return m_.params() + m_.layout_.units[size_t(u)].first; }
  float* grads(int u) override { return m_.grads() + m_.layout_.units[size_t(u)].first; }

 private:
  Model& m_;
};

Model::Model(const Config& cfg, Allocator& alloc, int B, Trace* trace, bool full_params, bool full_grads)
    : cfg_(cfg),
      llama_(cfg.model.arch == "llama"),
      B_(B),
      T_(cfg.model.seq_len),
      C_(cfg.model.d_model),
      H_(cfg.model.n_head),
      KV_(cfg.kv_heads()),
      D_(cfg.head_dim()),
      F_(cfg.model.d_ff),
      V_(cfg.model.vocab_size),
      L_(cfg.model.n_layer),
      policy_(recompute_from(cfg.train.recompute)),
      trace_(trace ? trace : &null_trace_),
      layout_(model_layout(cfg)),
      flat_(std::make_unique<FlatAccess>(*this)) {
  const int64_t n = int64_t(layout_.reg.numel());
  if (full_params) params_ = alloc.empty({n}, DType::f32, Mem::params);
  if (full_grads) grads_ = alloc.empty({n}, DType::f32, Mem::grads);
  plan_ = act_plan(cfg, B, policy_);
  for (auto& b : plan_.buffers) acts_.push_back(alloc.empty({b.numel * b.copies}, DType::f32, Mem::activations));
  for (auto& b : plan_.scratch) scratch_.push_back(alloc.empty({b.numel}, DType::f32, Mem::workspace));
  if (llama_) {
    rope_cos_ = alloc.empty({int64_t(T_) * D_ / 2}, DType::f32, Mem::workspace);
    rope_sin_ = alloc.empty({int64_t(T_) * D_ / 2}, DType::f32, Mem::workspace);
    rope_table(rope_cos_.f32(), rope_sin_.f32(), T_, D_, float(cfg.model.rope_theta));
  }
}

Model::LayerW Model::layer_w(const float* unit_base, int l) const {
  LayerW w{};
  const auto& offs = layout_.layer_offsets[size_t(l)];
  const int64_t lo = layout_.units[size_t(l) + 1].first;
  for (int f = 0; f < NUM_W; ++f)
    w.f[f] = offs[size_t(f)] == SIZE_MAX ? nullptr : const_cast<float*>(unit_base) + (int64_t(offs[size_t(f)]) - lo);
  return w;
}

const float* Model::at(const float* unit_base, int unit, const char* name) const {
  if (!name) return nullptr;
  return unit_base + (int64_t(layout_.reg.at(name).offset) - layout_.units[size_t(unit)].first);
}

Model::LayerA Model::layer_a(int l) {
  LayerA a{};
  for (int i = 0; i < NUM_BUF; ++i) {
    auto& b = plan_.buffers[i];
    a.b[i] = acts_[i].f32() + (b.copies == 1 ? 0 : int64_t(l) * b.numel);
  }
  return a;
}

void Model::zero_grad() {
  if (grads()) std::memset(grads(), 0, num_params() * sizeof(float));
}

void Model::block_forward(const LayerW& w, const LayerA& a, const float* x, float* out) {
  const int N = B_ * T_, qkv = (H_ + 2 * KV_) * D_;
  auto* const* A = a.b;
  auto* const* W = w.f;
  const float eps = float(cfg_.model.norm_eps);
  const WLayout lay = llama_ ? WLayout::out_in : WLayout::in_out;
  { auto s = trace_->scope("norm1_forward");
    if (llama_) rmsnorm_forward(A[LN1], A[LN1_RSTD], x, W[NORM1_W], N, C_, eps);
    else layernorm_forward(A[LN1], A[LN1_MEAN], A[LN1_RSTD], x, W[NORM1_W], W[NORM1_B], N, C_, eps); }
  { auto s = trace_->scope("qkv_forward");
    matmul_forward(A[QKV], A[LN1], W[QKV_W], W[QKV_B], N, C_, qkv, lay); }
  if (llama_) {
    auto s = trace_->scope("rope_forward");
    rope_forward(A[QKV], rope_cos_.f32(), rope_sin_.f32(), B_, T_, H_, KV_, D_);
  }
  { auto s = trace_->scope("attention_forward");
    attention_forward(A[ATTY], A[PROBS], A[QKV], B_, T_, H_, KV_, D_); }
  { auto s = trace_->scope("attn_proj_forward");
    matmul_forward(A[RES2], A[ATTY], W[PROJ_W], W[PROJ_B], N, C_, C_, lay);
    add_inplace(A[RES2], x, int64_t(N) * C_); }
  { auto s = trace_->scope("norm2_forward");
    if (llama_) rmsnorm_forward(A[LN2], A[LN2_RSTD], A[RES2], W[NORM2_W], N, C_, eps);
    else layernorm_forward(A[LN2], A[LN2_MEAN], A[LN2_RSTD], A[RES2], W[NORM2_W], W[NORM2_B], N, C_, eps); }
  { auto s = trace_->scope("fc_forward");
    matmul_forward(A[FC], A[LN2], W[FC_W], W[FC_B], N, C_, llama_ ? 2 * F_ : F_, lay); }
  { auto s = trace_->scope("act_forward");
    if (llama_) swiglu_forward(A[ACT], A[FC], N, F_);
    else gelu_forward(A[ACT], A[FC], int64_t(N) * F_); }
  { auto s = trace_->scope("down_forward");
    matmul_forward(out, A[ACT], W[DOWN_W], W[DOWN_B], N, F_, C_, lay);
    add_inplace(out, A[RES2], int64_t(N) * C_); }
}

// dres holds d(out) on entry and d(x) on return.
void Model::block_backward(const LayerW& w, const LayerW& dw, const LayerA& a, const float* x, float* dres) {
  const int N = B_ * T_, qkv = (H_ + 2 * KV_) * D_;
  auto* const* A = a.b;
  auto* const* W = w.f;
  auto* const* G = dw.f;
  float* dln = scratch_[D_LN].f32();
  float* datty = scratch_[D_ATTY].f32();
  float* dqkv = scratch_[D_QKV].f32();
  float* dfc = scratch_[D_FC].f32();
  float* dact = scratch_[D_ACT].f32();
  const WLayout lay = llama_ ? WLayout::out_in : WLayout::in_out;
  { auto s = trace_->scope("down_backward");
    matmul_backward(dact, G[DOWN_W], G[DOWN_B], dres, A[ACT], W[DOWN_W], N, F_, C_, lay); }
  { auto s = trace_->scope("act_backward");
    if (llama_) swiglu_backward(dfc, A[FC], dact, N, F_);
    else gelu_backward(dfc, A[FC], dact, int64_t(N) * F_); }
  { auto s = trace_->scope("fc_backward");
    matmul_backward(dln, G[FC_W], G[FC_B], dfc, A[LN2], W[FC_W], N, C_, llama_ ? 2 * F_ : F_, lay); }
  { auto s = trace_->scope("norm2_backward");  // dres += : the residual adds its own path
    if (llama_) rmsnorm_backward(dres, G[NORM2_W], dln, A[RES2], W[NORM2_W], A[LN2_RSTD], N, C_);
    else layernorm_backward(dres, G[NORM2_W], G[NORM2_B], dln, A[RES2], W[NORM2_W], A[LN2_MEAN], A[LN2_RSTD], N, C_); }
  { auto s = trace_->scope("attn_proj_backward");
    matmul_backward(datty, G[PROJ_W], G[PROJ_B], dres, A[ATTY], W[PROJ_W], N, C_, C_, lay); }
  { auto s = trace_->scope("attention_backward");
    attention_backward(dqkv, datty, A[QKV], A[PROBS], B_, T_, H_, KV_, D_); }
  if (llama_) {
    auto s = trace_->scope("rope_backward");
    rope_backward(dqkv, rope_cos_.f32(), rope_sin_.f32(), B_, T_, H_, KV_, D_);
  }
  { auto s = trace_->scope("qkv_backward");
    matmul_backward(dln, G[QKV_W], G[QKV_B], dqkv, A[LN1], W[QKV_W], N, C_, qkv, lay); }
  { auto s = trace_->scope("norm1_backward");
    if (llama_) rmsnorm_backward(dres, G[NORM1_W], dln, x, W[NORM1_W], A[LN1_RSTD], N, C_);
    else layernorm_backward(dres, G[NORM1_W], G[NORM1_B], dln, x, W[NORM1_W], A[LN1_MEAN], A[LN1_RSTD], N, C_); }
}

namespace {
struct HeadNames {
  const char* wte;
  const char* wpe;
  const char* norm_w;
  const char* norm_b;
};
HeadNames head_names(bool llama) {
  if (llama) return {"model.embed_tokens.weight", nullptr, "model.norm.weight", nullptr};
  return {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight", "transformer.ln_f.bias"};
}
}  // namespace

double Model::forward(const int32_t* tokens, const int32_t* targets, float dloss, UnitAccess* access) {
  UnitAccess& acc = access ? *access : *flat_;
  const int N = B_ * T_, head = L_ + 1;
  const auto names = head_names(llama_);
  float* residual = acts_[RESIDUAL].f32();
  const float* emb = acc.params(0, Pass::forward);
  { auto s = trace_->scope("embedding_forward");
    embedding_forward(residual, tokens, at(emb, 0, names.wte), at(emb, 0, names.wpe), B_, T_, C_); }
  for (int l = 0; l < L_; ++l) {
    const float* w = acc.params(l + 1, Pass::forward);
    block_forward(layer_w(w, l), layer_a(l), residual + int64_t(l) * N * C_, residual + int64_t(l + 1) * N * C_);
    acc.forward_done(l + 1);
  }
  const float* hw = acc.params(head, Pass::forward);
  LayerA a = layer_a(0);
  const float* x = residual + int64_t(L_) * N * C_;
  { auto s = trace_->scope("normf_forward");
    if (llama_) rmsnorm_forward(a.b[LNF], a.b[LNF_RSTD], x, at(hw, head, names.norm_w), N, C_, float(cfg_.model.norm_eps));
    else layernorm_forward(a.b[LNF], a.b[LNF_MEAN], a.b[LNF_RSTD], x, at(hw, head, names.norm_w),
                           at(hw, head, names.norm_b), N, C_, float(cfg_.model.norm_eps)); }
  const float* lm = cfg_.model.tie_embeddings ? at(emb, 0, names.wte) : at(hw, head, "lm_head.weight");
  { auto s = trace_->scope("lm_head_forward");
    matmul_forward(a.b[LOGITS], a.b[LNF], lm, nullptr, N, C_, V_, WLayout::out_in); }
  acc.forward_done(head);
  acc.forward_done(0);
  { auto s = trace_->scope("crossentropy_forward_backward");
    crossentropy_forward_backward(a.b[LOGITS], a.b[LOSSES], targets, N, V_, dloss); }
  double sum = 0.0;
  for (int n = 0; n < N; ++n) sum += a.b[LOSSES][n];
  return sum;
}

void Model::backward(const int32_t* tokens, UnitAccess* access) {
  UnitAccess& acc = access ? *access : *flat_;
  const int N = B_ * T_, head = L_ + 1;
  const auto names = head_names(llama_);
  float* residual = acts_[RESIDUAL].f32();
  float* dres = scratch_[D_RES].f32();
  float* dln = scratch_[D_LN].f32();
  LayerA a = layer_a(0);
  const bool tied = cfg_.model.tie_embeddings;
  const float* hw = acc.params(head, Pass::backward);
  float* hg = acc.grads(head);
  const float* emb = tied ? acc.params(0, Pass::backward) : nullptr;
  float* embg = tied ? acc.grads(0) : nullptr;
  const float* lm_w = tied ? at(emb, 0, names.wte) : at(hw, head, "lm_head.weight");
  float* lm_g = const_cast<float*>(tied ? at(embg, 0, names.wte) : at(hg, head, "lm_head.weight"));
  auto g = [&](float* base, int unit, const char* name) { return const_cast<float*>(at(base, unit, name)); };
  { auto s = trace_->scope("lm_head_backward");
    matmul_backward(dln, lm_g, nullptr, a.b[LOGITS], a.b[LNF], lm_w, N, C_, V_, WLayout::out_in); }
  std::memset(dres, 0, sizeof(float) * size_t(N) * C_);
  { auto s = trace_->scope("normf_backward");
    const float* x = residual + int64_t(L_) * N * C_;
    if (llama_) rmsnorm_backward(dres, g(hg, head, names.norm_w), dln, x, at(hw, head, names.norm_w), a.b[LNF_RSTD], N, C_);
    else layernorm_backward(dres, g(hg, head, names.norm_w), g(hg, head, names.norm_b), dln, x,
                            at(hw, head, names.norm_w), a.b[LNF_MEAN], a.b[LNF_RSTD], N, C_); }
  acc.backward_done(head);  // the final norm and an untied lm_head sit after every block
  for (int l = L_ - 1; l >= 0; --l) {
    LayerA la = layer_a(l);
    LayerW w = layer_w(acc.params(l + 1, Pass::backward), l);
    const float* x = residual + int64_t(l) * N * C_;
    // Recompute what the policy did not keep; the kernels are deterministic, so the
    // recomputed values are the same bits the forward produced.
    if (policy_ == Recompute::full) {
      auto s = trace_->scope("recompute_block");
      block_forward(w, la, x, dln);  // dln is free here; the block output is already stored
    } else if (policy_ == Recompute::selective) {
      auto s = trace_->scope("recompute_selective");
      attention_forward(la.b[ATTY], la.b[PROBS], la.b[QKV], B_, T_, H_, KV_, D_);
      if (llama_) swiglu_forward(la.b[ACT], la.b[FC], N, F_);
      else gelu_forward(la.b[ACT], la.b[FC], int64_t(N) * F_);
    }
    block_backward(w, layer_w(acc.grads(l + 1), l), la, x, dres);
    acc.backward_done(l + 1);
  }
  if (!tied) embg = acc.grads(0);
  { auto s = trace_->scope("embedding_backward");
    embedding_backward(g(embg, 0, names.wte), g(embg, 0, names.wpe), dres, tokens, B_, T_, C_, V_); }
  acc.backward_done(0);
}

}  // namespace loom
