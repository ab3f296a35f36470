// LayerNorm and RMSNorm. The row kernels give each row one warp and hold the row in registers
// (lane l keeps columns 8 (l + 32 j) .. + 7, j < V, as packed bf16), so every input is read
// from memory once, in 128-bit words where the rows are aligned; rows wider than
// kMaxRowVecs * 256 take the scalar kernels, which read the row again from cache. The backward
// gives dinp and the weight and bias gradients' per-block partials in one pass over dout and inp
// (up to 8 words a lane; wider rows sum their columns in a second pass, common.cuh), the blocks'
// partials then added in a fixed order. The forward
// kernels can first add the residual branch into their input in place (the fused residual +
// norm of each block).
#include <algorithm>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace loom::cuda {

namespace {

constexpr int kWarps = 4;        // rows per block
constexpr int kMaxRowVecs = 16;  // the widest row kept in registers: 16 words a lane, C = 4096

// Word j of the lane's share of a row: its first column.
__device__ __forceinline__ int lane_col(int lane, int j) {
  return (lane + 32 * j) * kPack;
}

// Loads the lane's share of row x into raw (zeros past C), first adding add's row into x in
// place (rounded to bf16, as the norm then reads it) when add is not null.
template <int V>
__device__ __forceinline__ void load_row(int4 (&raw)[V], bf16* __restrict__ x, const bf16* __restrict__ add, int C,
                                         bool aligned, int lane) {
#pragma unroll
  for (int j = 0; j < V; ++j) raw[j] = load_cols(x, lane_col(lane, j), C, aligned);
  if (!add) return;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    float v[kPack], a[kPack];
    unpack8(v, raw[j]);
    unpack8(a, load_cols(add, lane_col(lane, j), C, aligned));
#pragma unroll
    for (int k = 0; k < kPack; ++k) v[k] += a[k];
    raw[j] = pack8(v);
    store_cols(x, lane_col(lane, j), C, aligned, raw[j]);
  }
}

// Forward, bytes per row: reads C * 2 (inp) [+ C * 2 (add) + writes C * 2 (the sum)], writes
// C * 2 (out) + 8 (mean, rstd); the weight and bias come from L1/L2. Bound by DRAM bandwidth:
// 4C bytes a row, 8C with the residual add.
template <int V>
__global__ void __launch_bounds__(32 * kWarps)
    layernorm_forward_kernel(bf16* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                             bf16* __restrict__ inp, const bf16* __restrict__ add, const bf16* __restrict__ weight,
                             const bf16* __restrict__ bias, int N, int C, float eps, bool aligned) {
  const int n = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N) return;
  int4 raw[V];
  load_row(raw, inp + int64_t(n) * C, add ? add + int64_t(n) * C : nullptr, C, aligned, lane);
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    float v[kPack];
    unpack8(v, raw[j]);
#pragma unroll
    for (int k = 0; k < kPack; ++k) s += v[k];  // zeros past C add nothing
  }
  const float m = warp_sum(s) / C;
  float q = 0.0f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    float v[kPack];
    unpack8(v, raw[j]);
#pragma unroll
    for (int k = 0; k < kPack; ++k)
      if (lane_col(lane, j) + k < C) q += (v[k] - m) * (v[k] - m);
  }
  const float r = rsqrtf(warp_sum(q) / C + eps);
  bf16* o = out + int64_t(n) * C;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int c = lane_col(lane, j);
    float v[kPack], w[kPack], bb[kPack];
    unpack8(v, raw[j]);
    unpack8(w, load_cols(weight, c, C, aligned));
    unpack8(bb, load_cols(bias, c, C, aligned));
#pragma unroll
    for (int k = 0; k < kPack; ++k) v[k] = (v[k] - m) * r * w[k] + bb[k];
    store_cols(o, c, C, aligned, pack8(v));
  }
  if (lane == 0) mean[n] = m, rstd[n] = r;
}

