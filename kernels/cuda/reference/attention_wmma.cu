// A reference, not run by training (kernels/cuda/reference/attention_reference.h): the earlier
// causal attention on tensor cores (bf16 WMMA 16x16x16, fp32 accumulation) for head dims 64
// and 128, flash-attention style: a block owns a 64-row tile, its 4 warps 16 rows each, and
// K/V (or Q/dO) tiles of 64 rows stream through shared memory; no T x T matrix exists.
// Scores go through shared memory between the two matrix products, where each lane knows
// which row and column it holds (WMMA's register layout is opaque): the online softmax runs
// there, and the output accumulates in fp32 shared memory so it can be rescaled per row.
// Backward is two deterministic kernels, no atomics: dQ (a block per query tile, walking key
// tiles; it also writes delta = rowsum(dO * O)) and then dK/dV (a block per key tile, walking
// query tiles of every query head in its group, in order). Probabilities and dS are rounded
// to bf16 for the products, as in FlashAttention; row sums and statistics stay fp32.
// With data.doc_mask (pos) a query's keys start at its document's first token: scores before
// it are masked, and key tiles wholly before a query tile's first document are skipped (a
// document start never decreases along the sequence, so the tile's first row has the least).
#include <mma.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/reference/attention_mask.cuh"
#include "kernels/cuda/reference/attention_reference.h"

namespace loom::cuda::reference {

namespace {

using namespace nvcuda;

constexpr int kTile = 64;  // rows per query tile and per key tile
constexpr int kWarps = kTile / 16;
constexpr int kThreads = 32 * kWarps;
// Shared-memory row strides, padded against bank conflicts; every 16-row fragment start stays
// 32-byte aligned, as WMMA loads and stores require.
constexpr int kLS = kTile + 4;  // fp32 score tiles
constexpr int kLP = kTile + 8;  // bf16 probability tiles

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBt =
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;  // reads a row-major tile as its transpose
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

template <int D>
struct Tiles {
  static constexpr int LD = D + 8;  // bf16 [64][D] tiles
  static constexpr int LO = D + 4;  // fp32 [64][D] accumulators
  static constexpr size_t kv = size_t(kTile) * LD * 2;
  static constexpr size_t s = size_t(kTile) * kLS * 4;
  static constexpr size_t p = size_t(kTile) * kLP * 2;
  static constexpr size_t o = size_t(kTile) * LO * 4;
  static constexpr size_t stats = size_t(kTile) * 4;
  // forward: q, k, v, s, p, o
  static constexpr size_t forward = 3 * kv + s + p + o;
  // dq: q, do, k, v, s, dp, ds, lse, delta (the output tile reuses q and do)
  // dkv: k, v, q, do, s^T, dp^T, p^T, ds^T, lse, delta, first keys (the output tile reuses k and v)
  static constexpr size_t dq = 4 * kv + 2 * s + p + 2 * stats;
  static constexpr size_t dkv = 4 * kv + 2 * s + 2 * p + 3 * stats;
  static_assert(o <= 2 * kv, "the output tile must fit where two input tiles were");
};

// Carves consecutive regions out of dynamic shared memory.
struct Carve {
  unsigned char* at;
  template <class X>
  __device__ X* take(size_t bytes) {
    X* p = reinterpret_cast<X*>(at);
    at += bytes;
    return p;
  }
};

// Where a query tile's key tiles start: the tile holding its first row's first key.
__device__ __forceinline__ int first_key_tile(const int32_t* pos, int bi, int T, int q0) {
  return pos ? first_key(pos, bi, T, q0) / kTile * kTile : 0;
}

// Rows [r0, r0 + 64) of a bf16 matrix with row stride `stride` (D columns) into a [64][LD]
// tile; rows at or past T are zero, which keeps every score in the padding finite.
template <int D>
__device__ void tile_load(bf16* dst, const bf16* src, int64_t stride, int r0, int T) {
  constexpr int V = D / 8;  // 16-byte vectors per row
  for (int i = threadIdx.x; i < kTile * V; i += kThreads) {
    const int r = i / V, c = (i % V) * 8;
    int4 v = make_int4(0, 0, 0, 0);
    if (r0 + r < T) v = *reinterpret_cast<const int4*>(src + int64_t(r0 + r) * stride + c);
    *reinterpret_cast<int4*>(dst + r * Tiles<D>::LD + c) = v;
  }
}

// out[16][64] (fp32, stride kLS) = a[16][D] @ b[64][D]^T, both bf16 tiles with stride LD.
template <int D>
__device__ void warp_abt(float* out, const bf16* a, const bf16* bt) {
  constexpr int LD = Tiles<D>::LD;
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
      FragA fa;
      FragBt fb;
      wmma::load_matrix_sync(fa, a + k * 16, LD);
      wmma::load_matrix_sync(fb, bt + n * 16 * LD + k * 16, LD);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, kLS, wmma::mem_row_major);
  }
}

