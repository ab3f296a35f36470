// The flash attention's backward (the forward and its layout: attention_flash.cu),
// deterministic without atomics: dQ (a CTA per query tile walking its key tiles, a warp per two
// 16-row tiles, its rows' delta = rowsum(dO * O) first, written for the next kernel), then dK/dV
// (a CTA per key tile, a warp per two 16-key tiles with dK and dV in registers, walking every
// query tile of every head in its group, in order); S and dP are computed in both, the price of
// no atomics, unless the caller gives a scratch for dS (head dim 64, no document starts:
// kernels/flash_ds.h): then a delta pass, dK/dV storing each dS tile as bf16, and dQ = dS K
// walking the key tiles in order, one product a tile, the same bf16 operands added in the same
// order (the delta pass and dQ = dS K: attention_flash_ds.cu). dS is rounded to bf16 for its
// products, as in FlashAttention.
#include <cstdint>

#include "kernels/cuda/attention_flash_ds.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_tiles.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/flash_ds.h"

namespace loom::cuda {

namespace {

using namespace flash;

// dQ: a CTA of 4 warps, each with kFlashDqRowTiles tiles of 16 query rows, walking the key
// tiles as the forward does, its rows' delta = rowsum(dO * O) computed first from the dO tile
// and an O tile (and written for dK/dV, which runs after it: no separate delta pass over dO and
// O). With ARegs the warp's Q and dO fragments stay in registers, else they are read from
// shared memory at each use (head dim 128, where registers would spill). With two row tiles a
// key tile goes in two halves of 32 keys (S, dP and dS of two tiles over 64 keys would not fit
// the registers beside dQ, Q and dO); each dQ accumulator still adds its key blocks in order.
template <int D>
struct DqShape {
  static constexpr int kRowTiles = Plan<D>::kFlashDqRowTiles;
  static constexpr int kRows = 4 * 16 * kRowTiles;
  static constexpr int kThreads = 128;
  static constexpr int kKeyChunk = kRowTiles > 1 ? kKeys / 4 : kKeys;
  // Q, dO, then two buffers of a K tile and a V tile (the O tile borrows the second).
  static constexpr size_t kSmem = size_t(2 * kRows + 4 * kKeys) * row_ld<D>() * 2;
};

template <int D>
__global__ void __launch_bounds__(128, Plan<D>::kFlashDqBlocksPerSm)
    attention_dq_flash_kernel(bf16* dqkv, float* delta, const bf16* dout, const bf16* out, const bf16* qkv,
                              const float* lse, const int32_t* pos, int T, int H, int KV, float scale) {
  using S = DqShape<D>;
  constexpr bool ARegs = Plan<D>::kARegs;
  constexpr int R = S::kRowTiles, WR = 16 * R, KC = S::kKeyChunk;
  constexpr int LD = row_ld<D>(), BR = S::kRows, NT = S::kThreads;
  LOOM_DYNAMIC_SHARED(unsigned char, smem, 128);
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* dos = qs + BR * LD;
  bf16* kvs = dos + BR * LD;                  // [2][K, V][kKeys][LD]
  const int h = blockIdx.y, bi = blockIdx.z;  // as the forward's
  const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row = (H + 2 * KV) * D, kvh = h / (H / KV);
  const bf16* base = qkv + int64_t(bi) * T * row;
  const bf16* kbase = base + (H + kvh) * D;
  const bf16* vbase = base + (H + KV + kvh) * D;
  const float sl2 = scale * kLog2e;
  const int kt0 = first_key(pos, bi, T, q0) / kKeys;
  const int kt1 = (imin(q0 + BR, T) + kKeys - 1) / kKeys;
  const int64_t orow = int64_t(H) * D, obase = int64_t(bi) * T * orow + h * D;
  tile_async<D, BR, NT>(qs, base + h * D, row, q0, T);
  tile_async<D, BR, NT>(dos, dout + obase, orow, q0, T);
  tile_async<D, kKeys, NT>(kvs, kbase, row, kt0 * kKeys, T);
  tile_async<D, kKeys, NT>(kvs + kKeys * LD, vbase, row, kt0 * kKeys, T);
  static_assert(BR <= 2 * kKeys, "the O tile borrows the second K/V buffer");
  bf16* os = kvs + 2 * kKeys * LD;
  tile_async<D, BR, NT>(os, out + obase, orow, q0, T);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  const int wq = q0 + WR * w, fw = first_key(pos, bi, T, wq);
  const int64_t stat0 = (int64_t(bi) * H + h) * T;
  int r0[R], r1[R], f0[R], f1[R];  // tile r's rows g and g + 8, and their documents' first keys
  float l0[R], l1[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    r0[r] = wq + 16 * r + g, r1[r] = r0[r] + 8;
    f0[r] = first_key(pos, bi, T, r0[r]), f1[r] = first_key(pos, bi, T, r1[r]);
    l0[r] = r0[r] < T ? lse[stat0 + r0[r]] * kLog2e : 0.0f, l1[r] = r1[r] < T ? lse[stat0 + r1[r]] * kLog2e : 0.0f;
  }
  // delta = rowsum(dO * O) of the warp's rows, as the delta kernel sums it (rows past T: zero
  // filled, 0), written for dK/dV; then the K/V buffer the O tile borrowed is free again.
  float d0[R], d1[R];
#pragma unroll
  for (int r = 0; r < R; ++r) d0[r] = d1[r] = 0.0f;
#pragma unroll 1
  for (int i = 0; i < WR; ++i) {
    const float d = row_delta<D>(dos + (WR * w + i) * LD, os + (WR * w + i) * LD, lane);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      d0[r] = i == 16 * r + g ? d : d0[r];
      d1[r] = i == 16 * r + g + 8 ? d : d1[r];
    }
    // A row at a time (stored by the warp's 16 lanes at once instead, the kernel would spill 4 bytes).
    if (lane == 0 && wq + i < T) delta[stat0 + wq + i] = d;
  }
  __syncthreads();
  const bf16* qw = qs + WR * w * LD;
  const bf16* dow = dos + WR * w * LD;
  uint32_t qf[ARegs ? R : 1][ARegs ? D / 16 : 1][4], dof[ARegs ? R : 1][ARegs ? D / 16 : 1][4];
  if constexpr (ARegs) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        load_a<D>(qf[r][kk], qw + 16 * r * LD, kk), load_a<D>(dof[r][kk], dow + 16 * r * LD, kk);
  }
  float dq[R][D / 8][4];
  acc_zero(dq);

