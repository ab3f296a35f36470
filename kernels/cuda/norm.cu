// LayerNorm and RMSNorm. The row kernels split a row into slices of 256 columns, one warp a
// slice (lane l holds columns 256 w + 8 l .. + 7 as one 128-bit word), and a block's warps
// take its rows one after another: each row's loads go out at once, a slice's sums meet the
// others' through shared memory, and the weight (and bias) slice is read once a warp, not once
// a row. Every input is read from memory once; rows wider than kMaxSlices * 256 take the
// scalar kernels, which read the row again from cache. The backward gives dinp and each
// block's weight and bias gradient partials in one pass (each lane sums its columns over its
// rows in registers), the blocks' partials then added in a fixed order. The forward kernels
// can first add the residual branch into their input in place (the fused residual + norm).
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace loom::cuda {

namespace {

constexpr int kWarps = 4;               // rows a block of the scalar (wide) kernels
constexpr int kSliceCols = 32 * kPack;  // a warp's share of a row: 256 columns
constexpr int kMaxSlices = 16;          // the widest row of the slice kernels: C = 4096
constexpr int kForwardRows = 8;         // the forward's rows a block, at most
// The backward's warps a block (slices times row groups, at most): enough rows in flight.
constexpr int kBackwardWarps = 24;

__host__ __device__ inline int row_slices(int C) {
  return (C + kSliceCols - 1) / kSliceCols;
}
__device__ __forceinline__ int slice_cols(int w, int C) {  // columns of slice w (the last may be short)
  return C - w * kSliceCols < kSliceCols ? C - w * kSliceCols : kSliceCols;
}

// Rows a block of the forward: 8 where N fills the GPU with them (the weight's slice then costs
// an eighth of a row), fewer for small N.
inline int forward_rows(int N) {
  return std::clamp((N + 1023) / 1024, 1, kForwardRows);
}

// Forward, bytes per row: reads C * 2 (inp) [+ C * 2 (add) + writes C * 2 (the sum)], writes
// C * 2 (out); a block reads the weight (and bias) once and writes its rows' mean and rstd
// in one request. A row is one batch of loads, one round trip. The variance: each slice's sum
// of squares about its own mean, combined with Chan's formula in slice order (no cancellation).
template <bool kCentered>
__device__ __forceinline__ void norm_forward_rows(bf16* __restrict__ out, float* __restrict__ mean,
                                                  float* __restrict__ rstd, bf16* __restrict__ inp,
                                                  const bf16* __restrict__ add, const bf16* __restrict__ weight,
                                                  const bf16* __restrict__ bias, int N, int C, float eps, bool aligned,
                                                  int rows) {
  __shared__ float part[2][kMaxSlices][2];  // by row parity and slice: sum (LayerNorm), sum of squares
  __shared__ float stats[2][kForwardRows];  // the block's rows' mean and rstd
  const int slices = int(blockDim.x) / 32, w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int c = (w * 32 + lane) * kPack, n0 = blockIdx.x * rows, n1 = n0 + rows < N ? n0 + rows : N;
  const int4 wraw = load_cols(weight, c, C, aligned);
  const int4 braw = kCentered ? load_cols(bias, c, C, aligned) : int4{0, 0, 0, 0};
  for (int n = n0; n < n1; ++n) {
    const int p = (n - n0) & 1;
    bf16* x = inp + int64_t(n) * C;
    int4 raw = load_cols(x, c, C, aligned);
    if (add) {
      float v[kPack], a[kPack];
      unpack8(v, raw);
      unpack8(a, load_cols(add + int64_t(n) * C, c, C, aligned));
#pragma unroll
      for (int k = 0; k < kPack; ++k) v[k] += a[k];
      raw = pack8(v);  // rounded to bf16, as the norm then reads it
      store_cols(x, c, C, aligned, raw);
    }
    float v[kPack];
    unpack8(v, raw);
    float s = 0.0f, q = 0.0f;
#pragma unroll
    for (int k = 0; k < kPack; ++k) s += v[k];  // zeros past C add nothing
    s = warp_sum(s);
    const float ms = kCentered ? s / slice_cols(w, C) : 0.0f;
#pragma unroll
    for (int k = 0; k < kPack; ++k)
      if (c + k < C) q += (v[k] - ms) * (v[k] - ms);
    q = warp_sum(q);
    if (lane == 0) part[p][w][0] = s, part[p][w][1] = q;
    // One barrier a row: a warp writes part[p] again two rows on, past the next row's barrier,
    // which every warp reaches only after reading this row's.
    __syncthreads();
    float m = 0.0f, m2 = 0.0f;
    if constexpr (kCentered) {
      for (int u = 0; u < slices; ++u) m += part[p][u][0];
      m /= C;
      for (int u = 0; u < slices; ++u) {
        const float cols = float(slice_cols(u, C)), d = part[p][u][0] / cols - m;
        m2 += part[p][u][1] + cols * d * d;
      }
    } else {
      for (int u = 0; u < slices; ++u) m2 += part[p][u][1];
    }
    const float r = rsqrtf(m2 / C + eps);
    float wv[kPack], bv[kPack];
    unpack8(wv, wraw);
    unpack8(bv, braw);
#pragma unroll
    for (int k = 0; k < kPack; ++k) v[k] = kCentered ? (v[k] - m) * r * wv[k] + bv[k] : v[k] * r * wv[k];
    store_cols(out + int64_t(n) * C, c, C, aligned, pack8(v));
    if (threadIdx.x == 0) stats[0][n - n0] = m, stats[1][n - n0] = r;
  }
  __syncthreads();
  if (int(threadIdx.x) < n1 - n0) {
    if constexpr (kCentered) mean[n0 + threadIdx.x] = stats[0][threadIdx.x];
    rstd[n0 + threadIdx.x] = stats[1][threadIdx.x];
  }
}

__global__ void __launch_bounds__(32 * kMaxSlices)
    layernorm_forward_kernel(bf16* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                             bf16* __restrict__ inp, const bf16* __restrict__ add, const bf16* __restrict__ weight,
                             const bf16* __restrict__ bias, int N, int C, float eps, bool aligned, int rows) {
  norm_forward_rows<true>(out, mean, rstd, inp, add, weight, bias, N, C, eps, aligned, rows);
}

__global__ void __launch_bounds__(32 * kMaxSlices)
    rmsnorm_forward_kernel(bf16* __restrict__ out, float* __restrict__ rstd, bf16* __restrict__ inp,
                           const bf16* __restrict__ add, const bf16* __restrict__ weight, int N, int C, float eps,
                           bool aligned, int rows) {
  norm_forward_rows<false>(out, nullptr, rstd, inp, add, weight, nullptr, N, C, eps, aligned, rows);
}

// The backward's block: `slices` warps a row group, groups(slices) groups, each group taking
// rows_a_group consecutive rows of the block's in order.
inline int backward_groups(int slices) {
  return std::max(1, kBackwardWarps / slices);
}
// Rows a group: 8, more where the grid would pass max_blocks blocks.
inline int backward_group_rows(int N, int groups, int max_blocks) {
  const int least = (N + max_blocks * groups - 1) / (max_blocks * groups);
  return std::max(8, least);
}
// The gradient partials' shared row of a group: column c at c + c / 32, so that a warp's
// store of element k (columns 8 l + k) and 32 consecutive columns' loads each hit 32 banks.
__host__ __device__ constexpr int padded_cols(int C) {
  return C + C / 32 + 1;
}

// dinp += the input gradient of the block's rows; with kGrad, row blockIdx.x of part_w (and
// part_b, LayerNorm) gets the sums over those rows of xhat * dy (and dy). Bytes per row: reads
// C * 2 each of dout, inp and dinp, writes C * 2 (dinp); a warp reads its weight slice once and
// its group's mean and rstd in one request each; a block writes 4 C (8 C) of partials. A row is
// one batch of loads, one round trip. The order of every sum is fixed by N and C: a lane adds
// its group's rows in order, the block its groups in order, column_finish the blocks in order.
template <bool kCentered, bool kGrad>
__device__ __forceinline__ void norm_backward_rows(bf16* __restrict__ dinp, float* __restrict__ part_w,
                                                   float* __restrict__ part_b, const bf16* __restrict__ dout,
                                                   const bf16* __restrict__ inp, const bf16* __restrict__ weight,
                                                   const float* __restrict__ mean, const float* __restrict__ rstd,
                                                   int N, int C, int group_rows, bool aligned) {
  __shared__ float part[2][kBackwardWarps][2];  // by row parity and warp: the slice's two dot products
  const int slices = row_slices(C), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = warp / slices, w = warp % slices, groups = int(blockDim.x) / (32 * slices);
  const int c = (w * 32 + lane) * kPack;
  const int n0 = (blockIdx.x * groups + g) * group_rows;
  const int4 wraw = load_cols(weight, c, C, aligned);
  float wv[kPack], my_mean = 0.0f, my_rstd = 0.0f;
  float acc_w[kPack] = {}, acc_b[kPack] = {};
  for (int i = 0; i < group_rows; ++i) {  // every group the same count: the barrier below
    const int n = n0 + i, p = i & 1;
    const bool valid = n < N;
    if (i % 32 == 0) {  // the next 32 rows' mean and rstd, lane l holding row n + l's
      const bool have = i + lane < group_rows && n + lane < N;
      my_mean = kCentered && have ? mean[n + lane] : 0.0f;
      my_rstd = have ? rstd[n + lane] : 0.0f;
    }
    int4 xr{0, 0, 0, 0}, dyr{0, 0, 0, 0}, dr{0, 0, 0, 0};
    if (valid) {
      xr = load_cols(inp + int64_t(n) * C, c, C, aligned);
      dyr = load_cols(dout + int64_t(n) * C, c, C, aligned);
      dr = load_cols(dinp + int64_t(n) * C, c, C, aligned);
    }
    const float m = kCentered ? __shfl_sync(0xffffffffu, my_mean, i % 32) : 0.0f;
    const float r = __shfl_sync(0xffffffffu, my_rstd, i % 32);
    float x[kPack], dy[kPack];
    unpack8(x, xr);
    unpack8(dy, dyr);
    unpack8(wv, wraw);
    float a = 0.0f, bb = 0.0f;  // the slice's sums of w*dy (LayerNorm only) and of w*dy*xhat
#pragma unroll
    for (int k = 0; k < kPack; ++k) {  // zeros past C: dy = 0 adds nothing
      const float dn = wv[k] * dy[k];
      if constexpr (kCentered) {
        a += dn;
        bb += dn * (x[k] - m) * r;
      } else {
        bb += dn * x[k] * r;
      }
    }
    if constexpr (kCentered) a = warp_sum(a);
    bb = warp_sum(bb);
    if (lane == 0) part[p][warp][0] = a, part[p][warp][1] = bb;
    __syncthreads();  // as the forward's: part[p] is written again only past the next barrier
    a = bb = 0.0f;
    for (int u = g * slices; u < (g + 1) * slices; ++u) {
      if constexpr (kCentered) a += part[p][u][0];
      bb += part[p][u][1];
    }
    a /= C;
    bb /= C;
    if (!valid) continue;
    float d[kPack];
    unpack8(d, dr);
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      if constexpr (kCentered)
        d[k] += (wv[k] * dy[k] - a - (x[k] - m) * r * bb) * r;
      else
        d[k] += (wv[k] * dy[k] - x[k] * r * bb) * r;
      if constexpr (kGrad) {
        acc_w[k] += (x[k] - m) * r * dy[k];
        if constexpr (kCentered) acc_b[k] += dy[k];
      }
    }
    store_cols(dinp + int64_t(n) * C, c, C, aligned, pack8(d));
  }
  if constexpr (kGrad) {
    // The groups' sums meet in shared memory and are added in group order into the block's row.
    LOOM_DYNAMIC_SHARED(float, red, 16);
    const int pc = padded_cols(C);
    float* mine = red + int64_t(g) * pc;
#pragma unroll
    for (int k = 0; k < kPack; ++k)
      if (c + k < C) {
        mine[c + k + (c + k) / 32] = acc_w[k];
        if constexpr (kCentered) mine[int64_t(groups) * pc + c + k + (c + k) / 32] = acc_b[k];
      }
    __syncthreads();
    for (int col = threadIdx.x; col < C; col += blockDim.x) {
      float sw = 0.0f, sb = 0.0f;
      for (int h = 0; h < groups; ++h) {
        sw += red[int64_t(h) * pc + col + col / 32];
        if constexpr (kCentered) sb += red[int64_t(groups + h) * pc + col + col / 32];
      }
      part_w[int64_t(blockIdx.x) * C + col] = sw;
      if constexpr (kCentered) part_b[int64_t(blockIdx.x) * C + col] = sb;
    }
  }
}

template <bool kGrad>
__global__ void __launch_bounds__(32 * kBackwardWarps)
    layernorm_backward_kernel(bf16* __restrict__ dinp, float* __restrict__ part_w, float* __restrict__ part_b,
                              const bf16* __restrict__ dout, const bf16* __restrict__ inp,
                              const bf16* __restrict__ weight, const float* __restrict__ mean,
                              const float* __restrict__ rstd, int N, int C, int group_rows, bool aligned) {
  norm_backward_rows<true, kGrad>(dinp, part_w, part_b, dout, inp, weight, mean, rstd, N, C, group_rows, aligned);
}

template <bool kGrad>
__global__ void __launch_bounds__(32 * kBackwardWarps)
    rmsnorm_backward_kernel(bf16* __restrict__ dinp, float* __restrict__ part_w, const bf16* __restrict__ dout,
                            const bf16* __restrict__ inp, const bf16* __restrict__ weight,
                            const float* __restrict__ rstd, int N, int C, int group_rows, bool aligned) {
  norm_backward_rows<false, kGrad>(dinp, part_w, nullptr, dout, inp, weight, nullptr, rstd, N, C, group_rows, aligned);
}

// dinp +=, and (with dweight) dweight (dbias) += their column sums, through the slice kernels.
template <bool kCentered>
void norm_backward_slices(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                          const bf16* weight, const float* mean, const float* rstd, int N, int C, bool aligned,
                          float* partials, int max_blocks, cudaStream_t s) {
  if (N <= 0) return;
  LOOM_CHECK(max_blocks >= 1 && max_blocks <= kMaxNormGradBlocks, "norm backward: max_blocks {} is not in [1, {}]",
             max_blocks, kMaxNormGradBlocks);
  const int slices = row_slices(C), groups = backward_groups(slices);
  const int group_rows = backward_group_rows(N, groups, max_blocks);
  const int blocks = (N + groups * group_rows - 1) / (groups * group_rows), threads = 32 * slices * groups;
  float *pa = partials, *pb = kCentered ? partials + int64_t(blocks) * C : nullptr;
  const size_t smem = dweight ? size_t(kCentered ? 2 : 1) * groups * padded_cols(C) * sizeof(float) : 0;
  if constexpr (kCentered) {
    if (dweight) {
      smem_allow(layernorm_backward_kernel<true>, smem);
      LOOM_LAUNCH(layernorm_backward_kernel<true>, blocks, threads, smem, s)
      (dinp, pa, pb, dout, inp, weight, mean, rstd, N, C, group_rows, aligned);
    } else {
      LOOM_LAUNCH(layernorm_backward_kernel<false>, blocks, threads, 0, s)
      (dinp, nullptr, nullptr, dout, inp, weight, mean, rstd, N, C, group_rows, aligned);
    }
  } else {
    if (dweight) {
      smem_allow(rmsnorm_backward_kernel<true>, smem);
      LOOM_LAUNCH(rmsnorm_backward_kernel<true>, blocks, threads, smem, s)
      (dinp, pa, dout, inp, weight, rstd, N, C, group_rows, aligned);
    } else {
      LOOM_LAUNCH(rmsnorm_backward_kernel<false>, blocks, threads, 0, s)
      (dinp, nullptr, dout, inp, weight, rstd, N, C, group_rows, aligned);
    }
  }
  LOOM_CUDA_LAUNCHED();
  if (dweight) column_finish<true>(dweight, kCentered ? dbias : nullptr, pa, pb, blocks, C, s);
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

}  // namespace

void layernorm_forward(bf16* out, float* mean, float* rstd, bf16* inp, const bf16* add, const bf16* weight,
                       const bf16* bias, int N, int C, float eps, cudaStream_t s, ScalarPaths* paths) {
  if (N <= 0) return;
  const bool aligned =
      C % kPack == 0 && aligned16(paths, "layernorm_forward",
                                  {{"out", out}, {"inp", inp}, {"add", add}, {"weight", weight}, {"bias", bias}});
  if (row_slices(C) <= kMaxSlices) {
    const int rows = forward_rows(N);
    LOOM_LAUNCH(layernorm_forward_kernel, blocks_for(N, rows), 32 * row_slices(C), 0, s)
    (out, mean, rstd, inp, add, weight, bias, N, C, eps, aligned, rows);
  } else {
    LOOM_LAUNCH(layernorm_forward_wide_kernel, blocks_for(N, kWarps), 32 * kWarps, 0, s)
    (out, mean, rstd, inp, add, weight, bias, N, C, eps);
  }
  LOOM_CUDA_LAUNCHED();
}

void layernorm_backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp, const bf16* weight,
                        const float* mean, const float* rstd, int N, int C, float* partials, cudaStream_t s,
                        ScalarPaths* paths, int max_blocks) {
  const bool slices = row_slices(C) <= kMaxSlices;
  if (dinp) {
    const bool aligned =
        C % kPack == 0 &&
        aligned16(paths, "layernorm_backward", {{"dinp", dinp}, {"dout", dout}, {"inp", inp}, {"weight", weight}});
    if (slices) {
      norm_backward_slices<true>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, aligned, partials,
                                 max_blocks, s);
      return;
    }
    LOOM_LAUNCH(layernorm_dinp_wide_kernel, blocks_for(N, kWarps), 32 * kWarps, 0, s)
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
  if (N <= 0) return;
  const bool aligned = C % kPack == 0 && aligned16(paths, "rmsnorm_forward",
                                                   {{"out", out}, {"inp", inp}, {"add", add}, {"weight", weight}});
  if (row_slices(C) <= kMaxSlices) {
    const int rows = forward_rows(N);
    LOOM_LAUNCH(rmsnorm_forward_kernel, blocks_for(N, rows), 32 * row_slices(C), 0, s)
    (out, rstd, inp, add, weight, N, C, eps, aligned, rows);
  } else {
    LOOM_LAUNCH(rmsnorm_forward_wide_kernel, blocks_for(N, kWarps), 32 * kWarps, 0, s)
    (out, rstd, inp, add, weight, N, C, eps);
  }
  LOOM_CUDA_LAUNCHED();
}

void rmsnorm_backward(bf16* dinp, float* dweight, const bf16* dout, const bf16* inp, const bf16* weight,
                      const float* rstd, int N, int C, float* partials, cudaStream_t s, ScalarPaths* paths,
                      int max_blocks) {
  const bool slices = row_slices(C) <= kMaxSlices;
  if (dinp) {
    const bool aligned =
        C % kPack == 0 &&
        aligned16(paths, "rmsnorm_backward", {{"dinp", dinp}, {"dout", dout}, {"inp", inp}, {"weight", weight}});
    if (slices) {
      norm_backward_slices<false>(dinp, dweight, nullptr, dout, inp, weight, nullptr, rstd, N, C, aligned, partials,
                                  max_blocks, s);
      return;
    }
    LOOM_LAUNCH(rmsnorm_dinp_wide_kernel, blocks_for(N, kWarps), 32 * kWarps, 0, s)
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
