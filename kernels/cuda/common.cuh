// Helpers shared by the CUDA kernels: launch checks, bf16 conversion, warp reductions, and
// the two spellings that differ between nvcc and the CPU emulation (kernels/emu/), which
// compiles these same files with the host compiler: a launch, and dynamic shared memory.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/ops_cuda.h"
#include "runtime/cuda_check.h"

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

// A grid past 2^31 - 1 blocks is refused here, before the int wraps into a valid-looking one.
inline int blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  LOOM_CHECK(b <= INT32_MAX, "a grid of {} blocks ({} items of {} threads) is past CUDA's 2^31 - 1", b, n, threads);
  return int(b);
}

// Column sums over N rows in two deterministic stages (the weight and bias gradients, the MoE
// router's column sums): stage one gives each block 32 columns and one of column_chunks(N)
// row chunks, its 32 row phases added in order into partials[chunk][column]; stage two adds a
// column's chunks in order onto the output. The chunking depends on N alone, so the order of
// every sum is the same on any GPU; and a grid of (columns / 32) x chunks blocks fills one
// (768 columns over 8192 rows: 24 x 64 blocks, where a block per 32 columns gave 24).
constexpr int kColPhases = 32;
inline int chunk_rows(int N) {
  return (N + row_chunks(N) - 1) / row_chunks(N);
}

// Stage one: `value(n, c, a, b)` gives row n's contributions to column c (b may be unused).
// blockDim (32, kColPhases), grid (columns / 32, chunks).
template <class Value>
__global__ void column_partials_kernel(float* part_a, float* part_b, Value value, int N, int C, int rows) {
  __shared__ float sa[kColPhases][33], sb[kColPhases][33];
  const int c = blockIdx.x * 32 + threadIdx.x, n0 = blockIdx.y * rows, n1 = n0 + rows < N ? n0 + rows : N;
  float a = 0.0f, b = 0.0f;
  if (c < C)
    for (int n = n0 + threadIdx.y; n < n1; n += kColPhases) value(n, c, a, b);
  sa[threadIdx.y][threadIdx.x] = a;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  a = b = 0.0f;
  for (int p = 0; p < kColPhases; ++p) a += sa[p][threadIdx.x], b += sb[p][threadIdx.x];
  part_a[int64_t(blockIdx.y) * C + c] = a;
  if (part_b) part_b[int64_t(blockIdx.y) * C + c] = b;
}

// Stage two: out[c] (+)= the chunks' partials of column c, in chunk order.
template <bool Accumulate>
__global__ void column_finish_kernel(float* out, const float* part, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float t = 0.0f;
  for (int p = 0; p < chunks; ++p) t += part[int64_t(p) * C + c];
  out[c] = Accumulate ? out[c] + t : t;
}

// Both stages on stream s; partials: 2 * row_chunks(N) * C floats (one half without part_b).
template <bool Accumulate, class Value>
void column_sums_2stage(float* out_a, float* out_b, Value value, int N, int C, float* partials, cudaStream_t s) {
  const int chunks = row_chunks(N);
  float* pa = partials;
  float* pb = out_b ? partials + int64_t(chunks) * C : nullptr;
  LOOM_LAUNCH(column_partials_kernel<Value>, dim3(blocks_for(C, 32), chunks), dim3(32, kColPhases), 0, s)
  (pa, pb, value, N, C, chunk_rows(N));
  LOOM_CUDA_LAUNCHED();
  LOOM_LAUNCH(column_finish_kernel<Accumulate>, blocks_for(C, 256), 256, 0, s)(out_a, pa, chunks, C);
  LOOM_CUDA_LAUNCHED();
  if (!out_b) return;
  LOOM_LAUNCH(column_finish_kernel<Accumulate>, blocks_for(C, 256), 256, 0, s)(out_b, pb, chunks, C);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace loom::cuda