  for (int kt = kt0; kt < kt1; ++kt) {
    const int buf = (kt - kt0) % 2, k0 = kt * kKeys;
    if (kt + 1 < kt1) {
      bf16* next = kvs + (buf ^ 1) * 2 * kKeys * LD;
      tile_async<D, kKeys, NT>(next, kbase, row, k0 + kKeys, T);
      tile_async<D, kKeys, NT>(next + kKeys * LD, vbase, row, k0 + kKeys, T);
    }
    cp_async_commit();
#pragma unroll
    for (int c = 0; c < kKeys / KC; ++c) {
      const int kc0 = k0 + c * KC;
      const bf16* kt_s = kvs + (buf * 2 * kKeys + c * KC) * LD;
      const bf16* vt_s = kt_s + kKeys * LD;
      // Skipped where every row precedes the keys or every document starts after them: their
      // dS are all zero, so dQ keeps its bits.
      if (kc0 <= wq + WR - 1 && kc0 + KC > fw) {
        float sc[R][KC / 8][4], dp[R][KC / 8][4];
        gemm_abt<D, KC, R>(sc, a_fragments<D, ARegs>(qf, qw), kt_s);
        gemm_abt<D, KC, R>(dp, a_fragments<D, ARegs>(dof, dow), vt_s);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int n = 0; n < KC / 8; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int key = kc0 + 8 * n + 2 * t + i % 2, q = i < 2 ? r0[r] : r1[r], f = i < 2 ? f0[r] : f1[r];
              // fmaf: the device fuses it; written so, the emulation does too, as dK/dV does.
              const float p =
                  key <= q && key >= f ? exp2_approx(fmaf(sc[r][n][i], sl2, -(i < 2 ? l0[r] : l1[r]))) : 0.0f;
              sc[r][n][i] = p * (dp[r][n][i] - (i < 2 ? d0[r] : d1[r]));  // dS
            }
        gemm_pb<D, KC, R>(dq, sc, kt_s);
      }
    }
    cp_async_wait<0>();
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
    store_rows<D>(dqkv + int64_t(bi) * T * row + h * D, row, wq + 16 * r, T, dq[r], scale, scale,
                  qs + (WR * w + 16 * r) * LD);
}

