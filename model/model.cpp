#include "model/model.h"

#include <cmath>

#include "kernels/ops.h"
#include "parallel/tensor_parallel.h"

namespace loom {

using namespace cpu;

Recompute recompute_from(const std::string& s) {
  if (s == "selective") return Recompute::selective;
  if (s == "full") return Recompute::full;
  LOOM_CHECK(s == "none", "train.recompute = '{}' is not one of none|selective|full", s);
  return Recompute::none;
}

// Order of the stored buffers; LayerA and act_plan agree on it.
enum ActBuf {
  RESIDUAL,
  LN1,
  LN1_MEAN,
  LN1_RSTD,
  QKV,
  PROBS,
  ATTY,
  RES2,
  LN2,
  LN2_MEAN,
  LN2_RSTD,
  FC,
  ACT,
  LNF,
  LNF_MEAN,
  LNF_RSTD,
  LNF_FULL,
  LOGITS,
  LOSSES,
  NUM_BUF
};
enum Scr { D_RES, D_LN, D_ATTY, D_QKV, D_FC, D_ACT, FULL_A, FULL_B, D_SHARD, D_NORMW, CE_STATS, NUM_SCR };

// Per rank, under tensor parallelism tp: heads, KV heads, MLP width and vocabulary are split
// tp ways; with sequence parallelism the norm and residual regions hold N/tp rows.
ActPlan act_plan(const Config& cfg, int B, Recompute policy) {
  const int tp = cfg.parallel.tp;
  const bool sp = cfg.parallel.sp;
  const int64_t T = cfg.model.seq_len, C = cfg.model.d_model, H = cfg.model.n_head / tp, KV = cfg.kv_heads() / tp;
  const int64_t D = C / cfg.model.n_head, F = cfg.model.d_ff / tp, V = cfg.model.vocab_size / tp, N = B * T;
  const int64_t Ns = sp ? N / tp : N;  // rows of the norm and residual regions on this rank
  const int L = cfg.model.n_layer;
  const bool llama = cfg.model.arch == "llama";
  const int64_t qkv = (H + 2 * KV) * D, fc = llama ? 2 * F : F;
  // Copies: every layer's own (L), or one shared buffer that backward refills (1).
  const int keep = policy == Recompute::full ? 1 : L;
  const int keep_sel = policy == Recompute::none ? L : 1;
  ActPlan p;
  p.buffers = {
      {"residual", Ns * C, L + 1},  // block inputs and the final output: kept by every policy
      {"ln1", Ns * C, keep},
      {"ln1_mean", llama ? 0 : Ns, keep},
      {"ln1_rstd", Ns, keep},
      {"qkv", N * qkv, keep},
      {"probs", B * H * T * T, keep_sel},  // attention core: selective recomputes it
      {"atty", N * H * D, keep},
      {"res2", Ns * C, keep},
      {"ln2", Ns * C, keep},
      {"ln2_mean", llama ? 0 : Ns, keep},
      {"ln2_rstd", Ns, keep},
      {"fc", N * fc, keep},
      {"act", N * F, keep_sel},  // activation function output: selective recomputes it
      {"lnf", Ns * C, 1},
      {"lnf_mean", llama ? 0 : Ns, 1},
      {"lnf_rstd", Ns, 1},
      {"lnf_full", sp ? N * C : 0, 1},  // the gathered final norm, which the lm_head reads twice
      {"logits", N * V, 1},
      {"losses", N, 1},
  };
  p.scratch = {{"d_residual", Ns * C, 1},
               {"d_norm", N * C, 1},
               {"d_atty", N * H * D, 1},
               {"d_qkv", N * qkv, 1},
               {"d_fc", N * fc, 1},
               {"d_act", N * F, 1},
               // Tensor-parallel communication buffers: gathered rows, reduced shards, the
               // sequence-parallel norm gradients and the vocab-parallel loss statistics.
               {"full_a", sp ? N * C : 0, 1, true},
               {"full_b", sp ? N * C : 0, 1, true},
               {"d_shard", sp ? Ns * C : 0, 1, true},
               {"d_normw", sp ? 4 * C : 0, 1, true},
               {"ce_stats", tp > 1 ? 3 * N : 0, 1, true}};
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
  int64_t comm = 0;
  for (auto& b : scratch) comm += b.comm ? b.bytes() : 0;
  out += fmt::format("{:<12} {:>8} {:>12.2f}\n", "(backward)", "", (scratch_bytes() - comm) / 1048576.0);
  out += fmt::format("{:<12} {:>8} {:>12.2f}", "(tp comm)", "", comm / 1048576.0);
  return out;
}

// Fields of one block. gpt2 uses all; llama has no biases and no norm biases.
struct Model::LayerW {
  float* f[NUM_W];
};
struct Model::LayerA {
  float* b[NUM_BUF];
};

ModelLayout model_layout(const Config& cfg, int tp_rank) {
  using I = ParamSpec::Init;
  const bool llama = cfg.model.arch == "llama";
  const int L = cfg.model.n_layer, H = cfg.model.n_head, KV = cfg.kv_heads(), D = cfg.head_dim();
  const int tp = cfg.parallel.tp;
  const int64_t C = cfg.model.d_model, F = cfg.model.d_ff, V = cfg.model.vocab_size, T = cfg.model.seq_len;
  const float resid_std = 0.02f / std::sqrt(2.0f * L);  // GPT-2: scale residual projections
  ModelLayout m;
  auto& reg = m.reg;
  // Tensor parallel: column-parallel weights split their output dim, row-parallel ones their
  // input dim, and the vocabulary splits the embedding rows (dim 0 of [V, C]). GPT-2's fused
  // q|k|v splits each of its three blocks. Everything else is replicated.
  auto add = [&](const std::string& name, Shape shape, I init, int split_dim = -1, int parts = 1,
                 float std = 0.02f) -> const ParamSpec& {
    return reg.add(name, std::move(shape), init, std, split_dim, parts, tp, tp_rank);
  };
  m.layer_offsets.assign(size_t(L), std::vector<size_t>(NUM_W, SIZE_MAX));
  auto at = [&](int l, WField f, const ParamSpec& s) { m.layer_offsets[size_t(l)][f] = s.offset; };
  auto unit_end = [&] {
    int64_t lo = m.units.empty() ? 0 : m.units.back().second;
    m.units.push_back({lo, int64_t(reg.numel())});
  };
  if (!llama) {  // Conv1D weights are [in, out]: column-parallel splits dim 1, row-parallel dim 0
    add("transformer.wte.weight", {V, C}, I::normal, 0);
    add("transformer.wpe.weight", {T, C}, I::normal, -1, 1, 0.01f);
    unit_end();
    for (int l = 0; l < L; ++l) {
      std::string p = fmt::format("transformer.h.{}.", l);
      at(l, NORM1_W, add(p + "ln_1.weight", {C}, I::ones));
      at(l, NORM1_B, add(p + "ln_1.bias", {C}, I::zeros));
      at(l, QKV_W, add(p + "attn.c_attn.weight", {C, 3 * C}, I::normal, 1, 3));
      at(l, QKV_B, add(p + "attn.c_attn.bias", {3 * C}, I::zeros, 0, 3));
      at(l, PROJ_W, add(p + "attn.c_proj.weight", {C, C}, I::normal, 0, 1, resid_std));
      at(l, PROJ_B, add(p + "attn.c_proj.bias", {C}, I::zeros));
      at(l, NORM2_W, add(p + "ln_2.weight", {C}, I::ones));
      at(l, NORM2_B, add(p + "ln_2.bias", {C}, I::zeros));
      at(l, FC_W, add(p + "mlp.c_fc.weight", {C, F}, I::normal, 1));
      at(l, FC_B, add(p + "mlp.c_fc.bias", {F}, I::zeros, 0));
      at(l, DOWN_W, add(p + "mlp.c_proj.weight", {F, C}, I::normal, 0, 1, resid_std));
      at(l, DOWN_B, add(p + "mlp.c_proj.bias", {C}, I::zeros));
      unit_end();
    }
    add("transformer.ln_f.weight", {C}, I::ones);
    add("transformer.ln_f.bias", {C}, I::zeros);
  } else {  // nn.Linear weights are [out, in]: column-parallel splits dim 0, row-parallel dim 1
    add("model.embed_tokens.weight", {V, C}, I::normal, 0);
    unit_end();
    for (int l = 0; l < L; ++l) {
      std::string p = fmt::format("model.layers.{}.", l);
      // q, k, v (and gate, up) are registered back to back so that each pair forms one
      // contiguous [out, in] matrix and one GEMM computes them together, sharded or not.
      at(l, NORM1_W, add(p + "input_layernorm.weight", {C}, I::ones));
      at(l, QKV_W, add(p + "self_attn.q_proj.weight", {int64_t(H) * D, C}, I::normal, 0));
      add(p + "self_attn.k_proj.weight", {int64_t(KV) * D, C}, I::normal, 0);
      add(p + "self_attn.v_proj.weight", {int64_t(KV) * D, C}, I::normal, 0);
      at(l, PROJ_W, add(p + "self_attn.o_proj.weight", {C, int64_t(H) * D}, I::normal, 1, 1, resid_std));
      at(l, NORM2_W, add(p + "post_attention_layernorm.weight", {C}, I::ones));
      at(l, FC_W, add(p + "mlp.gate_proj.weight", {F, C}, I::normal, 0));
      add(p + "mlp.up_proj.weight", {F, C}, I::normal, 0);
      at(l, DOWN_W, add(p + "mlp.down_proj.weight", {C, F}, I::normal, 1, 1, resid_std));
      unit_end();
    }
    add("model.norm.weight", {C}, I::ones);
  }
  if (!cfg.model.tie_embeddings) add("lm_head.weight", {V, C}, I::normal, 0);
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

Model::Model(const Config& cfg, Allocator& alloc, int B, Trace* trace, bool full_params, bool full_grads,
             ProcessGroup* tp)
    : cfg_(cfg),
      llama_(cfg.model.arch == "llama"),
      B_(B),
      T_(cfg.model.seq_len),
      C_(cfg.model.d_model),
      H_(cfg.model.n_head / cfg.parallel.tp),
      KV_(cfg.kv_heads() / cfg.parallel.tp),
      D_(cfg.head_dim()),
      F_(cfg.model.d_ff / cfg.parallel.tp),
      V_(cfg.model.vocab_size / cfg.parallel.tp),
      L_(cfg.model.n_layer),
      tp_(tp),
      policy_(recompute_from(cfg.train.recompute)),
      trace_(trace ? trace : &null_trace_) {
  if (!tp_) {
    tp_local_ = local_group("tp", 0);
    tp_ = tp_local_.get();
  }
  tp_size_ = tp_->size();
  tp_rank_ = tp_->rank();
  LOOM_CHECK(tp_size_ == cfg.parallel.tp, "the tp group has {} ranks but parallel.tp = {}", tp_size_, cfg.parallel.tp);
  v0_ = tp_rank_ * V_;
  sp_ = cfg.parallel.sp && tp_size_ > 1;
  Ns_ = sp_ ? B_ * T_ / tp_size_ : B_ * T_;
  layout_ = model_layout(cfg, tp_rank_);
  flat_ = std::make_unique<FlatAccess>(*this);
  const int64_t n = int64_t(layout_.reg.numel());
  if (full_params) params_ = alloc.empty({n}, DType::f32, Mem::params);
  if (full_grads) grads_ = alloc.empty({n}, DType::f32, Mem::grads);
  plan_ = act_plan(cfg, B, policy_);
  for (auto& b : plan_.buffers) acts_.push_back(alloc.empty({b.numel * b.copies}, DType::f32, Mem::activations));
  for (auto& b : plan_.scratch)
    scratch_.push_back(alloc.empty({b.numel}, DType::f32, b.comm ? Mem::comm : Mem::workspace));
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
    auto& b = plan_.buffers[size_t(i)];
    a.b[i] = acts_[size_t(i)].f32() + (b.copies == 1 ? 0 : int64_t(l) * b.numel);
  }
  return a;
}

void Model::zero_grad() {
  if (grads()) std::memset(grads(), 0, num_params() * sizeof(float));
}

void Model::row_parallel_exit(float* partial, float* out, const float* residual) {
  const int64_t rows = int64_t(Ns_) * C_;
  if (sp_) {
    auto s = trace_->scope("scatter_to_sp");
    scatter_to_sp_forward(*tp_, partial, out, rows);
  } else if (tp_size_ > 1) {
    auto s = trace_->scope("reduce_from_tp");
    reduce_from_tp_forward(*tp_, out, rows);
  }
  add_inplace(out, residual, rows);
}

const float* Model::column_parallel_input(const float* normed, float* full) {
  if (!sp_) return normed;  // copy_to_tp: identity forward
  auto s = trace_->scope("gather_from_sp");
  gather_from_sp_forward(*tp_, normed, full, int64_t(Ns_) * C_);
  return full;
}

const float* Model::column_parallel_grad(float* dfull) {
  if (sp_) {
    auto s = trace_->scope("gather_from_sp_backward");
    float* shard = scratch_[D_SHARD].f32();
    gather_from_sp_backward(*tp_, dfull, shard, int64_t(Ns_) * C_);
    return shard;
  }
  if (tp_size_ > 1) {
    auto s = trace_->scope("copy_to_tp_backward");
    copy_to_tp_backward(*tp_, dfull, int64_t(B_) * T_ * C_);
  }
  return dfull;
}

const float* Model::row_parallel_grad(const float* drows, float* full) {
  if (!sp_) return drows;  // reduce_from_tp: identity backward
  auto s = trace_->scope("scatter_to_sp_backward");
  scatter_to_sp_backward(*tp_, drows, full, int64_t(Ns_) * C_);
  return full;
}

void Model::sp_param_grads_reduce(float* scratch, std::initializer_list<float*> grads, int64_t each) {
  const int64_t n = int64_t(grads.size()) * each;
  {
    auto s = trace_->scope("sp_param_grads_all_reduce");
    tp_->all_reduce(Buf(scratch, n)).wait();
  }
  int i = 0;
  for (float* g : grads) {
    if (g) add_inplace(g, scratch + i * each, each);
    ++i;
  }
}

void Model::block_forward(const LayerW& w, const LayerA& a, const float* x, float* out) {
  const int N = B_ * T_, qkv = (H_ + 2 * KV_) * D_;
  auto* const* A = a.b;
  auto* const* W = w.f;
  const float eps = float(cfg_.model.norm_eps);
  const WLayout lay = llama_ ? WLayout::out_in : WLayout::in_out;
  // A row-parallel bias is added once: by tp rank 0, before the partial sums are reduced.
  auto row_bias = [&](float* b) { return tp_rank_ == 0 ? b : nullptr; };
  float* partial = sp_ ? scratch_[FULL_B].f32() : nullptr;  // [N, C] before scatter_to_sp
  float* gathered = scratch_[FULL_A].f32();
  {
    auto s = trace_->scope("norm1_forward");
    if (llama_)
      rmsnorm_forward(A[LN1], A[LN1_RSTD], x, W[NORM1_W], Ns_, C_, eps);
    else
      layernorm_forward(A[LN1], A[LN1_MEAN], A[LN1_RSTD], x, W[NORM1_W], W[NORM1_B], Ns_, C_, eps);
  }
  const float* in1 = column_parallel_input(A[LN1], gathered);
  {
    auto s = trace_->scope("qkv_forward");
    matmul_forward(A[QKV], in1, W[QKV_W], W[QKV_B], N, C_, qkv, lay);
  }
  if (llama_) {
    auto s = trace_->scope("rope_forward");
    rope_forward(A[QKV], rope_cos_.f32(), rope_sin_.f32(), B_, T_, H_, KV_, D_);
  }
  {
    auto s = trace_->scope("attention_forward");
    attention_forward(A[ATTY], A[PROBS], A[QKV], B_, T_, H_, KV_, D_);
  }
  {
    auto s = trace_->scope("attn_proj_forward");
    matmul_forward(sp_ ? partial : A[RES2], A[ATTY], W[PROJ_W], row_bias(W[PROJ_B]), N, H_ * D_, C_, lay);
  }
  row_parallel_exit(partial, A[RES2], x);
  {
    auto s = trace_->scope("norm2_forward");
    if (llama_)
      rmsnorm_forward(A[LN2], A[LN2_RSTD], A[RES2], W[NORM2_W], Ns_, C_, eps);
    else
      layernorm_forward(A[LN2], A[LN2_MEAN], A[LN2_RSTD], A[RES2], W[NORM2_W], W[NORM2_B], Ns_, C_, eps);
  }
  const float* in2 = column_parallel_input(A[LN2], gathered);
  {
    auto s = trace_->scope("fc_forward");
    matmul_forward(A[FC], in2, W[FC_W], W[FC_B], N, C_, llama_ ? 2 * F_ : F_, lay);
  }
  {
    auto s = trace_->scope("act_forward");
    if (llama_)
      swiglu_forward(A[ACT], A[FC], N, F_);
    else
      gelu_forward(A[ACT], A[FC], int64_t(N) * F_);
  }
  {
    auto s = trace_->scope("down_forward");
    matmul_forward(sp_ ? partial : out, A[ACT], W[DOWN_W], row_bias(W[DOWN_B]), N, F_, C_, lay);
  }
  row_parallel_exit(partial, out, A[RES2]);
}

// dres holds d(out) on entry and d(x) on return (this rank's rows).
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
  float* full_a = scratch_[FULL_A].f32();
  float* full_b = scratch_[FULL_B].f32();
  // Sequence parallel: norm gains and biases see only this rank's rows; their gradients go to
  // a scratch that is reduced over tp once the block is done.
  float* normw = scratch_[D_NORMW].f32();
  if (sp_) std::memset(normw, 0, sizeof(float) * 4 * size_t(C_));
  float* g_n1w = sp_ ? normw : G[NORM1_W];
  float* g_n1b = sp_ ? normw + C_ : G[NORM1_B];
  float* g_n2w = sp_ ? normw + 2 * C_ : G[NORM2_W];
  float* g_n2b = sp_ ? normw + 3 * C_ : G[NORM2_B];
  const WLayout lay = llama_ ? WLayout::out_in : WLayout::in_out;
  const float* dout = row_parallel_grad(dres, full_a);
  {
    auto s = trace_->scope("down_backward");
    matmul_backward(dact, G[DOWN_W], G[DOWN_B], dout, A[ACT], W[DOWN_W], N, F_, C_, lay);
  }
  {
    auto s = trace_->scope("act_backward");
    if (llama_)
      swiglu_backward(dfc, A[FC], dact, N, F_);
    else
      gelu_backward(dfc, A[FC], dact, int64_t(N) * F_);
  }
  {
    auto s = trace_->scope("fc_backward");
    const float* in2 = column_parallel_input(A[LN2], full_b);  // sequence parallel keeps only rows
    matmul_backward(dln, G[FC_W], G[FC_B], dfc, in2, W[FC_W], N, C_, llama_ ? 2 * F_ : F_, lay);
  }
  const float* dln2 = column_parallel_grad(dln);
  {
    auto s = trace_->scope("norm2_backward");  // dres += : the residual adds its own path
    if (llama_)
      rmsnorm_backward(dres, g_n2w, dln2, A[RES2], W[NORM2_W], A[LN2_RSTD], Ns_, C_);
    else
      layernorm_backward(dres, g_n2w, g_n2b, dln2, A[RES2], W[NORM2_W], A[LN2_MEAN], A[LN2_RSTD], Ns_, C_);
  }
  dout = row_parallel_grad(dres, full_a);
  {
    auto s = trace_->scope("attn_proj_backward");
    matmul_backward(datty, G[PROJ_W], G[PROJ_B], dout, A[ATTY], W[PROJ_W], N, H_ * D_, C_, lay);
  }
  {
    auto s = trace_->scope("attention_backward");
    attention_backward(dqkv, datty, A[QKV], A[PROBS], B_, T_, H_, KV_, D_);
  }
  if (llama_) {
    auto s = trace_->scope("rope_backward");
    rope_backward(dqkv, rope_cos_.f32(), rope_sin_.f32(), B_, T_, H_, KV_, D_);
  }
  {
    auto s = trace_->scope("qkv_backward");
    const float* in1 = column_parallel_input(A[LN1], full_b);
    matmul_backward(dln, G[QKV_W], G[QKV_B], dqkv, in1, W[QKV_W], N, C_, qkv, lay);
  }
  const float* dln1 = column_parallel_grad(dln);
  {
    auto s = trace_->scope("norm1_backward");
    if (llama_)
      rmsnorm_backward(dres, g_n1w, dln1, x, W[NORM1_W], A[LN1_RSTD], Ns_, C_);
    else
      layernorm_backward(dres, g_n1w, g_n1b, dln1, x, W[NORM1_W], A[LN1_MEAN], A[LN1_RSTD], Ns_, C_);
  }
  if (sp_) sp_param_grads_reduce(normw, {G[NORM1_W], G[NORM1_B], G[NORM2_W], G[NORM2_B]}, C_);
}

