// A reference, not run by training (kernels/cuda/reference/attention_reference.h): row-wise
// causal attention with grouped-query heads, on CUDA cores: one warp per query row, each lane
// holding D/32 of the head dim, an online softmax over the keys, and never a T x T matrix. The
// plain reference the tensor-core kernels are tested and benchmarked against.
// Backward recomputes the probabilities from the saved log-sum-exp in two kernels, one for
// dQ (a warp per query row) and one for dK and dV (a warp per key row, summing the query
// heads of its group in order), so nothing is accumulated with atomics.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/reference/attention_mask.cuh"
#include "kernels/cuda/reference/attention_reference.h"
#include "kernels/cuda/reference/attention_rows.cuh"

namespace loom::cuda::reference {

namespace {

constexpr int kWarps = 4;

template <int D>
__global__ void attention_forward_kernel(bf16* out, float* lse, const bf16* qkv, const int32_t* pos, int T, int H,
                                         int KV, float scale) {
  constexpr int E = D / 32;
  const int t = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.y, bi = blockIdx.z;
  if (t >= T) return;
  const int row = (H + 2 * KV) * D, kvh = h / (H / KV);
  const bf16* base = qkv + int64_t(bi) * T * row;
  float q[E], acc[E];
  for (int e = 0; e < E; ++e) q[e] = f(base[int64_t(t) * row + h * D + lane + 32 * e]) * scale, acc[e] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int j = first_key(pos, bi, T, t); j <= t; ++j) {
    const bf16* k = base + int64_t(j) * row + (H + kvh) * D;
    const bf16* v = base + int64_t(j) * row + (H + KV + kvh) * D;
    row_merge_key<E>(q, k, v, lane, m, l, acc);
  }
  bf16* o = out + (int64_t(bi) * T + t) * H * D + h * D;
  for (int e = 0; e < E; ++e) o[lane + 32 * e] = b(acc[e] / l);
  if (lane == 0) lse[(int64_t(bi) * H + h) * T + t] = m + logf(l);
}

template <int D>
__global__ void attention_dq_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta,
                                    const int32_t* pos, int T, int H, int KV, float scale) {
  constexpr int E = D / 32;
  const int t = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.y, bi = blockIdx.z;
  if (t >= T) return;
  const int row = (H + 2 * KV) * D, kvh = h / (H / KV);
  const bf16* base = qkv + int64_t(bi) * T * row;
  const int64_t stat = (int64_t(bi) * H + h) * T + t;
  const float L = lse[stat], dl = delta[stat];
  float q[E], dy[E], dq[E];
  const bf16* go = dout + (int64_t(bi) * T + t) * H * D + h * D;
  for (int e = 0; e < E; ++e)
    q[e] = f(base[int64_t(t) * row + h * D + lane + 32 * e]) * scale, dy[e] = f(go[lane + 32 * e]), dq[e] = 0.0f;
  for (int j = first_key(pos, bi, T, t); j <= t; ++j) {
    const bf16* k = base + int64_t(j) * row + (H + kvh) * D;
    const bf16* v = base + int64_t(j) * row + (H + KV + kvh) * D;
    row_dq_key<E>(q, dy, k, v, L, dl, lane, dq);
  }
  bf16* out = dqkv + (int64_t(bi) * T + t) * row + h * D;
  for (int e = 0; e < E; ++e) out[lane + 32 * e] = b(dq[e] * scale);
}