// dS as dK/dV holds it (a warp's 16R keys x 16 queries from qc0, transposed in its accumulators)
// into its 64 x 64 tile of the stored dS: row = query, column = key, bf16 rounded as dQ's mma
// rounds it. A chunk's queries and a warp's keys fall in one tile each; dK/dV computes every
// chunk on or below the diagonal that a dQ warp reads (its queries reach its first key), and
// only tiles on or below the diagonal.
template <int R, int KK>
__device__ __forceinline__ void store_ds(bf16* ds, const uint32_t (&dsa)[R][KK][4], int bi, int h, int H, int T,
                                         int qc0, int wk) {
  constexpr int E = kFlashDsTile;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int qb = qc0 / E, kb = wk / E;
  // One pointer, the lane's first element; every store an immediate offset from it (dK/dV is at
  // its register limit).
  bf16* at = ds + ((int64_t(bi) * H + h) * flash_ds_tiles(T) + qb * (qb + 1) / 2 + kb) * E * E + (qc0 % E + 2 * t) * E +
             wk % E + g;
  // Accumulator block n, element i (query 8n + 2t + i % 2, key 16r + g + 8 (i / 2)) is half
  // i % 2 of word 2 (n % 2) + i / 2 of fragment n / 2 (pack_fragment).
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int n = 0; n < 2 * KK; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t word = dsa[r][n / 2][2 * (n % 2) + i / 2];
        const uint16_t half = uint16_t(i % 2 ? word >> 16 : word & 0xffffu);
        memcpy(&at[(8 * n + i % 2) * E + 16 * r + (i < 2 ? 0 : 8)], &half, 2);
      }
}

// dK and dV: a CTA of 4 warps of one kv head, each warp kFlashDkvKeyTiles tiles of 16 keys with
// their dK and dV accumulators in registers, walking the query tiles (BQ rows) of every query
// head of the group in order; Q, dO and the tiles' lse, delta and positions double-buffered,
// all by cp.async. With two key tiles a query tile goes in chunks of 16 queries (S^T, dP^T of
// two tiles over 64 queries would not fit the registers beside dK, dV, K and V); each
// accumulator still adds its query blocks in order, and each Q/dO fragment feeds both tiles.
template <int D>
struct DkvShape {
  static constexpr int kKeyTiles = Plan<D>::kFlashDkvKeyTiles;
  static constexpr int kRows = 4 * 16 * kKeyTiles;  // keys per CTA
  static constexpr int kBq = Plan<D>::kBq;
  static constexpr int kQueryChunk = kKeyTiles > 1 ? 16 : kBq;
  static constexpr int kThreads = 128;
  static constexpr size_t kSmem = size_t(2 * kRows + 4 * kBq) * row_ld<D>() * 2 + size_t(2 * 3 * kBq) * 4;
};

