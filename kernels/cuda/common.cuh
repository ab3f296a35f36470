// Helpers shared by the CUDA kernels: launch checks, bf16 conversion, warp reductions, and
// the two spellings that differ between nvcc and the CPU emulation (kernels/emu/), which
// compiles these same files with the host compiler: a launch, and dynamic shared memory.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>

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

// 128-bit words of 8 bf16: the unit the memory-bound kernels load and store. The emulation
// copies bytes (no aliasing assumptions for the host compiler) and traps where the GPU would
// fault on a misaligned word.
constexpr int kPack = 8;
__device__ __forceinline__ int4 load128(const void* p) {
#if defined(LOOM_CUDA_EMULATION)
  if (reinterpret_cast<uintptr_t>(p) % 16) __builtin_trap();
  int4 r;
  std::memcpy(&r, p, 16);
  return r;
#else
  return *reinterpret_cast<const int4*>(p);
#endif
}
__device__ __forceinline__ void store128(void* p, int4 v) {
#if defined(LOOM_CUDA_EMULATION)
  if (reinterpret_cast<uintptr_t>(p) % 16) __builtin_trap();
  std::memcpy(p, &v, 16);
#else
  *reinterpret_cast<int4*>(p) = v;
#endif
}
__device__ __forceinline__ void unpack8(float (&x)[kPack], int4 w) {
  bf16 h[kPack];
  std::memcpy(h, &w, 16);
#pragma unroll
  for (int k = 0; k < kPack; ++k) x[k] = f(h[k]);
}
__device__ __forceinline__ int4 pack8(const float (&x)[kPack]) {
  bf16 h[kPack];
#pragma unroll
  for (int k = 0; k < kPack; ++k) h[k] = b(x[k]);
  int4 w;
  std::memcpy(&w, h, 16);
  return w;
}
// Columns [c, c + 8) of a row of C, zeros past C: one word where `aligned` (the row starts on
// 16 bytes and C % 8 == 0, so a word is wholly inside or outside), else element by element.
__device__ __forceinline__ int4 load_cols(const bf16* __restrict__ row, int c, int C, bool aligned) {
  if (aligned) return c < C ? load128(row + c) : int4{0, 0, 0, 0};
  bf16 h[kPack];
#pragma unroll
  for (int k = 0; k < kPack; ++k) h[k] = c + k < C ? row[c + k] : b(0.0f);
  int4 w;
  std::memcpy(&w, h, 16);
  return w;
}
__device__ __forceinline__ void store_cols(bf16* __restrict__ row, int c, int C, bool aligned, int4 w) {
  if (aligned) {
    if (c < C) store128(row + c, w);
    return;
  }
  bf16 h[kPack];
  std::memcpy(h, &w, 16);
#pragma unroll
  for (int k = 0; k < kPack; ++k)
    if (c + k < C) row[c + k] = h[k];
}
// True where every pointer is on 16 bytes (null ones count as aligned); each one that is not
// is named to `paths` (when given) as a tensor of `kernel` taking the element-by-element path.
struct NamedPtr {
  const char* name;
  const void* p;
};
inline bool aligned16(ScalarPaths* paths, const char* kernel, std::initializer_list<NamedPtr> ps) {
  bool all = true;
  for (const NamedPtr& n : ps)
    if (reinterpret_cast<uintptr_t>(n.p) % 16) {
      all = false;
      if (paths) paths->taken(kernel, n.name);
    }
  return all;
}

// Kernels that load 16-byte vectors from every row: `what` must start on a 16-byte boundary.
inline void aligned16_check(const void* p, const char* kernel, const char* what) {
  LOOM_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, "{} needs {} 16-byte aligned", kernel, what);
}

