// Causal attention in the FlashAttention-2 structure on mma.sync m16n8k16 (bf16 operands,
// fp32 accumulators; kernels/cuda/mma.cuh), head dims 32, 64 and 128, grouped-query heads by
// head mapping (kv head = h / (H / KV), no copies), data.doc_mask's document starts (pos): the
// forward. A block of query rows per CTA, a warp per two 16-row tiles (one at head dim 128)
// with its Q fragments in registers, K/V tiles of 64 keys streamed through shared memory by
// cp.async into two buffers (the next tile lands while this one is used), each K/V fragment
// loaded once for the warp's tiles, S = QK^T and O += PV with the online softmax in registers
// (over 32 keys of the tile at a time at head dim 64, for three CTAs an SM; P goes from the S
// accumulators straight into A fragments), log-sum-exp written for the
// backward (attention_flash_bwd.cu) and context parallel; key tiles above the diagonal are
// skipped and the CTAs with the longest rows start first. P is rounded to bf16 for its product,
// as in FlashAttention. Shared-memory rows are padded by 16 bytes, so the eight 16-byte rows an
// ldmatrix or cp.async phase touches fall in distinct banks.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_tiles.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace loom::cuda {

namespace {

using namespace flash;

// The forward's CTA: 4 warps of kFlashFwdRowTiles x 16 query rows each.
template <int D>
using FlashFwd = FwdShape<D, 4, Plan<D>::kFlashFwdRowTiles>;

template <int D>
__global__ void __launch_bounds__(FlashFwd<D>::kThreads, Plan<D>::kFlashFwdBlocksPerSm)
    attention_forward_flash_kernel(bf16* out, float* lse, const bf16* qkv, const int32_t* pos, int T, int H, int KV,
                                   float scale) {
  using S = FlashFwd<D>;
  constexpr int R = Plan<D>::kFlashFwdRowTiles, WR = 16 * R;  // row tiles and rows of a warp
  constexpr bool QRegs = Plan<D>::kFlashFwdQRegs;
  constexpr int KC = Plan<D>::kFlashFwdKeyChunk;  // keys of S and of a softmax step
  constexpr int LD = row_ld<D>(), BR = S::kRows;
  LOOM_DYNAMIC_SHARED(unsigned char, smem, 128);
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = qs + BR * LD;  // [2][kKeys][LD]
  bf16* vs = ks + 2 * kKeys * LD;
  // x: query tiles, the last (longest rows) first; y: head; z: sequence (flash_tiles.cuh's grid_order).
  const int h = blockIdx.y, bi = blockIdx.z;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row = (H + 2 * KV) * D, kvh = h / (H / KV);
  const bf16* base = qkv + int64_t(bi) * T * row;
  const bf16* kbase = base + (H + kvh) * D;
  const bf16* vbase = base + (H + KV + kvh) * D;
  const float sl2 = scale * kLog2e;

  // Key tiles [kt0, kt1): from the first row's document start to the last row's diagonal.
  const int kt0 = first_key(pos, bi, T, q0) / kKeys;
  const int kt1 = (imin(q0 + BR, T) + kKeys - 1) / kKeys;
  tile_async<D, BR, S::kThreads>(qs, base + h * D, row, q0, T);
  tile_async<D, kKeys, S::kThreads>(ks, kbase, row, kt0 * kKeys, T);
  tile_async<D, kKeys, S::kThreads>(vs, vbase, row, kt0 * kKeys, T);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  const int wq = q0 + WR * w;  // the warp's first row
  const bf16* qw = qs + WR * w * LD;
  int r0[R], r1[R], f0[R], f1[R];  // tile r's rows g and g + 8, and their documents' first keys
#pragma unroll
  for (int r = 0; r < R; ++r) {
    r0[r] = wq + 16 * r + g, r1[r] = r0[r] + 8;
    f0[r] = first_key(pos, bi, T, r0[r]), f1[r] = first_key(pos, bi, T, r1[r]);
  }
  const int fw = first_key(pos, bi, T, wq);  // the warp's earliest document start
  int fmax = 0;
#pragma unroll
  for (int r = 0; r < R; ++r) fmax = imax(fmax, imax(f0[r], f1[r]));
  uint32_t qf[QRegs ? R : 1][QRegs ? D / 16 : 1][4];
  if constexpr (QRegs) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) load_a<D>(qf[r][kk], qw + 16 * r * LD, kk);
  }
  float o[R][D / 8][4];
  acc_zero(o);
  float m[R][2], l[R][2];  // l: this lane's part of the row sum
