// Whole-sequence attention kernels that training no longer runs, kept in one place as
// references: the CUDA tests compare the flash kernels (attention_flash.cu) against them, and
// `loom bench kernels` times them beside the flash kernels. Same shapes and semantics as
// cuda::attention_forward / attention_backward (kernels/cuda/ops_cuda.h); nothing in model/
// calls them.
#pragma once
#include "kernels/cuda/ops_cuda.h"

namespace loom::cuda::reference {

// defines: attention_forward_rowwise, attention_backward_rowwise (attention_rowwise.cu)
// A warp per query (forward, dQ) or key row (dK/dV) on CUDA cores, for D = 32, 64, 128: the
// plain reference the tensor-core kernels are tested and benchmarked against.
void attention_forward_rowwise(bf16* out, float* lse, const bf16* qkv, int B, int T, int H, int KV, int D,
                               const int32_t* pos, cudaStream_t s);
// dqkv overwritten; scratch: B*H*T floats (delta).
void attention_backward_rowwise(bf16* dqkv, const bf16* dout, const bf16* out, const bf16* qkv, const float* lse,
                                float* scratch, int B, int T, int H, int KV, int D, const int32_t* pos, cudaStream_t s);

// defines: attention_forward_wmma, attention_backward_wmma (attention_wmma.cu)
// The earlier tensor-core kernels (WMMA through shared memory), D = 64 and 128.
void attention_forward_wmma(bf16* out, float* lse, const bf16* qkv, int B, int T, int H, int KV, int D,
                            const int32_t* pos, cudaStream_t s);
void attention_backward_wmma(bf16* dqkv, const bf16* dout, const bf16* out, const bf16* qkv, const float* lse,
                             float* scratch, int B, int T, int H, int KV, int D, const int32_t* pos, cudaStream_t s);

}  // namespace loom::cuda::reference
