// Causal attention in the FlashAttention-2 structure on mma.sync m16n8k16 (bf16 operands,
// fp32 accumulators; kernels/cuda/mma.cuh), head dims 32, 64 and 128, grouped-query heads by
// head mapping (kv head = h / (H / KV), no copies), data.doc_mask's document starts (pos).
// Forward: a block of query rows per CTA, a warp per 16 rows with its Q fragments in
// registers, K/V tiles of 64 keys streamed through shared memory by cp.async into two buffers
// (the next tile lands while this one is used), S = QK^T and O += PV with the online softmax
// in registers (P goes from the S accumulators straight into A fragments), log-sum-exp
// written for the backward and context parallel; key tiles above the diagonal are skipped and
// the CTAs with the longest rows start first. Backward, deterministic without atomics: dQ (a
// CTA per query tile walking its key tiles, its rows' delta = rowsum(dO * O) first, written
// for the next kernel), then dK/dV (a CTA per
// key tile, dK and dV in registers, walking every query tile of every head in its group, in
// order); S and dP are computed in both, the price of no atomics. P and dS are rounded to bf16
// for their products, as in FlashAttention. Shared-memory rows are padded by 16 bytes, so the
// eight 16-byte rows an ldmatrix or cp.async phase touches fall in distinct banks.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_tiles.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace loom::cuda {

namespace {

using namespace flash;

// The first key query t of sequence bi attends to: its document's first token (pos = null:
// the sequence's).
__device__ __forceinline__ int first_key(const int32_t* pos, int bi, int T, int t) {
  return pos && t < T ? t - pos[int64_t(bi) * T + t] : 0;
}

template <int D>
__global__ void __launch_bounds__(32 * Plan<D>::kFwdWarps, Plan<D>::kFwdBlocksPerSm)
    attention_forward_flash_kernel(bf16* out, float* lse, const bf16* qkv, const int32_t* pos, int T, int H, int KV,
                                   float scale) {
  using S = FwdShape<D, Plan<D>::kFwdWarps>;
  constexpr int LD = row_ld<D>(), BR = S::kRows;
  LOOM_DYNAMIC_SHARED(unsigned char, smem, 128);
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = qs + BR * LD;  // [2][kKeys][LD]
  bf16* vs = ks + 2 * kKeys * LD;
  // x: head and sequence; y: query tiles, the last (longest rows) first.
  const int h = blockIdx.x % H, bi = blockIdx.x / H;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * BR;
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

  const int wq = q0 + 16 * w;  // the warp's first row
  const int r0 = wq + g, r1 = wq + g + 8;
  const int f0 = first_key(pos, bi, T, r0), f1 = first_key(pos, bi, T, r1);
  const int fw = first_key(pos, bi, T, wq);  // the warp's earliest document start
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) load_a<D>(qf[kk], qs + 16 * w * LD, kk);
  float o[D / 8][4];
  acc_zero(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this lane's part of the row sum

  for (int kt = kt0; kt < kt1; ++kt) {
    const int buf = (kt - kt0) % 2, k0 = kt * kKeys;
    if (kt + 1 < kt1) {
      tile_async<D, kKeys, S::kThreads>(ks + (buf ^ 1) * kKeys * LD, kbase, row, k0 + kKeys, T);
      tile_async<D, kKeys, S::kThreads>(vs + (buf ^ 1) * kKeys * LD, vbase, row, k0 + kKeys, T);
    }
    cp_async_commit();
    const bf16* kt_s = ks + buf * kKeys * LD;
    const bf16* vt_s = vs + buf * kKeys * LD;
    // A warp whose rows all precede the tile's keys (causal), or whose documents all start
    // past it, skips it (the condition is the warp's: document starts never decrease).
    if (k0 <= wq + 15 && k0 + kKeys > fw) {
      float s[kKeys / 8][4];
      gemm_abt<D, kKeys>(s, a_fragments<D, true>(qf, nullptr), kt_s);
      const bool edge = k0 + kKeys - 1 > wq || k0 < imax(f0, f1);
      if (edge) {
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int key = k0 + 8 * n + 2 * t + i % 2, r = i < 2 ? r0 : r1, f = i < 2 ? f0 : f1;
            if (key > r || key < f) s[n][i] = -INFINITY;
          }
      }
      softmax_online<D, kKeys>(s, m, l, o, sl2);
      gemm_pb<D, kKeys>(o, s, vt_s);
    }
    cp_async_wait<0>();
    __syncthreads();  // the next tile has landed; every warp is done with this one
  }
  quad_sum(l);
  store_rows<D>(out + int64_t(bi) * T * H * D + h * D, int64_t(H) * D, wq, T, o, 1.0f / l[0], 1.0f / l[1],
                qs + 16 * w * LD);
  if (t == 0) {
    float* ls = lse + (int64_t(bi) * H + h) * T;
    if (r0 < T) ls[r0] = m[0] * scale + logf(l[0]);
    if (r1 < T) ls[r1] = m[1] * scale + logf(l[1]);
  }
}