// acc[n] += p[16][64] (bf16, stride kLP) @ b[64][D] (bf16, stride LD), column block n of 16.
template <int D>
__device__ void warp_pb(FragC (&acc)[D / 16], const bf16* p, const bf16* bm) {
  constexpr int LD = Tiles<D>::LD;
#pragma unroll
  for (int k = 0; k < kTile / 16; ++k) {
    FragA fa;
    wmma::load_matrix_sync(fa, p + k * 16, kLP);
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      FragB fb;
      wmma::load_matrix_sync(fb, bm + k * 16 * LD + n * 16, LD);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Writes a warp's 16 accumulated rows times `scale` as bf16 rows of a strided matrix, going
// through the fp32 staging tile `stage` ([64][LO], the warp's rows only).
template <int D>
__device__ void warp_store_rows(bf16* dst, int64_t stride, int r0, int T, FragC (&acc)[D / 16], float* stage,
                                float scale) {
  constexpr int LO = Tiles<D>::LO;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < D / 16; ++n)
    wmma::store_matrix_sync(stage + w * 16 * LO + n * 16, acc[n], LO, wmma::mem_row_major);
  __syncwarp();
  for (int r = 0; r < 16; ++r) {
    const int t = r0 + w * 16 + r;
    if (t >= T) break;
    for (int e = lane; e < D; e += 32) dst[int64_t(t) * stride + e] = b(stage[(w * 16 + r) * LO + e] * scale);
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_forward_tc(bf16* out, float* lse, const bf16* qkv, const int32_t* pos, int T, int H, int KV,
                         float scale) {
  using L = Tiles<D>;
  LOOM_DYNAMIC_SHARED(unsigned char, smem, 128);
  Carve cv{smem};
  bf16* qs = cv.take<bf16>(L::kv);
  bf16* ks = cv.take<bf16>(L::kv);
  bf16* vs = cv.take<bf16>(L::kv);
  float* ss = cv.take<float>(L::s);
  bf16* ps = cv.take<bf16>(L::p);
  float* os = cv.take<float>(L::o);
  // The last query tiles have the most keys: start them first.
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kTile, h = blockIdx.y, bi = blockIdx.z;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, wr = w * 16;
  const int row = (H + 2 * KV) * D, kvh = h / (H / KV);
  const bf16* base = qkv + int64_t(bi) * T * row;
  tile_load<D>(qs, base + h * D, row, q0, T);
  for (int i = threadIdx.x; i < kTile * L::LO; i += kThreads) os[i] = 0.0f;
  float m[16], l[16];  // the warp's 16 rows' running max and sum, the same in every lane
#pragma unroll
  for (int r = 0; r < 16; ++r) m[r] = -INFINITY, l[r] = 0.0f;
  for (int k0 = first_key_tile(pos, bi, T, q0); k0 <= q0; k0 += kTile) {
    __syncthreads();  // every warp is done with the previous K and V
    tile_load<D>(ks, base + (H + kvh) * D, row, k0, T);
    tile_load<D>(vs, base + (H + KV + kvh) * D, row, k0, T);
    __syncthreads();
    warp_abt<D>(ss + wr * kLS, qs + wr * L::LD, ks);
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int tq = q0 + wr + r;
      float* srow = ss + (wr + r) * kLS;
      const int f0 = tq < T ? first_key(pos, bi, T, tq) : 0;
      const float s0 = key_visible(k0 + lane, tq, f0) ? srow[lane] * scale : -INFINITY;
      const float s1 = key_visible(k0 + lane + 32, tq, f0) ? srow[lane + 32] * scale : -INFINITY;
      const float mn = fmaxf(m[r], warp_max(fmaxf(s0, s1)));
      const float ms = mn == -INFINITY ? 0.0f : mn;  // a row with no key yet stays all zero
      const float p0 = __expf(s0 - ms), p1 = __expf(s1 - ms), corr = __expf(m[r] - ms);
      l[r] = l[r] * corr + warp_sum(p0 + p1);
      m[r] = mn;
      ps[(wr + r) * kLP + lane] = b(p0);
      ps[(wr + r) * kLP + lane + 32] = b(p1);
      for (int e = lane; e < D; e += 32) os[(wr + r) * L::LO + e] *= corr;
    }
    __syncwarp();
    FragC acc[D / 16];
#pragma unroll
    for (int n = 0; n < D / 16; ++n)
      wmma::load_matrix_sync(acc[n], os + wr * L::LO + n * 16, L::LO, wmma::mem_row_major);
    warp_pb<D>(acc, ps + wr * kLP, vs);
#pragma unroll
    for (int n = 0; n < D / 16; ++n)
      wmma::store_matrix_sync(os + wr * L::LO + n * 16, acc[n], L::LO, wmma::mem_row_major);
    __syncwarp();
  }
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const int tq = q0 + wr + r;
    if (tq < T) {
      const float inv = 1.0f / l[r];
      bf16* o = out + (int64_t(bi) * T + tq) * H * D + h * D;
      for (int e = lane; e < D; e += 32) o[e] = b(os[(wr + r) * L::LO + e] * inv);
      if (lane == 0) lse[(int64_t(bi) * H + h) * T + tq] = m[r] + logf(l[r]);
    }
  }
}

// Loads a query tile's lse and delta (zero past T) into shared memory.
__device__ void stats_load(float* lse_s, float* delta_s, const float* lse, const float* delta, int q0, int T) {
  for (int i = threadIdx.x; i < kTile; i += kThreads) {
    lse_s[i] = q0 + i < T ? lse[q0 + i] : 0.0f;
    delta_s[i] = q0 + i < T ? delta[q0 + i] : 0.0f;
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_dq_tc(bf16* dqkv, float* delta, const bf16* dout, const bf16* out, const bf16* qkv, const float* lse,
                    const int32_t* pos, int T, int H, int KV, float scale) {
  using L = Tiles<D>;
  LOOM_DYNAMIC_SHARED(unsigned char, smem, 128);
  Carve cv{smem};
  bf16* qs = cv.take<bf16>(L::kv);
  bf16* dos = cv.take<bf16>(L::kv);
  bf16* ks = cv.take<bf16>(L::kv);
  bf16* vs = cv.take<bf16>(L::kv);
  float* ss = cv.take<float>(L::s);
  float* dps = cv.take<float>(L::s);
  bf16* dss = cv.take<bf16>(L::p);
  float* lse_s = cv.take<float>(L::stats);
  float* delta_s = cv.take<float>(L::stats);
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kTile, h = blockIdx.y, bi = blockIdx.z;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, wr = w * 16;
  const int row = (H + 2 * KV) * D, kvh = h / (H / KV);
  const bf16* base = qkv + int64_t(bi) * T * row;
  const int64_t stat0 = (int64_t(bi) * H + h) * T;
  // delta = rowsum(dO * O) for this tile's rows, written for the dK/dV kernel as well.
  for (int r = 0; r < 16; ++r) {
    const int tq = q0 + wr + r;
    if (tq >= T) break;
    const int64_t at = (int64_t(bi) * T + tq) * H * D + h * D;
    float s = 0.0f;
    for (int e = lane; e < D; e += 32) s += f(dout[at + e]) * f(out[at + e]);
    s = warp_sum(s);
    if (lane == 0) delta[stat0 + tq] = s;
  }
  tile_load<D>(qs, base + h * D, row, q0, T);
  tile_load<D>(dos, dout + int64_t(bi) * T * H * D + h * D, int64_t(H) * D, q0, T);
  __syncthreads();  // delta is written (global, this block's threads) before it is read back
  stats_load(lse_s, delta_s, lse + stat0, delta + stat0, q0, T);
  FragC dq[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dq[n], 0.0f);
  for (int k0 = first_key_tile(pos, bi, T, q0); k0 <= q0; k0 += kTile) {
    __syncthreads();
    tile_load<D>(ks, base + (H + kvh) * D, row, k0, T);
    tile_load<D>(vs, base + (H + KV + kvh) * D, row, k0, T);
    __syncthreads();
    warp_abt<D>(ss + wr * kLS, qs + wr * L::LD, ks);
    warp_abt<D>(dps + wr * kLS, dos + wr * L::LD, vs);
    __syncwarp();
    for (int r = 0; r < 16; ++r) {
      const int tq = q0 + wr + r, f0 = tq < T ? first_key(pos, bi, T, tq) : 0;
      for (int c = lane; c < kTile; c += 32) {
        const float p = recomputed_prob(key_visible(k0 + c, tq, f0), ss[(wr + r) * kLS + c], scale, lse_s[wr + r]);
        dss[(wr + r) * kLP + c] = b(p * (dps[(wr + r) * kLS + c] - delta_s[wr + r]));
      }
    }
    __syncwarp();
    warp_pb<D>(dq, dss + wr * kLP, ks);
  }
  __syncthreads();  // the staging tile overwrites q and do
  warp_store_rows<D>(dqkv + int64_t(bi) * T * row + h * D, row, q0, T, dq, reinterpret_cast<float*>(smem), scale);
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_dkv_tc(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta,
                     const int32_t* pos, int T, int H, int KV, float scale) {
  using L = Tiles<D>;
  LOOM_DYNAMIC_SHARED(unsigned char, smem, 128);
  Carve cv{smem};
  bf16* ks = cv.take<bf16>(L::kv);
  bf16* vs = cv.take<bf16>(L::kv);
  bf16* qs = cv.take<bf16>(L::kv);
  bf16* dos = cv.take<bf16>(L::kv);
  float* sts = cv.take<float>(L::s);
  float* dpts = cv.take<float>(L::s);
  bf16* pts = cv.take<bf16>(L::p);
  bf16* dsts = cv.take<bf16>(L::p);
  float* lse_s = cv.take<float>(L::stats);
  float* delta_s = cv.take<float>(L::stats);
  int* first_s = cv.take<int>(L::stats);
  // The first key tiles see the most queries: start them first.
  const int k0 = blockIdx.x * kTile, kvh = blockIdx.y, bi = blockIdx.z;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, wr = w * 16;
  const int row = (H + 2 * KV) * D, group = H / KV;
  const bf16* base = qkv + int64_t(bi) * T * row;
  tile_load<D>(ks, base + (H + kvh) * D, row, k0, T);
  tile_load<D>(vs, base + (H + KV + kvh) * D, row, k0, T);
  FragC dk[D / 16], dv[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    const int64_t stat0 = (int64_t(bi) * H + h) * T;
    // Past the query tile whose first row starts a document after this key tile, no query
    // attends to it.
    for (int q0 = k0; q0 < T && first_key(pos, bi, T, q0) < k0 + kTile; q0 += kTile) {
      __syncthreads();  // every warp is done with the previous Q and dO
      for (int i = threadIdx.x; i < kTile; i += kThreads) first_s[i] = q0 + i < T ? first_key(pos, bi, T, q0 + i) : 0;
      tile_load<D>(qs, base + h * D, row, q0, T);
      tile_load<D>(dos, dout + int64_t(bi) * T * H * D + h * D, int64_t(H) * D, q0, T);
      stats_load(lse_s, delta_s, lse + stat0, delta + stat0, q0, T);
      __syncthreads();
      // Transposed scores: this warp's 16 keys against the tile's 64 queries.
      warp_abt<D>(sts + wr * kLS, ks + wr * L::LD, qs);
      warp_abt<D>(dpts + wr * kLS, vs + wr * L::LD, dos);
      __syncwarp();
      for (int r = 0; r < 16; ++r) {
        const int tk = k0 + wr + r;
        for (int c = lane; c < kTile; c += 32) {
          const int tq = q0 + c;
          const float p =
              recomputed_prob(tq < T && key_visible(tk, tq, first_s[c]), sts[(wr + r) * kLS + c], scale, lse_s[c]);
          pts[(wr + r) * kLP + c] = b(p);
          dsts[(wr + r) * kLP + c] = b(p * (dpts[(wr + r) * kLS + c] - delta_s[c]));
        }
      }
      __syncwarp();
      warp_pb<D>(dv, pts + wr * kLP, dos);
      warp_pb<D>(dk, dsts + wr * kLP, qs);
    }
  }
  __syncthreads();  // the staging tile overwrites k and v
  float* stage = reinterpret_cast<float*>(smem);
  bf16* drows = dqkv + int64_t(bi) * T * row;
  warp_store_rows<D>(drows + (H + kvh) * D, row, k0, T, dk, stage, scale);
  __syncwarp();
  warp_store_rows<D>(drows + (H + KV + kvh) * D, row, k0, T, dv, stage, 1.0f);
}

template <int D>
void forward_d(bf16* out, float* lse, const bf16* qkv, int B, int T, int H, int KV, const int32_t* pos,
               cudaStream_t s) {
  const size_t bytes = Tiles<D>::forward;
  aligned16_check(qkv, "tensor-core attention", "qkv");
  smem_allow(attention_forward_tc<D>, bytes);
  const dim3 grid(blocks_for(T, kTile), H, B);
  LOOM_LAUNCH(attention_forward_tc<D>, grid, kThreads, bytes, s)
  (out, lse, qkv, pos, T, H, KV, 1.0f / sqrtf(float(D)));
  LOOM_CUDA_LAUNCHED();
}

template <int D>
void backward_d(bf16* dqkv, const bf16* dout, const bf16* out, const bf16* qkv, const float* lse, float* delta, int B,
                int T, int H, int KV, const int32_t* pos, cudaStream_t s) {
  const float scale = 1.0f / sqrtf(float(D));
  aligned16_check(qkv, "tensor-core attention", "qkv");
  aligned16_check(dout, "tensor-core attention", "dout");
  smem_allow(attention_dq_tc<D>, Tiles<D>::dq);
  smem_allow(attention_dkv_tc<D>, Tiles<D>::dkv);
  LOOM_LAUNCH(attention_dq_tc<D>, dim3(blocks_for(T, kTile), H, B), kThreads, Tiles<D>::dq, s)
  (dqkv, delta, dout, out, qkv, lse, pos, T, H, KV, scale);
  LOOM_CUDA_LAUNCHED();
  LOOM_LAUNCH(attention_dkv_tc<D>, dim3(blocks_for(T, kTile), KV, B), kThreads, Tiles<D>::dkv, s)
  (dqkv, dout, qkv, lse, delta, pos, T, H, KV, scale);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace

void attention_forward_wmma(bf16* out, float* lse, const bf16* qkv, int B, int T, int H, int KV, int D,
                            const int32_t* pos, cudaStream_t s) {
  if (D == 64) return forward_d<64>(out, lse, qkv, B, T, H, KV, pos, s);
  if (D == 128) return forward_d<128>(out, lse, qkv, B, T, H, KV, pos, s);
  fail("the WMMA attention kernels support head dims 64 and 128, not {}", D);
}

void attention_backward_wmma(bf16* dqkv, const bf16* dout, const bf16* out, const bf16* qkv, const float* lse,
                             float* scratch, int B, int T, int H, int KV, int D, const int32_t* pos, cudaStream_t s) {
  if (D == 64) return backward_d<64>(dqkv, dout, out, qkv, lse, scratch, B, T, H, KV, pos, s);
  if (D == 128) return backward_d<128>(dqkv, dout, out, qkv, lse, scratch, B, T, H, KV, pos, s);
  fail("the WMMA attention kernels support head dims 64 and 128, not {}", D);
}

}  // namespace loom::cuda::reference