// StoreDs (head dim 64, no document starts, pos null): each chunk's dS also goes to `ds` as
// bf16, for attention_dq_ds_flash_kernel (kernels/flash_ds.h has the layout's size).
template <int D, bool StoreDs>
__device__ __forceinline__ void dkv_flash(bf16* dqkv, bf16* ds_store, const bf16* dout, const bf16* qkv,
                                          const float* lse, const float* delta, const int32_t* pos, int T, int H,
                                          int KV, float scale) {
  using S = DkvShape<D>;
  constexpr bool ARegs = Plan<D>::kARegs;
  constexpr int R = S::kKeyTiles, WR = 16 * R, QC = S::kQueryChunk;
  constexpr int BQ = S::kBq, LD = row_ld<D>(), BK = S::kRows, NT = S::kThreads;
  // The stored dS is planned without document starts: no per-query positions to read (the
  // chunk's skip test still reads its first, T: without it the kernel spills 8 bytes).
  constexpr bool Docs = !StoreDs;
  LOOM_DYNAMIC_SHARED(unsigned char, smem, 128);
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = ks + BK * LD;
  bf16* qs = vs + BK * LD;  // [2][BQ][LD]
  bf16* dos = qs + 2 * BQ * LD;
  float* lse_s = reinterpret_cast<float*>(dos + 2 * BQ * LD);  // [2][BQ]
  float* delta_s = lse_s + 2 * BQ;
  int* pos_s = reinterpret_cast<int*>(delta_s + 2 * BQ);  // T throughout without document starts
  // x: key tiles, the first (seen by the most queries) first; y: kv head; z: sequence.
  const int kvh = blockIdx.y, bi = blockIdx.z, k0 = blockIdx.x * BK;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row = (H + 2 * KV) * D, group = H / KV;
  const bf16* base = qkv + int64_t(bi) * T * row;
  const float sl2 = scale * kLog2e;
  // Query tiles from the diagonal on, up to the first whose document starts past these keys.
  static_assert(BK % BQ == 0, "a key tile's diagonal starts a query tile");
  const int qt0 = k0 / BQ;
  int qt1 = qt0;
  while (qt1 * BQ < T && first_key(pos, bi, T, qt1 * BQ) < k0 + BK) ++qt1;
  const int per_head = qt1 - qt0, steps = group * per_head;
  auto load = [&](int h, int q0, int buf) {
    tile_async<D, BQ, NT>(qs + buf * BQ * LD, base + h * D, row, q0, T);
    tile_async<D, BQ, NT>(dos + buf * BQ * LD, dout + int64_t(bi) * T * H * D + h * D, int64_t(H) * D, q0, T);
    // The tile's lse, delta and positions by 4-byte cp.async in the tiles' group: nothing
    // waits on them before this step's compute (rows past T zero filled).
    const int64_t stat0 = (int64_t(bi) * H + h) * T;
    for (int j = threadIdx.x; j < (pos ? 3 : 2) * BQ; j += NT) {
      const int which = j / BQ, i = j % BQ;
      const bool ok = q0 + i < T;
      const int64_t at = ok ? q0 + i : 0;
      const void* src = which == 0   ? static_cast<const void*>(lse + stat0 + at)
                        : which == 1 ? static_cast<const void*>(delta + stat0 + at)
                                     : static_cast<const void*>(pos + int64_t(bi) * T + at);
      cp_async4(lse_s + (2 * which + buf) * BQ + i, src, ok);
    }
  };
  tile_async<D, BK, NT>(ks, base + (H + kvh) * D, row, k0, T);
  tile_async<D, BK, NT>(vs, base + (H + KV + kvh) * D, row, k0, T);
  if (steps > 0) load(kvh * group, qt0 * BQ, 0);
  if (!pos)  // a query's document then starts at or before key 0, and no test branches on pos
    for (int i = threadIdx.x; i < 2 * BQ; i += NT) pos_s[i] = T;
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  const int wk = k0 + WR * w;  // the warp's first key
  const bf16* kw = ks + WR * w * LD;
  const bf16* vw = vs + WR * w * LD;
  constexpr int VRegTiles = ARegs ? Plan<D>::kFlashDkvVRegTiles : 0;
  uint32_t kf[ARegs ? R : 1][ARegs ? D / 16 : 1][4], vf[VRegTiles > 0 ? VRegTiles : 1][D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int r = 0; r < R; ++r)
      if constexpr (ARegs) load_a<D>(kf[r][kk], kw + 16 * r * LD, kk);
#pragma unroll
    for (int r = 0; r < VRegTiles; ++r) load_a<D>(vf[r][kk], vw + 16 * r * LD, kk);
  }
  float dk[R][D / 8][4], dv[R][D / 8][4];
  acc_zero(dk), acc_zero(dv);

  // The step's query tile q0 of head h; the steps walk a head's tiles, then the next head's.
  for (int step = 0, h = kvh * group, q0 = qt0 * BQ; step < steps; ++step) {
    const int buf = step % 2;
    const bool head_ends = q0 == (qt1 - 1) * BQ;
    const int next_h = head_ends ? h + 1 : h, next_q0 = head_ends ? qt0 * BQ : q0 + BQ;
    if (step + 1 < steps) load(next_h, next_q0, buf ^ 1);
    cp_async_commit();
#pragma unroll 1
    for (int c = 0; c < BQ / QC; ++c) {
      const int qc0 = q0 + c * QC;
      const bf16* qt_s = qs + (buf * BQ + c * QC) * LD;
      const bf16* dot_s = dos + (buf * BQ + c * QC) * LD;
      const float* ls = lse_s + buf * BQ + c * QC;
      const float* ds = delta_s + buf * BQ + c * QC;
      const int* ps = pos_s + buf * BQ + c * QC;
      // Skipped where every query precedes the warp's keys, or every document starts after
      // them: the skipped dS and P are all zero, so dK and dV keep their bits.
      if (qc0 + QC - 1 >= wk && qc0 - ps[0] < wk + WR) {
        float st[R][QC / 8][4], dpt[R][QC / 8][4];  // S^T and dP^T: the warp's keys x the chunk's queries
        gemm_abt<D, QC, R>(st, a_fragments<D, ARegs>(kf, kw), qt_s);
        gemm_abt<D, QC, R>(dpt, AFragments<D, VRegTiles, D / 16>{vf, vw}, dot_s);
        // The lane's columns 8n + 2t and 8n + 2t + 1: their statistics loaded once for both key
        // tiles, side by side, and the mask a select after an unconditional exp, so no load
        // waits on a test. fmaf: the device fuses the scaling into one rounding; so does the
        // emulation, whatever it inlines.
        float2 lq[QC / 8], dq[QC / 8];
        int2 pq[QC / 8];
#pragma unroll
        for (int n = 0; n < QC / 8; ++n) {
          lq[n] = *reinterpret_cast<const float2*>(ls + 8 * n + 2 * t);
          dq[n] = *reinterpret_cast<const float2*>(ds + 8 * n + 2 * t);
          if constexpr (Docs) pq[n] = *reinterpret_cast<const int2*>(ps + 8 * n + 2 * t);
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int n = 0; n < QC / 8; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const bool odd = i % 2;
              const int q = qc0 + 8 * n + 2 * t + i % 2, key = wk + 16 * r + g + (i < 2 ? 0 : 8);
              const int first = Docs ? q - (odd ? pq[n].y : pq[n].x) : 0;  // the query's document start
              const bool live = (key <= q) & (q < T) & (key >= first);
              const float lse2 = (odd ? lq[n].y : lq[n].x) * kLog2e;
              const float e = exp2_approx(fmaf(st[r][n][i], sl2, -lse2));
              const float p = live ? e : 0.0f;
              st[r][n][i] = p;
              dpt[r][n][i] = p * (dpt[r][n][i] - (odd ? dq[n].y : dq[n].x));  // dS^T
            }
        if constexpr (StoreDs) {
          // dS^T rounded once (as gemm_pb rounds it): 8 registers a tile, not 16, live through
          // dV's product and the store (unpacked, they spilled 8 bytes). Without the store,
          // rounding a kk at a time keeps fewer live (packed first, it spills 4).
          uint32_t dsa[R][QC / 16][4];
          pack_a<QC, R>(dsa, dpt);
          gemm_pb<D, QC, R>(dv, st, dot_s);
          store_ds(ds_store, dsa, bi, h, H, T, qc0, wk);
          gemm_ab<D, QC, R>(dk, dsa, qt_s);
        } else {
          gemm_pb<D, QC, R>(dv, st, dot_s);
          gemm_pb<D, QC, R>(dk, dpt, qt_s);
        }
      }
    }
    cp_async_wait<0>();
    __syncthreads();
    h = next_h, q0 = next_q0;
  }
  bf16* drows = dqkv + int64_t(bi) * T * row;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    store_rows<D>(drows + (H + kvh) * D, row, wk + 16 * r, T, dk[r], scale, scale, ks + (WR * w + 16 * r) * LD);
    store_rows<D>(drows + (H + KV + kvh) * D, row, wk + 16 * r, T, dv[r], 1.0f, 1.0f, vs + (WR * w + 16 * r) * LD);
  }
}