HeadNames head_names(bool llama) {
  if (llama) return {"model.embed_tokens.weight", nullptr, "model.norm.weight", nullptr};
  return {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight", "transformer.ln_f.bias"};
}

double Model::forward(const int32_t* tokens, const int32_t* targets, float dloss, UnitAccess* access) {
  UnitAccess& acc = access ? *access : *flat_;
  const int N = B_ * T_, head = L_ + 1;
  const auto names = head_names(llama_);
  float* residual = acts_[RESIDUAL].f32();
  const float* emb = acc.params(0, Pass::forward);
  {
    // Vocab-parallel under tp: each rank fills the rows of its tokens, zeros elsewhere, and
    // rank 0 adds the positions; the sum over tp (reduce_from_tp or scatter_to_sp) is exact.
    float* full = sp_ ? scratch_[FULL_B].f32() : residual;
    {
      auto s = trace_->scope("embedding_forward");
      embedding_forward(full, tokens, at(emb, 0, names.wte), v0_, V_, tp_rank_ == 0 ? at(emb, 0, names.wpe) : nullptr,
                        B_, T_, C_);
    }
    if (sp_) {
      auto s = trace_->scope("scatter_to_sp");
      scatter_to_sp_forward(*tp_, full, residual, int64_t(Ns_) * C_);
    } else if (tp_size_ > 1) {
      auto s = trace_->scope("reduce_from_tp");
      reduce_from_tp_forward(*tp_, residual, int64_t(N) * C_);
    }
  }
  for (int l = 0; l < L_; ++l) {
    const float* w = acc.params(l + 1, Pass::forward);
    block_forward(layer_w(w, l), layer_a(l), residual + int64_t(l) * Ns_ * C_, residual + int64_t(l + 1) * Ns_ * C_);
    acc.forward_done(l + 1);
  }
  const float* hw = acc.params(head, Pass::forward);
  LayerA a = layer_a(0);
  const float* x = residual + int64_t(L_) * Ns_ * C_;
  {
    auto s = trace_->scope("normf_forward");
    if (llama_)
      rmsnorm_forward(a.b[LNF], a.b[LNF_RSTD], x, at(hw, head, names.norm_w), Ns_, C_, float(cfg_.model.norm_eps));
    else
      layernorm_forward(a.b[LNF], a.b[LNF_MEAN], a.b[LNF_RSTD], x, at(hw, head, names.norm_w),
                        at(hw, head, names.norm_b), Ns_, C_, float(cfg_.model.norm_eps));
  }
  const float* lnf = column_parallel_input(a.b[LNF], a.b[LNF_FULL]);
  const float* lm = cfg_.model.tie_embeddings ? at(emb, 0, names.wte) : at(hw, head, "lm_head.weight");
  {
    auto s = trace_->scope("lm_head_forward");
    matmul_forward(a.b[LOGITS], lnf, lm, nullptr, N, C_, V_, WLayout::out_in);
  }
  acc.forward_done(head);
  acc.forward_done(0);
  if (tp_size_ == 1) {
    auto s = trace_->scope("crossentropy_forward_backward");
    crossentropy_forward_backward(a.b[LOGITS], a.b[LOSSES], targets, N, V_, dloss);
  } else {
    // Vocab-parallel cross-entropy: no rank ever holds logits for the whole vocabulary.
    auto s = trace_->scope("crossentropy_vocab_parallel");
    float* st = scratch_[CE_STATS].f32();
    float *rowmax = st, *sumexp = st + N, *target = st + 2 * N;
    crossentropy_shard_stats(a.b[LOGITS], targets, N, V_, v0_, rowmax, target);
    tp_->all_reduce(Buf(rowmax, N), ReduceOp::max).wait();
    crossentropy_shard_sumexp(a.b[LOGITS], rowmax, N, V_, sumexp);
    tp_->all_reduce(Buf(sumexp, 2 * int64_t(N))).wait();  // sumexp and target, adjacent
    crossentropy_shard_finish(a.b[LOGITS], a.b[LOSSES], targets, N, V_, v0_, rowmax, sumexp, target, dloss);
  }
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
  const float* lnf = sp_ ? a.b[LNF_FULL] : a.b[LNF];
  {
    auto s = trace_->scope("lm_head_backward");
    matmul_backward(dln, lm_g, nullptr, a.b[LOGITS], lnf, lm_w, N, C_, V_, WLayout::out_in);
  }
  const float* dlnf = column_parallel_grad(dln);
  std::memset(dres, 0, sizeof(float) * size_t(Ns_) * C_);
  {
    float* normw = scratch_[D_NORMW].f32();
    if (sp_) std::memset(normw, 0, sizeof(float) * 2 * size_t(C_));
    float* gw = sp_ ? normw : g(hg, head, names.norm_w);
    float* gb = sp_ ? normw + C_ : g(hg, head, names.norm_b);
    {
      auto s = trace_->scope("normf_backward");
      const float* x = residual + int64_t(L_) * Ns_ * C_;
      if (llama_)
        rmsnorm_backward(dres, gw, dlnf, x, at(hw, head, names.norm_w), a.b[LNF_RSTD], Ns_, C_);
      else
        layernorm_backward(dres, gw, gb, dlnf, x, at(hw, head, names.norm_w), a.b[LNF_MEAN], a.b[LNF_RSTD], Ns_, C_);
    }
    if (sp_) sp_param_grads_reduce(normw, {g(hg, head, names.norm_w), g(hg, head, names.norm_b)}, C_);
  }
  acc.backward_done(head);  // the final norm and an untied lm_head sit after every block
  for (int l = L_ - 1; l >= 0; --l) {
    LayerA la = layer_a(l);
    LayerW w = layer_w(acc.params(l + 1, Pass::backward), l);
    const float* x = residual + int64_t(l) * Ns_ * C_;
    // Recompute what the policy did not keep; the kernels are deterministic, so the
    // recomputed values are the same bits the forward produced.
    if (policy_ == Recompute::full) {
      auto s = trace_->scope("recompute_block");
      block_forward(w, la, x, dln);  // dln is free here; the block output is already stored
    } else if (policy_ == Recompute::selective) {
      auto s = trace_->scope("recompute_selective");
      attention_forward(la.b[ATTY], la.b[PROBS], la.b[QKV], B_, T_, H_, KV_, D_);
      if (llama_)
        swiglu_forward(la.b[ACT], la.b[FC], N, F_);
      else
        gelu_forward(la.b[ACT], la.b[FC], int64_t(N) * F_);
    }
    block_backward(w, layer_w(acc.grads(l + 1), l), la, x, dres);
    acc.backward_done(l + 1);
  }
  if (!tied) embg = acc.grads(0);
  const float* demb = row_parallel_grad(dres, scratch_[FULL_A].f32());  // every row, for the lookup
  {
    auto s = trace_->scope("embedding_backward");
    embedding_backward(g(embg, 0, names.wte), v0_, V_, g(embg, 0, names.wpe), demb, tokens, B_, T_, C_);
  }
  acc.backward_done(0);
}

}  // namespace loom
