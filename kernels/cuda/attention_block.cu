// Context parallel's attention over blocks of keys (model/context_parallel.h), on CUDA
// cores: the row-wise pattern of attention.cu (a warp per query row forward and for dQ, a warp
// per key row for dK and dV, lanes holding D/32 of the head dim), with the causal mask given by
// global positions, kpos[u] <= qpos[t], instead of indices. Forward merges each block into a
// running output and (max, sum) by the online softmax; backward recomputes P from the saved
// log-sum-exp and adds into fp32 gradients, each row written by one warp: no atomics, the same
// bits on every run. Blocks that a query row cannot see cost one position test per key.
#include "kernels/cuda/attention_rows.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace loom::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 256;

__global__ void kv_extract_kernel(bf16* kv, const bf16* qkv, int H, int KV, int D, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int kvw = 2 * KV * D;
  const int64_t r = i / kvw;
  kv[i] = qkv[r * (H + 2 * KV) * D + H * D + i % kvw];
}

template <int D>
__global__ void block_forward_kernel(float* acc, float* ml, const bf16* qkv, const bf16* kv, const int32_t* qpos,
                                     const int32_t* kpos, int Tq, int Tk, int H, int KV, float scale, bool first) {
  constexpr int E = D / 32;
  const int t = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.y, bi = blockIdx.z;
  if (t >= Tq) return;
  const int kvw = 2 * KV * D, kvh = h / (H / KV), qp = qpos[t];
  const bf16* q = qkv + (int64_t(bi) * Tq + t) * (H + 2 * KV) * D + h * D;
  const bf16* blk = kv + int64_t(bi) * Tk * kvw;
  float* a = acc + (int64_t(bi) * Tq + t) * H * D + h * D;
  float* st = ml + ((int64_t(bi) * H + h) * Tq + t) * 2;
  float qv[E], o[E];
  for (int e = 0; e < E; ++e) qv[e] = f(q[lane + 32 * e]) * scale, o[e] = first ? 0.0f : a[lane + 32 * e];
  float m = first ? -INFINITY : st[0], l = first ? 0.0f : st[1];
  for (int u = 0; u < Tk; ++u) {
    if (kpos[u] > qp) continue;
    const bf16* k = blk + int64_t(u) * kvw + kvh * D;
    row_merge_key<E>(qv, k, k + KV * D, lane, m, l, o);
  }
  for (int e = 0; e < E; ++e) a[lane + 32 * e] = o[e];
  // Every lane read st above; with no visible key no shuffle has ordered those reads yet.
  __syncwarp();
  if (lane == 0) st[0] = m, st[1] = l;
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

template <int D>
__global__ void block_dq_kernel(float* dq, const bf16* dout, const bf16* qkv, const bf16* kv, const float* lse,
                                const float* delta, const int32_t* qpos, const int32_t* kpos, int Tq, int Tk, int H,
                                int KV, float scale) {
  constexpr int E = D / 32;
  const int t = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.y, bi = blockIdx.z;
  if (t >= Tq) return;
  const int kvw = 2 * KV * D, kvh = h / (H / KV), qp = qpos[t];
  const bf16* q = qkv + (int64_t(bi) * Tq + t) * (H + 2 * KV) * D + h * D;
  const bf16* dy = dout + (int64_t(bi) * Tq + t) * H * D + h * D;
  const bf16* blk = kv + int64_t(bi) * Tk * kvw;
  const int64_t stat = (int64_t(bi) * H + h) * Tq + t;
  const float L = lse[stat], dl = delta[stat];
  float qv[E], g[E], d[E];
  for (int e = 0; e < E; ++e) qv[e] = f(q[lane + 32 * e]) * scale, g[e] = f(dy[lane + 32 * e]), d[e] = 0.0f;
  for (int u = 0; u < Tk; ++u) {
    if (kpos[u] > qp) continue;
    const bf16* k = blk + int64_t(u) * kvw + kvh * D;
    row_dq_key<E>(qv, g, k, k + KV * D, L, dl, lane, d);
  }
  float* out = dq + (int64_t(bi) * Tq + t) * H * D + h * D;
  for (int e = 0; e < E; ++e) out[lane + 32 * e] += d[e] * scale;
}

template <int D>
__global__ void block_dkv_kernel(float* dkv, const bf16* dout, const bf16* qkv, const bf16* kv, const float* lse,
                                 const float* delta, const int32_t* qpos, const int32_t* kpos, int Tq, int Tk, int H,
                                 int KV, float scale) {
  constexpr int E = D / 32;
  const int u = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32, kvh = blockIdx.y, bi = blockIdx.z;
  if (u >= Tk) return;
  const int kvw = 2 * KV * D, row = (H + 2 * KV) * D, group = H / KV, kp = kpos[u];
  const bf16* k = kv + (int64_t(bi) * Tk + u) * kvw + kvh * D;
  const bf16* v = k + KV * D;
  float kr[E], vr[E], dk[E], dv[E];
  for (int e = 0; e < E; ++e) kr[e] = f(k[lane + 32 * e]), vr[e] = f(v[lane + 32 * e]), dk[e] = dv[e] = 0.0f;
  for (int h = kvh * group; h < (kvh + 1) * group; ++h)
    for (int t = 0; t < Tq; ++t) {
      if (qpos[t] < kp) continue;
      const bf16* q = qkv + (int64_t(bi) * Tq + t) * row + h * D;
      const bf16* dy = dout + (int64_t(bi) * Tq + t) * H * D + h * D;
      const int64_t stat = (int64_t(bi) * H + h) * Tq + t;
      row_dkv_query<E>(q, dy, kr, vr, lse[stat], delta[stat], scale, lane, dk, dv);
    }
  float* out = dkv + (int64_t(bi) * Tk + u) * kvw;
  for (int e = 0; e < E; ++e) {
    out[kvh * D + lane + 32 * e] += dk[e] * scale;
    out[(KV + kvh) * D + lane + 32 * e] += dv[e];
  }
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

template <int D>
void forward_d(float* acc, float* ml, const bf16* qkv, const bf16* kv, const int32_t* qpos, const int32_t* kpos, int B,
               int Tq, int Tk, int H, int KV, bool first, cudaStream_t s) {
  LOOM_LAUNCH(block_forward_kernel<D>, dim3(blocks_for(Tq, kWarps), H, B), 32 * kWarps, 0, s)
  (acc, ml, qkv, kv, qpos, kpos, Tq, Tk, H, KV, 1.0f / sqrtf(float(D)), first);
  LOOM_CUDA_LAUNCHED();
}

template <int D>
void finish_d(bf16* out, float* lse, const float* acc, const float* ml, int B, int Tq, int H, cudaStream_t s) {
  LOOM_LAUNCH(block_finish_kernel<D>, dim3(blocks_for(Tq, kWarps), H, B), 32 * kWarps, 0, s)(out, lse, acc, ml, Tq, H);
  LOOM_CUDA_LAUNCHED();
}

template <int D>
void backward_d(float* dq, float* dkv, const bf16* dout, const bf16* qkv, const bf16* kv, const float* lse,
                const float* delta, const int32_t* qpos, const int32_t* kpos, int B, int Tq, int Tk, int H, int KV,
                cudaStream_t s) {
  const float scale = 1.0f / sqrtf(float(D));
  LOOM_LAUNCH(block_dq_kernel<D>, dim3(blocks_for(Tq, kWarps), H, B), 32 * kWarps, 0, s)
  (dq, dout, qkv, kv, lse, delta, qpos, kpos, Tq, Tk, H, KV, scale);
  LOOM_CUDA_LAUNCHED();
  LOOM_LAUNCH(block_dkv_kernel<D>, dim3(blocks_for(Tk, kWarps), KV, B), 32 * kWarps, 0, s)
  (dkv, dout, qkv, kv, lse, delta, qpos, kpos, Tq, Tk, H, KV, scale);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace

void attention_kv_extract(bf16* kv, const bf16* qkv, int B, int T, int H, int KV, int D, cudaStream_t s) {
  const int64_t n = int64_t(B) * T * 2 * KV * D;
  LOOM_LAUNCH(kv_extract_kernel, blocks_for(n, kThreads), kThreads, 0, s)(kv, qkv, H, KV, D, n);
  LOOM_CUDA_LAUNCHED();
}

void attention_block_forward(float* acc, float* ml, const bf16* qkv, const bf16* kv, const int32_t* qpos,
                             const int32_t* kpos, int B, int Tq, int Tk, int H, int KV, int D, bool first,
                             cudaStream_t s) {
  check_dims(H, KV, D);
  if (D == 64) return forward_d<64>(acc, ml, qkv, kv, qpos, kpos, B, Tq, Tk, H, KV, first, s);
  if (D == 128) return forward_d<128>(acc, ml, qkv, kv, qpos, kpos, B, Tq, Tk, H, KV, first, s);
  forward_d<32>(acc, ml, qkv, kv, qpos, kpos, B, Tq, Tk, H, KV, first, s);
}

void attention_block_finish(bf16* out, float* lse, const float* acc, const float* ml, int B, int Tq, int H, int D,
                            cudaStream_t s) {
  check_dims(H, H, D);
  if (D == 64) return finish_d<64>(out, lse, acc, ml, B, Tq, H, s);
  if (D == 128) return finish_d<128>(out, lse, acc, ml, B, Tq, H, s);
  finish_d<32>(out, lse, acc, ml, B, Tq, H, s);
}

void attention_block_backward(float* dq, float* dkv, const bf16* dout, const bf16* qkv, const bf16* kv,
                              const float* lse, const float* delta, const int32_t* qpos, const int32_t* kpos, int B,
                              int Tq, int Tk, int H, int KV, int D, cudaStream_t s) {
  check_dims(H, KV, D);
  if (D == 64) return backward_d<64>(dq, dkv, dout, qkv, kv, lse, delta, qpos, kpos, B, Tq, Tk, H, KV, s);
  if (D == 128) return backward_d<128>(dq, dkv, dout, qkv, kv, lse, delta, qpos, kpos, B, Tq, Tk, H, KV, s);
  backward_d<32>(dq, dkv, dout, qkv, kv, lse, delta, qpos, kpos, B, Tq, Tk, H, KV, s);
}

void attention_block_grads_store(bf16* dqkv, const float* dq, const float* dkv, int B, int T, int H, int KV, int D,
                                 cudaStream_t s) {
  const int64_t n = int64_t(B) * T * (H + 2 * KV) * D;
  LOOM_LAUNCH(grads_store_kernel, blocks_for(n, kThreads), kThreads, 0, s)(dqkv, dq, dkv, H, KV, D, n);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace loom::cuda
