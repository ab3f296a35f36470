// The causal (and data.doc_mask) mask of the reference attention kernels (attention_rowwise.cu,
// attention_wmma.cu), written once: which keys a query sees, and backward's probability of a
// score recomputed from its row's log-sum-exp. Not here: the kernels' tiling or walks.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace loom::cuda::reference {

// The first key query t of sequence bi attends to: its document's first token (pos, for
// data.doc_mask), or the sequence's. Documents are contiguous, so it never decreases with t.
__device__ __forceinline__ int first_key(const int32_t* pos, int bi, int T, int t) {
  return pos ? t - pos[int64_t(bi) * T + t] : 0;
}

// Whether `key` is visible to `query`, whose document starts at key `first`.
__device__ __forceinline__ bool key_visible(int key, int query, int first) {
  return key <= query && key >= first;
}

// P = exp(s * scale - lse) of a visible key's raw score s, 0 where the mask hides it.
__device__ __forceinline__ float recomputed_prob(bool visible, float s, float scale, float lse) {
  return visible ? __expf(s * scale - lse) : 0.0f;
}

}  // namespace loom::cuda::reference
