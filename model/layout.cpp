#include "model/layout.h"

#include <algorithm>
#include <cmath>

#include "kernels/moe_row.h"
#include "kernels/ops.h"

namespace loom {

int64_t norm_block(const ModelDims& dims) {
  const int C = dims.C;
  return 64 * std::min(16, C & -C);
}

BackendTraits backend_traits(DeviceKind device, DType dtype, const ModelDims& dims) {
  BackendTraits t;
  t.device = device;
  t.dtype = dtype;
  // Context parallel's attention keeps a log-sum-exp and recomputes P block by block.
  t.attention_probs = device == DeviceKind::cpu && dims.cp == 1;
  // cuBLASLt's GELU epilogue reads its aux matrix with a stride that must be a multiple of 8.
  t.fused_dgelu = device_is_cuda(device) && dims.arch == Arch::gpt2 && dims.gelu_epilogue == GeluEpilogue::fused &&
                  (dims.F / dims.tp) % 8 == 0;
  return t;
}

// Per rank, under tensor parallelism tp: heads, KV heads, MLP width and vocabulary are split
// tp ways; with sequence parallelism the norm and residual regions hold N/tp rows.
ActPlan act_plan(const ModelDims& dims, int B, Recompute policy, const BackendTraits& bt, int unit_lo, int unit_hi) {
  const int tp = dims.tp, ep = dims.ep;
  const bool sp = dims.sp;
  // T: the tokens of a sequence this rank holds (its share under context parallel).
  const int64_t T = dims.T_local(), C = dims.C, H = dims.H / tp, KV = dims.KV / tp;
  const int64_t D = C / dims.H, F = dims.F / tp, V = dims.V_padded() / tp, N = B * T;
  const int64_t Ns = sp ? N / tp : N;  // rows of the norm and residual regions on this rank
  const int L_all = dims.L;
  const int64_t cp = dims.cp, kvblock = N * 2 * KV * D;
  const bool ring = dims.cp_attention == CpAttentionKind::ring;
  if (unit_hi < 0) unit_hi = L_all + 2;
  // This chunk's blocks, and whether it ends with the head.
  const int L = std::max(0, std::min(unit_hi, L_all + 1) - std::max(unit_lo, 1));
  int nm = 0;  // of them, mixtures of experts (their own buffers; the dense MLP's are the others')
  for (int l = std::max(unit_lo, 1) - 1; l < std::max(unit_lo, 1) - 1 + L; ++l) nm += dims.moe_block(l) ? 1 : 0;
  const int nd = L - nm;
  const int64_t head = unit_hi == L_all + 2 ? 1 : 0;
  const bool llama = dims.arch == Arch::llama;
  const int64_t qkv = (H + 2 * KV) * D, fc = llama ? 2 * F : F;
  const DType x = bt.dtype, f32 = DType::f32;
  // Copies: every layer's own (L), or one shared buffer that backward refills (1).
  const int keep = policy == Recompute::full ? 1 : L;
  const int keep_sel = policy == Recompute::none ? L : 1;
  // The same for the dense MLPs (nd of them) and the MoE layers (nm).
  auto kept = [&](int n, bool selective_too) {
    return policy == Recompute::none || (policy == Recompute::selective && !selective_too) ? n : std::min(n, 1);
  };
  const int64_t E = dims.moe.num_experts, k = nm ? dims.moe.top_k : 0, Fe = dims.F;
  // Rows of the expert-sorted buffers: this rank's assignments (R), and what its experts
  // receive from the ep group (Rr; R without expert parallelism).
  const int64_t R = nm ? moe_rows(dims, N) : 0, Rr = nm ? moe_rows_received(dims, N) : 0;
  const int64_t Rx = std::max(R, Rr);
  // The attention's saved statistics: probabilities go with selective recompute, a
  // log-sum-exp stays with every policy but full.
  const int keep_stats = bt.attention_probs ? keep_sel : keep;
  // A split backward (zb, zbv, dualpipev) keeps each linear's and norm's output gradient from the
  // input-gradient pass B until the weight-gradient pass W; the inputs stay where they are
  // (selective recompute's activation output is recomputed in W, sequence parallel gathers
  // again in W).
  const bool split = dims.split_backward;
  const int64_t stash_block = N * C + N * fc + Ns * C + N * C + N * qkv + Ns * C;
  const int64_t stash = split ? L * stash_block + head * Ns * C + (unit_lo == 0 ? N * C : 0) : 0;
  ActPlan p;
  p.buffers = {
      // block inputs and the chunk's output: kept by every policy (the next norm adds the
      // branch still pending into them in place)
      {"residual", Ns * C, L + 1, x},
      {"ln1", Ns * C, keep, x},
      {"ln1_mean", llama ? 0 : Ns, keep, f32},
      {"ln1_rstd", Ns, keep, f32},
      {"qkv", N * qkv, keep, x},
      {"attn_stats", bt.attention_stats(B, T, H), keep_stats, bt.attention_stats_dtype()},
      {"atty", N * H * D, keep, x},
      {"res2", Ns * C, keep, x},
      {"ln2", Ns * C, keep, x},
      {"ln2_mean", llama ? 0 : Ns, keep, f32},
      {"ln2_rstd", Ns, keep, f32},
      {"fc", N * fc, kept(nd, false), x},
      {"act", N * F, kept(nd, true), x},  // activation function output: selective recomputes it
      {"lnf", head * Ns * C, 1, x},
      {"lnf_mean", llama ? 0 : head * Ns, 1, f32},
      {"lnf_rstd", head * Ns, 1, f32},
      {"lnf_full", sp ? head * N * C : 0, 1, x},  // the gathered final norm, which the lm_head reads twice
      {"logits", head * N * V, 1, x},
      {"losses", head * N, 1, f32},
      {"wgrad_stash", stash, 1, x},
      // MoE layers (model/decoder_part.h): the router's probabilities, choices and weights, where
      // each assignment went, and the expert-sorted rows through the experts.
      {"moe_probs", N * E, kept(nm, false), f32},
      {"moe_idx", N * k, kept(nm, false), DType::i32},
      {"moe_w", N * k, kept(nm, false), f32},
      {"moe_row_of", N * k, kept(nm, false), DType::i32},
      {"moe_token", R, kept(nm, false), DType::i32},
      // routed and kept per expert, and (ep, dropless) the rows each rank sends my experts
      {"moe_counts", 3 * E, kept(nm, false), DType::i32},
      {"moe_x", Rr * C, kept(nm, false), x},
      {"moe_fc", Rr * 2 * Fe, kept(nm, false), x},
      {"moe_act", Rr * Fe, kept(nm, true), x},
      {"moe_y", R * C, kept(nm, false), x},
      // expert parallel: where each received row goes, expert-major, and back
      {"moe_map_in", ep > 1 ? Rr : 0, kept(nm, false), DType::i32},
      {"moe_map_out", ep > 1 ? Rr : 0, kept(nm, false), DType::i32},
  };
  p.scratch = {
      {"d_residual", Ns * C, 1, x},
      {"d_norm", N * C, 1, x},
      {"d_atty", N * H * D, 1, x},
      {"d_qkv", N * qkv, 1, x},
      {"d_fc", N * fc, 1, x},
      {"d_act", bt.fused_dgelu ? 0 : N * F, 1, x},
      {"attn_scratch", bt.attention_probs || cp > 1 ? 0 : B * H * T, 1, f32},
      // Tensor-parallel communication buffers: gathered rows, reduced shards, the
      // sequence-parallel norm gradients and the vocab-parallel loss statistics.
      {"full_a", sp ? N * C : 0, 1, x, true},
      {"full_b", sp ? N * C : 0, 1, x, true},
      {"d_shard", sp ? Ns * C : 0, 1, x, true},
      {"d_normw", sp ? 4 * C : 0, 1, f32, true},
      {"ce_stats", tp > 1 ? head * 3 * N : 0, 1, f32, true},
      {"moe_logits", nm ? N * E : 0, 1, x},  // and their gradient
      {"moe_plan", nm ? moe_row::plan_scratch_ints(N * k, int(E)) : 0, 1, DType::i32},
      {"moe_drows", Rx * C, 1, x},
      {"moe_dfc", Rr * 2 * Fe, 1, x},
      {"moe_dact", Rr * Fe, 1, x},
      {"moe_dw", nm ? N * k : 0, 1, f32},
      {"moe_aux", nm ? 2 * E : 0, 1, f32},  // the aux gradient per expert, then the probabilities' sums
      {"moe_dx", nm ? N * C : 0, 1, x},
      {"moe_send", ep > 1 ? Rx * C : 0, 1, x, true},  // the all_to_all_v buffers
      {"moe_recv", ep > 1 ? Rx * C : 0, 1, x, true},
      // Context parallel (model/context_parallel.h): key/value blocks (the ring's
      // held and incoming ones, or all cp gathered and this rank's own), the running
      // output (backward: dq), max and sum (backward: delta), and the key/value
      // gradients (ring: one block's part and the two accumulators in flight; all-gather:
      // every block's, and this rank's reduced).
      {"cp_kv", cp > 1 ? (ring ? 2 : cp + 1) * kvblock : 0, 1, x, true},
      {"cp_acc", cp > 1 ? N * H * D : 0, 1, f32},
      {"cp_ml", cp > 1 ? 2 * B * H * T : 0, 1, f32},
      {"cp_dkv", cp > 1 ? (ring ? 3 : cp + 1) * kvblock : 0, 1, f32, true},
      // the CPU block kernels' scores: one (query run, key run) pair's P (and dS) at a time
      {"cp_scores",
       cp > 1 && bt.device == DeviceKind::cpu ? cpu::attention_block_scratch(B, int(T), int(T), int(H), int(KV)) : 0, 1,
       f32},
      // MoE under cp: a micro-batch's expert counts summed over the cp ranks (the
      // load-balancing loss is the whole sequence's)
      {"moe_cp_counts", nm && cp > 1 ? 2 * E : 0, 1, DType::i32, true}};
  return p;
}

int64_t moe_capacity(const ModelDims& dims, int64_t N) {
  const auto& m = dims.moe;
  if (m.capacity_factor <= 0) return N * m.top_k;  // dropless: one expert may take every assignment
  return int64_t(std::ceil(m.capacity_factor * double(N) * m.top_k / m.num_experts));
}

int64_t moe_slot(const ModelDims& dims, int64_t N) {
  return dims.moe.capacity_factor > 0 ? std::min(moe_capacity(dims, N), N) : 0;
}

int64_t moe_rows(const ModelDims& dims, int64_t N) {
  const auto& m = dims.moe;
  if (const int64_t slot = moe_slot(dims, N)) return m.num_experts * slot;
  return N * m.top_k;
}

int64_t moe_rows_received(const ModelDims& dims, int64_t N) {
  const auto& m = dims.moe;
  const int64_t ep = dims.ep, El = m.num_experts / ep;
  // Padded: a slot per expert from each ep rank, as many as sent. Dropless: from each ep rank
  // at most N tokens x min(top_k, El) of this rank's experts.
  if (const int64_t slot = moe_slot(dims, N)) return m.num_experts * slot;
  return ep * N * std::min<int64_t>(m.top_k, El);
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
  std::string out = fmt::format("{:<12} {:>8} {:>6} {:>12}\n", "activation", "copies", "dtype", "MiB");
  for (auto& b : buffers)
    if (b.numel)
      out +=
          fmt::format("{:<12} {:>8} {:>6} {:>12.2f}\n", b.name, b.copies, dtype_name(b.dtype), b.bytes() / 1048576.0);
  out += fmt::format("{:<12} {:>8} {:>6} {:>12.2f}\n", "(saved)", "", "", activation_bytes() / 1048576.0);
  int64_t comm = 0;
  for (auto& b : scratch) comm += b.comm ? b.bytes() : 0;
  out += fmt::format("{:<12} {:>8} {:>6} {:>12.2f}\n", "(backward)", "", "", (scratch_bytes() - comm) / 1048576.0);
  out += fmt::format("{:<12} {:>8} {:>6} {:>12.2f}", "(tp comm)", "", "", comm / 1048576.0);
  return out;
}

HeadNames head_names(const ModelDims& dims) {
  const bool tied = dims.tied;
  if (dims.arch == Arch::llama)
    return {"model.embed_tokens.weight", nullptr, "model.norm.weight", nullptr,
            tied ? "model.embed_tokens.weight" : "lm_head.weight"};
  return {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight", "transformer.ln_f.bias",
          tied ? "transformer.wte.weight" : "lm_head.weight"};
}

int ModelLayout::unit_of(const std::string& name) const {
  const int64_t off = int64_t(reg.at(name).offset);
  for (int u = 0; u < num_units(); ++u)
    if (off >= units[size_t(u)].first && off < units[size_t(u)].second) return unit_ids[size_t(u)];
  LOOM_ASSERT(false);
  return -1;
}

int ModelLayout::local(int unit) const {
  const auto it = std::lower_bound(unit_ids.begin(), unit_ids.end(), unit);
  LOOM_ASSERT(it != unit_ids.end() && *it == unit);
  return int(it - unit_ids.begin());
}

ModelLayout model_layout(const ModelDims& dims, int tp_rank, int unit_lo, int unit_hi) {
  return model_layout(dims, tp_rank, {{unit_lo, unit_hi}}, -1);
}

ModelLayout model_layout(const ModelDims& dims, int tp_rank, const std::vector<std::pair<int, int>>& runs,
                         int ep_rank) {
  using I = ParamSpec::Init;
  const bool llama = dims.arch == Arch::llama;
  const int L = dims.L, H = dims.H, KV = dims.KV, D = dims.D;
  const int tp = dims.tp;
  const int64_t C = dims.C, F = dims.F, V = dims.vocab, T = dims.T;
  const int64_t Vp = dims.V_padded();
  const float resid_std = 0.02f / std::sqrt(2.0f * L);  // GPT-2: scale residual projections
  // Experts: E in all, El on this rank from e0 (expert parallel: its share).
  const int E = dims.moe.num_experts, El = ep_rank < 0 ? E : E / dims.ep, e0 = std::max(ep_rank, 0) * El;
  ModelLayout m;
  auto& reg = m.reg;
  int unit = 0;  // the global unit being registered
  static const ParamSpec skipped{};
  // Tensor parallel: column-parallel weights split their output dim, row-parallel ones their
  // input dim, and the vocabulary splits the embedding rows (dim 0 of [V, C], padded to Vp).
  // GPT-2's fused q|k|v splits each of its three blocks. Everything else is replicated.
  const auto mine = [&] {
    for (auto [lo, hi] : runs)
      if (unit >= lo && unit < (hi < 0 ? L + 2 : hi)) return true;
    return false;
  };
  const bool holds_embedding = runs.front().first == 0;
  auto add = [&](const std::string& name, Shape shape, I init, int split_dim = -1, int parts = 1,
                 float std = 0.02f) -> const ParamSpec& {
    if (!mine()) return skipped;
    return reg.add(name, std::move(shape), init, std, split_dim, parts, tp, tp_rank);
  };
  auto add_vocab = [&](const std::string& name) {
    if (mine()) reg.add(name, {V, C}, I::normal, 0.02f, 0, 1, tp, tp_rank, Vp);
  };
  m.layer_offsets.assign(size_t(L), std::vector<size_t>(NUM_W, SIZE_MAX));
  auto at = [&](int l, WField f, const ParamSpec& s) {
    if (mine()) m.layer_offsets[size_t(l)][f] = s.offset;
  };
  auto unit_end = [&] {
    if (mine()) {
      int64_t lo = m.units.empty() ? 0 : m.units.back().second;
      m.units.push_back({lo, int64_t(reg.numel())});
      m.unit_ids.push_back(unit);
    }
    ++unit;
  };
  if (!llama) {  // Conv1D weights are [in, out]: column-parallel splits dim 1, row-parallel dim 0
    add_vocab("transformer.wte.weight");
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
    add_vocab("model.embed_tokens.weight");
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
      if (dims.moe_block(l)) {
        // Mixtral's sparse block; experts are whole on every tp rank (this rank's ep share).
        const std::string q = p + "block_sparse_moe.";
        at(l, MOE_GATE, add(q + "gate.weight", {E, C}, I::normal));
        for (int e = e0; e < e0 + El; ++e) {
          const std::string x = fmt::format("{}experts.{}.", q, e);
          const ParamSpec& w1 = add(x + "w1.weight", {F, C}, I::normal);
          if (e == e0) at(l, MOE_EXPERTS, w1);
          add(x + "w3.weight", {F, C}, I::normal);
          add(x + "w2.weight", {C, F}, I::normal, -1, 1, resid_std);
        }
        unit_end();
        continue;
      }
      at(l, FC_W, add(p + "mlp.gate_proj.weight", {F, C}, I::normal, 0));
      add(p + "mlp.up_proj.weight", {F, C}, I::normal, 0);
      at(l, DOWN_W, add(p + "mlp.down_proj.weight", {C, F}, I::normal, 1, 1, resid_std));
      unit_end();
    }
    add("model.norm.weight", {C}, I::ones);
  }
  if (!dims.tied) add_vocab("lm_head.weight");
  // A head chunk without the embedding (a pipeline's last stage) keeps its own copy of the
  // tied embedding, under the embedding's name.
  if (dims.tied && !holds_embedding) add_vocab(head_names(dims).wte);
  unit_end();
  return m;
}

}  // namespace loom
