// The experts' GEMMs of a dropless MoE layer, sized on the device: expert e's rows are a run of
// the expert-sorted buffer whose length (the sum of its counts over the sources) only the
// device knows, so cuBLASLt, whose shapes are host arguments, would need the host to wait for
// them. Here every block finds its own expert and rows from the counts. bf16 WMMA tiles of
// 64 x 64, fp32 accumulation, a fixed order of every sum (no atomics, no split over rows), so
// results repeat to the bit. Rows past a run, and columns past the matrix, are loaded as zeros.
#include <mma.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace loom::cuda {

namespace {

using namespace nvcuda;

constexpr int kBM = 64, kBN = 64, kBK = 32;  // the block's output tile, and its step over the sum
constexpr int kThreads = 128;                // 4 warps, each a 32 x 32 quarter of the tile
// Shared-memory row strides, padded against bank conflicts; every fragment start stays 32-byte
// aligned, as WMMA loads and stores require.
constexpr int kLA = kBK + 8, kLB = kBN + 8, kLC = kBN + 4;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
// Dynamic shared memory: the a and b tiles (bf16), then the output tile (fp32); 27 KB.
constexpr size_t kShared = size_t(kBM) * kLA * 2 + size_t(kBK) * kLB * 2 + size_t(kBM) * kLC * 4;
static_assert((size_t(kBM) * kLA * 2 + size_t(kBK) * kLB * 2) % 32 == 0, "the output tile starts 32-byte aligned");

// Expert e's rows: the sum over the sources of counts[s * El + e].
__device__ int run_rows(const int32_t* counts, int sources, int El, int e) {
  int n = 0;
  for (int s = 0; s < sources; ++s) n += counts[s * El + e];
  return n;
}

// acc += a[64][kBK] @ b[kBK][64] (shared bf16 tiles) for this warp's quarter.
__device__ void tile_mma(FragC (&acc)[2][2], const bf16* a, const bf16* bm) {
  const int w = threadIdx.x / 32, wm = w / 2, wn = w % 2;
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk) {
    FragA fa[2];
    FragB fb[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], a + (wm * 32 + i * 16) * kLA + kk * 16, kLA);
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], bm + kk * 16 * kLB + wn * 32 + j * 16, kLB);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
  }
}

// The warps' quarters into the fp32 tile c[64][kLC].
__device__ void tile_store(float* c, FragC (&acc)[2][2]) {
  const int w = threadIdx.x / 32, wm = w / 2, wn = w % 2;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(c + (wm * 32 + i * 16) * kLC + wn * 32 + j * 16, acc[i][j], kLC, wmma::mem_row_major);
}

