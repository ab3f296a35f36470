// Context parallel's attention over blocks of keys (model/context_parallel.h) on tensor
// cores: the flash kernels' tiles (kernels/cuda/flash_tiles.cuh) with the causal mask given
// by global positions, kpos[u] <= qpos[t], instead of indices, and with data.doc_mask kpos[u] >=
// the query's document start, qpos[t] - qdoc[b, t]. Forward: a CTA per tile of query
// rows takes the running output, max and sum of earlier blocks (fp32, unnormalized) into its
// registers, walks the block's key tiles with the online softmax and writes them back;
// finish divides. Backward recomputes P from the saved log-sum-exp: dQ (a CTA per query tile
// walking the block's key tiles) and dK/dV (a CTA per key tile walking every query tile of
// every head in its group, in order) add into fp32 gradients, each element by one thread: no
// atomics, the same bits on every run. A warp skips a tile none of whose keys its rows see
// (positions need not be sorted: the tests are on the tile's and the warp's least and greatest).
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_tiles.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace loom::cuda {

namespace {

using namespace flash;

constexpr int kThreads = 256;
constexpr int kWarps = 4;          // the finish kernel: a warp per row
constexpr int kNoKey = INT32_MAX;  // past the block's last key: seen by no query
constexpr int kNoRow = INT32_MIN;  // past the last query row: sees no key

__device__ __forceinline__ int warp_min_int(int v) {
  for (int o = 16; o > 0; o >>= 1) v = imin(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ int warp_max_int(int v) {
  for (int o = 16; o > 0; o >>= 1) v = imax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Keys [k0, k0 + R) of a block: K and V rows by cp.async, their positions by plain stores
// (read after the __syncthreads that follows the wait).
template <int D, int R, int Threads>
__device__ __forceinline__ void keys_async(bf16* ks, bf16* vs, int* kp, const bf16* kbase, const bf16* vbase,
                                           int64_t stride, const int32_t* kpos, int k0, int Tk) {
  tile_async<D, R, Threads>(ks, kbase, stride, k0, Tk);
  tile_async<D, R, Threads>(vs, vbase, stride, k0, Tk);
  for (int i = threadIdx.x; i < R; i += Threads) kp[i] = k0 + i < Tk ? kpos[k0 + i] : kNoKey;
}

// The least and greatest of a tile's kKeys positions, in every lane.
__device__ __forceinline__ void tile_span(const int* kp, int& lo, int& hi) {
  const int lane = threadIdx.x % 32;
  lo = warp_min_int(imin(kp[lane], kp[lane + 32]));
  hi = warp_max_int(imax(kp[lane], kp[lane + 32]));
}

// The first position query row r (at position p) sees: its document's start with data.doc_mask
// (qdoc [B,Tq], each query's position in its document), else any.
__device__ __forceinline__ int row_start(const int32_t* qdoc, int bi, int Tq, int r, int p) {
  return qdoc && r < Tq ? p - qdoc[int64_t(bi) * Tq + r] : kNoRow;
}

// A warp's 16 fp32 accumulator rows (row r0 + g and r0 + g + 8, columns 8n + 2t) added into,
// or loaded from, a row-major fp32 matrix; rows at or past T are left alone.
template <int D>
__device__ __forceinline__ void rows_add(float* dst, int64_t stride, int r0, int T, const float (&acc)[D / 8][4],
                                         float scale) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r0 + g + 8 * half;
    if (r >= T) continue;
    float* row = dst + int64_t(r) * stride + 2 * t;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      row[8 * n] += acc[n][2 * half] * scale, row[8 * n + 1] += acc[n][2 * half + 1] * scale;
  }
}

template <int D>
struct BlockFwd {
  static constexpr int kWarps = Plan<D>::kFwdWarps;
  using Tiles = FwdShape<D, kWarps>;
  static constexpr size_t kSmem = Tiles::kSmem + 2 * kKeys * sizeof(int);  // + key positions [2]
};

template <int D>
__global__ void __launch_bounds__(32 * Plan<D>::kFwdWarps, Plan<D>::kFwdBlocksPerSm)
    block_forward_flash_kernel(float* acc, float* ml, const bf16* qkv, const bf16* kv, const int32_t* qpos,
                               const int32_t* kpos, const int32_t* qdoc, int Tq, int Tk, int H, int KV, float scale,
                               bool first) {
  using S = typename BlockFwd<D>::Tiles;
  constexpr int LD = row_ld<D>(), BR = S::kRows, NT = S::kThreads;
  LOOM_DYNAMIC_SHARED(unsigned char, smem, 128);
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = qs + BR * LD;  // [2][kKeys][LD]
  bf16* vs = ks + 2 * kKeys * LD;
  int* kps = reinterpret_cast<int*>(vs + 2 * kKeys * LD);  // [2][kKeys]
  const int h = blockIdx.x % H, bi = blockIdx.x / H, q0 = blockIdx.y * BR;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row = (H + 2 * KV) * D, kvw = 2 * KV * D, kvh = h / (H / KV);
  const bf16* kbase = kv + int64_t(bi) * Tk * kvw + kvh * D;
  const bf16* vbase = kbase + KV * D;
  const float sl2 = scale * kLog2e;
  const int tiles = (Tk + kKeys - 1) / kKeys;
  tile_async<D, BR, NT>(qs, qkv + int64_t(bi) * Tq * row + h * D, row, q0, Tq);
  keys_async<D, kKeys, NT>(ks, vs, kps, kbase, vbase, kvw, kpos, 0, Tk);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  const int wq = q0 + 16 * w, r0 = wq + g, r1 = wq + g + 8;
  const int p0 = r0 < Tq ? qpos[r0] : kNoRow, p1 = r1 < Tq ? qpos[r1] : kNoRow;
  const int f0 = row_start(qdoc, bi, Tq, r0, p0), f1 = row_start(qdoc, bi, Tq, r1, p1);
  const int last = warp_max_int(imax(p0, p1)), least = warp_min_int(imin(p0, p1));
  const int start_lo = warp_min_int(imin(f0, f1)), start_hi = warp_max_int(imax(f0, f1));
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) load_a<D>(qf[kk], qs + 16 * w * LD, kk);
  // The running state: output and sum unnormalized, the max raw (unscaled), the sum in the
  // quad's first lane (the others add their parts to zero).
  float* arows = acc + int64_t(bi) * Tq * H * D + h * D;
  float* stats = ml + (int64_t(bi) * H + h) * Tq * 2;
  float o[D / 8][4];
  acc_zero(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  if (!first) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = half ? r1 : r0;
      if (r >= Tq) continue;
      const float* ar = arows + int64_t(r) * H * D + 2 * t;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) o[n][2 * half] = ar[8 * n], o[n][2 * half + 1] = ar[8 * n + 1];
      m[half] = stats[2 * r] / scale;
      l[half] = t == 0 ? stats[2 * r + 1] : 0.0f;
    }
  }

  for (int kt = 0; kt < tiles; ++kt) {
    const int buf = kt % 2;
    if (kt + 1 < tiles) {
      const int nb = buf ^ 1;
      keys_async<D, kKeys, NT>(ks + nb * kKeys * LD, vs + nb * kKeys * LD, kps + nb * kKeys, kbase, vbase, kvw, kpos,
                               (kt + 1) * kKeys, Tk);
    }
    cp_async_commit();
    const int* kp = kps + buf * kKeys;
    int lo, hi;
    tile_span(kp, lo, hi);
    if (lo <= last && hi >= start_lo) {
      float s[kKeys / 8][4];
      gemm_abt<D, kKeys>(s, a_fragments<D, true>(qf, nullptr), ks + buf * kKeys * LD);
      if (hi > least || lo < start_hi) {  // some key here is hidden from some row of the warp
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int k = kp[8 * n + 2 * t + i % 2];
            if (k > (i < 2 ? p0 : p1) || k < (i < 2 ? f0 : f1)) s[n][i] = -INFINITY;
          }
      }
      softmax_online<D, kKeys>(s, m, l, o, sl2);
      gemm_pb<D, kKeys>(o, s, vs + buf * kKeys * LD);
    }
    cp_async_wait<0>();
    __syncthreads();  // the next tile has landed; every warp is done with this one
  }
  quad_sum(l);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = half ? r1 : r0;
    if (r >= Tq) continue;
    float* ar = arows + int64_t(r) * H * D + 2 * t;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) ar[8 * n] = o[n][2 * half], ar[8 * n + 1] = o[n][2 * half + 1];
    if (t == 0) stats[2 * r] = m[half] * scale, stats[2 * r + 1] = l[half];
  }
}