template <int D>
__global__ void __launch_bounds__(128)
    attention_dkv_flash_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta,
                               const int32_t* pos, int T, int H, int KV, float scale) {
  dkv_flash<D, false>(dqkv, nullptr, dout, qkv, lse, delta, pos, T, H, KV, scale);
}
__global__ void __launch_bounds__(128)
    attention_dkv_ds_flash_kernel(bf16* dqkv, bf16* ds, const bf16* dout, const bf16* qkv, const float* lse,
                                  const float* delta, int T, int H, int KV, float scale) {
  dkv_flash<64, true>(dqkv, ds, dout, qkv, lse, delta, nullptr, T, H, KV, scale);
}

template <int D>
void backward_d(bf16* dqkv, const bf16* dout, const bf16* out, const bf16* qkv, const float* lse, float* delta, int B,
                int T, int H, int KV, const int32_t* pos, bf16* ds, int64_t ds_elems, cudaStream_t s) {
  const float scale = 1.0f / sqrtf(float(D));
  aligned16_check(qkv, "flash attention", "qkv");
  aligned16_check(dout, "flash attention", "dout");
  aligned16_check(dqkv, "flash attention", "dqkv");
  aligned16_check(out, "flash attention", "out");
  constexpr size_t dkv_smem = DkvShape<D>::kSmem;
  if constexpr (D == 64) {
    const int64_t need = flash_ds_elems(B, T, H, D, pos != nullptr);
    if (ds && need > 0 && ds_elems >= need) {  // delta, dK/dV storing dS, then dQ = dS K
      aligned16_check(ds, "flash attention", "stored dS");
      ds_delta(delta, dout, out, B, T, H, s);
      smem_allow(attention_dkv_ds_flash_kernel, dkv_smem);
      LOOM_LAUNCH(attention_dkv_ds_flash_kernel, grid_order(blocks_for(T, DkvShape<D>::kRows), KV, B),
                  DkvShape<D>::kThreads, dkv_smem, s)
      (dqkv, ds, dout, qkv, lse, delta, T, H, KV, scale);
      LOOM_CUDA_LAUNCHED();
      ds_dq(dqkv, ds, qkv, B, T, H, KV, scale, s);
      return;
    }
  }
  constexpr size_t dq_smem = DqShape<D>::kSmem;
  smem_allow(attention_dq_flash_kernel<D>, dq_smem);
  smem_allow(attention_dkv_flash_kernel<D>, dkv_smem);
  LOOM_LAUNCH(attention_dq_flash_kernel<D>, grid_order(blocks_for(T, DqShape<D>::kRows), H, B), DqShape<D>::kThreads,
              dq_smem, s)
  (dqkv, delta, dout, out, qkv, lse, pos, T, H, KV, scale);
  LOOM_CUDA_LAUNCHED();
  LOOM_LAUNCH(attention_dkv_flash_kernel<D>, grid_order(blocks_for(T, DkvShape<D>::kRows), KV, B),
              DkvShape<D>::kThreads, dkv_smem, s)
  (dqkv, dout, qkv, lse, delta, pos, T, H, KV, scale);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace

void attention_backward(bf16* dqkv, const bf16* dout, const bf16* out, const bf16* qkv, const float* lse,
                        float* scratch, int B, int T, int H, int KV, int D, const int32_t* pos, cudaStream_t s,
                        bf16* ds, int64_t ds_elems) {
  if (D == 64) return backward_d<64>(dqkv, dout, out, qkv, lse, scratch, B, T, H, KV, pos, ds, ds_elems, s);
  if (D == 128) return backward_d<128>(dqkv, dout, out, qkv, lse, scratch, B, T, H, KV, pos, ds, ds_elems, s);
  if (D == 32) return backward_d<32>(dqkv, dout, out, qkv, lse, scratch, B, T, H, KV, pos, ds, ds_elems, s);
  fail("CUDA attention supports head dims 32, 64 and 128, not {}; change model.d_model / model.n_head", D);
}

}  // namespace loom::cuda
