// The tile machinery of the flash attention kernels (attention_flash{,_bwd}.cu) and of context
// parallel's block kernels (attention_block.cu): cp.async tile loads into padded shared rows,
// ldmatrix fragment loads, the two mma.sync products a warp's row tiles of 16 rows need (S = A X^T
// and O += P X, each B fragment loaded once for all of them), the bf16 row stores, and the tile
// shapes per head dim.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"

namespace loom::cuda::flash {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kKeys = 64;  // keys per tile (forward and dQ), queries per CTA (dQ)

template <int D>
__host__ __device__ constexpr int row_ld() {  // padded shared-memory row, in bf16
  return D + 8;
}

__device__ __forceinline__ int imin(int a, int b) {
  return a < b ? a : b;
}
__device__ __forceinline__ int imax(int a, int b) {
  return a > b ? a : b;
}

// Rows [r0, r0 + R) of a bf16 matrix (row stride `stride`, D columns) into a padded shared
// tile by cp.async; rows at or past T are zero filled (and not read). Rolled: a loop the
// compiler keeps, for the loads a key loop issues ahead, whose unrolled addresses would stay
// live across the loop (the forward at head dim 64 spilled 52 bytes at 168 registers).
template <int D, int R, int Threads, bool Rolled = false>
__device__ __forceinline__ void tile_async(bf16* dst, const bf16* src, int64_t stride, int r0, int T) {
  constexpr int V = D / 8, N = R * V / Threads;
  static_assert(R * V % Threads == 0, "every thread copies as many vectors");
  auto copy = [&](int j) {
    const int i = threadIdx.x + j * Threads, r = i / V, c = (i % V) * 8;
    const bool ok = r0 + r < T;
    cp_async16(dst + r * row_ld<D>() + c, src + int64_t(ok ? r0 + r : 0) * stride + c, ok);
  };
  if constexpr (Rolled) {
#pragma unroll 1
    for (int j = 0; j < N; ++j) copy(j);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) copy(j);
  }
}

// A fragments (16 rows x 16 columns, column block kk) of a warp's 16 padded rows.
template <int D>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* rows, int kk) {
  const int lane = threadIdx.x % 32;
  ldmatrix<4>(a, rows + (lane % 16) * row_ld<D>() + kk * 16 + 8 * (lane / 16));
}

// B fragments of two 8-column blocks of X^T, where X is the padded tile `rows` (row n, column
// k): keys n0..n0+15 at dims k0..k0+15 (S = Q K^T, dP = dO V^T). b[0..1] block n0, b[2..3] n0+8.
template <int D>
__device__ __forceinline__ void load_bt(uint32_t (&b)[4], const bf16* rows, int n0, int k0) {
  const int lane = threadIdx.x % 32;
  ldmatrix<4>(b, rows + (n0 + lane % 8 + 8 * (lane / 16)) * row_ld<D>() + k0 + 8 * ((lane / 8) % 2));
}

// B fragments of two 8-column blocks of X itself (row k, column n): rows k0..k0+15, columns
// n0..n0+15 (O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q).
template <int D>
__device__ __forceinline__ void load_b(uint32_t (&b)[4], const bf16* rows, int k0, int n0) {
  const int lane = threadIdx.x % 32;
  ldmatrix<4, true>(b, rows + (k0 + lane % 8 + 8 * ((lane / 8) % 2)) * row_ld<D>() + n0 + 8 * (lane / 16));
}

__device__ __forceinline__ void mma2(float (&d0)[4], float (&d1)[4], const uint32_t (&a)[4], const uint32_t (&b)[4]) {
  const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
  mma_16816(d0, a, b0, d0);
  mma_16816(d1, a, b1, d1);
}