// RMSNorm forward, bytes per row: as LayerNorm's less the bias and the mean: 4C (8C with the
// residual add) + 4, at DRAM bandwidth.
template <int V>
__global__ void __launch_bounds__(32 * kWarps)
    rmsnorm_forward_kernel(bf16* __restrict__ out, float* __restrict__ rstd, bf16* __restrict__ inp,
                           const bf16* __restrict__ add, const bf16* __restrict__ weight, int N, int C, float eps,
                           bool aligned) {
  const int n = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N) return;
  int4 raw[V];
  load_row(raw, inp + int64_t(n) * C, add ? add + int64_t(n) * C : nullptr, C, aligned, lane);
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    float v[kPack];
    unpack8(v, raw[j]);
#pragma unroll
    for (int k = 0; k < kPack; ++k) ss += v[k] * v[k];
  }
  const float r = rsqrtf(warp_sum(ss) / C + eps);
  bf16* o = out + int64_t(n) * C;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int c = lane_col(lane, j);
    float v[kPack], w[kPack];
    unpack8(v, raw[j]);
    unpack8(w, load_cols(weight, c, C, aligned));
#pragma unroll
    for (int k = 0; k < kPack; ++k) v[k] = v[k] * r * w[k];
    store_cols(o, c, C, aligned, pack8(v));
  }
  if (lane == 0) rstd[n] = r;
}

// No weight or bias gradient: the dinp-only kernels' rows add nothing.
struct NoGrad {
  __device__ void operator()(int, const float (&)[kPack], const float (&)[kPack], float, float) const {}
};

// Row n's input gradient, LayerNorm's (kCentered) or RMSNorm's (the same formula less the mean
// and the mean of w*dy, written out so that each compiles to its own expression). Bytes per
// row: reads C * 2 each of dout, inp and dinp (+=), writes C * 2 (dinp), reads 4 or 8 (rstd,
// mean): 8C bytes a row at DRAM bandwidth. grad(j, x, dy, m, r) sees each of the lane's words
// once, for the weight and bias gradients of the fused kernel.
template <int V, bool kCentered, class Grad>
__device__ __forceinline__ void norm_dinp_row(bf16* __restrict__ dinp, const bf16* __restrict__ dout,
                                              const bf16* __restrict__ inp, const bf16* __restrict__ weight,
                                              const float* __restrict__ mean, const float* __restrict__ rstd, int n,
                                              int C, bool aligned, int lane, Grad grad) {
  int4 xr[V], dyr[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    xr[j] = load_cols(inp + int64_t(n) * C, lane_col(lane, j), C, aligned);
    dyr[j] = load_cols(dout + int64_t(n) * C, lane_col(lane, j), C, aligned);
  }
  const float m = kCentered ? mean[n] : 0.0f, r = rstd[n];
  float a = 0.0f, bb = 0.0f;  // the means of w*dy (LayerNorm only) and of w*dy*xhat
#pragma unroll
  for (int j = 0; j < V; ++j) {
    float x[kPack], dy[kPack], w[kPack];
    unpack8(x, xr[j]);
    unpack8(dy, dyr[j]);
    unpack8(w, load_cols(weight, lane_col(lane, j), C, aligned));
#pragma unroll
    for (int k = 0; k < kPack; ++k) {  // zeros past C: dy = 0 adds nothing
      const float dn = w[k] * dy[k];
      if constexpr (kCentered) {
        a += dn;
        bb += dn * (x[k] - m) * r;
      } else {
        bb += dn * x[k] * r;
      }
    }
  }
  if constexpr (kCentered) a = warp_sum(a) / C;
  bb = warp_sum(bb) / C;
  bf16* dx = dinp + int64_t(n) * C;
  // The read-modify-write of dinp in chunks of up to 4 words: a chunk's dinp and weight words
  // all load before any store (the compiler will not move a load above a store into the same
  // row), so the row takes one round trip a chunk rather than one a word.
  constexpr int kChunk = V < 4 ? V : 4;
#pragma unroll
  for (int j0 = 0; j0 < V; j0 += kChunk) {
    int4 dr[kChunk], wr[kChunk];
#pragma unroll
    for (int jj = 0; jj < kChunk; ++jj) {
      dr[jj] = load_cols(dx, lane_col(lane, j0 + jj), C, aligned);
      wr[jj] = load_cols(weight, lane_col(lane, j0 + jj), C, aligned);
    }
#pragma unroll
    for (int jj = 0; jj < kChunk; ++jj) {
      const int j = j0 + jj, c = lane_col(lane, j);
      float x[kPack], dy[kPack], w[kPack], d[kPack];
      unpack8(x, xr[j]);
      unpack8(dy, dyr[j]);
      unpack8(w, wr[jj]);
      unpack8(d, dr[jj]);
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        if constexpr (kCentered)
          d[k] += (w[k] * dy[k] - a - (x[k] - m) * r * bb) * r;
        else
          d[k] += (w[k] * dy[k] - x[k] * r * bb) * r;
      }
      store_cols(dx, c, C, aligned, pack8(d));
      grad(j, x, dy, m, r);
    }
  }
}

