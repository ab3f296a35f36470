// Causal multi-head attention with grouped-query heads, and RoPE.
// Memory is O(T^2): forward keeps the softmax probabilities [B,H,T,T] for backward. On the
// CPU at the lengths it trains (T <= a few thousand) that is a few MiB per head, and reusing
// it saves recomputing every exp in backward; `train.recompute=selective` drops it and
// recomputes instead. An online-softmax (flash) kernel pays where memory bandwidth is the
// limit, which is the GPU, and lives with the CUDA kernels.
// Backward runs one thread per (batch, kv head) so the k/v gradients that several query
// heads share are summed by one thread in a fixed order.
// Scores and weighted sums are GEMMs through OpenBLAS; inside the parallel region OpenBLAS's
// OpenMP build runs each call on the calling thread alone.
#include <cmath>
#include <vector>

#include "kernels/cpu/vecmath.h"
#include "kernels/ops.h"

namespace loom::cpu {

void rope_table(float* cos, float* sin, int T, int D, float theta) {
  for (int i = 0; i < D / 2; ++i) {
    float inv_freq = 1.0f / std::pow(theta, float(2 * i) / float(D));
    for (int t = 0; t < T; ++t) {
      float angle = float(t) * inv_freq;
      cos[t * (D / 2) + i] = std::cos(angle);
      sin[t * (D / 2) + i] = std::sin(angle);
    }
  }
}

namespace {
template <bool Inverse>
void rope_apply(float* qkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D) {
  int row = (H + 2 * KV) * D, half = D / 2;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      float* x = qkv + (int64_t(b) * T + t) * row;
      const float* c = cos + t * half;
      const float* s = sin + t * half;
      for (int h = 0; h < H + KV; ++h) {  // q heads then k heads: contiguous
        float* xh = x + h * D;
        for (int i = 0; i < half; ++i) {
          float x1 = xh[i], x2 = xh[i + half];
          float sn = Inverse ? -s[i] : s[i];
          xh[i] = x1 * c[i] - x2 * sn;
          xh[i + half] = x2 * c[i] + x1 * sn;
        }
      }
    }
}
}  // namespace

void rope_forward(float* qkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D) {
  rope_apply<false>(qkv, cos, sin, B, T, H, KV, D);
}
void rope_backward(float* dqkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D) {
  rope_apply<true>(dqkv, cos, sin, B, T, H, KV, D);
}

// Per (batch, head): S = Q K^T as one GEMM over the full T x T square (the masked half is
// wasted work, but a GEMM runs an order of magnitude faster than the scalar loop that would
// skip it), a causal softmax row by row, then O = P V as a second GEMM. Threads own whole
// (batch, head) pairs and call single-threaded GEMMs inside the parallel region.
void attention_forward(float* out, float* probs, const float* qkv, int B, int T, int H, int KV, int D) {
  const int row = (H + 2 * KV) * D, group = H / KV;
  const float scale = 1.0f / std::sqrt(float(D));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const float* base = qkv + int64_t(b) * T * row;
      const float* q = base + h * D;
      const float* k = base + (H + h / group) * D;
      const float* v = base + (H + KV + h / group) * D;
      float* P = probs + (int64_t(b) * H + h) * T * T;
      gemm(false, true, T, T, D, scale, q, row, k, row, 0.0f, P, T);
      for (int t = 0; t < T; ++t) {
        float* p = P + int64_t(t) * T;
        float maxv = p[0];
        for (int u = 1; u <= t; ++u) maxv = std::max(maxv, p[u]);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int u = 0; u <= t; ++u) sum += (p[u] = exp_approx(p[u] - maxv));
        const float inv = 1.0f / sum;
        for (int u = 0; u <= t; ++u) p[u] *= inv;
        for (int u = t + 1; u < T; ++u) p[u] = 0.0f;
      }
      gemm(false, false, T, D, T, 1.0f, P, T, v, row, 0.0f, out + int64_t(b) * T * H * D + h * D, H * D);
    }
}

// Per (batch, kv head), over its group of query heads in order:
//   dP = dO V^T, dV += P^T dO, dS = P * (dP - rowsum(P * dP)) * scale, dQ = dS K, dK += dS^T Q.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs, int B, int T, int H,
                        int KV, int D) {
  const int row = (H + 2 * KV) * D, group = H / KV;
  const float scale = 1.0f / std::sqrt(float(D));
#pragma omp parallel
  {
    std::vector<float> dP(size_t(T) * T);
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b)
      for (int kvh = 0; kvh < KV; ++kvh) {
        const float* base = qkv + int64_t(b) * T * row;
        float* dbase = dqkv + int64_t(b) * T * row;
        const float* k = base + (H + kvh) * D;
        const float* v = base + (H + KV + kvh) * D;
        float* dk = dbase + (H + kvh) * D;
        float* dv = dbase + (H + KV + kvh) * D;
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
          const float* P = probs + (int64_t(b) * H + h) * T * T;
          const float* dy = dout + int64_t(b) * T * H * D + h * D;
          const float* q = base + h * D;
          const float beta = h == kvh * group ? 0.0f : 1.0f;  // first head overwrites dk, dv
          gemm(false, true, T, T, D, 1.0f, dy, H * D, v, row, 0.0f, dP.data(), T);
          gemm(true, false, T, D, T, 1.0f, P, T, dy, H * D, beta, dv, row);
          for (int t = 0; t < T; ++t) {
            const float* p = P + int64_t(t) * T;
            float* ds = dP.data() + int64_t(t) * T;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int u = 0; u <= t; ++u) dot += p[u] * ds[u];
            for (int u = 0; u <= t; ++u) ds[u] = p[u] * (ds[u] - dot) * scale;
            for (int u = t + 1; u < T; ++u) ds[u] = 0.0f;
          }
          gemm(false, false, T, D, T, 1.0f, dP.data(), T, k, row, 0.0f, dbase + h * D, row);
          gemm(true, false, T, D, T, 1.0f, dP.data(), T, q, row, beta, dk, row);
        }
      }
  }
}

}  // namespace loom::cpu
