// The flash backward's stored-dS path: host launches of its own kernels (attention_flash_ds.cu),
// called by the backward's launcher (attention_flash_bwd.cu).
#pragma once
#include "kernels/cuda/common.cuh"

namespace loom::cuda::flash {

// The stored-dS path's launches (attention_flash_ds.cu), head dim 64: delta = rowsum(dO * O)
// for dK/dV, and dQ = scale * dS K from the stored tiles.
void ds_delta(float* delta, const bf16* dout, const bf16* out, int B, int T, int H, cudaStream_t s);
void ds_dq(bf16* dqkv, const bf16* ds, const bf16* qkv, int B, int T, int H, int KV, float scale, cudaStream_t s);

}  // namespace loom::cuda::flash
