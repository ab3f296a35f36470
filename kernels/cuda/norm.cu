// LayerNorm and RMSNorm: one warp per row for the row statistics and the input gradient; the
// weight and bias gradients are column sums in two deterministic stages (common.cuh). The forward kernels can first add
// the residual branch into their input in place (the fused residual + norm of each block).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace loom::cuda {

namespace {

constexpr int kWarps = 4;  // rows per block

// Row n of inp, after inp += add when add is not null: the lane's columns are summed and
// stored in place, and the passes after the first read the stored (bf16-rounded) sums.
__device__ __forceinline__ float row_value(bf16* x, const bf16* add, int c) {
  if (!add) return f(x[c]);
  const bf16 v = b(f(x[c]) + f(add[c]));
  x[c] = v;
  return f(v);
}

__global__ void layernorm_forward_kernel(bf16* out, float* mean, float* rstd, bf16* inp, const bf16* add,
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

__global__ void layernorm_dinp_kernel(bf16* dinp, const bf16* dout, const bf16* inp, const bf16* weight,
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
};

__global__ void rmsnorm_forward_kernel(bf16* out, float* rstd, bf16* inp, const bf16* add, const bf16* weight, int N,
                                       int C, float eps) {
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

__global__ void rmsnorm_dinp_kernel(bf16* dinp, const bf16* dout, const bf16* inp, const bf16* weight,
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
                       const bf16* bias, int N, int C, float eps, cudaStream_t s) {
  LOOM_LAUNCH(layernorm_forward_kernel, blocks_for(N, kWarps), 32 * kWarps, 0, s)
  (out, mean, rstd, inp, add, weight, bias, N, C, eps);
  LOOM_CUDA_LAUNCHED();
}

void layernorm_backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp, const bf16* weight,
                        const float* mean, const float* rstd, int N, int C, float* partials, cudaStream_t s) {
  if (dinp) {
    LOOM_LAUNCH(layernorm_dinp_kernel, blocks_for(N, kWarps), 32 * kWarps, 0, s)
    (dinp, dout, inp, weight, mean, rstd, N, C);
    LOOM_CUDA_LAUNCHED();
  }
  if (!dweight) return;
  column_sums_2stage<true>(dweight, dbias, NormGrad{dout, inp, mean, rstd, C}, N, C, partials, s);
}

void rmsnorm_forward(bf16* out, float* rstd, bf16* inp, const bf16* add, const bf16* weight, int N, int C, float eps,
                     cudaStream_t s) {
  LOOM_LAUNCH(rmsnorm_forward_kernel, blocks_for(N, kWarps), 32 * kWarps, 0, s)(out, rstd, inp, add, weight, N, C, eps);
  LOOM_CUDA_LAUNCHED();
}

void rmsnorm_backward(bf16* dinp, float* dweight, const bf16* dout, const bf16* inp, const bf16* weight,
                      const float* rstd, int N, int C, float* partials, cudaStream_t s) {
  if (dinp) {
    LOOM_LAUNCH(rmsnorm_dinp_kernel, blocks_for(N, kWarps), 32 * kWarps, 0, s)(dinp, dout, inp, weight, rstd, N, C);
    LOOM_CUDA_LAUNCHED();
  }
  if (!dweight) return;
  column_sums_2stage<true>(dweight, nullptr, NormGrad{dout, inp, nullptr, rstd, C}, N, C, partials, s);
}

}  // namespace loom::cuda