// gemm_abt's A operand: fragment kk of row tile r (16 rows each) of the warp, from registers
// loaded once for the first RegTiles tiles, read again from the rows in shared memory for the
// others (tile r at rows + 16 r).
template <int D, int RegTiles, int K>
struct AFragments {
  const uint32_t (&regs)[RegTiles > 0 ? RegTiles : 1][K][4];
  const bf16* rows;
  __device__ __forceinline__ void operator()(uint32_t (&a)[4], int r, int kk) const {
    if (r < RegTiles) {
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = regs[r][kk][i];
    } else {
      load_a<D>(a, rows + 16 * r * row_ld<D>(), kk);
    }
  }
};
// Every tile's fragments from registers (InRegs) or every tile's from shared memory.
template <int D, bool InRegs, int R, int K>
__device__ __forceinline__ AFragments<D, InRegs ? R : 0, K> a_fragments(const uint32_t (&regs)[R][K][4],
                                                                        const bf16* rows) {
  if constexpr (InRegs) {
    return {regs, rows};
  } else {
    return {reinterpret_cast<const uint32_t(&)[1][K][4]>(regs), rows};
  }
}
// One row tile's fragments (the warp's 16 rows).
template <int D, bool InRegs, int K>
__device__ __forceinline__ AFragments<D, InRegs ? 1 : 0, K> a_fragments(const uint32_t (&regs)[K][4],
                                                                        const bf16* rows) {
  return {reinterpret_cast<const uint32_t(&)[1][K][4]>(regs), rows};
}

// Zeroes a warp's accumulator fragments (16 rows x 8N columns).
template <int N>
__device__ __forceinline__ void acc_zero(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
}
template <int R, int N>
__device__ __forceinline__ void acc_zero(float (&acc)[R][N][4]) {
#pragma unroll
  for (int r = 0; r < R; ++r) acc_zero(acc[r]);
}

// acc[r][N/8] = A_r (16 x D, from `a_frag(r, kk)`) @ X^T for the N rows of the padded tile `xt`,
// for the warp's R row tiles: each B fragment of X is loaded once and feeds R tiles' mma.sync.
// Every accumulator sums its D / 16 products in kk order, whatever R is.
template <int D, int N, int R, class AFrag>
__device__ __forceinline__ void gemm_abt(float (&acc)[R][N / 8][4], AFrag a_frag, const bf16* xt) {
  acc_zero(acc);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) a_frag(a[r], r, kk);
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t b[4];
      load_bt<D>(b, xt, np * 16, kk * 16);
#pragma unroll
      for (int r = 0; r < R; ++r) mma2(acc[r][2 * np], acc[r][2 * np + 1], a[r], b);
    }
  }
}
template <int D, int N, class AFrag>
__device__ __forceinline__ void gemm_abt(float (&acc)[N / 8][4], AFrag a_frag, const bf16* xt) {
  gemm_abt<D, N, 1>(reinterpret_cast<float(&)[1][N / 8][4]>(acc), a_frag, xt);
}

// One A fragment (16 rows x 16 columns, bf16) from the fp32 accumulators of its two 8-column
// blocks.
__device__ __forceinline__ void pack_fragment(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}
// P_r (16 x N, fp32 accumulators) rounded to bf16 A fragments: the operand gemm_pb makes as it
// goes, made once where one P feeds a product and a store.
template <int N, int R>
__device__ __forceinline__ void pack_a(uint32_t (&a)[R][N / 16][4], const float (&p)[R][N / 8][4]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) pack_fragment(a[r][kk], p[r][2 * kk], p[r][2 * kk + 1]);
}

// acc[r][D/8] += A_r (16 x N, packed bf16 A fragments) @ X (N x D), for the warp's R row
// tiles, each B fragment of X loaded once. Each accumulator adds its N / 16 products in kk
// order, whatever R is.
template <int D, int N, int R>
__device__ __forceinline__ void gemm_ab(float (&acc)[R][D / 8][4], const uint32_t (&a)[R][N / 16][4], const bf16* x) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk)
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      load_b<D>(b, x, kk * 16, dp * 16);
#pragma unroll
      for (int r = 0; r < R; ++r) mma2(acc[r][2 * dp], acc[r][2 * dp + 1], a[r][kk], b);
    }
}

// gemm_ab of P_r (fp32 accumulators), rounded to bf16 a kk at a time: one packed fragment a
// row tile is live beside P.
template <int D, int N, int R>
__device__ __forceinline__ void gemm_pb(float (&acc)[R][D / 8][4], const float (&p)[R][N / 8][4], const bf16* x) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    uint32_t a[R][1][4];
#pragma unroll
    for (int r = 0; r < R; ++r) pack_fragment(a[r][0], p[r][2 * kk], p[r][2 * kk + 1]);
    gemm_ab<D, 16, R>(acc, a, x + kk * 16 * row_ld<D>());
  }
}
template <int D, int N>
__device__ __forceinline__ void gemm_pb(float (&acc)[D / 8][4], const float (&p)[N / 8][4], const bf16* x) {
  gemm_pb<D, N, 1>(reinterpret_cast<float(&)[1][D / 8][4]>(acc), reinterpret_cast<const float(&)[1][N / 8][4]>(p), x);
}