__device__ void acc_zero(FragC (&acc)[2][2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
}

// out[r, :N] = a[r, :K] @ B_e for the rows r of expert e, B_e [K, N] read from w + e * w_stride
// as W [N, K] transposed (w_nk: the forward's out_in weights) or as W [K, N] (the input
// gradient through them). Block x is the x-th 64-row tile of the experts' runs in turn (the
// grid covers the most there can be); block y a tile of 64 output columns.
__global__ void __launch_bounds__(kThreads)
    gemm_ragged_rows_kernel(bf16* out, const bf16* a, const bf16* w, int64_t w_stride, int w_nk, const int32_t* counts,
                            int sources, int El, int K, int N) {
  LOOM_DYNAMIC_SHARED(unsigned char, smem, 32);
  bf16 *as = reinterpret_cast<bf16*>(smem), *bs = as + kBM * kLA;
  float* cs = reinterpret_cast<float*>(bs + kBK * kLB);
  __shared__ int tile_e, tile_r0, tile_rows;
  if (threadIdx.x == 0) {
    tile_e = -1;
    int t = blockIdx.x, r0 = 0;
    for (int e = 0; e < El; ++e) {
      const int n = run_rows(counts, sources, El, e), tiles = (n + kBM - 1) / kBM;
      if (t < tiles) {
        tile_e = e;
        tile_r0 = r0 + t * kBM;
        tile_rows = n - t * kBM < kBM ? n - t * kBM : kBM;
        break;
      }
      t -= tiles;
      r0 += n;
    }
  }
  __syncthreads();
  if (tile_e < 0) return;  // past the last run's last tile
  const int e = tile_e, r0 = tile_r0, rows = tile_rows, n0 = blockIdx.y * kBN;
  const bf16* we = w + e * w_stride;
  const bf16 zero = b(0.0f);
  FragC acc[2][2];
  acc_zero(acc);
  for (int k0 = 0; k0 < K; k0 += kBK) {
    for (int i = threadIdx.x; i < kBM * kBK; i += kThreads) {  // row-major over a's rows
      const int r = i / kBK, k = i % kBK;
      as[r * kLA + k] = r < rows && k0 + k < K ? a[int64_t(r0 + r) * K + k0 + k] : zero;
    }
    for (int i = threadIdx.x; i < kBK * kBN; i += kThreads) {  // along w's rows in memory
      const int k = w_nk ? i % kBK : i / kBN, n = w_nk ? i / kBK : i % kBN;
      const bool in = k0 + k < K && n0 + n < N;
      bs[k * kLB + n] = !in ? zero : w_nk ? we[int64_t(n0 + n) * K + k0 + k] : we[int64_t(k0 + k) * N + n0 + n];
    }
    __syncthreads();
    tile_mma(acc, as, bs);
    __syncthreads();
  }
  tile_store(cs, acc);
  __syncthreads();
  for (int i = threadIdx.x; i < kBM * kBN; i += kThreads) {
    const int r = i / kBN, n = i % kBN;
    if (r < rows && n0 + n < N) out[int64_t(r0 + r) * N + n0 + n] = b(cs[r * kLC + n]);
  }
}

// dw_e[N, K] += dy_e^T @ x_e over expert e's rows (blockIdx.z): the weight gradient of the
// forward's out_in weights, in fp32, its sum over the rows in row order.
__global__ void __launch_bounds__(kThreads)
    gemm_ragged_wgrad_kernel(float* dw, const bf16* dy, const bf16* x, int64_t w_stride, const int32_t* counts,
                             int sources, int El, int N, int K) {
  LOOM_DYNAMIC_SHARED(unsigned char, smem, 32);
  bf16 *as = reinterpret_cast<bf16*>(smem), *bs = as + kBM * kLA;
  float* cs = reinterpret_cast<float*>(bs + kBK * kLB);
  const int e = blockIdx.z, m0 = blockIdx.y * kBM, n0 = blockIdx.x * kBN;
  int r0 = 0;
  for (int j = 0; j < e; ++j) r0 += run_rows(counts, sources, El, j);
  const int rows = run_rows(counts, sources, El, e);
  if (rows == 0) return;
  const bf16 zero = b(0.0f);
  FragC acc[2][2];
  acc_zero(acc);
  for (int k0 = 0; k0 < rows; k0 += kBK) {
    for (int i = threadIdx.x; i < kBM * kBK; i += kThreads) {  // along dy's rows in memory
      const int m = i % kBM, k = i / kBM;
      as[m * kLA + k] = k0 + k < rows && m0 + m < N ? dy[int64_t(r0 + k0 + k) * N + m0 + m] : zero;
    }
    for (int i = threadIdx.x; i < kBK * kBN; i += kThreads) {
      const int k = i / kBN, n = i % kBN;
      bs[k * kLB + n] = k0 + k < rows && n0 + n < K ? x[int64_t(r0 + k0 + k) * K + n0 + n] : zero;
    }
    __syncthreads();
    tile_mma(acc, as, bs);
    __syncthreads();
  }
  tile_store(cs, acc);
  __syncthreads();
  float* dwe = dw + e * w_stride;
  for (int i = threadIdx.x; i < kBM * kBN; i += kThreads) {
    const int m = i / kBN, n = i % kBN;
    if (m0 + m < N && n0 + n < K) dwe[int64_t(m0 + m) * K + n0 + n] += cs[m * kLC + n];
  }
}

}  // namespace

int gemm_ragged_tiles(int64_t R, int El) {
  return blocks_for(R, kBM) + El;
}

void gemm_ragged_rows(bf16* out, const bf16* a, const bf16* w, int64_t w_stride, bool w_nk, const int32_t* counts,
                      int sources, int El, int64_t R, int K, int N, cudaStream_t s) {
  if (R == 0 || El == 0) return;
  const dim3 grid(unsigned(gemm_ragged_tiles(R, El)), unsigned(blocks_for(N, kBN)));
  LOOM_LAUNCH(gemm_ragged_rows_kernel, grid, kThreads, kShared, s)
  (out, a, w, w_stride, w_nk, counts, sources, El, K, N);
  LOOM_CUDA_LAUNCHED();
}

void gemm_ragged_wgrad(float* dw, const bf16* dy, const bf16* x, int64_t w_stride, const int32_t* counts, int sources,
                       int El, int N, int K, cudaStream_t s) {
  if (El == 0) return;
  const dim3 grid(unsigned(blocks_for(K, kBN)), unsigned(blocks_for(N, kBM)), unsigned(El));
  LOOM_LAUNCH(gemm_ragged_wgrad_kernel, grid, kThreads, kShared, s)(dw, dy, x, w_stride, counts, sources, El, N, K);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace loom::cuda
