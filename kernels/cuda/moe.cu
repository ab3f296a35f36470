// Mixture-of-experts routing, permutation and combination: the twins of kernels/cpu/moe.cpp,
// one thread per token (or row), each doing its own row's work in a fixed order (no atomics).
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/moe_row.h"

namespace loom::cuda {

namespace {

constexpr int kThreads = 128;

__global__ void moe_route_kernel(float* probs, int32_t* idx, float* w, const bf16* logits, int N, int E, int k) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const bf16* l = logits + int64_t(t) * E;
  moe_row::route(probs + int64_t(t) * E, idx + int64_t(t) * k, w + int64_t(t) * k, E, k,
                 [l](int e) { return f(l[e]); });
}

__global__ void moe_gather_kernel(bf16* rows, const bf16* x, const int32_t* token_of_row, int R, int C) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(R) * C) return;
  const int64_t r = i / C, c = i % C;
  rows[i] = x[int64_t(token_of_row[r]) * C + c];
}

__global__ void moe_combine_kernel(bf16* out, const bf16* rows, const int32_t* row_of, const float* w, int N, int k,
                                   int C) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(N) * C) return;
  const int64_t t = i / C, c = i % C;
  float acc = 0.0f;
  for (int j = 0; j < k; ++j) {
    const int32_t r = row_of[t * k + j];
    if (r >= 0) acc += w[t * k + j] * f(rows[int64_t(r) * C + c]);
  }
  out[i] = b(acc);
}

// One warp per assignment: the dot product over C, and the row of drows.
__global__ void moe_combine_backward_kernel(bf16* drows, float* dw, const bf16* dout, const bf16* rows,
                                            const int32_t* row_of, const float* w, int A, int k, int C) {
  const int64_t a = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (a >= A) return;
  const int32_t r = row_of[a];
  if (r < 0) {
    if (lane == 0) dw[a] = 0.0f;
    return;
  }
  const bf16* d = dout + (a / k) * C;
  const bf16* y = rows + int64_t(r) * C;
  bf16* dy = drows + int64_t(r) * C;
  float dot = 0.0f;
  for (int c = lane; c < C; c += 32) {
    dot += f(d[c]) * f(y[c]);
    dy[c] = b(w[a] * f(d[c]));
  }
  dot = warp_sum(dot);
  if (lane == 0) dw[a] = dot;
}

__global__ void moe_scatter_add_kernel(bf16* dx, const bf16* drows, const int32_t* row_of, int N, int k, int C) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(N) * C) return;
  const int64_t t = i / C, c = i % C;
  float acc = f(dx[i]);
  for (int j = 0; j < k; ++j) {
    const int32_t r = row_of[t * k + j];
    if (r >= 0) acc += f(drows[int64_t(r) * C + c]);
  }
  dx[i] = b(acc);
}

__global__ void moe_router_backward_kernel(bf16* dlogits, const float* probs, const int32_t* idx, const float* w,
                                           const float* dw, const float* aux_g, int N, int E, int k) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  bf16* dl = dlogits + int64_t(t) * E;
  moe_row::router_backward(probs + int64_t(t) * E, idx + int64_t(t) * k, w + int64_t(t) * k, dw + int64_t(t) * k, aux_g,
                           E, k, [dl](int e, float v) { dl[e] = b(v); });
}

// Token t's router probability for expert e.
struct ProbColumn {
  const float* probs;
  int E;
  __device__ void operator()(int t, int e, float& a, float&) const { a += probs[int64_t(t) * E + e]; }
};

}  // namespace

void moe_route(float* probs, int32_t* idx, float* w, const bf16* logits, int N, int E, int k, cudaStream_t s) {
  LOOM_LAUNCH(moe_route_kernel, blocks_for(N, kThreads), kThreads, 0, s)(probs, idx, w, logits, N, E, k);
  LOOM_CUDA_LAUNCHED();
}
void moe_gather(bf16* rows, const bf16* x, const int32_t* token_of_row, int R, int C, cudaStream_t s) {
  if (R == 0) return;
  LOOM_LAUNCH(moe_gather_kernel, blocks_for(int64_t(R) * C, kThreads), kThreads, 0, s)(rows, x, token_of_row, R, C);
  LOOM_CUDA_LAUNCHED();
}
void moe_combine(bf16* out, const bf16* rows, const int32_t* row_of, const float* w, int N, int k, int C,
                 cudaStream_t s) {
  LOOM_LAUNCH(moe_combine_kernel, blocks_for(int64_t(N) * C, kThreads), kThreads, 0, s)(out, rows, row_of, w, N, k, C);
  LOOM_CUDA_LAUNCHED();
}
void moe_combine_backward(bf16* drows, float* dw, const bf16* dout, const bf16* rows, const int32_t* row_of,
                          const float* w, int N, int k, int C, cudaStream_t s) {
  const int64_t A = int64_t(N) * k;
  LOOM_LAUNCH(moe_combine_backward_kernel, blocks_for(A * 32, kThreads), kThreads, 0, s)
  (drows, dw, dout, rows, row_of, w, int(A), k, C);
  LOOM_CUDA_LAUNCHED();
}
void moe_scatter_add(bf16* dx, const bf16* drows, const int32_t* row_of, int N, int k, int C, cudaStream_t s) {
  LOOM_LAUNCH(moe_scatter_add_kernel, blocks_for(int64_t(N) * C, kThreads), kThreads, 0, s)(dx, drows, row_of, N, k, C);
  LOOM_CUDA_LAUNCHED();
}
void moe_router_backward(bf16* dlogits, const float* probs, const int32_t* idx, const float* w, const float* dw,
                         const float* aux_g, int N, int E, int k, cudaStream_t s) {
  LOOM_LAUNCH(moe_router_backward_kernel, blocks_for(N, kThreads), kThreads, 0, s)
  (dlogits, probs, idx, w, dw, aux_g, N, E, k);
  LOOM_CUDA_LAUNCHED();
}
void column_sums(float* out, const float* probs, int N, int E, float* partials, cudaStream_t s) {
  column_sums_2stage<false>(out, nullptr, ProbColumn{probs, E}, N, E, partials, s);
}

}  // namespace loom::cuda