#pragma unroll
  for (int r = 0; r < R; ++r) m[r][0] = m[r][1] = -INFINITY, l[r][0] = l[r][1] = 0.0f;

  for (int kt = kt0; kt < kt1; ++kt) {
    const int buf = (kt - kt0) % 2, k0 = kt * kKeys;
    if (kt + 1 < kt1) {
      tile_async<D, kKeys, S::kThreads, true>(ks + (buf ^ 1) * kKeys * LD, kbase, row, k0 + kKeys, T);
      tile_async<D, kKeys, S::kThreads, true>(vs + (buf ^ 1) * kKeys * LD, vbase, row, k0 + kKeys, T);
    }
    cp_async_commit();
    const bf16* kt_s = ks + buf * kKeys * LD;
    const bf16* vt_s = vs + buf * kKeys * LD;
#pragma unroll
    for (int c = 0; c < kKeys / KC; ++c) {
      const int kc0 = k0 + c * KC;
      // A warp whose rows all precede the chunk's keys (causal), or whose documents all start
      // past them, skips it (the condition is the warp's: document starts never decrease). A
      // row tile of the warp with no key in the chunk goes through it as an exact no-op: its
      // scores are all -inf, so its max, sum and output keep their bits (corr is 2^0 = 1, or
      // the row stays zero).
      if (kc0 <= wq + WR - 1 && kc0 + KC > fw) {
        const bf16* kc_s = kt_s + c * KC * LD;
        float s[R][KC / 8][4];
        gemm_abt<D, KC, R>(s, a_fragments<D, QRegs>(qf, qw), kc_s);
        const bool edge = kc0 + KC - 1 > wq || kc0 < fmax;
        if (edge) {
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int n = 0; n < KC / 8; ++n)
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                const int key = kc0 + 8 * n + 2 * t + i % 2, q = i < 2 ? r0[r] : r1[r], f = i < 2 ? f0[r] : f1[r];
                if (key > q || key < f) s[r][n][i] = -INFINITY;
              }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) softmax_online<D, KC>(s[r], m[r], l[r], o[r], sl2);
        gemm_pb<D, KC, R>(o, s, vt_s + c * KC * LD);
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the next tile has landed; every warp is done with this one
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    quad_sum(l[r]);
    store_rows<D>(out + int64_t(bi) * T * H * D + h * D, int64_t(H) * D, wq + 16 * r, T, o[r], 1.0f / l[r][0],
                  1.0f / l[r][1], qs + (WR * w + 16 * r) * LD);
    if (t == 0) {
      float* ls = lse + (int64_t(bi) * H + h) * T;
      if (r0[r] < T) ls[r0[r]] = m[r][0] * scale + logf(l[r][0]);
      if (r1[r] < T) ls[r1[r]] = m[r][1] * scale + logf(l[r][1]);
    }
  }
}

template <int D>
void forward_d(bf16* out, float* lse, const bf16* qkv, int B, int T, int H, int KV, const int32_t* pos,
               cudaStream_t s) {
  using S = FlashFwd<D>;
  aligned16_check(qkv, "flash attention", "qkv");
  aligned16_check(out, "flash attention", "out");
  smem_allow(attention_forward_flash_kernel<D>, S::kSmem);
  const dim3 grid = grid_order(blocks_for(T, S::kRows), H, B);
  LOOM_LAUNCH(attention_forward_flash_kernel<D>, grid, S::kThreads, S::kSmem, s)
  (out, lse, qkv, pos, T, H, KV, 1.0f / sqrtf(float(D)));
  LOOM_CUDA_LAUNCHED();
}

}  // namespace

void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int H, int KV, int D, const int32_t* pos,
                       cudaStream_t s) {
  LOOM_CHECK(KV > 0 && H % KV == 0, "attention needs n_head ({}) a multiple of n_kv_head ({})", H, KV);
  if (D == 64) return forward_d<64>(out, lse, qkv, B, T, H, KV, pos, s);
  if (D == 128) return forward_d<128>(out, lse, qkv, B, T, H, KV, pos, s);
  if (D == 32) return forward_d<32>(out, lse, qkv, B, T, H, KV, pos, s);
  fail("CUDA attention supports head dims 32, 64 and 128, not {}; change model.d_model / model.n_head", D);
}

}  // namespace loom::cuda