// dQ: a CTA of 4 warps per 64 query rows, walking the key tiles as the forward does, its rows'
// delta = rowsum(dO * O) computed first from the dO tile and an O tile (and written for dK/dV,
// which runs after it: no separate delta pass over dO and O). With
// ARegs the warp's Q and dO fragments stay in registers, else they are read from shared
// memory at each use (head dim 128, where registers would spill).
template <int D, bool ARegs>
struct DqShape {
  static constexpr int kThreads = 128;
  static constexpr size_t kSmem = size_t(2 * 64 + 4 * kKeys) * row_ld<D>() * 2;  // Q, dO, K[2], V[2]
};

template <int D>
__global__ void __launch_bounds__(128, Plan<D>::kDqBlocksPerSm)
    attention_dq_flash_kernel(bf16* dqkv, float* delta, const bf16* dout, const bf16* out, const bf16* qkv,
                              const float* lse, const int32_t* pos, int T, int H, int KV, float scale) {
  constexpr bool ARegs = Plan<D>::kARegs;
  constexpr int LD = row_ld<D>(), BR = 64, NT = DqShape<D, ARegs>::kThreads;
  LOOM_DYNAMIC_SHARED(unsigned char, smem, 128);
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* dos = qs + BR * LD;
  bf16* ks = dos + BR * LD;  // [2][kKeys][LD]
  bf16* vs = ks + 2 * kKeys * LD;
  const int h = blockIdx.x % H, bi = blockIdx.x / H;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * BR;
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
  tile_async<D, kKeys, NT>(ks, kbase, row, kt0 * kKeys, T);
  tile_async<D, kKeys, NT>(vs, vbase, row, kt0 * kKeys, T);
  static_assert(BR == kKeys, "the O tile borrows the second K buffer");
  tile_async<D, BR, NT>(ks + kKeys * LD, out + obase, orow, q0, T);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  const int wq = q0 + 16 * w, r0 = wq + g, r1 = wq + g + 8;
  const int f0 = first_key(pos, bi, T, r0), f1 = first_key(pos, bi, T, r1), fw = first_key(pos, bi, T, wq);
  const int64_t stat0 = (int64_t(bi) * H + h) * T;
  const float l0 = r0 < T ? lse[stat0 + r0] * kLog2e : 0.0f, l1 = r1 < T ? lse[stat0 + r1] * kLog2e : 0.0f;
  // delta = rowsum(dO * O) of the warp's rows, as the delta kernel sums it (rows past T: zero
  // filled, 0), written for dK/dV; then the K buffer the O tile borrowed is free again.
  float d0 = 0.0f, d1 = 0.0f;
#pragma unroll 1
  for (int r = 0; r < 16; ++r) {
    const float d = row_delta<D>(dos + (16 * w + r) * LD, ks + (kKeys + 16 * w + r) * LD, lane);
    d0 = r == g ? d : d0;
    d1 = r == g + 8 ? d : d1;
    // A row at a time (stored by the warp's 16 lanes at once, the kernel spills 4 bytes).
    if (lane == 0 && wq + r < T) delta[stat0 + wq + r] = d;
  }
  __syncthreads();
  const bf16* qw = qs + 16 * w * LD;
  const bf16* dow = dos + 16 * w * LD;
  uint32_t qf[ARegs ? D / 16 : 1][4], dof[ARegs ? D / 16 : 1][4];
  if constexpr (ARegs) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) load_a<D>(qf[kk], qw, kk), load_a<D>(dof[kk], dow, kk);
  }
  float dq[D / 8][4];
  acc_zero(dq);

  for (int kt = kt0; kt < kt1; ++kt) {
    const int buf = (kt - kt0) % 2, k0 = kt * kKeys;
    if (kt + 1 < kt1) {
      tile_async<D, kKeys, NT>(ks + (buf ^ 1) * kKeys * LD, kbase, row, k0 + kKeys, T);
      tile_async<D, kKeys, NT>(vs + (buf ^ 1) * kKeys * LD, vbase, row, k0 + kKeys, T);
    }
    cp_async_commit();
    const bf16* kt_s = ks + buf * kKeys * LD;
    const bf16* vt_s = vs + buf * kKeys * LD;
    if (k0 <= wq + 15 && k0 + kKeys > fw) {
      float sc[kKeys / 8][4], dp[kKeys / 8][4];
      gemm_abt<D, kKeys>(sc, a_fragments<D, ARegs>(qf, qw), kt_s);
      gemm_abt<D, kKeys>(dp, a_fragments<D, ARegs>(dof, dow), vt_s);
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = k0 + 8 * n + 2 * t + i % 2, r = i < 2 ? r0 : r1, f = i < 2 ? f0 : f1;
          const float p = key <= r && key >= f ? exp2_approx(sc[n][i] * sl2 - (i < 2 ? l0 : l1)) : 0.0f;
          sc[n][i] = p * (dp[n][i] - (i < 2 ? d0 : d1));  // dS
        }
      gemm_pb<D, kKeys>(dq, sc, kt_s);
    }
    cp_async_wait<0>();
    __syncthreads();
  }
  store_rows<D>(dqkv + int64_t(bi) * T * row + h * D, row, wq, T, dq, scale, scale, qs + 16 * w * LD);
}