// Four blocks an SM (128 registers) at 8 words a lane, as before the dinp loads were hoisted
// (unbounded it takes 131: three); elsewhere 0, no bound (a bound lets the narrower rows take
// more registers than they need, fewer blocks).
template <int V>
constexpr int kDinpBlocks = V == 8 ? 4 : 0;

// The input gradient alone (no weight gradient asked for, or rows of 16 words a lane): a warp a row.
template <int V>
__global__ void __launch_bounds__(32 * kWarps, kDinpBlocks<V>)
    layernorm_dinp_kernel(bf16* __restrict__ dinp, const bf16* __restrict__ dout, const bf16* __restrict__ inp,
                          const bf16* __restrict__ weight, const float* __restrict__ mean,
                          const float* __restrict__ rstd, int N, int C, bool aligned) {
  const int n = blockIdx.x * kWarps + threadIdx.x / 32;
  if (n < N) norm_dinp_row<V, true>(dinp, dout, inp, weight, mean, rstd, n, C, aligned, threadIdx.x % 32, NoGrad{});
}

template <int V>
__global__ void __launch_bounds__(32 * kWarps, kDinpBlocks<V>)
    rmsnorm_dinp_kernel(bf16* __restrict__ dinp, const bf16* __restrict__ dout, const bf16* __restrict__ inp,
                        const bf16* __restrict__ weight, const float* __restrict__ rstd, int N, int C, bool aligned) {
  const int n = blockIdx.x * kWarps + threadIdx.x / 32;
  if (n < N) norm_dinp_row<V, false>(dinp, dout, inp, weight, nullptr, rstd, n, C, aligned, threadIdx.x % 32, NoGrad{});
}

// The fused backward: dinp and the weight (and bias) gradients' partials from one read of dout
// and inp. W warps a block; block g takes rows [g R, g R + R) and its warp w the rows
// g R + w + W i, in order, each row's xhat * dy (and dy) added into the warp's own accumulators
// in shared memory. Then the block adds its warps' accumulators in warp order into row g of the
// partials, and column_finish adds the rows in block order: the order of every sum is fixed by
// N and C alone. A warp's accumulators hold word j, element k of lane l at
// 32 (8 j + k) + (l + 4 k) % 32: a warp's access of one (j, k) and the finish's 32 consecutive
// columns (4 lanes by 8 elements) each touch 32 banks.
template <int V, bool kCentered>
struct NormGradShape {
  static constexpr int kHalves = kCentered ? 2 : 1;  // the weight's and the bias's gradients
  static constexpr int kWarpFloats = 32 * kPack * V;
  static constexpr int kWarpBytes = kWarpFloats * 4 * kHalves;
  // Eight warps (the one block size the launch table and ptxas check hold for every V).
  static constexpr int kWarps = 8;
  static constexpr int kSmem = kWarps * kWarpBytes;
  // Blocks an SM the registers must allow: three (85 a thread) up to 3 words a lane, else two
  // where two blocks' accumulators fit, else one.
  static constexpr int kBlocksPerSm = kSmem > 96 * 1024 ? 1 : V <= 3 ? 3 : 2;
};
// Rows of 16 words a lane keep the separate partials (two warps a block of 64 KB would not keep
// enough rows in flight).
template <int V>
constexpr bool kFusedGrad = V <= 8;

__device__ __forceinline__ int acc_at(int j, int k, int lane) {
  return ((j * kPack + k) << 5) | ((lane + 4 * k) & 31);
}

