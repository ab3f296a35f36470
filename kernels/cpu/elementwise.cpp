// Pointwise and row-wise kernels: embedding, GELU, SwiGLU, residual add, fused softmax
// cross-entropy, and the norm reductions the optimizer needs.
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/vecmath.h"
#include "kernels/ops.h"

namespace loom::cpu {

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
}

namespace {
// Splits [0, n) into 16Ki-element chunks over the threads; the body's inner loop vectorizes.
template <class F>
void for_chunks(int64_t n, F&& body) {
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) body(c * kChunk, std::min(n, (c + 1) * kChunk));
}
}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n) {
  for_chunks(n, [=](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      float x = inp[i];
      float cube = 0.044715f * x * x * x;
      out[i] = 0.5f * x * (1.0f + tanh_approx(kGeluScale * (x + cube)));
    }
  });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  for_chunks(n, [=](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      float x = inp[i];
      float cube = 0.044715f * x * x * x;
      float th = tanh_approx(kGeluScale * (x + cube));
      float sech2 = 1.0f - th * th;
      float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
      dinp[i] = grad * dout[i];
    }
  });
}

void swiglu_forward(float* out, const float* inp, int N, int F) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* g = inp + int64_t(n) * 2 * F;
    const float* u = g + F;
    float* o = out + int64_t(n) * F;
#pragma omp simd
    for (int f = 0; f < F; ++f) o[f] = g[f] / (1.0f + exp_approx(-g[f])) * u[f];
  }
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* g = inp + int64_t(n) * 2 * F;
    const float* u = g + F;
    const float* dy = dout + int64_t(n) * F;
    float* dg = dinp + int64_t(n) * 2 * F;
    float* du = dg + F;
#pragma omp simd
    for (int f = 0; f < F; ++f) {
      float sig = 1.0f / (1.0f + exp_approx(-g[f]));
      float silu = g[f] * sig;
      dg[f] = dy[f] * u[f] * sig * (1.0f + g[f] * (1.0f - sig));
      du[f] = dy[f] * silu;
    }
  }
}

void add_forward(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void add_inplace(float* acc, const float* x, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}

void crossentropy_forward_backward(float* logits, float* losses, const int32_t* targets, int N, int V, float dloss) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    float* l = logits + int64_t(n) * V;
    float maxv = l[0];
#pragma omp simd reduction(max : maxv)
    for (int v = 0; v < V; ++v) maxv = std::max(maxv, l[v]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; ++v) sum += exp_approx(l[v] - maxv);
    int y = targets[n];
    losses[n] = std::log(sum) + maxv - l[y];
    if (dloss != 0.0f) {
      const float scale = dloss / sum;
#pragma omp simd
      for (int v = 0; v < V; ++v) l[v] = exp_approx(l[v] - maxv) * scale;
      l[y] -= dloss;
    }
  }
}

void embedding_forward(float* out, const int32_t* tokens, const float* wte_local, int v0, int Vl, const float* wpe,
                       int B, int T, int C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      float* o = out + (int64_t(b) * T + t) * C;
      const int id = tokens[b * T + t] - v0;
      const float* p = wpe ? wpe + int64_t(t) * C : nullptr;
      for (int c = 0; c < C; ++c) {
        float e = id >= 0 && id < Vl ? wte_local[int64_t(id) * C + c] : 0.0f;
        o[c] = p ? e + p[c] : e;
      }
    }
}

void embedding_backward(float* dwte_local, int v0, int Vl, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C) {
#pragma omp parallel
  {
    int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    int lo = int(int64_t(C) * tid / nt), hi = int(int64_t(C) * (tid + 1) / nt);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) {
        const float* d = dout + (int64_t(b) * T + t) * C;
        const int id = tokens[b * T + t] - v0;
        if (id >= 0 && id < Vl) {
          float* e = dwte_local + int64_t(id) * C;
          for (int c = lo; c < hi; ++c) e[c] += d[c];
        }
        if (dwpe) {
          float* p = dwpe + int64_t(t) * C;
          for (int c = lo; c < hi; ++c) p[c] += d[c];
        }
      }
  }
}

void crossentropy_shard_stats(const float* logits, const int32_t* targets, int N, int Vl, int v0, float* rowmax,
                              float* target_logit) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* l = logits + int64_t(n) * Vl;
    float maxv = l[0];
#pragma omp simd reduction(max : maxv)
    for (int v = 0; v < Vl; ++v) maxv = std::max(maxv, l[v]);
    rowmax[n] = maxv;
    const int id = targets[n] - v0;
    target_logit[n] = id >= 0 && id < Vl ? l[id] : 0.0f;
  }
}

void crossentropy_shard_sumexp(const float* logits, const float* rowmax, int N, int Vl, float* sumexp) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* l = logits + int64_t(n) * Vl;
    const float maxv = rowmax[n];
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < Vl; ++v) sum += exp_approx(l[v] - maxv);
    sumexp[n] = sum;
  }
}

void crossentropy_shard_finish(float* logits, float* losses, const int32_t* targets, int N, int Vl, int v0,
                               const float* rowmax, const float* sumexp, const float* target_logit, float dloss) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    losses[n] = std::log(sumexp[n]) + rowmax[n] - target_logit[n];
    if (dloss == 0.0f) continue;
    float* l = logits + int64_t(n) * Vl;
    const float maxv = rowmax[n], scale = dloss / sumexp[n];
#pragma omp simd
    for (int v = 0; v < Vl; ++v) l[v] = exp_approx(l[v] - maxv) * scale;
    const int id = targets[n] - v0;
    if (id >= 0 && id < Vl) l[id] -= dloss;
  }
}

double sum_squares(const float* x, int64_t n) {
  // Fixed 64Ki-element chunks summed in order: the result does not depend on thread count.
  constexpr int64_t kChunk = 1 << 16;
  int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(size_t(chunks), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0.0;
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) s += double(x[i]) * x[i];
    part[size_t(c)] = s;
  }
  double s = 0.0;
  for (double p : part) s += p;
  return s;
}

void scale_inplace(float* x, float s, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace loom::cpu