// dK and dV: a CTA of 4 warps per 64 keys of one kv head, a warp per 16 keys with its dK and
// dV accumulators in registers, walking the query tiles (BQ rows) of every query head of the
// group in order; Q, dO and the tiles' lse, delta and positions double-buffered, all by cp.async.
template <int D, int BQ, bool ARegs>
struct DkvShape {
  static constexpr int kThreads = 128;
  static constexpr size_t kSmem = size_t(2 * 64 + 4 * BQ) * row_ld<D>() * 2 + size_t(2 * 3 * BQ) * 4;
};

template <int D>
__global__ void __launch_bounds__(128)
    attention_dkv_flash_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta,
                               const int32_t* pos, int T, int H, int KV, float scale) {
  constexpr bool ARegs = Plan<D>::kARegs;
  constexpr int BQ = Plan<D>::kBq, LD = row_ld<D>(), BK = 64, NT = DkvShape<D, BQ, ARegs>::kThreads;
  LOOM_DYNAMIC_SHARED(unsigned char, smem, 128);
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = ks + BK * LD;
  bf16* qs = vs + BK * LD;  // [2][BQ][LD]
  bf16* dos = qs + 2 * BQ * LD;
  float* lse_s = reinterpret_cast<float*>(dos + 2 * BQ * LD);  // [2][BQ]
  float* delta_s = lse_s + 2 * BQ;
  int* pos_s = reinterpret_cast<int*>(delta_s + 2 * BQ);  // T throughout without document starts
  // x: kv head and sequence; y: key tiles, the first (seen by the most queries) first.
  const int kvh = blockIdx.x % KV, bi = blockIdx.x / KV, k0 = blockIdx.y * BK;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row = (H + 2 * KV) * D, group = H / KV;
  const bf16* base = qkv + int64_t(bi) * T * row;
  const float sl2 = scale * kLog2e;
  // Query tiles from the diagonal on, up to the first whose document starts past these keys.
  const int qt0 = k0 / BQ;
  int qt1 = qt0;
  while (qt1 * BQ < T && first_key(pos, bi, T, qt1 * BQ) < k0 + BK) ++qt1;
  const int per_head = qt1 - qt0, steps = group * per_head;
  auto load = [&](int step, int buf) {
    const int h = kvh * group + step / per_head, q0 = (qt0 + step % per_head) * BQ;
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
  if (steps > 0) load(0, 0);
  if (!pos)  // a query's document then starts at or before key 0, and no test branches on pos
    for (int i = threadIdx.x; i < 2 * BQ; i += NT) pos_s[i] = T;
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  const int wk = k0 + 16 * w, key0 = wk + g, key1 = wk + g + 8;
  const bf16* kw = ks + 16 * w * LD;
  const bf16* vw = vs + 16 * w * LD;
  uint32_t kf[ARegs ? D / 16 : 1][4], vf[ARegs ? D / 16 : 1][4];
  if constexpr (ARegs) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) load_a<D>(kf[kk], kw, kk), load_a<D>(vf[kk], vw, kk);
  }
  float dk[D / 8][4], dv[D / 8][4];
  acc_zero(dk), acc_zero(dv);

  for (int step = 0; step < steps; ++step) {
    const int buf = step % 2, q0 = (qt0 + step % per_head) * BQ;
    if (step + 1 < steps) load(step + 1, buf ^ 1);
    cp_async_commit();
    const bf16* qt_s = qs + buf * BQ * LD;
    const bf16* dot_s = dos + buf * BQ * LD;
    const float* ls = lse_s + buf * BQ;
    const float* ds = delta_s + buf * BQ;
    const int* ps = pos_s + buf * BQ;
    // Skipped where every query precedes the warp's keys, or every document starts after them.
    if (q0 + BQ - 1 >= wk && q0 - ps[0] < wk + 16) {
      float st[BQ / 8][4], dpt[BQ / 8][4];  // S^T and dP^T: the warp's keys x the tile's queries
      gemm_abt<D, BQ>(st, a_fragments<D, ARegs>(kf, kw), qt_s);
      gemm_abt<D, BQ>(dpt, a_fragments<D, ARegs>(vf, vw), dot_s);
      // The lane's columns 8n + 2t and 8n + 2t + 1: their statistics loaded once, side by side,
      // and the mask a select after an unconditional exp, so no load waits on a test. fmaf: the
      // device fuses the scaling into one rounding; so does the emulation, whatever it inlines.
      float2 lq[BQ / 8], dq[BQ / 8];
      int2 pq[BQ / 8];
#pragma unroll
      for (int n = 0; n < BQ / 8; ++n) {
        lq[n] = *reinterpret_cast<const float2*>(ls + 8 * n + 2 * t);
        dq[n] = *reinterpret_cast<const float2*>(ds + 8 * n + 2 * t);
        pq[n] = *reinterpret_cast<const int2*>(ps + 8 * n + 2 * t);
      }
#pragma unroll
      for (int n = 0; n < BQ / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const bool odd = i % 2;
          const int q = q0 + 8 * n + 2 * t + i % 2, key = i < 2 ? key0 : key1;
          const int first = q - (odd ? pq[n].y : pq[n].x);  // the query's document start
          const bool live = (key <= q) & (q < T) & (key >= first);
          const float lse2 = (odd ? lq[n].y : lq[n].x) * kLog2e;
          const float e = exp2_approx(fmaf(st[n][i], sl2, -lse2));
          const float p = live ? e : 0.0f;
          st[n][i] = p;
          dpt[n][i] = p * (dpt[n][i] - (odd ? dq[n].y : dq[n].x));  // dS^T
        }
      gemm_pb<D, BQ>(dv, st, dot_s);
      gemm_pb<D, BQ>(dk, dpt, qt_s);
    }
    cp_async_wait<0>();
    __syncthreads();
  }
  bf16* drows = dqkv + int64_t(bi) * T * row;
  store_rows<D>(drows + (H + kvh) * D, row, wk, T, dk, scale, scale, ks + 16 * w * LD);
  store_rows<D>(drows + (H + KV + kvh) * D, row, wk, T, dv, 1.0f, 1.0f, vs + 16 * w * LD);
}

