// LayerNorm and RMSNorm over the last dim. Forward saves the per-row statistics backward
// needs (mean, 1/std) instead of the normalized output, which backward recomputes; it can add
// the residual branch into its input first (the fused residual + norm of each block).
// Parameter gradients are reduced by column ranges per thread, so sums run in a fixed order.
#include <omp.h>

#include <cmath>

#include "kernels/ops.h"

namespace loom::cpu {
namespace {
// dweight[c] += sum_n f(n, c) with threads owning column ranges.
template <class F>
void column_accumulate(int N, int C, F&& body) {
#pragma omp parallel
  {
    int nt = omp_get_num_threads(), id = omp_get_thread_num();
    int lo = int(int64_t(C) * id / nt), hi = int(int64_t(C) * (id + 1) / nt);
    for (int n = 0; n < N; ++n) body(n, lo, hi);
  }
}

// Row x += add (stored rounded to S), the sum of the row returned.
template <class S>
float add_row(S* x, const S* add, int C) {
  float s = 0.0f;
  if (add) {
    for (int c = 0; c < C; ++c) {
      st(x[c], ld(x[c]) + ld(add[c]));
      s += ld(x[c]);
    }
  } else {
    for (int c = 0; c < C; ++c) s += ld(x[c]);
  }
  return s;
}
}  // namespace

template <class S>
void layernorm_forward(S* out, float* mean, float* rstd, S* inp, const S* add, const S* weight, const S* bias, int N,
                       int C, float eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    S* x = inp + int64_t(n) * C;
    float m = add_row(x, add ? add + int64_t(n) * C : nullptr, C);
    m /= C;
    float v = 0.0f;
    for (int c = 0; c < C; ++c) v += (ld(x[c]) - m) * (ld(x[c]) - m);
    v /= C;
    float s = 1.0f / std::sqrt(v + eps);
    S* o = out + int64_t(n) * C;
    for (int c = 0; c < C; ++c) st(o[c], (ld(x[c]) - m) * s * ld(weight[c]) + ld(bias[c]));
    mean[n] = m;
    rstd[n] = s;
  }
}

template <class S>
void layernorm_backward(S* dinp, float* dweight, float* dbias, const S* dout, const S* inp, const S* weight,
                        const float* mean, const float* rstd, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < (dinp ? N : 0); ++n) {  // no input gradient asked for: weights only
    const S* x = inp + int64_t(n) * C;
    const S* dy = dout + int64_t(n) * C;
    float m = mean[n], s = rstd[n];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = 0; c < C; ++c) {
      float xhat = (ld(x[c]) - m) * s;
      float dnorm = ld(weight[c]) * ld(dy[c]);
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * xhat;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    S* dx = dinp + int64_t(n) * C;
    for (int c = 0; c < C; ++c) {
      float xhat = (ld(x[c]) - m) * s;
      st(dx[c], ld(dx[c]) + (ld(weight[c]) * ld(dy[c]) - dnorm_mean - xhat * dnorm_norm_mean) * s);
    }
  }
  if (!dweight) return;
  column_accumulate(N, C, [&](int n, int lo, int hi) {
    const S* x = inp + int64_t(n) * C;
    const S* dy = dout + int64_t(n) * C;
    for (int c = lo; c < hi; ++c) {
      dweight[c] += (ld(x[c]) - mean[n]) * rstd[n] * ld(dy[c]);
      dbias[c] += ld(dy[c]);
    }
  });
}

template <class S>
void rmsnorm_forward(S* out, float* rstd, S* inp, const S* add, const S* weight, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    S* x = inp + int64_t(n) * C;
    add_row(x, add ? add + int64_t(n) * C : nullptr, C);
    float ss = 0.0f;
    for (int c = 0; c < C; ++c) ss += ld(x[c]) * ld(x[c]);
    float s = 1.0f / std::sqrt(ss / C + eps);
    S* o = out + int64_t(n) * C;
    for (int c = 0; c < C; ++c) st(o[c], ld(x[c]) * s * ld(weight[c]));
    rstd[n] = s;
  }
}

template <class S>
void rmsnorm_backward(S* dinp, float* dweight, const S* dout, const S* inp, const S* weight, const float* rstd, int N,
                      int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < (dinp ? N : 0); ++n) {  // no input gradient asked for: weights only
    const S* x = inp + int64_t(n) * C;
    const S* dy = dout + int64_t(n) * C;
    float s = rstd[n];
    float dot = 0.0f;  // mean of dnorm * xhat
    for (int c = 0; c < C; ++c) dot += ld(weight[c]) * ld(dy[c]) * ld(x[c]) * s;
    dot /= C;
    S* dx = dinp + int64_t(n) * C;
    for (int c = 0; c < C; ++c) st(dx[c], ld(dx[c]) + (ld(weight[c]) * ld(dy[c]) - ld(x[c]) * s * dot) * s);
  }
  if (!dweight) return;
  column_accumulate(N, C, [&](int n, int lo, int hi) {
    const S* x = inp + int64_t(n) * C;
    const S* dy = dout + int64_t(n) * C;
    for (int c = lo; c < hi; ++c) dweight[c] += ld(x[c]) * rstd[n] * ld(dy[c]);
  });
}

#define LOOM_NORM(S)                                                                                                \
  template void layernorm_forward<S>(S*, float*, float*, S*, const S*, const S*, const S*, int, int, float);        \
  template void layernorm_backward<S>(S*, float*, float*, const S*, const S*, const S*, const float*, const float*, \
                                      int, int);                                                                    \
  template void rmsnorm_forward<S>(S*, float*, S*, const S*, const S*, int, int, float);                            \
  template void rmsnorm_backward<S>(S*, float*, const S*, const S*, const S*, const float*, int, int);
LOOM_NORM(float)
LOOM_NORM(bf16)

}  // namespace loom::cpu