template <int V, bool kCentered>
struct SharedGrad {
  float* acc;  // the warp's accumulators: the weight's, then the bias's
  int lane;
  __device__ void operator()(int j, const float (&x)[kPack], const float (&dy)[kPack], float m, float r) const {
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      float& a = acc[acc_at(j, k, lane)];
      if constexpr (kCentered) {
        a += (x[k] - m) * r * dy[k];
        acc[NormGradShape<V, kCentered>::kWarpFloats + acc_at(j, k, lane)] += dy[k];
      } else {
        a += x[k] * r * dy[k];
      }
    }
  }
};

template <int V, bool kCentered>
__device__ __forceinline__ void norm_backward_rows(bf16* __restrict__ dinp, float* __restrict__ part_a,
                                                   float* __restrict__ part_b, const bf16* __restrict__ dout,
                                                   const bf16* __restrict__ inp, const bf16* __restrict__ weight,
                                                   const float* __restrict__ mean, const float* __restrict__ rstd,
                                                   int N, int C, int rows, bool aligned) {
  using S = NormGradShape<V, kCentered>;
  LOOM_DYNAMIC_SHARED(float, acc, 16);
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const SharedGrad<V, kCentered> grad{acc + w * S::kHalves * S::kWarpFloats, lane};
#pragma unroll
  for (int j = 0; j < V; ++j)
#pragma unroll
    for (int k = 0; k < kPack; ++k)
#pragma unroll
      for (int h = 0; h < S::kHalves; ++h) grad.acc[h * S::kWarpFloats + acc_at(j, k, lane)] = 0.0f;
  const int n0 = blockIdx.x * rows, n1 = n0 + rows < N ? n0 + rows : N;
  for (int n = n0 + w; n < n1; n += S::kWarps)
    norm_dinp_row<V, kCentered>(dinp, dout, inp, weight, mean, rstd, n, C, aligned, lane, grad);
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += 32 * S::kWarps) {
    const int at = acc_at(c / (32 * kPack), c % kPack, c / kPack % 32);
    float a = 0.0f, bsum = 0.0f;
    for (int v = 0; v < S::kWarps; ++v) {
      a += acc[v * S::kHalves * S::kWarpFloats + at];
      if constexpr (kCentered) bsum += acc[(v * S::kHalves + 1) * S::kWarpFloats + at];
    }
    part_a[int64_t(blockIdx.x) * C + c] = a;
    if constexpr (kCentered) part_b[int64_t(blockIdx.x) * C + c] = bsum;
  }
}

// Two or three blocks an SM: the rows' round trips overlap over 16-24 warps.
template <int V>
__global__ void __launch_bounds__(32 * NormGradShape<V, true>::kWarps, NormGradShape<V, true>::kBlocksPerSm)
    layernorm_backward_kernel(bf16* __restrict__ dinp, float* __restrict__ part_w, float* __restrict__ part_b,
                              const bf16* __restrict__ dout, const bf16* __restrict__ inp,
                              const bf16* __restrict__ weight, const float* __restrict__ mean,
                              const float* __restrict__ rstd, int N, int C, int rows, bool aligned) {
  norm_backward_rows<V, true>(dinp, part_w, part_b, dout, inp, weight, mean, rstd, N, C, rows, aligned);
}

template <int V>
__global__ void __launch_bounds__(32 * NormGradShape<V, false>::kWarps, NormGradShape<V, false>::kBlocksPerSm)
    rmsnorm_backward_kernel(bf16* __restrict__ dinp, float* __restrict__ part_w, const bf16* __restrict__ dout,
                            const bf16* __restrict__ inp, const bf16* __restrict__ weight,
                            const float* __restrict__ rstd, int N, int C, int rows, bool aligned) {
  norm_backward_rows<V, false>(dinp, part_w, nullptr, dout, inp, weight, nullptr, rstd, N, C, rows, aligned);
}

// Rows a block of the fused kernel: 4 a warp (16384 rows: 512 blocks, 3 on every SM), more
// where that would pass kMaxNormGradBlocks.
inline int norm_grad_rows(int N, int warps) {
  const int least = (N + kMaxNormGradBlocks - 1) / kMaxNormGradBlocks;
  return std::max(warps * 4, (least + warps - 1) / warps * warps);
}

