// Helpers shared by the CUDA kernels: launch checks, bf16 conversion, warp reductions, and
// the two spellings that differ between nvcc and the CPU emulation (kernels/emu/), which
// compiles these same files with the host compiler: a launch, and dynamic shared memory.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/check.h"

#if !defined(LOOM_CUDA_EMULATION)
// LOOM_LAUNCH(kernel, grid, block, shared_bytes, stream)(args...)
#define LOOM_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#define LOOM_DYNAMIC_SHARED(T, name, align) \
  extern __shared__ __align__(align)        \
  T name[]
#endif

namespace loom::cuda {

__device__ __forceinline__ float f(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ __nv_bfloat16 b(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

inline int blocks_for(int64_t n, int threads) {
  return int((n + threads - 1) / threads);
}

}  // namespace loom::cuda