// dQ: a CTA of 4 warps per 64 query rows walking the block's key tiles; Q and dO fragments
// in registers where they fit (Plan::kARegs), as in the flash dQ kernel.
template <int D>
struct BlockDq {
  static constexpr size_t kSmem = size_t(2 * 64 + 4 * kKeys) * row_ld<D>() * 2 + 2 * kKeys * sizeof(int);
};

template <int D>
__global__ void __launch_bounds__(128)
    block_dq_flash_kernel(float* dq, const bf16* dout, const bf16* qkv, const bf16* kv, const float* lse,
                          const float* delta, const int32_t* qpos, const int32_t* kpos, const int32_t* qdoc, int Tq,
                          int Tk, int H, int KV, float scale) {
  constexpr bool ARegs = Plan<D>::kARegs;
  constexpr int LD = row_ld<D>(), BR = 64, NT = 128;
  LOOM_DYNAMIC_SHARED(unsigned char, smem, 128);
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* dos = qs + BR * LD;
  bf16* ks = dos + BR * LD;  // [2][kKeys][LD]
  bf16* vs = ks + 2 * kKeys * LD;
  int* kps = reinterpret_cast<int*>(vs + 2 * kKeys * LD);  // [2][kKeys]
  const int h = blockIdx.x % H, bi = blockIdx.x / H, q0 = blockIdx.y * BR;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row = (H + 2 * KV) * D, kvw = 2 * KV * D, kvh = h / (H / KV);
  const bf16* kbase = kv + int64_t(bi) * Tk * kvw + kvh * D;
  const bf16* vbase = kbase + KV * D;
  const float sl2 = scale * kLog2e;
  const int tiles = (Tk + kKeys - 1) / kKeys;
  tile_async<D, BR, NT>(qs, qkv + int64_t(bi) * Tq * row + h * D, row, q0, Tq);
  tile_async<D, BR, NT>(dos, dout + int64_t(bi) * Tq * H * D + h * D, int64_t(H) * D, q0, Tq);
  keys_async<D, kKeys, NT>(ks, vs, kps, kbase, vbase, kvw, kpos, 0, Tk);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  const int wq = q0 + 16 * w, r0 = wq + g, r1 = wq + g + 8;
  const int p0 = r0 < Tq ? qpos[r0] : kNoRow, p1 = r1 < Tq ? qpos[r1] : kNoRow;
  const int f0 = row_start(qdoc, bi, Tq, r0, p0), f1 = row_start(qdoc, bi, Tq, r1, p1);
  const int last = warp_max_int(imax(p0, p1)), start_lo = warp_min_int(imin(f0, f1));
  const int64_t stat0 = (int64_t(bi) * H + h) * Tq;
  const float l0 = r0 < Tq ? lse[stat0 + r0] * kLog2e : 0.0f, l1 = r1 < Tq ? lse[stat0 + r1] * kLog2e : 0.0f;
  const float d0 = r0 < Tq ? delta[stat0 + r0] : 0.0f, d1 = r1 < Tq ? delta[stat0 + r1] : 0.0f;
  const bf16* qw = qs + 16 * w * LD;
  const bf16* dow = dos + 16 * w * LD;
  uint32_t qf[ARegs ? D / 16 : 1][4], dof[ARegs ? D / 16 : 1][4];
  if constexpr (ARegs) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) load_a<D>(qf[kk], qw, kk), load_a<D>(dof[kk], dow, kk);
  }
  float dqa[D / 8][4];
  acc_zero(dqa);

  for (int kt = 0; kt < tiles; ++kt) {
    const int buf = kt % 2;
    if (kt + 1 < tiles) {
      const int nb = buf ^ 1;
      keys_async<D, kKeys, NT>(ks + nb * kKeys * LD, vs + nb * kKeys * LD, kps + nb * kKeys, kbase, vbase, kvw, kpos,
                               (kt + 1) * kKeys, Tk);
    }
    cp_async_commit();
    const bf16* kt_s = ks + buf * kKeys * LD;
    const int* kp = kps + buf * kKeys;
    int lo, hi;
    tile_span(kp, lo, hi);
    if (lo <= last && hi >= start_lo) {
      float sc[kKeys / 8][4], dp[kKeys / 8][4];
      gemm_abt<D, kKeys>(sc, a_fragments<D, ARegs>(qf, qw), kt_s);
      gemm_abt<D, kKeys>(dp, a_fragments<D, ARegs>(dof, dow), vs + buf * kKeys * LD);
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int k = kp[8 * n + 2 * t + i % 2];
          const bool seen = k <= (i < 2 ? p0 : p1) && k >= (i < 2 ? f0 : f1);
          const float p = seen ? exp2_approx(sc[n][i] * sl2 - (i < 2 ? l0 : l1)) : 0.0f;
          sc[n][i] = p * (dp[n][i] - (i < 2 ? d0 : d1));  // dS
        }
      gemm_pb<D, kKeys>(dqa, sc, kt_s);
    }
    cp_async_wait<0>();
    __syncthreads();
  }
  rows_add<D>(dq + int64_t(bi) * Tq * H * D + h * D, int64_t(H) * D, wq, Tq, dqa, scale);
}