// dinp +=, and dweight (dbias) += their column sums, through the fused kernel.
template <int V, bool kCentered>
void norm_backward_fused(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                         const bf16* weight, const float* mean, const float* rstd, int N, int C, bool aligned,
                         float* partials, cudaStream_t s) {
  using S = NormGradShape<V, kCentered>;
  if (N <= 0) return;
  const int rows = norm_grad_rows(N, S::kWarps), blocks = (N + rows - 1) / rows;
  float *pa = partials, *pb = kCentered ? partials + int64_t(blocks) * C : nullptr;
  if constexpr (kCentered) {
    smem_allow(layernorm_backward_kernel<V>, S::kSmem);
    LOOM_LAUNCH(layernorm_backward_kernel<V>, blocks, 32 * S::kWarps, S::kSmem, s)
    (dinp, pa, pb, dout, inp, weight, mean, rstd, N, C, rows, aligned);
  } else {
    smem_allow(rmsnorm_backward_kernel<V>, S::kSmem);
    LOOM_LAUNCH(rmsnorm_backward_kernel<V>, blocks, 32 * S::kWarps, S::kSmem, s)
    (dinp, pa, dout, inp, weight, rstd, N, C, rows, aligned);
  }
  LOOM_CUDA_LAUNCHED();
  column_finish<true>(dweight, kCentered ? dbias : nullptr, pa, pb, blocks, C, s);
}

// Rows wider than the register kernels hold: a warp per row, scalar, each pass reading the row
// again (from L1/L2).
// Row n of inp, after inp += add when add is not null: the lane's columns are summed and
// stored in place, and the passes after the first read the stored (bf16-rounded) sums.
__device__ __forceinline__ float row_value(bf16* x, const bf16* add, int c) {
  if (!add) return f(x[c]);
  const bf16 v = b(f(x[c]) + f(add[c]));
  x[c] = v;
  return f(v);
}

__global__ void layernorm_forward_wide_kernel(bf16* out, float* mean, float* rstd, bf16* inp, const bf16* add,
                                              const bf16* weight, const bf16* bias, int N, int C, float eps) {
  const int n = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N) return;
  bf16* x = inp + int64_t(n) * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += row_value(x, add ? add + int64_t(n) * C : nullptr, c);
  const float m = warp_sum(s) / C;
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) v += (f(x[c]) - m) * (f(x[c]) - m);
  const float r = rsqrtf(warp_sum(v) / C + eps);
  bf16* o = out + int64_t(n) * C;
  for (int c = lane; c < C; c += 32) o[c] = b((f(x[c]) - m) * r * f(weight[c]) + f(bias[c]));
  if (lane == 0) mean[n] = m, rstd[n] = r;
}

__global__ void layernorm_dinp_wide_kernel(bf16* dinp, const bf16* dout, const bf16* inp, const bf16* weight,
                                           const float* mean, const float* rstd, int N, int C) {
  const int n = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N) return;
  const bf16* x = inp + int64_t(n) * C;
  const bf16* dy = dout + int64_t(n) * C;
  const float m = mean[n], r = rstd[n];
  float a = 0.0f, bb = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float dn = f(weight[c]) * f(dy[c]);
    a += dn;
    bb += dn * (f(x[c]) - m) * r;
  }
  a = warp_sum(a) / C;
  bb = warp_sum(bb) / C;
  bf16* dx = dinp + int64_t(n) * C;
  for (int c = lane; c < C; c += 32) {
    float xhat = (f(x[c]) - m) * r;
    dx[c] = b(f(dx[c]) + (f(weight[c]) * f(dy[c]) - a - xhat * bb) * r);
  }
}

