// Fused softmax cross-entropy (one block per row), AdamW over fp32 master weights, and the
// sum of squares for the global gradient norm (fixed grid, two passes: deterministic).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace loom::cuda {

namespace {

constexpr int kThreads = 256;

// Sum or max over the block; every thread gets the result.
template <bool Max>
__device__ float block_reduce(float v) {
  __shared__ float part[kThreads / 32];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  v = Max ? warp_max(v) : warp_sum(v);
  if (lane == 0) part[w] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? part[lane] : (Max ? -INFINITY : 0.0f);
  v = Max ? warp_max(v) : warp_sum(v);
  __syncthreads();  // part may be reused by the next call
  return v;
}

__global__ void crossentropy_kernel(bf16* logits, float* losses, const int32_t* targets, int V, float dloss) {
  bf16* l = logits + int64_t(blockIdx.x) * V;
  float m = -INFINITY;
  for (int v = threadIdx.x; v < V; v += kThreads) m = fmaxf(m, f(l[v]));
  m = block_reduce<true>(m);
  float s = 0.0f;
  for (int v = threadIdx.x; v < V; v += kThreads) s += __expf(f(l[v]) - m);
  s = block_reduce<false>(s);
  const int y = targets[blockIdx.x];
  const float target = f(l[y]);
  __syncthreads();  // every thread has read l[y] before anyone overwrites it
  if (threadIdx.x == 0) losses[blockIdx.x] = logf(s) + m - target;
  if (dloss == 0.0f) return;
  const float scale = dloss / s;
  for (int v = threadIdx.x; v < V; v += kThreads) l[v] = b(__expf(f(l[v]) - m) * scale - (v == y ? dloss : 0.0f));
}

__global__ void adamw_kernel(float* master, bf16* params, const bf16* grads, float* m, float* v, int64_t n,
                             float lr_step, float bc2_sqrt, float beta1, float beta2, float eps, float decay,
                             float grad_scale) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = f(grads[i]) * grad_scale;
  const float p = master[i] * decay;
  const float mi = m[i] + (g - m[i]) * (1.0f - beta1);
  const float vi = v[i] * beta2 + (1.0f - beta2) * g * g;
  const float out = p - lr_step * (mi / (sqrtf(vi) / bc2_sqrt + eps));
  master[i] = out;
  params[i] = b(out);
  m[i] = mi;
  v[i] = vi;
}

constexpr int kPartials = 1024;  // fixed grid: the summation order never depends on n

__global__ void sum_squares_partial(float* partial, const bf16* x, int64_t n) {
  float s = 0.0f;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(kPartials) * kThreads)
    s += f(x[i]) * f(x[i]);
  s = block_reduce<false>(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_squares_final(float* out, const float* partial) {
  float s = 0.0f;
  for (int i = threadIdx.x; i < kPartials; i += kThreads) s += partial[i];
  s = block_reduce<false>(s);
  if (threadIdx.x == 0) *out = s;
}

}  // namespace

void crossentropy_forward_backward(bf16* logits, float* losses, const int32_t* targets, int N, int V, float dloss,
                                   cudaStream_t s) {
  crossentropy_kernel<<<N, kThreads, 0, s>>>(logits, losses, targets, V, dloss);
  LOOM_CUDA_LAUNCHED();
}

void adamw_update(float* master, bf16* params, const bf16* grads, float* m, float* v, int64_t n, float lr_step,
                  float bc2_sqrt, float beta1, float beta2, float eps, float decay, float grad_scale, cudaStream_t s) {
  if (n == 0) return;
  adamw_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(master, params, grads, m, v, n, lr_step, bc2_sqrt, beta1,
                                                            beta2, eps, decay, grad_scale);
  LOOM_CUDA_LAUNCHED();
}

// scratch: kPartials floats.
void sum_squares(float* out, const bf16* x, int64_t n, float* scratch, cudaStream_t s) {
  sum_squares_partial<<<kPartials, kThreads, 0, s>>>(scratch, x, n);
  LOOM_CUDA_LAUNCHED();
  sum_squares_final<<<1, kThreads, 0, s>>>(out, scratch);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace loom::cuda
