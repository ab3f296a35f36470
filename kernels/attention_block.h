// The shape of one block of context parallel's attention (this rank's queries against one
// block of keys and values), which the CPU kernels (kernels/ops.h), their CUDA twins
// (kernels/cuda/ops_cuda.h) and Backend take whole instead of as nine positional arguments.
// Only shapes and the mask's positions: the tensors stay arguments of each op.
#pragma once
#include <cstdint>

namespace loom {

// B sequences' Tq queries against Tk keys; H query heads, KV key/value heads, each of D. Key u
// is visible to query t where kpos[u] <= qpos[t] and, with data.doc_mask, kpos[u] >= qpos[t] -
// qdoc[b, t]. qpos [Tq] and kpos [Tk] are global positions in the sequence, qdoc [B, Tq] each
// query's position in its document (null: no documents); all three where the op reads them.
struct AttentionBlockShape {
  int B = 0, Tq = 0, Tk = 0, H = 0, KV = 0, D = 0;
  const int32_t* qpos = nullptr;
  const int32_t* kpos = nullptr;
  const int32_t* qdoc = nullptr;
};

}  // namespace loom