template <int D>
__global__ void attention_dkv_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                                     const float* delta, const int32_t* pos, int T, int H, int KV, float scale) {
  constexpr int E = D / 32;
  const int j = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32, kvh = blockIdx.y, bi = blockIdx.z;
  if (j >= T) return;
  const int row = (H + 2 * KV) * D, group = H / KV;
  const bf16* base = qkv + int64_t(bi) * T * row;
  float k[E], v[E], dk[E], dv[E];
  for (int e = 0; e < E; ++e) {
    k[e] = f(base[int64_t(j) * row + (H + kvh) * D + lane + 32 * e]);
    v[e] = f(base[int64_t(j) * row + (H + KV + kvh) * D + lane + 32 * e]);
    dk[e] = dv[e] = 0.0f;
  }
  for (int h = kvh * group; h < (kvh + 1) * group; ++h)
    for (int t = j; t < T && first_key(pos, bi, T, t) <= j; ++t) {  // past j's document: no later query
      const bf16* q = base + int64_t(t) * row + h * D;
      const bf16* dy = dout + (int64_t(bi) * T + t) * H * D + h * D;
      const int64_t stat = (int64_t(bi) * H + h) * T + t;
      row_dkv_query<E>(q, dy, k, v, lse[stat], delta[stat], scale, lane, dk, dv);
    }
  bf16* out = dqkv + (int64_t(bi) * T + j) * row;
  for (int e = 0; e < E; ++e) {
    out[(H + kvh) * D + lane + 32 * e] = b(dk[e] * scale);
    out[(H + KV + kvh) * D + lane + 32 * e] = b(dv[e]);
  }
}

template <int D>
void forward_d(bf16* out, float* lse, const bf16* qkv, int B, int T, int H, int KV, const int32_t* pos,
               cudaStream_t s) {
  dim3 grid(blocks_for(T, kWarps), H, B);
  LOOM_LAUNCH(attention_forward_kernel<D>, grid, 32 * kWarps, 0, s)
  (out, lse, qkv, pos, T, H, KV, 1.0f / sqrtf(float(D)));
  LOOM_CUDA_LAUNCHED();
}

template <int D>
void backward_d(bf16* dqkv, const bf16* dout, const bf16* out, const bf16* qkv, const float* lse, float* delta, int B,
                int T, int H, int KV, const int32_t* pos, cudaStream_t s) {
  const float scale = 1.0f / sqrtf(float(D));
  dim3 grid(blocks_for(T, kWarps), H, B), kv_grid(blocks_for(T, kWarps), KV, B);
  attention_block_delta(delta, dout, out, B, T, H, D, s);  // training's cp kernel: the same rows
  LOOM_LAUNCH(attention_dq_kernel<D>, grid, 32 * kWarps, 0, s)(dqkv, dout, qkv, lse, delta, pos, T, H, KV, scale);
  LOOM_CUDA_LAUNCHED();
  LOOM_LAUNCH(attention_dkv_kernel<D>, kv_grid, 32 * kWarps, 0, s)(dqkv, dout, qkv, lse, delta, pos, T, H, KV, scale);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace

void attention_forward_rowwise(bf16* out, float* lse, const bf16* qkv, int B, int T, int H, int KV, int D,
                               const int32_t* pos, cudaStream_t s) {
  if (D == 64) return forward_d<64>(out, lse, qkv, B, T, H, KV, pos, s);
  if (D == 128) return forward_d<128>(out, lse, qkv, B, T, H, KV, pos, s);
  if (D == 32) return forward_d<32>(out, lse, qkv, B, T, H, KV, pos, s);
  fail("CUDA attention supports head dims 32, 64 and 128, not {}; change model.d_model / model.n_head", D);
}

void attention_backward_rowwise(bf16* dqkv, const bf16* dout, const bf16* out, const bf16* qkv, const float* lse,
                                float* scratch, int B, int T, int H, int KV, int D, const int32_t* pos,
                                cudaStream_t s) {
  if (D == 64) return backward_d<64>(dqkv, dout, out, qkv, lse, scratch, B, T, H, KV, pos, s);
  if (D == 128) return backward_d<128>(dqkv, dout, out, qkv, lse, scratch, B, T, H, KV, pos, s);
  if (D == 32) return backward_d<32>(dqkv, dout, out, qkv, lse, scratch, B, T, H, KV, pos, s);
  fail("CUDA attention supports head dims 32, 64 and 128, not {}; change model.d_model / model.n_head", D);
}

}  // namespace loom::cuda::reference
