// The decoder: gpt2 (LayerNorm, learned positions, GELU MLP, biases) and llama (RMSNorm,
// RoPE, grouped-query attention, SwiGLU, no biases), pre-norm, with explicit forward and
// backward per block. Activations are planned once from (B, T, config, recompute policy) and
// allocated up front; the policy changes which buffers are per layer and which are shared
// and recomputed, never the control flow of the layer loop.
// Not here: distribution (parallel/), the optimizer (optim/), data (runtime/data).
#pragma once
#include <memory>

#include "model/registry.h"
#include "runtime/allocator.h"
#include "runtime/comm/process_group.h"
#include "runtime/config.h"
#include "runtime/trace.h"

namespace loom {

enum class Recompute { none, selective, full };
Recompute recompute_from(const std::string& s);

// One buffer of the plan: elements per copy, and how many copies (L when each layer keeps
// its own, 1 when layers share it and backward recomputes it).
struct ActBuffer {
  const char* name;
  int64_t numel;
  int copies;
  bool comm = false;  // a tensor-parallel communication buffer (Mem::comm in the ledger)
  int64_t bytes() const { return numel * copies * 4; }
};
struct ActPlan {
  std::vector<ActBuffer> buffers;  // saved between forward and backward (Mem::activations)
  std::vector<ActBuffer> scratch;  // working space (Mem::workspace, or Mem::comm where marked)
  int64_t activation_bytes() const;
  int64_t scratch_bytes() const;
  std::string table() const;
};
ActPlan act_plan(const Config& cfg, int B, Recompute policy);

// Fields of one block in ModelLayout::layer_offsets. gpt2 uses all; llama has no biases.
enum WField { NORM1_W, NORM1_B, QKV_W, QKV_B, PROJ_W, PROJ_B, NORM2_W, NORM2_B, FC_W, FC_B, DOWN_W, DOWN_B, NUM_W };

// Names of the tensors outside the blocks (null where the architecture has none).
struct HeadNames {
  const char* wte;
  const char* wpe;
  const char* norm_w;
  const char* norm_b;
};
HeadNames head_names(bool llama);

// A model's parameters (names, shapes, offsets) and its units: contiguous ranges of the
// registry that are gathered, reduced and sharded together. Unit 0 holds the embeddings,
// unit l+1 block l, unit L+1 the final norm and an untied lm_head. Built without allocating.
struct ModelLayout {
  ParamRegistry reg;
  std::vector<std::pair<int64_t, int64_t>> units;  // [lo, hi) in registry elements
  std::vector<std::vector<size_t>> layer_offsets;  // per block, per weight field
  int num_units() const { return int(units.size()); }
  int64_t unit_len(int u) const { return units[size_t(u)].second - units[size_t(u)].first; }
};
// This rank's view under tensor parallelism (cfg.parallel.tp): local shapes, global names.
ModelLayout model_layout(const Config& cfg, int tp_rank = 0);

enum class Pass { forward, backward };

// How forward and backward reach each unit's weights and where its gradients go. The model
// calls it at fixed points; plain training reads the flat buffers, data parallelism starts
// reductions from backward_done, ZeRO-3 gathers weights in params() and frees them after.
// Pointers address the unit's first element and stay valid until the matching *_done call.
class UnitAccess {
 public:
  virtual ~UnitAccess() = default;
  virtual const float* params(int unit, Pass pass) = 0;
  virtual float* grads(int unit) = 0;  // accumulate (+=) here
  virtual void forward_done(int unit) { (void)unit; }
  virtual void backward_done(int unit) { (void)unit; }  // this micro-batch's grads are final
};

class Model {
 public:
  // full_params / full_grads: whether this rank holds the whole flat buffers (ZeRO-3 and -2
  // do not; they bring their own UnitAccess).
  // tp: the tensor-parallel group (null: one rank); its size must equal cfg.parallel.tp.
  Model(const Config& cfg, Allocator& alloc, int B, Trace* trace = nullptr, bool full_params = true,
        bool full_grads = true, ProcessGroup* tp = nullptr);

  const ParamRegistry& registry() const { return layout_.reg; }
  const ModelLayout& layout() const { return layout_; }
  float* params() { return params_.storage ? params_.f32() : nullptr; }
  float* grads() { return grads_.storage ? grads_.f32() : nullptr; }
  size_t num_params() const { return layout_.reg.numel(); }
  const ActPlan& plan() const { return plan_; }
  void init_weights(uint64_t seed) { registry_init(layout_.reg, params(), seed); }
  void zero_grad();

  // tokens, targets: [B, T]. Returns the sum of per-token losses. With dloss != 0 the
  // logits are turned into their gradient (scaled by dloss) for backward().
  double forward(const int32_t* tokens, const int32_t* targets, float dloss, UnitAccess* access = nullptr);
  // Accumulates (+=) this micro-batch's gradients. Units finish in reverse order: the head,
  // blocks L-1 .. 0, then the embeddings.
  void backward(const int32_t* tokens, UnitAccess* access = nullptr);

 private:
  struct LayerW;  // pointers of one block's parameters (or gradients)
  struct LayerA;  // pointers of one block's activations
  class FlatAccess;
  LayerW layer_w(const float* unit_base, int l) const;
  LayerA layer_a(int l);
  const float* at(const float* unit_base, int unit, const char* name) const;
  void block_forward(const LayerW& w, const LayerA& a, const float* x, float* out);
  // Row-parallel linear output [N, C] -> this rank's rows, summed over tp (reduce_from_tp or
  // scatter_to_sp); then out += residual.
  void row_parallel_exit(float* partial, float* out, const float* residual);
  // A normed input [Ns, C] -> what a column-parallel linear reads, [N, C] (gather_from_sp).
  const float* column_parallel_input(const float* normed, float* full);
  // A column-parallel input gradient [N, C] -> this rank's rows, summed over tp.
  const float* column_parallel_grad(float* dfull);
  // The gradient of a row-parallel output, this rank's rows -> [N, C].
  const float* row_parallel_grad(const float* drows, float* full);
  // Sequence-parallel norm gradients are partial sums: reduce them over tp into `grads`.
  void sp_param_grads_reduce(float* scratch, std::initializer_list<float*> grads, int64_t each);
  void block_backward(const LayerW& w, const LayerW& dw, const LayerA& a, const float* x, float* dres);

  Config cfg_;
  bool llama_;
  int B_, T_, C_, H_, KV_, D_, F_, V_, L_;  // H_, KV_, F_, V_: this rank's share under tp
  ProcessGroup* tp_;
  std::unique_ptr<ProcessGroup> tp_local_;
  int tp_size_, tp_rank_, v0_;  // v0_: the first vocabulary id this rank holds
  bool sp_;
  int Ns_;  // rows of the norm and residual regions on this rank (N / tp with sp)
  Recompute policy_;
  Trace* trace_;
  Trace null_trace_;
  ModelLayout layout_;
  Tensor params_, grads_;
  ActPlan plan_;
  std::vector<Tensor> acts_, scratch_;
  Tensor rope_cos_, rope_sin_;
  std::unique_ptr<UnitAccess> flat_;
};

}  // namespace loom