// Lets `kernel` take `bytes` of dynamic shared memory (past the 48 KB default).
template <class Kernel>
void smem_allow(Kernel kernel, size_t bytes) {
  LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
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

// Stage two: out[c] (+)= the chunks' partials of column c, in chunk order; blockIdx.y 1 takes
// the second gradient (out_b from part_b), so that both finish in one launch.
template <bool Accumulate>
__global__ void column_finish_kernel(float* out_a, float* out_b, const float* part_a, const float* part_b, int chunks,
                                     int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float* out = blockIdx.y ? out_b : out_a;
  const float* part = blockIdx.y ? part_b : part_a;
  // 16 loads in flight, added in chunk order.
  constexpr int kInFlight = 16;
  float t = 0.0f;
  for (int p0 = 0; p0 < chunks; p0 += kInFlight) {
    float v[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) v[i] = p0 + i < chunks ? part[int64_t(p0 + i) * C + c] : 0.0f;
#pragma unroll
    for (int i = 0; i < kInFlight; ++i)
      if (p0 + i < chunks) t += v[i];
  }
  out[c] = Accumulate ? out[c] + t : t;
}

// Stage one over 128-bit words (C % 8 == 0, every row on 16 bytes): `value.word(n, c, a, b)`
// gives row n's contributions to columns [c, c + 8). Each thread takes 8 columns, so a block of
// (kWordsPerBlock, kColPhases) covers 128 columns with kColPhases row phases, added in order;
// the grid, (C / 128) x chunks, fills the device (768 columns over 8192 rows: 6 x 64 blocks).
// Bytes: the rows' bf16 operands read once, 4 C (8 C with b) written a chunk: at DRAM bandwidth.
constexpr int kWordsPerBlock = 16;
template <class Value>
__global__ void __launch_bounds__(kWordsPerBlock* kColPhases)
    column_word_partials_kernel(float* __restrict__ part_a, float* __restrict__ part_b, Value value, int N, int C,
                                int rows) {
  constexpr int kCols = kWordsPerBlock * kPack;
  __shared__ float sa[kColPhases][kCols], sb[kColPhases][kCols];
  const int c = (blockIdx.x * kWordsPerBlock + threadIdx.x) * kPack, n0 = blockIdx.y * rows,
            n1 = n0 + rows < N ? n0 + rows : N;
  float a[kPack] = {}, b[kPack] = {};
  if (c < C)
    for (int n = n0 + threadIdx.y; n < n1; n += kColPhases) value.word(n, c, a, b);
  // Column 8 x + k of phase y sits at 8 x + (k + 2 (x / 4) + y) % 8 of its row: a warp's store
  // of one k (16 x by 2 y) and a warp's load of 32 columns of one phase each hit 32 banks (in
  // place, 8 x + k, the store took 8 wavefronts).
  auto at = [](int y, int col) { return (col & ~7) + ((col + 2 * (col / 32) + y) & 7); };
#pragma unroll
  for (int k = 0; k < kPack; ++k) {
    sa[threadIdx.y][at(threadIdx.y, threadIdx.x * kPack + k)] = a[k];
    sb[threadIdx.y][at(threadIdx.y, threadIdx.x * kPack + k)] = b[k];
  }
  __syncthreads();
  // Threads [0, 128) finish the a columns, [128, 256) the b ones.
  const int t = threadIdx.y * kWordsPerBlock + threadIdx.x, col = t % kCols, out = blockIdx.x * kCols + col;
  if (t >= 2 * kCols || out >= C) return;
  const bool is_b = t >= kCols;
  if (is_b && !part_b) return;
  float sum = 0.0f;
  for (int p = 0; p < kColPhases; ++p) sum += is_b ? sb[p][at(p, col)] : sa[p][at(p, col)];
  (is_b ? part_b : part_a)[int64_t(blockIdx.y) * C + out] = sum;
}

// Stage two on stream s: each column's partials summed in chunk order, into out_a (and out_b),
// one launch for both.
template <bool Accumulate>
void column_finish(float* out_a, float* out_b, const float* pa, const float* pb, int chunks, int C, cudaStream_t s) {
  LOOM_LAUNCH(column_finish_kernel<Accumulate>, dim3(blocks_for(C, 256), out_b ? 2 : 1), 256, 0, s)
  (out_a, out_b, pa, pb, chunks, C);
  LOOM_CUDA_LAUNCHED();
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
  column_finish<Accumulate>(out_a, out_b, pa, pb, chunks, C, s);
}

// The same with stage one over words where `aligned` (C % 8 == 0 and the value's rows on 16
// bytes); Value gives both operator() and word().
template <bool Accumulate, class Value>
void column_sums_2stage_words(float* out_a, float* out_b, Value value, int N, int C, bool aligned, float* partials,
                              cudaStream_t s) {
  if (!aligned) return column_sums_2stage<Accumulate>(out_a, out_b, value, N, C, partials, s);
  const int chunks = row_chunks(N);
  float* pa = partials;
  float* pb = out_b ? partials + int64_t(chunks) * C : nullptr;
  LOOM_LAUNCH(column_word_partials_kernel<Value>, dim3(blocks_for(C, kWordsPerBlock * kPack), chunks),
              dim3(kWordsPerBlock, kColPhases), 0, s)
  (pa, pb, value, N, C, chunk_rows(N));
  LOOM_CUDA_LAUNCHED();
  column_finish<Accumulate>(out_a, out_b, pa, pb, chunks, C, s);
}

}  // namespace loom::cuda