// dK and dV: a CTA of 4 warps per 64 keys of one kv head, a warp per 16 keys with dK and dV in
// registers, walking the query tiles (BQ rows) of every query head of the group in order; Q,
// dO and the tiles' lse, delta, positions and document starts double-buffered.
template <int D>
struct BlockDkv {
  static constexpr int kBq = Plan<D>::kBq;
  static constexpr size_t kSmem = size_t(2 * 64 + 4 * kBq) * row_ld<D>() * 2 + size_t(2 * 4 * kBq) * 4;
};

template <int D>
__global__ void __launch_bounds__(128)
    block_dkv_flash_kernel(float* dkv, const bf16* dout, const bf16* qkv, const bf16* kv, const float* lse,
                           const float* delta, const int32_t* qpos, const int32_t* kpos, const int32_t* qdoc, int Tq,
                           int Tk, int H, int KV, float scale) {
  constexpr bool ARegs = Plan<D>::kARegs;
  constexpr int BQ = Plan<D>::kBq, LD = row_ld<D>(), BK = 64, NT = 128;
  LOOM_DYNAMIC_SHARED(unsigned char, smem, 128);
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = ks + BK * LD;
  bf16* qs = vs + BK * LD;  // [2][BQ][LD]
  bf16* dos = qs + 2 * BQ * LD;
  float* lse_s = reinterpret_cast<float*>(dos + 2 * BQ * LD);  // [2][BQ], times log2 e
  float* delta_s = lse_s + 2 * BQ;
  int* qpos_s = reinterpret_cast<int*>(delta_s + 2 * BQ);
  int* start_s = qpos_s + 2 * BQ;  // each query's first visible position; past the rows, none
  const int kvh = blockIdx.x % KV, bi = blockIdx.x / KV, k0 = blockIdx.y * BK;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row = (H + 2 * KV) * D, kvw = 2 * KV * D, group = H / KV;
  const bf16* qbase = qkv + int64_t(bi) * Tq * row;
  const bf16* kbase = kv + int64_t(bi) * Tk * kvw + kvh * D;
  const float sl2 = scale * kLog2e;
  const int per_head = (Tq + BQ - 1) / BQ, steps = group * per_head;
  auto load = [&](int step, int buf) {
    const int h = kvh * group + step / per_head, q0 = (step % per_head) * BQ;
    tile_async<D, BQ, NT>(qs + buf * BQ * LD, qbase + h * D, row, q0, Tq);
    tile_async<D, BQ, NT>(dos + buf * BQ * LD, dout + int64_t(bi) * Tq * H * D + h * D, int64_t(H) * D, q0, Tq);
    const int64_t stat0 = (int64_t(bi) * H + h) * Tq;
    for (int i = threadIdx.x; i < BQ; i += NT) {
      const bool ok = q0 + i < Tq;
      lse_s[buf * BQ + i] = ok ? lse[stat0 + q0 + i] * kLog2e : 0.0f;
      delta_s[buf * BQ + i] = ok ? delta[stat0 + q0 + i] : 0.0f;
      qpos_s[buf * BQ + i] = ok ? qpos[q0 + i] : kNoRow;
      start_s[buf * BQ + i] = ok ? row_start(qdoc, bi, Tq, q0 + i, qpos[q0 + i]) : kNoKey;
    }
  };
  tile_async<D, BK, NT>(ks, kbase, kvw, k0, Tk);
  tile_async<D, BK, NT>(vs, kbase + KV * D, kvw, k0, Tk);
  load(0, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  const int wk = k0 + 16 * w, key0 = wk + g, key1 = wk + g + 8;
  const int kp0 = key0 < Tk ? kpos[key0] : kNoKey, kp1 = key1 < Tk ? kpos[key1] : kNoKey;
  const int least = warp_min_int(imin(kp0, kp1)), greatest = warp_max_int(imax(kp0, kp1));
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
    const int buf = step % 2;
    if (step + 1 < steps) load(step + 1, buf ^ 1);
    cp_async_commit();
    const bf16* qt_s = qs + buf * BQ * LD;
    const bf16* dot_s = dos + buf * BQ * LD;
    const float* ls = lse_s + buf * BQ;
    const float* ds = delta_s + buf * BQ;
    const int* qp = qpos_s + buf * BQ;
    const int* fs = start_s + buf * BQ;
    int last = kNoRow, start_lo = kNoKey;
    for (int i = lane; i < BQ; i += 32) last = imax(last, qp[i]), start_lo = imin(start_lo, fs[i]);
    last = warp_max_int(last), start_lo = warp_min_int(start_lo);
    if (last >= least && start_lo <= greatest) {  // some query of the tile may see some key of the warp
      float st[BQ / 8][4], dpt[BQ / 8][4];        // S^T and dP^T: the warp's keys x the tile's queries
      gemm_abt<D, BQ>(st, a_fragments<D, ARegs>(kf, kw), qt_s);
      gemm_abt<D, BQ>(dpt, a_fragments<D, ARegs>(vf, vw), dot_s);
#pragma unroll
      for (int n = 0; n < BQ / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c = 8 * n + 2 * t + i % 2;
          const int k = i < 2 ? kp0 : kp1;
          const float p = k <= qp[c] && k >= fs[c] ? exp2_approx(st[n][i] * sl2 - ls[c]) : 0.0f;
          st[n][i] = p;
          dpt[n][i] = p * (dpt[n][i] - ds[c]);  // dS^T
        }
      gemm_pb<D, BQ>(dv, st, dot_s);
      gemm_pb<D, BQ>(dk, dpt, qt_s);
    }
    cp_async_wait<0>();
    __syncthreads();
  }
  float* drows = dkv + int64_t(bi) * Tk * kvw;
  rows_add<D>(drows + kvh * D, kvw, wk, Tk, dk, scale);
  rows_add<D>(drows + (KV + kvh) * D, kvw, wk, Tk, dv, 1.0f);
}

