// The stored-dS path's own kernels (the flash backward's third way, attention_flash_bwd.cu; the
// store's layout: kernels/flash_ds.h): the delta pass dK/dV reads, and dQ = dS K from the tiles
// dK/dV stored, for head dim 64 without document starts.
#include <cstdint>

#include "kernels/cuda/attention_flash_ds.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_tiles.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/flash_ds.h"

namespace loom::cuda {

namespace {

using namespace flash;

// dQ = scale * dS K from the stored dS (head dim 64, no document starts): a CTA of 4 warps of
// three 16-row query tiles (192 rows: three CTAs an SM fit their shared memory, four tiles'
// 256 rows did not), walking the key tiles in order with each key tile's K and the CTA's dS
// tiles double-buffered by cp.async; one product a chunk of 16 keys, no S or dP. Each
// accumulator adds the same chunks in the same order, from the same bf16 A fragments (given
// the same dS), as attention_dq_flash_kernel: a tile skips a chunk exactly where that kernel's
// warp of 32 rows (rows 32j..32j+31) does (its rows all precede the keys), so it never reads a
// dS that dK/dV did not write; a tile wholly past T (its dS tile not loaded) skips them all.
// Each ldmatrix of K feeds three row tiles.
struct DqDsShape {
  static constexpr int kRowTiles = 3;
  static constexpr int kRows = 4 * 16 * kRowTiles;
  static constexpr int kThreads = 128;
  // [2] dS rows of the CTA over a key tile, then [2] K tiles.
  static constexpr size_t kSmem = size_t(2 * (kRows + kKeys)) * row_ld<64>() * 2;
};

__global__ void __launch_bounds__(128, Plan<64>::kFlashDqDsBlocksPerSm)
    attention_dq_ds_flash_kernel(bf16* dqkv, const bf16* ds, const bf16* qkv, int T, int H, int KV, float scale) {
  constexpr int D = 64, E = kFlashDsTile, R = DqDsShape::kRowTiles, WR = 16 * R, KC = 16;
  constexpr int LD = row_ld<D>(), BR = DqDsShape::kRows, NT = DqDsShape::kThreads;
  static_assert(E == kKeys && row_ld<E>() == LD, "a dS tile is a key tile wide, rows padded as K's");
  static_assert(BR % E == 0, "a CTA's rows are whole dS tiles");
  LOOM_DYNAMIC_SHARED(unsigned char, smem, 128);
  bf16* dss = reinterpret_cast<bf16*>(smem);  // [2][BR][LD]
  bf16* ks = dss + 2 * BR * LD;               // [2][kKeys][LD]
  const int h = blockIdx.y, bi = blockIdx.z;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;
  const int w = threadIdx.x / 32;
  const int row = (H + 2 * KV) * D, kvh = h / (H / KV);
  const bf16* kbase = qkv + int64_t(bi) * T * row + (H + kvh) * D;
  const bf16* dsh = ds + (int64_t(bi) * H + h) * flash_ds_tiles(T) * E * E;
  const int nq = (T + E - 1) / E, kt1 = (imin(q0 + BR, T) + kKeys - 1) / kKeys;
  auto load = [&](int kt, int buf) {
    tile_async<D, kKeys, NT>(ks + buf * kKeys * LD, kbase, row, kt * kKeys, T);
#pragma unroll
    for (int j = 0; j < BR / E; ++j) {
      const int qb = q0 / E + j;  // tiles above the diagonal are neither stored nor read
      if (qb < nq && kt <= qb)
        tile_async<E, E, NT>(dss + (buf * BR + E * j) * LD, dsh + (int64_t(qb) * (qb + 1) / 2 + kt) * E * E, E, 0, E);
    }
  };
  load(0, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  const int wq = q0 + WR * w;
  float dq[R][D / 8][4];
  acc_zero(dq);
  for (int kt = 0; kt < kt1; ++kt) {
    const int buf = kt % 2, k0 = kt * kKeys;
    if (kt + 1 < kt1) load(kt + 1, buf ^ 1);
    cp_async_commit();
    const bf16* ds_s = dss + (buf * BR + WR * w) * LD;
    const bf16* kt_s = ks + buf * kKeys * LD;
#pragma unroll
    for (int c = 0; c < kKeys / KC; ++c) {
      const int kc0 = k0 + c * KC;
      bool live[R], any = false;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int rt = wq + 16 * r;  // the tile's first row
        live[r] = rt < T && kc0 <= (rt | 31);
        any = any || live[r];
      }
      if (!any) continue;
      uint32_t a[R][4];
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (live[r]) load_a<D>(a[r], ds_s + 16 * r * LD, c);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        load_b<D>(b, kt_s + c * KC * LD, 0, dp * 16);
#pragma unroll
        for (int r = 0; r < R; ++r)
          if (live[r]) mma2(dq[r][2 * dp], dq[r][2 * dp + 1], a[r], b);
      }
    }
    cp_async_wait<0>();
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
    store_rows<D>(dqkv + int64_t(bi) * T * row + h * D, row, wq + 16 * r, T, dq[r], scale, scale,
                  dss + (WR * w + 16 * r) * LD);
}

// delta = rowsum(dO * O), a warp a row, summed as dQ's prologue sums it (row_delta), for dK/dV
// where dQ runs after it.
template <int D>
__global__ void attention_bwd_delta_kernel(float* delta, const bf16* dout, const bf16* out, int T, int H) {
  const int t = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.y, bi = blockIdx.z;
  if (t >= T) return;
  const int64_t at = (int64_t(bi) * T + t) * H * D + h * D;
  const float d = row_delta<D>(dout + at, out + at, lane);
  if (lane == 0) delta[(int64_t(bi) * H + h) * T + t] = d;
}

}  // namespace

namespace flash {

void ds_delta(float* delta, const bf16* dout, const bf16* out, int B, int T, int H, cudaStream_t s) {
  LOOM_LAUNCH(attention_bwd_delta_kernel<64>, dim3(unsigned(blocks_for(T, 4)), unsigned(H), unsigned(B)), 128, 0, s)
  (delta, dout, out, T, H);
  LOOM_CUDA_LAUNCHED();
}

void ds_dq(bf16* dqkv, const bf16* ds, const bf16* qkv, int B, int T, int H, int KV, float scale, cudaStream_t s) {
  smem_allow(attention_dq_ds_flash_kernel, DqDsShape::kSmem);
  LOOM_LAUNCH(attention_dq_ds_flash_kernel, grid_order(blocks_for(T, DqDsShape::kRows), H, B), DqDsShape::kThreads,
              DqDsShape::kSmem, s)
  (dqkv, ds, qkv, T, H, KV, scale);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace flash

}  // namespace loom::cuda
