// FLOPs per token for MFU (DESIGN 9): 6N + 12*L*C*T, N the parameters a token's matmuls
// touch (lookup tables such as position embeddings, and an untied input embedding, are
// lookups, not matmuls, and do not count). HFU adds the recomputed forward work.
#pragma once
#include "runtime/config.h"

namespace loom {

struct FlopsPerToken {
  double model;     // 6N + 12 L C T
  double hardware;  // model + recompute
  int64_t matmul_params;
};
// cuda: the GPU path's recompute, which differs from the CPU's: its selective policy reruns no
// matmul (flash attention keeps no probabilities to recompute) and its full policy stops
// before each block's down projection.
FlopsPerToken flops_per_token(const Config& cfg, bool cuda = false);
int64_t param_count(const Config& cfg);  // every parameter the registry holds

}  // namespace loom