__global__ void kv_extract_kernel(bf16* kv, const bf16* qkv, int H, int KV, int D, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int kvw = 2 * KV * D;
  const int64_t r = i / kvw;
  kv[i] = qkv[r * (H + 2 * KV) * D + H * D + i % kvw];
}

template <int D>
__global__ void block_finish_kernel(bf16* out, float* lse, const float* acc, const float* ml, int Tq, int H) {
  constexpr int E = D / 32;
  const int t = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.y, bi = blockIdx.z;
  if (t >= Tq) return;
  const int64_t at = (int64_t(bi) * Tq + t) * H * D + h * D, stat = (int64_t(bi) * H + h) * Tq + t;
  const float m = ml[stat * 2], l = ml[stat * 2 + 1];
  for (int e = 0; e < E; ++e) out[at + lane + 32 * e] = b(acc[at + lane + 32 * e] / l);
  if (lane == 0) lse[stat] = m + logf(l);
}

__global__ void grads_store_kernel(bf16* dqkv, const float* dq, const float* dkv, int H, int KV, int D, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int row = (H + 2 * KV) * D, c = int(i % row);
  const int64_t r = i / row;
  dqkv[i] = b(c < H * D ? dq[r * H * D + c] : dkv[r * 2 * KV * D + c - H * D]);
}

