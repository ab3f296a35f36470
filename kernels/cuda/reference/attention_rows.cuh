// The per-key and per-query steps of the row-wise reference attention kernels
// (attention_rowwise.cu): a warp holds one row, each lane E = D/32 elements of the head dim at
// lane + 32 e.
#pragma once
#include "kernels/cuda/common.cuh"

namespace loom::cuda::reference {

// Forward: merges key k and value v into the row's running max m, sum l and output o, by the
// online softmax (q already scaled).
template <int E>
__device__ __forceinline__ void row_merge_key(const float* q, const bf16* k, const bf16* v, int lane, float& m,
                                              float& l, float* o) {
  float s = 0.0f;
  for (int e = 0; e < E; ++e) s += q[e] * f(k[lane + 32 * e]);
  s = warp_sum(s);
  const float mn = fmaxf(m, s), corr = __expf(m - mn), p = __expf(s - mn);
  l = l * corr + p;
  for (int e = 0; e < E; ++e) o[e] = o[e] * corr + p * f(v[lane + 32 * e]);
  m = mn;
}

// dQ: adds key k's dS * k to d (q already scaled, dy the row's output gradient; L and dl its
// log-sum-exp and delta).
template <int E>
__device__ __forceinline__ void row_dq_key(const float* q, const float* dy, const bf16* k, const bf16* v, float L,
                                           float dl, int lane, float* d) {
  float s = 0.0f, dp = 0.0f;
  for (int e = 0; e < E; ++e) s += q[e] * f(k[lane + 32 * e]), dp += dy[e] * f(v[lane + 32 * e]);
  s = warp_sum(s);
  dp = warp_sum(dp);
  const float ds = __expf(s - L) * (dp - dl);
  for (int e = 0; e < E; ++e) d[e] += ds * f(k[lane + 32 * e]);
}

// dK and dV: adds query q's share (dy its output gradient, L and dl its log-sum-exp and delta)
// to the key row's dk and dv (k and v held in registers).
template <int E>
__device__ __forceinline__ void row_dkv_query(const bf16* q, const bf16* dy, const float* k, const float* v, float L,
                                              float dl, float scale, int lane, float* dk, float* dv) {
  float s = 0.0f, dp = 0.0f;
  for (int e = 0; e < E; ++e) s += f(q[lane + 32 * e]) * k[e], dp += f(dy[lane + 32 * e]) * v[e];
  s = warp_sum(s) * scale;
  dp = warp_sum(dp);
  const float p = __expf(s - L), ds = p * (dp - dl);
  for (int e = 0; e < E; ++e) {
    dv[e] += p * f(dy[lane + 32 * e]);
    dk[e] += ds * f(q[lane + 32 * e]);
  }
}

}  // namespace loom::cuda::reference