// One tile of the online softmax for a warp's 16 rows: s holds the raw scores (16 x N in the
// accumulator layout, masked ones -inf) and becomes P = 2^(s sl2 - max); the running max m
// (raw) and this lane's part of the row sums l move on, and the output o is rescaled.
template <int D, int N>
__device__ __forceinline__ void softmax_online(float (&s)[N / 8][4], float (&m)[2], float (&l)[2], float (&o)[D / 8][4],
                                               float sl2) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float mx = m[half];
#pragma unroll
    for (int n = 0; n < N / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float ms = mx == -INFINITY ? 0.0f : mx * sl2;  // a row with no key yet stays zero
    const float corr = exp2_approx(m[half] * sl2 - ms);
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < N / 8; ++n)
#pragma unroll
      for (int j = 2 * half; j < 2 * half + 2; ++j) {
        s[n][j] = exp2_approx(s[n][j] * sl2 - ms);
        sum += s[n][j];
      }
    l[half] = l[half] * corr + sum;
    m[half] = mx;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][2 * half] *= corr, o[n][2 * half + 1] *= corr;
  }
}

// sum_d dO[d] * O[d] of one padded shared row each, over the warp: each lane's D / 32 products
// in order, then the butterfly, as attention.cu's delta kernel (every lane gets the same bits).
// fmaf: the device fuses them; written so, the emulation does too, whatever it inlines.
template <int D>
__device__ __forceinline__ float row_delta(const bf16* dout_row, const bf16* out_row, int lane) {
  float s = 0.0f;
#pragma unroll
  for (int e = 0; e < D / 32; ++e) s = fmaf(f(dout_row[lane + 32 * e]), f(out_row[lane + 32 * e]), s);
  return warp_sum(s);
}

// A warp's two rows' sums: each lane holds a quarter of its rows' terms (the quad of lanes
// 4g..4g+3 shares rows g and g + 8).
__device__ __forceinline__ void quad_sum(float (&l)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
  }
}

// A warp's 16 accumulated rows (times `scale`) as bf16 rows r0.. of a strided matrix, staged
// through the warp's own 16 padded shared rows for 16-byte stores.
template <int D>
__device__ __forceinline__ void store_rows(bf16* dst, int64_t stride, int r0, int T, const float (&acc)[D / 8][4],
                                           float scale0, float scale1, bf16* stage) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    *reinterpret_cast<uint32_t*>(stage + g * row_ld<D>() + 8 * n + 2 * t) =
        pack_bf16(acc[n][0] * scale0, acc[n][1] * scale0);
    *reinterpret_cast<uint32_t*>(stage + (g + 8) * row_ld<D>() + 8 * n + 2 * t) =
        pack_bf16(acc[n][2] * scale1, acc[n][3] * scale1);
  }
  __syncwarp();
  constexpr int V = D / 8;
#pragma unroll
  for (int j = 0; j < V / 2; ++j) {
    const int i = lane + 32 * j, r = i / V, c = (i % V) * 8;
    if (r0 + r < T)
      *reinterpret_cast<int4*>(dst + int64_t(r0 + r) * stride + c) =
          *reinterpret_cast<const int4*>(stage + r * row_ld<D>() + c);
  }
}