void check_dims(int H, int KV, int D) {
  LOOM_CHECK(D == 32 || D == 64 || D == 128, "CUDA attention supports head dims 32, 64 and 128, not {}", D);
  LOOM_CHECK(KV > 0 && H % KV == 0, "{} query heads do not group over {} kv heads", H, KV);
}

// delta[b,h,t] = sum_d dO * O, the softmax backward's row term.
template <int D>
__global__ void attention_delta_kernel(float* delta, const bf16* dout, const bf16* out, int T, int H) {
  constexpr int E = D / 32;
  const int t = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.y, bi = blockIdx.z;
  if (t >= T) return;
  const int64_t at = (int64_t(bi) * T + t) * H * D + h * D;
  float s = 0.0f;
  for (int e = 0; e < E; ++e) s += f(dout[at + lane + 32 * e]) * f(out[at + lane + 32 * e]);
  s = warp_sum(s);
  if (lane == 0) delta[(int64_t(bi) * H + h) * T + t] = s;
}

template <int D>
void forward_d(float* acc, float* ml, const bf16* qkv, const bf16* kv, const int32_t* qpos, const int32_t* kpos,
               const int32_t* qdoc, int B, int Tq, int Tk, int H, int KV, bool first, cudaStream_t s) {
  using F = BlockFwd<D>;
  aligned16_check(qkv, "cp block attention", "qkv");
  aligned16_check(kv, "cp block attention", "kv");
  smem_allow(block_forward_flash_kernel<D>, F::kSmem);
  const dim3 grid(blocks_for(int64_t(B) * H, 1), blocks_for(Tq, F::Tiles::kRows));
  LOOM_LAUNCH(block_forward_flash_kernel<D>, grid, F::Tiles::kThreads, F::kSmem, s)
  (acc, ml, qkv, kv, qpos, kpos, qdoc, Tq, Tk, H, KV, 1.0f / sqrtf(float(D)), first);
  LOOM_CUDA_LAUNCHED();
}