// Row n's contribution to the weight (a) and bias (b) gradients of column c; mean is null for
// RMSNorm (xhat = x * rstd).
struct NormGrad {
  const bf16* dout;
  const bf16* inp;
  const float* mean;
  const float* rstd;
  int C;
  __device__ void operator()(int n, int c, float& a, float& b) const {
    const float dy = f(dout[int64_t(n) * C + c]);
    a += (f(inp[int64_t(n) * C + c]) - (mean ? mean[n] : 0.0f)) * rstd[n] * dy;
    b += dy;
  }
  __device__ void word(int n, int c, float (&a)[kPack], float (&b)[kPack]) const {
    float dy[kPack], x[kPack];
    unpack8(dy, load128(dout + int64_t(n) * C + c));
    unpack8(x, load128(inp + int64_t(n) * C + c));
    const float m = mean ? mean[n] : 0.0f, r = rstd[n];
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      a[k] += (x[k] - m) * r * dy[k];
      b[k] += dy[k];
    }
  }
};

__global__ void rmsnorm_forward_wide_kernel(bf16* out, float* rstd, bf16* inp, const bf16* add, const bf16* weight,
                                            int N, int C, float eps) {
  const int n = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N) return;
  bf16* x = inp + int64_t(n) * C;
  float ss = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float v = row_value(x, add ? add + int64_t(n) * C : nullptr, c);
    ss += v * v;
  }
  const float r = rsqrtf(warp_sum(ss) / C + eps);
  bf16* o = out + int64_t(n) * C;
  for (int c = lane; c < C; c += 32) o[c] = b(f(x[c]) * r * f(weight[c]));
  if (lane == 0) rstd[n] = r;
}

__global__ void rmsnorm_dinp_wide_kernel(bf16* dinp, const bf16* dout, const bf16* inp, const bf16* weight,
                                         const float* rstd, int N, int C) {
  const int n = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N) return;
  const bf16* x = inp + int64_t(n) * C;
  const bf16* dy = dout + int64_t(n) * C;
  const float r = rstd[n];
  float dot = 0.0f;
  for (int c = lane; c < C; c += 32) dot += f(weight[c]) * f(dy[c]) * f(x[c]) * r;
  dot = warp_sum(dot) / C;
  bf16* dx = dinp + int64_t(n) * C;
  for (int c = lane; c < C; c += 32) dx[c] = b(f(dx[c]) + (f(weight[c]) * f(dy[c]) - f(x[c]) * r * dot) * r);
}

// Calls fn(integral_constant<V>) with the fewest words a lane of the register kernels (1, 2, 3,
// 4, 8 or 16) that hold a row of C; false where C is wider (the scalar kernels' rows).
template <class Fn>
bool with_row_vecs(int C, Fn fn) {
  const int need = (C + 32 * kPack - 1) / (32 * kPack);
  if (need <= 1)
    fn(std::integral_constant<int, 1>{});
  else if (need <= 2)
    fn(std::integral_constant<int, 2>{});
  else if (need <= 3)
    fn(std::integral_constant<int, 3>{});
  else if (need <= 4)
    fn(std::integral_constant<int, 4>{});
  else if (need <= 8)
    fn(std::integral_constant<int, 8>{});
  else if (need <= kMaxRowVecs)
    fn(std::integral_constant<int, kMaxRowVecs>{});
  else
    return false;
  return true;
}

}  // namespace

void layernorm_forward(bf16* out, float* mean, float* rstd, bf16* inp, const bf16* add, const bf16* weight,
                       const bf16* bias, int N, int C, float eps, cudaStream_t s, ScalarPaths* paths) {
  const bool aligned =
      C % kPack == 0 && aligned16(paths, "layernorm_forward",
                                  {{"out", out}, {"inp", inp}, {"add", add}, {"weight", weight}, {"bias", bias}});
  const bool fits = with_row_vecs(C, [&](auto v) {
    LOOM_LAUNCH(layernorm_forward_kernel<decltype(v)::value>, blocks_for(N, kWarps), 32 * kWarps, 0, s)
    (out, mean, rstd, inp, add, weight, bias, N, C, eps, aligned);
  });
  if (!fits) LOOM_LAUNCH(layernorm_forward_wide_kernel, blocks_for(N, kWarps), 32 * kWarps, 0, s)
  (out, mean, rstd, inp, add, weight, bias, N, C, eps);
  LOOM_CUDA_LAUNCHED();
}

