// Fused softmax cross-entropy (one block per row, padded columns left out) and its
// vocab-parallel phases, the loss sum (fp64), the sum of squares for the global gradient norm
// over the optimizer's chunk table (fixed grid, two passes, fp64: deterministic), the clipping
// factor computed on the device, and a multi-tensor AdamW: one launch over the table, reading
// the clipping factor from device memory, so an optimizer step never waits on the host.
#include <algorithm>

#include "kernels/clip.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace loom::cuda {

namespace {

constexpr int kThreads = 256;

// Sum or max over the block; every thread gets the result.
template <bool Max, class X>
__device__ X block_reduce(X v) {
  __shared__ X part[kThreads / 32];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  for (int o = 16; o > 0; o >>= 1) {
    const X u = __shfl_xor_sync(0xffffffffu, v, o);
    v = Max ? (u > v ? u : v) : v + u;
  }
  if (lane == 0) part[w] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? part[lane] : (Max ? X(-INFINITY) : X(0));
  for (int o = 16; o > 0; o >>= 1) {
    const X u = __shfl_xor_sync(0xffffffffu, v, o);
    v = Max ? (u > v ? u : v) : v + u;
  }
  __syncthreads();  // part may be reused by the next call
  return v;
}

// One pass of an online softmax (each thread keeps its running max and the sum scaled to it,
// merged across the block), then one pass writing the gradient: two reads and one write of
// the row, the least a V-wide softmax with its gradient can do. Columns from `valid` on are
// padding: out of the softmax, gradient 0.
__global__ void crossentropy_kernel(bf16* logits, float* losses, const int32_t* targets, int V, int valid,
                                    float dloss) {
  bf16* l = logits + int64_t(blockIdx.x) * V;
  float m = -INFINITY, s = 0.0f;
  for (int v = threadIdx.x; v < valid; v += kThreads) {
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
  for (int v = threadIdx.x; v < V; v += kThreads)
    l[v] = v < valid ? b(__expf(f(l[v]) - M) * scale - (v == y ? dloss : 0.0f)) : b(0.0f);
}

// Vocab-parallel phases, one block per row of a shard.
__global__ void ce_stats_kernel(const bf16* logits, const int32_t* targets, int Vl, int valid, int v0, float* rowmax,
                                float* target_logit) {
  const bf16* l = logits + int64_t(blockIdx.x) * Vl;
  float m = -INFINITY;
  for (int v = threadIdx.x; v < valid; v += kThreads) m = fmaxf(m, f(l[v]));
  m = block_reduce<true>(m);
  if (threadIdx.x != 0) return;
  rowmax[blockIdx.x] = m;
  const int id = targets[blockIdx.x] - v0;
  target_logit[blockIdx.x] = id >= 0 && id < valid ? f(l[id]) : 0.0f;
}

__global__ void ce_sumexp_kernel(const bf16* logits, const float* rowmax, int Vl, int valid, float* sumexp) {
  const bf16* l = logits + int64_t(blockIdx.x) * Vl;
  const float m = rowmax[blockIdx.x];
  float s = 0.0f;
  for (int v = threadIdx.x; v < valid; v += kThreads) s += __expf(f(l[v]) - m);
  s = block_reduce<false>(s);
  if (threadIdx.x == 0) sumexp[blockIdx.x] = s;
}

__global__ void ce_finish_kernel(bf16* logits, float* losses, const int32_t* targets, int Vl, int valid, int v0,
                                 const float* rowmax, const float* sumexp, const float* target_logit, float dloss) {
  const int n = blockIdx.x;
  if (threadIdx.x == 0) losses[n] = logf(sumexp[n]) + rowmax[n] - target_logit[n];
  if (dloss == 0.0f) return;
  bf16* l = logits + int64_t(n) * Vl;
  const float m = rowmax[n], scale = dloss / sumexp[n];
  const int id = targets[n] - v0;
  for (int v = threadIdx.x; v < Vl; v += kThreads)
    l[v] = v < valid ? b(__expf(f(l[v]) - m) * scale - (v == id ? dloss : 0.0f)) : b(0.0f);
}

// One block per chunk; decay_factor (1 - lr * weight_decay) applies where the chunk says so.
__global__ void adamw_multi_kernel(float* master, bf16* params, const float* grads, float* m, float* v,
                                   const OptChunkDev* chunks, float lr_step, float bc2_sqrt, float beta1, float beta2,
                                   float eps, float decay_factor, const float* grad_scale) {
  const OptChunkDev ch = chunks[blockIdx.x];
  const float decay = ch.decay ? decay_factor : 1.0f, scale = *grad_scale;
  for (int k = threadIdx.x; k < ch.n; k += kThreads) {
    const int64_t i = ch.state + k;
    const float g = scale == 1.0f ? grads[ch.grad + k] : grads[ch.grad + k] * scale;
    const float p = master[i] * decay;
    const float mi = m[i] + (g - m[i]) * (1.0f - beta1);
    const float vi = v[i] * beta2 + (1.0f - beta2) * g * g;
    const float out = p - lr_step * (mi / (sqrtf(vi) / bc2_sqrt + eps));
    master[i] = out;
    params[ch.param + k] = b(out);
    m[i] = mi;
    v[i] = vi;
  }
}

__global__ void clip_scale_kernel(float* scale, const double* sum_squares, double max_norm) {
  *scale = float(clip_coef(sqrt(*sum_squares), max_norm));
}

// acc += the sum of losses[N], in a fixed order, in double.
__global__ void loss_accumulate_kernel(double* acc, const float* losses, int N) {
  double s = 0.0;
  for (int i = threadIdx.x; i < N; i += kThreads) s += double(losses[i]);
  s = block_reduce<false>(s);
  if (threadIdx.x == 0) *acc += s;
}

constexpr int kPartials = 1024;  // fixed grid: the summation order never depends on the table

// Block p sums chunks p, p + kPartials, ... of the table (those counted in the norm).
__global__ void sum_squares_partial(double* partial, const float* grads, const OptChunkDev* chunks, int n_chunks) {
  double s = 0.0;
  for (int c = blockIdx.x; c < n_chunks; c += kPartials) {
    const OptChunkDev ch = chunks[c];
    if (!ch.norm) continue;
    for (int k = threadIdx.x; k < ch.n; k += kThreads) {
      const double g = grads[ch.grad + k];
      s += g * g;
    }
  }
  s = block_reduce<false>(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_squares_final(double* out, const double* partial) {
  double s = 0.0;
  for (int i = threadIdx.x; i < kPartials; i += kThreads) s += partial[i];
  s = block_reduce<false>(s);
  if (threadIdx.x == 0) *out = s;
}

}  // namespace

void crossentropy_forward_backward(bf16* logits, float* losses, const int32_t* targets, int N, int V, int valid,
                                   float dloss, cudaStream_t s) {
  LOOM_LAUNCH(crossentropy_kernel, N, kThreads, 0, s)(logits, losses, targets, V, valid, dloss);
  LOOM_CUDA_LAUNCHED();
}

void crossentropy_shard_stats(const bf16* logits, const int32_t* targets, int N, int Vl, int valid, int v0,
                              float* rowmax, float* target_logit, cudaStream_t s) {
  LOOM_LAUNCH(ce_stats_kernel, N, kThreads, 0, s)(logits, targets, Vl, valid, v0, rowmax, target_logit);
  LOOM_CUDA_LAUNCHED();
}

void crossentropy_shard_sumexp(const bf16* logits, const float* rowmax, int N, int Vl, int valid, float* sumexp,
                               cudaStream_t s) {
  LOOM_LAUNCH(ce_sumexp_kernel, N, kThreads, 0, s)(logits, rowmax, Vl, valid, sumexp);
  LOOM_CUDA_LAUNCHED();
}

void crossentropy_shard_finish(bf16* logits, float* losses, const int32_t* targets, int N, int Vl, int valid, int v0,
                               const float* rowmax, const float* sumexp, const float* target_logit, float dloss,
                               cudaStream_t s) {
  LOOM_LAUNCH(ce_finish_kernel, N, kThreads, 0, s)
  (logits, losses, targets, Vl, valid, v0, rowmax, sumexp, target_logit, dloss);
  LOOM_CUDA_LAUNCHED();
}

void loss_accumulate(double* acc, const float* losses, int N, cudaStream_t s) {
  LOOM_LAUNCH(loss_accumulate_kernel, 1, kThreads, 0, s)(acc, losses, N);
  LOOM_CUDA_LAUNCHED();
}

void adamw_multi(float* master, bf16* params, const float* grads, float* m, float* v, const OptChunkDev* chunks,
                 int n_chunks, float lr_step, float bc2_sqrt, float beta1, float beta2, float eps, float decay_factor,
                 const float* grad_scale, cudaStream_t s) {
  if (n_chunks == 0) return;
  LOOM_LAUNCH(adamw_multi_kernel, n_chunks, kThreads, 0, s)
  (master, params, grads, m, v, chunks, lr_step, bc2_sqrt, beta1, beta2, eps, decay_factor, grad_scale);
  LOOM_CUDA_LAUNCHED();
}

void grad_clip_scale(float* scale, const double* sum_squares, double max_norm, cudaStream_t s) {
  LOOM_LAUNCH(clip_scale_kernel, 1, 1, 0, s)(scale, sum_squares, max_norm);
  LOOM_CUDA_LAUNCHED();
}

void sum_squares_table(double* out, const float* grads, const OptChunkDev* chunks, int n_chunks, double* scratch,
                       cudaStream_t s) {
  LOOM_LAUNCH(sum_squares_partial, kPartials, kThreads, 0, s)(scratch, grads, chunks, n_chunks);
  LOOM_CUDA_LAUNCHED();
  LOOM_LAUNCH(sum_squares_final, 1, kThreads, 0, s)(out, scratch);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace loom::cuda