template <int D>
void finish_d(bf16* out, float* lse, const float* acc, const float* ml, int B, int Tq, int H, cudaStream_t s) {
  LOOM_LAUNCH(block_finish_kernel<D>, dim3(blocks_for(Tq, kWarps), H, B), 32 * kWarps, 0, s)(out, lse, acc, ml, Tq, H);
  LOOM_CUDA_LAUNCHED();
}

template <int D>
void backward_d(float* dq, float* dkv, const bf16* dout, const bf16* qkv, const bf16* kv, const float* lse,
                const float* delta, const int32_t* qpos, const int32_t* kpos, const int32_t* qdoc, int B, int Tq,
                int Tk, int H, int KV, cudaStream_t s) {
  const float scale = 1.0f / sqrtf(float(D));
  aligned16_check(qkv, "cp block attention", "qkv");
  aligned16_check(kv, "cp block attention", "kv");
  aligned16_check(dout, "cp block attention", "dout");
  smem_allow(block_dq_flash_kernel<D>, BlockDq<D>::kSmem);
  smem_allow(block_dkv_flash_kernel<D>, BlockDkv<D>::kSmem);
  LOOM_LAUNCH(block_dq_flash_kernel<D>, dim3(blocks_for(int64_t(B) * H, 1), blocks_for(Tq, 64)), 128, BlockDq<D>::kSmem,
              s)
  (dq, dout, qkv, kv, lse, delta, qpos, kpos, qdoc, Tq, Tk, H, KV, scale);
  LOOM_CUDA_LAUNCHED();
  LOOM_LAUNCH(block_dkv_flash_kernel<D>, dim3(blocks_for(int64_t(B) * KV, 1), blocks_for(Tk, 64)), 128,
              BlockDkv<D>::kSmem, s)
  (dkv, dout, qkv, kv, lse, delta, qpos, kpos, qdoc, Tq, Tk, H, KV, scale);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace

void attention_kv_extract(bf16* kv, const bf16* qkv, int B, int T, int H, int KV, int D, cudaStream_t s) {
  const int64_t n = int64_t(B) * T * 2 * KV * D;
  LOOM_LAUNCH(kv_extract_kernel, blocks_for(n, kThreads), kThreads, 0, s)(kv, qkv, H, KV, D, n);
  LOOM_CUDA_LAUNCHED();
}

void attention_block_forward(float* acc, float* ml, const bf16* qkv, const bf16* kv, const AttentionBlockShape& shape,
                             bool first, cudaStream_t s) {
  const int B = shape.B, Tq = shape.Tq, Tk = shape.Tk, H = shape.H, KV = shape.KV, D = shape.D;
  const int32_t *qpos = shape.qpos, *kpos = shape.kpos, *qdoc = shape.qdoc;
  check_dims(H, KV, D);
  if (D == 64) return forward_d<64>(acc, ml, qkv, kv, qpos, kpos, qdoc, B, Tq, Tk, H, KV, first, s);
  if (D == 128) return forward_d<128>(acc, ml, qkv, kv, qpos, kpos, qdoc, B, Tq, Tk, H, KV, first, s);
  forward_d<32>(acc, ml, qkv, kv, qpos, kpos, qdoc, B, Tq, Tk, H, KV, first, s);
}

void attention_block_finish(bf16* out, float* lse, const float* acc, const float* ml, int B, int Tq, int H, int D,
                            cudaStream_t s) {
  check_dims(H, H, D);
  if (D == 64) return finish_d<64>(out, lse, acc, ml, B, Tq, H, s);
  if (D == 128) return finish_d<128>(out, lse, acc, ml, B, Tq, H, s);
  finish_d<32>(out, lse, acc, ml, B, Tq, H, s);
}

void attention_block_delta(float* delta, const bf16* dout, const bf16* out, int B, int Tq, int H, int D,
                           cudaStream_t s) {
  const dim3 grid(blocks_for(Tq, kWarps), H, B);
  if (D == 64)
    LOOM_LAUNCH(attention_delta_kernel<64>, grid, 32 * kWarps, 0, s)(delta, dout, out, Tq, H);
  else if (D == 128)
    LOOM_LAUNCH(attention_delta_kernel<128>, grid, 32 * kWarps, 0, s)(delta, dout, out, Tq, H);
  else if (D == 32)
    LOOM_LAUNCH(attention_delta_kernel<32>, grid, 32 * kWarps, 0, s)(delta, dout, out, Tq, H);
  else
    fail("CUDA attention supports head dims 32, 64 and 128, not {}", D);
  LOOM_CUDA_LAUNCHED();
}

void attention_block_backward(float* dq, float* dkv, const bf16* dout, const bf16* qkv, const bf16* kv,
                              const float* lse, const float* delta, const AttentionBlockShape& shape, cudaStream_t s) {
  const int B = shape.B, Tq = shape.Tq, Tk = shape.Tk, H = shape.H, KV = shape.KV, D = shape.D;
  const int32_t *qpos = shape.qpos, *kpos = shape.kpos, *qdoc = shape.qdoc;
  check_dims(H, KV, D);
  if (D == 64) return backward_d<64>(dq, dkv, dout, qkv, kv, lse, delta, qpos, kpos, qdoc, B, Tq, Tk, H, KV, s);
  if (D == 128) return backward_d<128>(dq, dkv, dout, qkv, kv, lse, delta, qpos, kpos, qdoc, B, Tq, Tk, H, KV, s);
  backward_d<32>(dq, dkv, dout, qkv, kv, lse, delta, qpos, kpos, qdoc, B, Tq, Tk, H, KV, s);
}

void attention_block_grads_store(bf16* dqkv, const float* dq, const float* dkv, int B, int T, int H, int KV, int D,
                                 cudaStream_t s) {
  const int64_t n = int64_t(B) * T * (H + 2 * KV) * D;
  LOOM_LAUNCH(grads_store_kernel, blocks_for(n, kThreads), kThreads, 0, s)(dqkv, dq, dkv, H, KV, D, n);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace loom::cuda
