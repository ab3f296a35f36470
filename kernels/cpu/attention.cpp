// Causal multi-head attention with grouped-query heads, and RoPE.
// Memory is O(T^2): forward keeps the softmax probabilities [B,H,T,T] for backward. On the
// CPU at the lengths it trains (T <= a few thousand) that is a few MiB per head, and reusing
// it saves recomputing every exp in backward; `train.recompute=selective` drops it and
// recomputes instead. An online-softmax (flash) kernel pays where memory bandwidth is the
// limit, which is the GPU, and lives with the CUDA kernels.
// Backward runs one thread per (batch, kv head) so the k/v gradients that several query
// heads share are summed by one thread in a fixed order.
#include <cmath>
#include <vector>

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

void attention_forward(float* out, float* probs, const float* qkv, int B, int T, int H, int KV, int D) {
  const int row = (H + 2 * KV) * D, group = H / KV;
  const float scale = 1.0f / std::sqrt(float(D));
#pragma omp parallel for collapse(3) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t) {
        const float* base = qkv + int64_t(b) * T * row;
        const float* q = base + int64_t(t) * row + h * D;
        const int koff = (H + h / group) * D, voff = (H + KV + h / group) * D;
        float* p = probs + ((int64_t(b) * H + h) * T + t) * T;
        float maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* k = base + int64_t(t2) * row + koff;
          float s = 0.0f;
          for (int d = 0; d < D; ++d) s += q[d] * k[d];
          s *= scale;
          p[t2] = s;
          maxv = std::max(maxv, s);
        }
        float sum = 0.0f;
        for (int t2 = 0; t2 <= t; ++t2) {
          p[t2] = std::exp(p[t2] - maxv);
          sum += p[t2];
        }
        float inv = 1.0f / sum;
        for (int t2 = 0; t2 <= t; ++t2) p[t2] *= inv;
        for (int t2 = t + 1; t2 < T; ++t2) p[t2] = 0.0f;
        float* o = out + (int64_t(b) * T + t) * H * D + h * D;
        for (int d = 0; d < D; ++d) o[d] = 0.0f;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* v = base + int64_t(t2) * row + voff;
          float pv = p[t2];
          for (int d = 0; d < D; ++d) o[d] += pv * v[d];
        }
      }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs, int B,
                        int T, int H, int KV, int D) {
  const int row = (H + 2 * KV) * D, group = H / KV;
  const float scale = 1.0f / std::sqrt(float(D));
#pragma omp parallel
  {
    std::vector<float> dp(T);
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b)
      for (int kvh = 0; kvh < KV; ++kvh) {
        const float* base = qkv + int64_t(b) * T * row;
        float* dbase = dqkv + int64_t(b) * T * row;
        const int koff = (H + kvh) * D, voff = (H + KV + kvh) * D;
        for (int t = 0; t < T; ++t) {
          float* drow = dbase + int64_t(t) * row;
          for (int d = 0; d < D; ++d) drow[koff + d] = drow[voff + d] = 0.0f;
          for (int h = kvh * group; h < (kvh + 1) * group; ++h)
            for (int d = 0; d < D; ++d) drow[h * D + d] = 0.0f;
        }
        for (int h = kvh * group; h < (kvh + 1) * group; ++h)
          for (int t = 0; t < T; ++t) {
            const float* p = probs + ((int64_t(b) * H + h) * T + t) * T;
            const float* q = base + int64_t(t) * row + h * D;
            const float* dy = dout + (int64_t(b) * T + t) * H * D + h * D;
            float* dq = dbase + int64_t(t) * row + h * D;
            float dot = 0.0f;
            for (int t2 = 0; t2 <= t; ++t2) {
              const float* v = base + int64_t(t2) * row + voff;
              float s = 0.0f;
              for (int d = 0; d < D; ++d) s += dy[d] * v[d];
              dp[t2] = s;
              dot += p[t2] * s;
            }
            for (int t2 = 0; t2 <= t; ++t2) {
              const float* k = base + int64_t(t2) * row + koff;
              float* dk = dbase + int64_t(t2) * row + koff;
              float* dv = dbase + int64_t(t2) * row + voff;
              float ds = p[t2] * (dp[t2] - dot) * scale;
              float pv = p[t2];
              for (int d = 0; d < D; ++d) {
                dq[d] += ds * k[d];
                dk[d] += ds * q[d];
                dv[d] += pv * dy[d];
              }
            }
          }
      }
  }
}

}  // namespace loom::cpu