void layernorm_backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp, const bf16* weight,
                        const float* mean, const float* rstd, int N, int C, float* partials, cudaStream_t s,
                        ScalarPaths* paths) {
  if (dinp) {
    const bool aligned =
        C % kPack == 0 &&
        aligned16(paths, "layernorm_backward", {{"dinp", dinp}, {"dout", dout}, {"inp", inp}, {"weight", weight}});
    bool fused = false;
    const bool fits = with_row_vecs(C, [&](auto v) {
      constexpr int V = decltype(v)::value;
      if constexpr (kFusedGrad<V>) {
        if (dweight) {
          norm_backward_fused<V, true>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, aligned, partials, s);
          fused = true;
          return;
        }
      }
      LOOM_LAUNCH(layernorm_dinp_kernel<V>, blocks_for(N, kWarps), 32 * kWarps, 0, s)
      (dinp, dout, inp, weight, mean, rstd, N, C, aligned);
    });
    if (fused) return;
    if (!fits) LOOM_LAUNCH(layernorm_dinp_wide_kernel, blocks_for(N, kWarps), 32 * kWarps, 0, s)
    (dinp, dout, inp, weight, mean, rstd, N, C);
    LOOM_CUDA_LAUNCHED();
  }
  if (!dweight) return;
  column_sums_2stage_words<true>(
      dweight, dbias, NormGrad{dout, inp, mean, rstd, C}, N, C,
      C % kPack == 0 && aligned16(paths, "layernorm_backward (weight gradient)", {{"dout", dout}, {"inp", inp}}),
      partials, s);
}

void rmsnorm_forward(bf16* out, float* rstd, bf16* inp, const bf16* add, const bf16* weight, int N, int C, float eps,
                     cudaStream_t s, ScalarPaths* paths) {
  const bool aligned = C % kPack == 0 && aligned16(paths, "rmsnorm_forward",
                                                   {{"out", out}, {"inp", inp}, {"add", add}, {"weight", weight}});
  const bool fits = with_row_vecs(C, [&](auto v) {
    LOOM_LAUNCH(rmsnorm_forward_kernel<decltype(v)::value>, blocks_for(N, kWarps), 32 * kWarps, 0, s)
    (out, rstd, inp, add, weight, N, C, eps, aligned);
  });
  if (!fits) LOOM_LAUNCH(rmsnorm_forward_wide_kernel, blocks_for(N, kWarps), 32 * kWarps, 0, s)
  (out, rstd, inp, add, weight, N, C, eps);
  LOOM_CUDA_LAUNCHED();
}

void rmsnorm_backward(bf16* dinp, float* dweight, const bf16* dout, const bf16* inp, const bf16* weight,
                      const float* rstd, int N, int C, float* partials, cudaStream_t s, ScalarPaths* paths) {
  if (dinp) {
    const bool aligned =
        C % kPack == 0 &&
        aligned16(paths, "rmsnorm_backward", {{"dinp", dinp}, {"dout", dout}, {"inp", inp}, {"weight", weight}});
    bool fused = false;
    const bool fits = with_row_vecs(C, [&](auto v) {
      constexpr int V = decltype(v)::value;
      if constexpr (kFusedGrad<V>) {
        if (dweight) {
          norm_backward_fused<V, false>(dinp, dweight, nullptr, dout, inp, weight, nullptr, rstd, N, C, aligned,
                                        partials, s);
          fused = true;
          return;
        }
      }
      LOOM_LAUNCH(rmsnorm_dinp_kernel<V>, blocks_for(N, kWarps), 32 * kWarps, 0, s)
      (dinp, dout, inp, weight, rstd, N, C, aligned);
    });
    if (fused) return;
    if (!fits) LOOM_LAUNCH(rmsnorm_dinp_wide_kernel, blocks_for(N, kWarps), 32 * kWarps, 0, s)
    (dinp, dout, inp, weight, rstd, N, C);
    LOOM_CUDA_LAUNCHED();
  }
  if (!dweight) return;
  column_sums_2stage_words<true>(
      dweight, nullptr, NormGrad{dout, inp, nullptr, rstd, C}, N, C,
      C % kPack == 0 && aligned16(paths, "rmsnorm_backward (weight gradient)", {{"dout", dout}, {"inp", inp}}),
      partials, s);
}

}  // namespace loom::cuda
