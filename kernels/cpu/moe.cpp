// Mixture-of-experts routing, permutation and combination (kernels/ops.h gives the shapes).
// Every loop runs over tokens or rows with per-row work only: no shared sums, so the results
// do not depend on the thread count.
#include <cmath>

#include "kernels/ops.h"

namespace loom::cpu {

template <class S>
void moe_route(float* probs, int32_t* idx, float* w, const S* logits, int N, int E, int k) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; ++t) {
    const S* l = logits + int64_t(t) * E;
    float* p = probs + int64_t(t) * E;
    float mx = -INFINITY;
    for (int e = 0; e < E; ++e) mx = std::fmax(mx, ld(l[e]));
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(ld(l[e]) - mx));
    for (int e = 0; e < E; ++e) p[e] /= sum;
    int32_t* id = idx + int64_t(t) * k;
    float* wt = w + int64_t(t) * k;
    float sel = 0.0f;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken = taken || id[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      id[j] = best;
      sel += p[best];
    }
    for (int j = 0; j < k; ++j) wt[j] = p[id[j]] / sel;
  }
}

template <class S>
void moe_gather(S* rows, const S* x, const int32_t* token_of_row, int R, int C) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < R; ++r) {
    const S* src = x + int64_t(token_of_row[r]) * C;
    S* dst = rows + int64_t(r) * C;
    for (int c = 0; c < C; ++c) dst[c] = src[c];
  }
}

template <class S>
void moe_combine(S* out, const S* rows, const int32_t* row_of, const float* w, int N, int k, int C) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; ++t) {
    S* o = out + int64_t(t) * C;
    for (int c = 0; c < C; ++c) {
      float acc = 0.0f;
      for (int j = 0; j < k; ++j) {
        const int32_t r = row_of[int64_t(t) * k + j];
        if (r >= 0) acc += w[int64_t(t) * k + j] * ld(rows[int64_t(r) * C + c]);
      }
      st(o[c], acc);
    }
  }
}

template <class S>
void moe_combine_backward(S* drows, float* dw, const S* dout, const S* rows, const int32_t* row_of, const float* w,
                          int N, int k, int C) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; ++t) {
    const S* d = dout + int64_t(t) * C;
    for (int j = 0; j < k; ++j) {
      const int64_t a = int64_t(t) * k + j;
      const int32_t r = row_of[a];
      if (r < 0) {
        dw[a] = 0.0f;
        continue;
      }
      const S* y = rows + int64_t(r) * C;
      S* dy = drows + int64_t(r) * C;
      float dot = 0.0f;
      for (int c = 0; c < C; ++c) {
        dot += ld(d[c]) * ld(y[c]);
        st(dy[c], w[a] * ld(d[c]));
      }
      dw[a] = dot;
    }
  }
}

template <class S>
void moe_scatter_add(S* dx, const S* drows, const int32_t* row_of, int N, int k, int C) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; ++t) {
    S* o = dx + int64_t(t) * C;
    for (int c = 0; c < C; ++c) {
      float acc = ld(o[c]);
      for (int j = 0; j < k; ++j) {
        const int32_t r = row_of[int64_t(t) * k + j];
        if (r >= 0) acc += ld(drows[int64_t(r) * C + c]);
      }
      st(o[c], acc);
    }
  }
}

template <class S>
void moe_router_backward(S* dlogits, const float* probs, const int32_t* idx, const float* w, const float* dw,
                         const float* aux_g, int N, int E, int k) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; ++t) {
    const float* p = probs + int64_t(t) * E;
    const int32_t* id = idx + int64_t(t) * k;
    const float* wt = w + int64_t(t) * k;
    const float* g = dw + int64_t(t) * k;
    // w_j = p_j / s with s the sum of the selected: d p_j = (g_j - sum_i g_i w_i) / s.
    float s = 0.0f, gw = 0.0f;
    for (int j = 0; j < k; ++j) s += p[id[j]], gw += g[j] * wt[j];
    float dp_dot_p = 0.0f;  // sum_e dp_e p_e for the softmax's backward
    for (int e = 0; e < E; ++e) dp_dot_p += aux_g[e] * p[e];
    for (int j = 0; j < k; ++j) dp_dot_p += (g[j] - gw) / s * p[id[j]];
    S* dl = dlogits + int64_t(t) * E;
    for (int e = 0; e < E; ++e) {
      float dp = aux_g[e];
      for (int j = 0; j < k; ++j)
        if (id[j] == e) dp += (g[j] - gw) / s;
      st(dl[e], p[e] * (dp - dp_dot_p));
    }
  }
}

void column_sums(float* out, const float* probs, int N, int E) {
  for (int e = 0; e < E; ++e) out[e] = 0.0f;
  for (int t = 0; t < N; ++t)
    for (int e = 0; e < E; ++e) out[e] += probs[int64_t(t) * E + e];
}

#define LOOM_MOE(S)                                                                                                   \
  template void moe_route<S>(float*, int32_t*, float*, const S*, int, int, int);                                      \
  template void moe_gather<S>(S*, const S*, const int32_t*, int, int);                                                \
  template void moe_combine<S>(S*, const S*, const int32_t*, const float*, int, int, int);                            \
  template void moe_combine_backward<S>(S*, float*, const S*, const S*, const int32_t*, const float*, int, int, int); \
  template void moe_scatter_add<S>(S*, const S*, const int32_t*, int, int, int);                                      \
  template void moe_router_backward<S>(S*, const float*, const int32_t*, const float*, const float*, const float*,    \
                                       int, int, int);
LOOM_MOE(float)
LOOM_MOE(bf16)

}  // namespace loom::cpu
