// The decoder: gpt2 (LayerNorm, learned positions, GELU MLP, biases) and llama (RMSNorm,
// RoPE, grouped-query attention, SwiGLU, no biases), pre-norm, with explicit forward and
// backward per block. Activations are planned once from (B, T, config, recompute policy) and
// allocated up front; the policy changes which buffers are per layer and which are shared
// and recomputed, never the control flow of the layer loop.
// Not here: distribution (parallel/), the optimizer (optim/), data (runtime/data).
#pragma once
#include <functional>
#include <memory>

#include "model/registry.h"
#include "runtime/allocator.h"
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
  int64_t bytes() const { return numel * copies * 4; }
};
struct ActPlan {
  std::vector<ActBuffer> buffers;   // saved between forward and backward (Mem::activations)
  std::vector<ActBuffer> scratch;   // backward working space (Mem::workspace)
  int64_t activation_bytes() const;
  int64_t scratch_bytes() const;
  std::string table() const;
};
ActPlan act_plan(const Config& cfg, int B, Recompute policy);

class Model {
 public:
  Model(const Config& cfg, Allocator& alloc, int B, Trace* trace = nullptr);

  const ParamRegistry& registry() const { return reg_; }
  float* params() { return params_.f32(); }
  float* grads() { return grads_.f32(); }
  size_t num_params() const { return reg_.numel(); }
  const ActPlan& plan() const { return plan_; }
  void init_weights(uint64_t seed) { registry_init(reg_, params(), seed); }
  void zero_grad();

  // tokens, targets: [B, T]. Returns the sum of per-token losses. With dloss != 0 the
  // logits are turned into their gradient (scaled by dloss) for backward().
  double forward(const int32_t* tokens, const int32_t* targets, float dloss);
  // Accumulates (+=) this micro-batch's gradients into grads(). Gradients are produced in
  // reverse registration order; after each block, grads_ready(offset) (if given) says that
  // grads [offset, num_params) are final, which is what data parallelism overlaps with.
  void backward(const int32_t* tokens, const std::function<void(int64_t)>& grads_ready = {});

 private:
  struct LayerW;  // pointers of one block's parameters (or gradients) into a flat buffer
  struct LayerA;  // pointers of one block's activations
  LayerW layer_w(float* base, int l) const;
  LayerA layer_a(int l);
  void block_forward(const LayerW& w, const LayerA& a, const float* x, float* out);
  void block_backward(const LayerW& w, const LayerW& dw, const LayerA& a, const float* x, float* dres);
  void build_registry();

  Config cfg_;
  bool llama_;
  int B_, T_, C_, H_, KV_, D_, F_, V_, L_;
  Recompute policy_;
  Trace* trace_;
  Trace null_trace_;
  ParamRegistry reg_;
  Tensor params_, grads_;
  ActPlan plan_;
  std::vector<std::vector<size_t>> layer_offsets_;  // per layer, per LayerW field
  std::vector<Tensor> acts_, scratch_;
  Tensor rope_cos_, rope_sin_;
};

}  // namespace loom
