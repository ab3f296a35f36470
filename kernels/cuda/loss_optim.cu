// Fused softmax cross-entropy (one block per row) and the loss sum, the sum of squares for the
// global gradient norm (fixed grid, two passes: deterministic), the clipping factor computed on
// the device, and a multi-tensor AdamW: one launch over every parameter tensor, reading the
// clipping factor from device memory, so an optimizer step never waits on the host.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "optim/clip.h"

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

// One pass of an online softmax (each thread keeps its running max and the sum scaled to it,
// merged across the block), then one pass writing the gradient: two reads and one write of
// the row, the least a V-wide softmax with its gradient can do.
__global__ void crossentropy_kernel(bf16* logits, int64_t ld, float* losses, const int32_t* targets, int V,
                                    float dloss) {
  bf16* l = logits + int64_t(blockIdx.x) * ld;
  float m = -INFINITY, s = 0.0f;
  for (int v = threadIdx.x; v < V; v += kThreads) {
    const float x = f(l[v]);
    if (x > m) {
      s = s * __expf(m - x) + 1.0f;
      m = x;
    } else {
      s += __expf(x - m);
    }
  }
  const float M = block_reduce<true>(m);
  const float S = block_reduce<false>(m == -INFINITY ? 0.0f : s * __expf(m - M));
  const int y = targets[blockIdx.x];
  const float target = f(l[y]);
  __syncthreads();  // every thread has read l[y] before anyone overwrites it
  if (threadIdx.x == 0) losses[blockIdx.x] = logf(S) + M - target;
  if (dloss == 0.0f) return;
  const float scale = dloss / S;
  for (int v = threadIdx.x; v < V; v += kThreads) l[v] = b(__expf(f(l[v]) - M) * scale - (v == y ? dloss : 0.0f));
}

// One block per chunk; decay_factor (1 - lr * weight_decay) applies where the chunk says so.
__global__ void adamw_multi_kernel(float* master, bf16* params, const bf16* grads, float* m, float* v,
                                   const AdamChunk* chunks, float lr_step, float bc2_sqrt, float beta1, float beta2,
                                   float eps, float decay_factor, const float* grad_scale) {
  const AdamChunk ch = chunks[blockIdx.x];
  const float decay = ch.decay ? decay_factor : 1.0f, scale = *grad_scale;
  for (int k = threadIdx.x; k < ch.n; k += kThreads) {
    const int64_t i = ch.offset + k;
    const float g = f(grads[i]) * scale;
    const float p = master[i] * decay;
    const float mi = m[i] + (g - m[i]) * (1.0f - beta1);
    const float vi = v[i] * beta2 + (1.0f - beta2) * g * g;
    const float out = p - lr_step * (mi / (sqrtf(vi) / bc2_sqrt + eps));
    master[i] = out;
    params[i] = b(out);
    m[i] = mi;
    v[i] = vi;
  }
}

__global__ void clip_scale_kernel(float* scale, const float* sum_squares, double max_norm) {
  *scale = float(clip_coef(sqrt(double(*sum_squares)), max_norm));
}

// acc += the sum of losses[N], in a fixed order.
__global__ void loss_accumulate_kernel(float* acc, const float* losses, int N) {
  float s = 0.0f;
  for (int i = threadIdx.x; i < N; i += kThreads) s += losses[i];
  s = block_reduce<false>(s);
  if (threadIdx.x == 0) *acc += s;
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

void crossentropy_forward_backward(bf16* logits, int64_t ld, float* losses, const int32_t* targets, int N, int V,
                                   float dloss, cudaStream_t s) {
  crossentropy_kernel<<<N, kThreads, 0, s>>>(logits, ld, losses, targets, V, dloss);
  LOOM_CUDA_LAUNCHED();
}

void loss_accumulate(float* acc, const float* losses, int N, cudaStream_t s) {
  loss_accumulate_kernel<<<1, kThreads, 0, s>>>(acc, losses, N);
  LOOM_CUDA_LAUNCHED();
}

std::vector<AdamChunk> adamw_chunks(const std::vector<AdamSpan>& spans) {
  std::vector<AdamChunk> chunks;
  for (const AdamSpan& sp : spans)
    for (int64_t k = 0; k < sp.n; k += kAdamChunk)
      chunks.push_back({sp.offset + k, int32_t(std::min<int64_t>(kAdamChunk, sp.n - k)), sp.decay ? 1 : 0});
  return chunks;
}

void adamw_multi(float* master, bf16* params, const bf16* grads, float* m, float* v, const AdamChunk* chunks,
                 int n_chunks, float lr_step, float bc2_sqrt, float beta1, float beta2, float eps, float decay_factor,
                 const float* grad_scale, cudaStream_t s) {
  if (n_chunks == 0) return;
  adamw_multi_kernel<<<n_chunks, kThreads, 0, s>>>(master, params, grads, m, v, chunks, lr_step, bc2_sqrt, beta1, beta2,
                                                   eps, decay_factor, grad_scale);
  LOOM_CUDA_LAUNCHED();
}

void grad_clip_scale(float* scale, const float* sum_squares, double max_norm, cudaStream_t s) {
  clip_scale_kernel<<<1, 1, 0, s>>>(scale, sum_squares, max_norm);
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
