// FLOPs per token for MFU: 6N + 12*L*C*T, N the parameters a token's matmuls
// touch (with MoE layers the router and its top_k experts, not all of them; lookup tables
// such as position embeddings, and an untied input embedding, are lookups, not matmuls, and
// do not count). HFU adds the recomputed forward work.
#pragma once
#include "model/model_dims.h"

namespace loom {

struct FlopsPerToken {
  double model;     // 6N + 12 L C T
  double hardware;  // model + recompute
  int64_t matmul_params;
};
// Recompute: full reruns each block's forward up to (not including) its down projection;
// selective reruns the attention core where the backend keeps attention probabilities
// (attention_probs; flash attention keeps none, so its selective policy reruns no matmul).
FlopsPerToken flops_per_token(const ModelDims& dims, bool attention_probs = true);
int64_t param_count(const ModelDims& dims);         // every parameter of the model (all experts)
double param_count_f64(const ModelDims& dims);      // the same in doubles, which never overflow
int64_t active_param_count(const ModelDims& dims);  // those a token meets (its top_k experts)

// Forward FLOPs per token of block `layer`, by part: the one count of a block's work that the
// pipeline's "auto" split and the step-time model share (MFU uses the 6N rule above).
struct BlockFlops {
  double attn_proj;  // q, k, v and o projections: 2 C (H + 2 KV) D + 2 H D C
  double core;       // attention scores and values over the whole sequence: 4 T H D
  double mlp;        // GELU (2 matmuls) or SwiGLU (3); a MoE block's top_k experts
  double router;     // a MoE block's router: 2 C E (0 for a dense block)
  double total() const { return attn_proj + core + mlp + router; }
};
BlockFlops block_flops(const ModelDims& dims, int layer);
// Forward FLOPs per token of the head: the logits (2 C V) and the loss's softmax and gradient.
double head_flops(const ModelDims& dims);

}  // namespace loom
