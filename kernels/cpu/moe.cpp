// Mixture-of-experts routing, permutation and combination (kernels/ops.h gives the shapes).
// Every loop runs over tokens or rows with per-row work only: no shared sums, so the results
// do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/moe_row.h"
#include "kernels/ops.h"
#include "runtime/error.h"

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

void moe_plan(int32_t* row_of, int32_t* token_of, int32_t* counts, const int32_t* idx, int N, int E, int k, int cap,
              int slot, int rows) {
  LOOM_CHECK(slot == 0 || cap <= slot, "the padded MoE layout's slots of {} rows cannot hold a capacity of {}", slot,
             cap);
  const int64_t A = int64_t(N) * k;
  int32_t *routed = counts, *kept = counts + E;
  std::vector<int64_t> start(static_cast<size_t>(E)), taken(static_cast<size_t>(E), 0);
  for (int e = 0; e < E; ++e) routed[e] = 0;
  for (int64_t i = 0; i < A; ++i) ++routed[idx[i]];
  for (int64_t e = 0, at = 0; e < E; ++e) {
    kept[e] = std::min(routed[e], cap);
    start[size_t(e)] = slot > 0 ? e * slot : at;
    at += kept[e];
  }
  for (int r = 0; r < rows; ++r) token_of[r] = -1;
  for (int64_t i = 0; i < A; ++i) {
    const int e = idx[i];
    const int64_t p = taken[size_t(e)]++;
    row_of[i] = p < cap ? int32_t(start[size_t(e)] + p) : -1;
    if (p < cap) token_of[start[size_t(e)] + p] = int32_t(i / k);
  }
}

void moe_ep_maps(int32_t* map_in, int32_t* map_out, const int32_t* from, int P, int El, int slot) {
  auto len = [&](int r, int j) { return int64_t(from ? from[r * El + j] : slot); };
  // Expert-major: expert j's rows start after every row of the experts before it.
  std::vector<int64_t> q(static_cast<size_t>(El), 0);
  for (int j = 0; j + 1 < El; ++j) {
    q[size_t(j) + 1] = q[size_t(j)];
    for (int r = 0; r < P; ++r) q[size_t(j) + 1] += len(r, j);
  }
  int64_t p = 0;
  for (int r = 0; r < P; ++r)
    for (int j = 0; j < El; ++j)
      for (int64_t i = 0, n = len(r, j); i < n; ++i, ++p) {
        const int64_t at = q[size_t(j)]++;
        map_in[at] = int32_t(p);
        map_out[p] = int32_t(at);
      }
}

template <class S>
void moe_gather(S* rows, const S* x, const int32_t* token_of_row, int R, int C) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < R; ++r) {
    S* dst = rows + int64_t(r) * C;
    if (token_of_row[r] < 0) {
      for (int c = 0; c < C; ++c) st(dst[c], 0.0f);
      continue;
    }
    const S* src = x + int64_t(token_of_row[r]) * C;
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

void moe_stats_add(double* st, const int32_t* counts, const float* prob_sums, int N, int E, int k) {
  moe_row::stats_add(st, counts, prob_sums, N, E, k);
}

void moe_aux_grad(float* g, const int32_t* counts, double scale, int N, int E, int k) {
  const int64_t A = int64_t(N) * k;
  for (int e = 0; e < E; ++e) g[e] = float(scale * float(double(counts[e]) / double(A)));
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