template <int D>
void forward_d(bf16* out, float* lse, const bf16* qkv, int B, int T, int H, int KV, const int32_t* pos,
               cudaStream_t s) {
  constexpr int W = Plan<D>::kFwdWarps;
  using S = FwdShape<D, W>;
  aligned16_check(qkv, "flash attention", "qkv");
  aligned16_check(out, "flash attention", "out");
  smem_allow(attention_forward_flash_kernel<D>, S::kSmem);
  const dim3 grid(blocks_for(int64_t(B) * H, 1), blocks_for(T, S::kRows));
  LOOM_LAUNCH(attention_forward_flash_kernel<D>, grid, S::kThreads, S::kSmem, s)
  (out, lse, qkv, pos, T, H, KV, 1.0f / sqrtf(float(D)));
  LOOM_CUDA_LAUNCHED();
}

template <int D>
void backward_d(bf16* dqkv, const bf16* dout, const bf16* out, const bf16* qkv, const float* lse, float* delta, int B,
                int T, int H, int KV, const int32_t* pos, cudaStream_t s) {
  constexpr bool A = Plan<D>::kARegs;
  constexpr int BQ = Plan<D>::kBq;
  const float scale = 1.0f / sqrtf(float(D));
  aligned16_check(qkv, "flash attention", "qkv");
  aligned16_check(dout, "flash attention", "dout");
  aligned16_check(dqkv, "flash attention", "dqkv");
  aligned16_check(out, "flash attention", "out");
  constexpr size_t dq_smem = DqShape<D, A>::kSmem, dkv_smem = DkvShape<D, BQ, A>::kSmem;
  smem_allow(attention_dq_flash_kernel<D>, dq_smem);
  smem_allow(attention_dkv_flash_kernel<D>, dkv_smem);
  LOOM_LAUNCH(attention_dq_flash_kernel<D>, dim3(blocks_for(int64_t(B) * H, 1), blocks_for(T, 64)), 128, dq_smem, s)
  (dqkv, delta, dout, out, qkv, lse, pos, T, H, KV, scale);
  LOOM_CUDA_LAUNCHED();
  LOOM_LAUNCH(attention_dkv_flash_kernel<D>, dim3(blocks_for(int64_t(B) * KV, 1), blocks_for(T, 64)), 128, dkv_smem, s)
  (dqkv, dout, qkv, lse, delta, pos, T, H, KV, scale);
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

void attention_backward(bf16* dqkv, const bf16* dout, const bf16* out, const bf16* qkv, const float* lse,
                        float* scratch, int B, int T, int H, int KV, int D, const int32_t* pos, cudaStream_t s) {
  if (D == 64) return backward_d<64>(dqkv, dout, out, qkv, lse, scratch, B, T, H, KV, pos, s);
  if (D == 128) return backward_d<128>(dqkv, dout, out, qkv, lse, scratch, B, T, H, KV, pos, s);
  if (D == 32) return backward_d<32>(dqkv, dout, out, qkv, lse, scratch, B, T, H, KV, pos, s);
  fail("CUDA attention supports head dims 32, 64 and 128, not {}; change model.d_model / model.n_head", D);
}

}  // namespace loom::cuda
