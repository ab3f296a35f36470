// Fused softmax cross-entropy (one block per row, padded columns left out) and its
// vocab-parallel phases, the loss sum (fp64), the sum of squares for the global gradient norm
// over the optimizer's chunk table (fixed grid, two passes, fp64: deterministic), the clipping
// factor computed on the device, and a multi-tensor AdamW: one launch over the table, reading
// the clipping factor from device memory, so an optimizer step never waits on the host.
#include <algorithm>

#include "kernels/clip.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "runtime/exact_digits.h"

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

// A row of bf16 as its elements before the first 16-byte boundary (`head`), whole 128-bit words
// from there, and the tail after them: every row of a vocabulary that is no multiple of 8
// starts at another offset within a word.
struct RowWords {
  int head, words;
};
__device__ __forceinline__ RowWords row_words(const bf16* p, int len) {
  int head = int((16 - reinterpret_cast<uintptr_t>(p) % 16) % 16 / 2);
  head = head < len ? head : len;
  return {head, (len - head) / kPack};
}

// One thread's running max m and sum s of exp(x - m) over the values it has seen.
__device__ __forceinline__ void softmax_add(float& m, float& s, float x) {
  if (x > m) {
    s = s * __expf(m - x) + 1.0f;
    m = x;
  } else {
    s += __expf(x - m);
  }
}

// The fused classifier: one block per row, an online softmax in one pass (each thread keeps its
// running max and the sum scaled to it, merged across the block), then one pass writing the
// gradient over the logits; no probabilities are stored. Bytes per row: reads 2V (the logits)
// + 4 (target), writes 2V (their gradient) + 4 (loss): bound by DRAM bandwidth. With kHold the
// first pass keeps the row in shared memory (2V bytes: 100 KB at GPT-2's vocabulary, two rows an
// SM) and the second reads it there; without, the second reads the row again from global
// memory, and with 8 blocks an SM the 1056 rows in flight of an H100 (106 MB at GPT-2's
// vocabulary) pass the 50 MB L2: much of that second read comes from DRAM.
// Columns from `valid` on are padding: out of the softmax, gradient 0.
template <bool kHold>
__global__ void __launch_bounds__(kThreads)
    crossentropy_kernel(bf16* __restrict__ logits, float* __restrict__ losses, const int32_t* __restrict__ targets,
                        int V, int valid, float dloss) {
  LOOM_DYNAMIC_SHARED(bf16, held, 16);
  bf16* l = logits + int64_t(blockIdx.x) * V;
  float m = -INFINITY, s = 0.0f;
  const RowWords in = row_words(l, valid);
  // The row's element c sits at held[c + pad]: its 16-byte words on 16 bytes in shared memory too.
  const int pad = (kPack - in.head % kPack) % kPack;
  auto keep = [&](int c, bf16 x) {
    if (kHold) held[c + pad] = x;
    return f(x);
  };
  for (int c = threadIdx.x; c < in.head; c += kThreads) softmax_add(m, s, keep(c, l[c]));
  for (int w = threadIdx.x; w < in.words; w += kThreads) {
    const int4 raw = load128(l + in.head + w * kPack);
    if (kHold) store128(held + pad + in.head + w * kPack, raw);
    float x[kPack];
    unpack8(x, raw);
    float mx = x[0];
#pragma unroll
    for (int k = 1; k < kPack; ++k) mx = fmaxf(mx, x[k]);
    if (mx > m) {
      s *= __expf(m - mx);
      m = mx;
    }
#pragma unroll
    for (int k = 0; k < kPack; ++k) s += __expf(x[k] - m);
  }
  for (int c = in.head + in.words * kPack + threadIdx.x; c < valid; c += kThreads) softmax_add(m, s, keep(c, l[c]));
  const float M = block_reduce<true>(m);  // (its barriers also order the held row's stores before the reads)
  const float S = block_reduce<false>(m == -INFINITY ? 0.0f : s * __expf(m - M));
  const int y = targets[blockIdx.x];
  const float target = f(l[y]);
  __syncthreads();  // every thread has read l[y] before anyone overwrites it
  if (threadIdx.x == 0) losses[blockIdx.x] = logf(S) + M - target;
  if (dloss == 0.0f) return;
  const float scale = dloss / S;
  auto grad = [&](int c, float x) { return c < valid ? __expf(x - M) * scale - (c == y ? dloss : 0.0f) : 0.0f; };
  // The values of columns past `valid` are never used (their gradient is 0): held leaves them unset.
  auto value = [&](int c) { return kHold ? (c < valid ? f(held[c + pad]) : 0.0f) : f(l[c]); };
  const RowWords out = row_words(l, V);
  for (int c = threadIdx.x; c < out.head; c += kThreads) l[c] = b(grad(c, value(c)));
  for (int w = threadIdx.x; w < out.words; w += kThreads) {
    bf16* p = l + out.head + w * kPack;
    const int c0 = out.head + w * kPack;
    float x[kPack];
    if (!kHold) {
      unpack8(x, load128(p));
    } else if (c0 + kPack <= valid) {
      unpack8(x, load128(held + pad + c0));
    } else {
#pragma unroll
      for (int k = 0; k < kPack; ++k) x[k] = value(c0 + k);
    }
#pragma unroll
    for (int k = 0; k < kPack; ++k) x[k] = grad(c0 + k, x[k]);
    store128(p, pack8(x));
  }
  for (int c = out.head + out.words * kPack + threadIdx.x; c < V; c += kThreads) l[c] = b(grad(c, value(c)));
}