// Tile shapes per head dim. Context parallel's block kernels (attention_block.cu) keep 16 rows a
// warp: forward CTAs of 128 query rows (8 warps) at D = 32, 64 rows (4 warps) at 64 and 128,
// three CTAs per SM at D = 64 (168 registers, no spill; four spill), two elsewhere; their
// backward keeps its operands in shared memory at 128 and walks 32-query tiles there.
// The flash kernels (attention_flash{,_bwd}.cu) give a warp two tiles of 16 rows at D <= 64, so that
// each fragment an ldmatrix loads feeds both tiles' mma.sync (issue 53: ~2 mma per ldmatrix at
// one tile, ~4 at two): the forward and dQ 4 warps of 32 query rows (128-row CTAs), dK/dV 4
// warps of 32 keys (128-key CTAs). The forward at D = 64 takes S and the online softmax over
// 32 keys of its 64-key tile at a time (S of two tiles over 64 keys beside O and Q would not
// fit), with its key loop's loads rolled: 168 registers, three CTAs per SM, no spill (at 64
// keys a step it spilled 348 bytes there, so it ran two CTAs at 255). dQ and dK/dV run two CTAs
// per SM by their registers (245-255, no spill). dQ from the stored dS gives a warp three tiles
// (192-row CTAs, 72 KB of tiles: three CTAs per SM, 160 registers; four tiles' 90 KB fit two).
// dK/dV keeps its K fragments and the first key tile's V fragments in registers and rereads
// the second tile's (all of them spill 24 bytes). At D = 128 each keeps one tile (two spilled:
// 88 bytes in the forward with Q reread, 812 in dK/dV), and dQ's fit only by rereading Q and dO
// for every 16 keys (the same 1.7 mma per ldmatrix) at one CTA per SM (139 KB tiles).
template <int D>
struct Plan {
  static constexpr int kFwdWarps = D <= 32 ? 8 : 4;
  static constexpr int kFwdBlocksPerSm = D == 64 ? 3 : 2;
  static constexpr int kDqBlocksPerSm = D == 64 ? 3 : 0;
  static constexpr bool kARegs = D <= 64;
  static constexpr int kBq = D <= 64 ? 64 : 32;
  // The flash kernels (attention_flash{,_bwd}.cu).
  static constexpr int kFlashFwdRowTiles = D <= 64 ? 2 : 1;
  static constexpr int kFlashFwdBlocksPerSm = D == 64 ? 3 : 2;
  static constexpr int kFlashFwdKeyChunk = D == 64 ? 32 : kKeys;
  static constexpr bool kFlashFwdQRegs = true;
  static constexpr int kFlashDqRowTiles = D <= 64 ? 2 : 1;
  static constexpr int kFlashDqBlocksPerSm = D == 64 ? 2 : 0;
  static constexpr int kFlashDqDsBlocksPerSm = 3;
  static constexpr int kFlashDkvKeyTiles = D <= 64 ? 2 : 1;
  static constexpr int kFlashDkvVRegTiles = D <= 32 ? 2 : 1;
};

template <int D, int Warps, int RowTiles = 1>
struct FwdShape {
  static constexpr int kRows = 16 * RowTiles * Warps;
  static constexpr int kThreads = 32 * Warps;
  static constexpr size_t kSmem = size_t(kRows + 4 * kKeys) * row_ld<D>() * 2;  // Q, K[2], V[2]
};

// The first key query t of sequence bi attends to: its document's first token (pos = null:
// the sequence's).
__device__ __forceinline__ int first_key(const int32_t* pos, int bi, int T, int t) {
  return pos && t < T ? t - pos[int64_t(bi) * T + t] : 0;
}

// Grid order: x, the fastest in launch order, walks one head's tiles, then y the heads (a GQA
// group's query heads next to each other), then z the sequences. Blocks start in that order, so
// the CTAs resident at once (2-3 per SM, ~264-396 on an H100) are a few heads' tiles, whose K/V (or
// Q/dO) they share: GPT-2 124M (T 1024, D 64) reads 256 KB of K/V a head, ~9 MB in flight for
// ~33 heads, well inside the 50 MB L2, so a head's K/V comes from DRAM about once. With heads
// fastest (the order before), the resident CTAs were one query tile of every head: all 192
// heads' K/V (50 MB; qkv 75 MB) in flight, and each head's next tile, a wave later, missed L2.
// At T 8192, D 128 a head's K/V is 4 MB and 2-3 heads (128 tiles each) are in flight: they
// still fit, where heads fastest would put every head's in flight (256 MB). Longest first
// holds within a head only: the grid ends on one head's short tiles, after at most one long one.
// The counts see requested bytes, not L2 hits: this is argued from footprints, to be measured.
inline dim3 grid_order(int tiles, int heads, int B) {
  LOOM_CHECK(heads <= 65535 && B <= 65535, "flash attention takes at most 65535 heads ({}) and sequences ({}) a launch",
             heads, B);
  return dim3(unsigned(tiles), unsigned(heads), unsigned(B));
}

}  // namespace loom::cuda::flash
