// The shapes of attention, taken whole instead of as positional arguments: the whole
// sequence's (AttentionShape: Backend and the CPU kernels, kernels/ops.h; the CUDA flash kernels
// still take its fields one by one) and one block of context parallel's (AttentionBlockShape:
// Backend, the CPU kernels and their CUDA twins, kernels/cuda/ops_cuda.h).
// Only shapes and the mask's positions: the tensors stay arguments of each op.
#pragma once
#include <cstdint>

namespace loom {

// B sequences of T tokens, each query attending causally to the keys before it; H query heads,
// KV key/value heads, each of D. pos [B, T] (data.doc_mask): each token's position in its
// document, so query t sees keys t - pos[b, t] .. t (null: 0 .. t); where the op reads it.
struct AttentionShape {
  int B = 0, T = 0, H = 0, KV = 0, D = 0;
  const int32_t* pos = nullptr;
};

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