// The most shared memory a held row takes: 2 rows an SM of an sm_90 (228 KB) at GPT-2's
// vocabulary; wider vocabularies read their row twice.
constexpr int kMaxHeldRowBytes = 110 * 1024;

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

// One block per chunk; bytes per element: reads 4 each of master, m, v and the gradient, writes
// 4 each of master, m, v and 2 of the bf16 weight: 30, at DRAM bandwidth. decay_factor (1 - lr * weight_decay) applies
// where the chunk says so.
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

__global__ void clip_scale_kernel(float* scale, const double* digits, double max_norm) {
  int64_t d[kExactDigits];
  bool finite = true;
  for (int i = 0; i < kExactDigits; ++i) {
    finite = finite && exact_finite(digits[i]);
    d[i] = finite ? int64_t(digits[i]) : 0;
  }
  exact_normalize(d);  // (digits summed over ranks are past 2^32)
  *scale = float(clip_coef(finite ? sqrt(exact_value(d)) : nan(""), max_norm));
}

// acc (exact digits) += the sum of losses[N], taken in a fixed order in double.
__global__ void loss_accumulate_kernel(double* acc, const float* losses, int N) {
  double s = 0.0;
  for (int i = threadIdx.x; i < N; i += kThreads) s += double(losses[i]);
  s = block_reduce<false>(s);
  if (threadIdx.x == 0) exact_accumulate(acc, s);
}

constexpr int kNormBlocks = 1024;  // blocks of the norm's grid, each walking chunks

// Each counted chunk's sum of squares in double (a block's fixed reduction order: the chunk's
// sum does not depend on which block takes it), added as integers into the block's own digits,
// then the block's digits into the output's: one global atomic per digit a block touched, not
// three per chunk (a 124M model has ~120k chunks).
__global__ void sum_squares_exact(unsigned long long* digits, const float* grads, const OptChunkDev* chunks,
                                  int n_chunks) {
  __shared__ long long mine[kExactDigits + 1];  // the last: a count of non-finite sums
  for (int i = threadIdx.x; i <= kExactDigits; i += kThreads) mine[i] = 0;
  __syncthreads();
  for (int c = blockIdx.x; c < n_chunks; c += gridDim.x) {
    const OptChunkDev ch = chunks[c];
    if (!ch.norm) continue;  // (the same for the whole block)
    double s = 0.0;
    for (int k = threadIdx.x; k < ch.n; k += kThreads) {
      const double g = grads[ch.grad + k];
      s += g * g;
    }
    s = block_reduce<false>(s);
    if (threadIdx.x == 0 && s != 0) {  // (thread 0 alone writes `mine` until the flush)
      if (!exact_finite(s)) {
        ++mine[kExactDigits];
      } else {
        const ExactParts p = exact_parts(s);
        for (int i = 0; i < 3; ++i) mine[p.k + i] += p.parts[i];
      }
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i <= kExactDigits; i += kThreads)
    if (mine[i]) atomicAdd(&digits[i], static_cast<unsigned long long>(mine[i]));
}

__global__ void exact_finish(double* out, const unsigned long long* digits) {
  int64_t d[kExactDigits];
  for (int i = 0; i < kExactDigits; ++i) d[i] = static_cast<int64_t>(digits[i]);
  exact_normalize(d);
  const bool finite = digits[kExactDigits] == 0;
  for (int i = 0; i < kExactDigits; ++i) out[i] = finite ? double(d[i]) : nan("");
}

}  // namespace

void crossentropy_forward_backward(bf16* logits, float* losses, const int32_t* targets, int N, int V, int valid,
                                   float dloss, cudaStream_t s) {
  const int held_bytes = (valid + kPack) * 2;
  if (held_bytes <= kMaxHeldRowBytes) {
    smem_allow(crossentropy_kernel<true>, size_t(held_bytes));
    LOOM_LAUNCH(crossentropy_kernel<true>, N, kThreads, held_bytes, s)(logits, losses, targets, V, valid, dloss);
  } else {
    LOOM_LAUNCH(crossentropy_kernel<false>, N, kThreads, 0, s)(logits, losses, targets, V, valid, dloss);
  }
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
  auto* digits = reinterpret_cast<unsigned long long*>(scratch);
  LOOM_CUDA_CHECK(cudaMemsetAsync(digits, 0, (kExactDigits + 1) * sizeof(unsigned long long), s));
  if (n_chunks > 0) {
    LOOM_LAUNCH(sum_squares_exact, std::min(n_chunks, kNormBlocks), kThreads, 0, s)(digits, grads, chunks, n_chunks);
    LOOM_CUDA_LAUNCHED();
  }
  LOOM_LAUNCH(exact_finish, 1, 1, 0, s)(out, digits);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace loom::cuda
