// LayerNorm and RMSNorm over the last dim. Forward saves the per-row statistics backward
// needs (mean, 1/std) instead of the normalized output, which backward recomputes.
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
}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C, float eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + int64_t(n) * C;
    float m = 0.0f;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    float v = 0.0f;
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= C;
    float s = 1.0f / std::sqrt(v + eps);
    float* o = out + int64_t(n) * C;
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + int64_t(n) * C;
    const float* dy = dout + int64_t(n) * C;
    float m = mean[n], s = rstd[n];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = 0; c < C; ++c) {
      float xhat = (x[c] - m) * s;
      float dnorm = weight[c] * dy[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * xhat;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    float* dx = dinp + int64_t(n) * C;
    for (int c = 0; c < C; ++c) {
      float xhat = (x[c] - m) * s;
      dx[c] += (weight[c] * dy[c] - dnorm_mean - xhat * dnorm_norm_mean) * s;
    }
  }
  column_accumulate(N, C, [&](int n, int lo, int hi) {
    const float* x = inp + int64_t(n) * C;
    const float* dy = dout + int64_t(n) * C;
    for (int c = lo; c < hi; ++c) {
      dweight[c] += (x[c] - mean[n]) * rstd[n] * dy[c];
      dbias[c] += dy[c];
    }
  });
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + int64_t(n) * C;
    float ss = 0.0f;
    for (int c = 0; c < C; ++c) ss += x[c] * x[c];
    float s = 1.0f / std::sqrt(ss / C + eps);
    float* o = out + int64_t(n) * C;
    for (int c = 0; c < C; ++c) o[c] = x[c] * s * weight[c];
    rstd[n] = s;
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + int64_t(n) * C;
    const float* dy = dout + int64_t(n) * C;
    float s = rstd[n];
    float dot = 0.0f;  // mean of dnorm * xhat
    for (int c = 0; c < C; ++c) dot += weight[c] * dy[c] * x[c] * s;
    dot /= C;
    float* dx = dinp + int64_t(n) * C;
    for (int c = 0; c < C; ++c) dx[c] += (weight[c] * dy[c] - x[c] * s * dot) * s;
  }
  column_accumulate(N, C, [&](int n, int lo, int hi) {
    const float* x = inp + int64_t(n) * C;
    const float* dy = dout + int64_t(n) * C;
    for (int c = lo; c < hi; ++c) dweight[c] += x[c] * rstd[n] * dy[c];
  });
}

}  // namespace loom::cpu
