// What a rank's part of the decoder looks like before anything is allocated: its parameters
// (names, shapes, offsets, units) and its activation plan. The chunk allocates exactly this,
// and `loom plan memory` adds it up; neither needs a device.
//   model: gpt2 (LayerNorm, learned positions, GELU MLP, biases) or llama (RMSNorm, RoPE,
//   grouped-query attention, SwiGLU, no biases), pre-norm.
// The activation plan comes from (B, T, the model's dims, recompute policy, what the backend keeps): the
// policy changes which buffers are per layer and which are shared and recomputed, never the
// control flow of the layer loop.
#pragma once
#include <string>
#include <vector>

#include "model/model_dims.h"
#include "model/registry.h"
#include "runtime/allocator.h"

namespace loom {

// How a backend's ops shape the plan (docs/design.md, core abstractions: the decoder is one, its ops are the
// backend's). Pure data, the same for a device that is not there.
struct BackendTraits {
  DeviceKind device = DeviceKind::cpu;
  DType dtype = DType::f32;  // activations and weights
  // CPU attention keeps its probabilities [B,H,T,T] (compute dtype), which selective recompute
  // drops and recomputes; flash attention (CUDA) keeps the log-sum-exp [B,H,T] (fp32) only.
  bool attention_probs = true;
  // GELU's backward rides the down projection's input-gradient GEMM: no d_act buffer (gpt2).
  bool fused_dgelu = false;
  int64_t attention_stats(int64_t B, int64_t T, int64_t H) const { return attention_probs ? B * H * T * T : B * H * T; }
  DType attention_stats_dtype() const { return attention_probs ? dtype : DType::f32; }
};
// The traits of the backend that would run dims (device and dtype resolved).
BackendTraits backend_traits(DeviceKind device, DType dtype, const ModelDims& dims);

// One buffer of the plan: elements per copy, and how many copies (L when each layer keeps
// its own, 1 when layers share it and backward recomputes it).
struct ActBuffer {
  const char* name;
  int64_t numel;
  int copies;
  DType dtype;
  bool comm = false;  // a tensor-parallel communication buffer (Mem::comm in the ledger)
  int64_t bytes() const { return numel * copies * int64_t(dtype_size(dtype)); }
};
struct ActPlan {
  std::vector<ActBuffer> buffers;  // saved between forward and backward (Mem::activations)
  std::vector<ActBuffer> scratch;  // working space (Mem::workspace, or Mem::comm where marked)
  int64_t activation_bytes() const;
  int64_t scratch_bytes() const;
  std::string table() const;
};
// An expert's capacity for N tokens: ceil(capacity_factor * N * top_k / E) assignments (all N
// top_k of them when dropless), and the rows the expert-sorted buffers hold.
int64_t moe_capacity(const ModelDims& dims, int64_t N);
// With a capacity, each expert's rows sit in a slot of its own, min(capacity, N) rows (a token
// picks an expert once), padded with zero rows: every shape in the layer is fixed, so a GPU
// plans it without the host. Dropless (0): the experts' rows packed, their counts on the host.
int64_t moe_slot(const ModelDims& dims, int64_t N);
int64_t moe_rows(const ModelDims& dims, int64_t N);
int64_t moe_rows_received(const ModelDims& dims, int64_t N);  // by one rank's experts, from the ep group
// The gradient norm's block (elements): its squares are summed in blocks of this many elements
// from each unit's start (cut at tensor boundaries too), each block whole on one rank, and the
// blocks' sums exactly (runtime/exact_sum.h), so the norm is the same bits in every layout of
// the same tp. ZeRO's shards start at multiples of it. 64 times the largest power of two up to
// 16 that divides C: a tied embedding's rows (a multiple of 64 of them, C wide) then end on a
// block boundary, so a pipeline's first stage, which shards the embedding apart from the rest
// of its unit, cuts the same blocks as one rank.
int64_t norm_block(const ModelDims& dims);

// For the chunk of units [unit_lo, unit_hi) (-1: through the head).
ActPlan act_plan(const ModelDims& dims, int B, Recompute policy, const BackendTraits& traits = {}, int unit_lo = 0,
                 int unit_hi = -1);

// Fields of one block in ModelLayout::layer_offsets. gpt2 uses all; llama has no biases.
// A MoE block (llama) has no FC/DOWN: MOE_GATE is its router [E, C], MOE_EXPERTS the first of
// its (local) experts, each w1 [F, C], w3 [F, C] (one [2F, C] matrix), w2 [C, F] in turn.
enum WField {
  NORM1_W,
  NORM1_B,
  QKV_W,
  QKV_B,
  PROJ_W,
  PROJ_B,
  NORM2_W,
  NORM2_B,
  FC_W,
  FC_B,
  DOWN_W,
  DOWN_B,
  MOE_GATE,
  MOE_EXPERTS,
  NUM_W
};

// Names of the tensors outside the blocks (null where the architecture has none).
struct HeadNames {
  const char* wte;
  const char* wpe;
  const char* norm_w;
  const char* norm_b;
  const char* lm_head;  // the output projection: wte itself when the embeddings are tied
};
HeadNames head_names(const ModelDims& dims);

// A model's parameters (names, shapes, offsets) and its units: contiguous ranges of the
// registry that are gathered, reduced and sharded together. Unit 0 holds the embeddings,
// unit l+1 block l, unit L+1 the final norm and an untied lm_head. A layout may hold a run of
// units only (a pipeline stage's, one run or, interleaved, several): units[i] is global unit
// unit_ids[i], ascending, and the registry holds their tensors only, from offset 0. Built
// without allocating.
struct ModelLayout {
  ParamRegistry reg;
  std::vector<int> unit_ids;                       // the global unit of each local one
  std::vector<std::pair<int64_t, int64_t>> units;  // [lo, hi) in registry elements
  std::vector<std::vector<size_t>> layer_offsets;  // per global block, per weight field (SIZE_MAX: absent)
  int num_units() const { return int(units.size()); }
  int local(int unit) const;  // the local index of a global unit this layout holds
  // Local unit index i (0 .. num_units-1).
  int64_t unit_lo(int i) const { return units[size_t(i)].first; }
  int64_t unit_len(int i) const { return units[size_t(i)].second - units[size_t(i)].first; }
  // The global unit that holds a parameter.
  int unit_of(const std::string& name) const;
};
// This rank's view under tensor parallelism (dims.tp): local shapes, global names, the
// vocabulary padded to dims.V_padded() rows; units [unit_lo, unit_hi) (-1: through the head);
// every expert of the MoE blocks.
ModelLayout model_layout(const ModelDims& dims, int tp_rank = 0, int unit_lo = 0, int unit_hi = -1);
// Units from several runs [lo, hi) (hi -1: through the head), in model order; ep_rank: which
// num_experts / ep experts of each MoE block this rank holds (-1: all of them).
ModelLayout model_layout(const ModelDims& dims, int tp_rank, const std::vector<std::pair<int, int>>& runs,
                         int ep_rank = 0);

}  // namespace loom
