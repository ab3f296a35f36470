// Mixture-of-experts routing, permutation and combination (kernels/ops.h gives the shapes).
// Every loop runs over tokens or rows with per-row work only: no shared sums, so the results
// do not depend on the thread count.
#include <cmath>

#include "kernels/moe_row.h"
#include "kernels/ops.h"

namespace loom::cpu {

template <class S>
void moe_route(float* probs, int32_t* idx, float* w, const S* logits, int N, int E, int k) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; ++t) {
    const S* l = logits + int64_t(t) * E;
    moe_row::route(probs + int64_t(t) * E, idx + int64_t(t) * k, w + int64_t(t) * k, E, k,
                   [l](int e) { return ld(l[e]); });
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
    S* dl = dlogits + int64_t(t) * E;
    moe_row::router_backward(probs + int64_t(t) * E, idx + int64_t(t) * k, w + int64_t(t) * k, dw + int64_t(t) * k,
                             aux_g, E, k, [dl](int e, float v) { st(dl[e], v); });
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
