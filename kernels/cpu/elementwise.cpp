// Pointwise and row-wise kernels: embedding, GELU, SwiGLU, fused softmax cross-entropy (whole
// and vocab-parallel), the norm reductions the optimizer needs, and bf16 conversions.
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

template <class S>
void gelu_forward(S* out, const S* inp, int64_t n) {
  for_chunks(n, [=](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      float x = ld(inp[i]);
      float cube = 0.044715f * x * x * x;
      st(out[i], 0.5f * x * (1.0f + tanh_approx(kGeluScale * (x + cube))));
    }
  });
}

template <class S>
void gelu_backward(S* dinp, const S* inp, const S* dout, int64_t n) {
  for_chunks(n, [=](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      float x = ld(inp[i]);
      float cube = 0.044715f * x * x * x;
      float th = tanh_approx(kGeluScale * (x + cube));
      float sech2 = 1.0f - th * th;
      float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
      st(dinp[i], grad * ld(dout[i]));
    }
  });
}

template <class S>
void swiglu_forward(S* out, const S* inp, int N, int F) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const S* g = inp + int64_t(n) * 2 * F;
    const S* u = g + F;
    S* o = out + int64_t(n) * F;
#pragma omp simd
    for (int f = 0; f < F; ++f) st(o[f], ld(g[f]) / (1.0f + exp_approx(-ld(g[f]))) * ld(u[f]));
  }
}

template <class S>
void swiglu_backward(S* dinp, const S* inp, const S* dout, int N, int F) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const S* g = inp + int64_t(n) * 2 * F;
    const S* u = g + F;
    const S* dy = dout + int64_t(n) * F;
    S* dg = dinp + int64_t(n) * 2 * F;
    S* du = dg + F;
#pragma omp simd
    for (int f = 0; f < F; ++f) {
      float gf = ld(g[f]), uf = ld(u[f]), dyf = ld(dy[f]);
      float sig = 1.0f / (1.0f + exp_approx(-gf));
      float silu = gf * sig;
      st(dg[f], dyf * uf * sig * (1.0f + gf * (1.0f - sig)));
      st(du[f], dyf * silu);
    }
  }
}

void add_inplace(float* acc, const float* x, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}

template <class S>
void crossentropy_forward_backward(S* logits, float* losses, const int32_t* targets, int N, int V, int valid,
                                   float dloss) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    S* l = logits + int64_t(n) * V;
    float maxv = ld(l[0]);
#pragma omp simd reduction(max : maxv)
    for (int v = 0; v < valid; ++v) maxv = std::max(maxv, ld(l[v]));
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < valid; ++v) sum += exp_approx(ld(l[v]) - maxv);
    int y = targets[n];
    losses[n] = std::log(sum) + maxv - ld(l[y]);
    if (dloss != 0.0f) {
      const float scale = dloss / sum;
      const float ly = ld(l[y]);
#pragma omp simd
      for (int v = 0; v < valid; ++v) st(l[v], exp_approx(ld(l[v]) - maxv) * scale);
      for (int v = valid; v < V; ++v) st(l[v], 0.0f);
      st(l[y], exp_approx(ly - maxv) * scale - dloss);
    }
  }
}

template <class S>
void embedding_forward(S* out, const int32_t* tokens, const S* wte_local, int v0, int Vl, const S* wpe, int B, int T,
                       int C, const int32_t* pos) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      S* o = out + (int64_t(b) * T + t) * C;
      const int id = tokens[b * T + t] - v0;
      const S* p = wpe ? wpe + int64_t(pos ? pos[b * T + t] : t) * C : nullptr;
      for (int c = 0; c < C; ++c) {
        float e = id >= 0 && id < Vl ? ld(wte_local[int64_t(id) * C + c]) : 0.0f;
        st(o[c], p ? e + ld(p[c]) : e);
      }
    }
}

template <class S>
void embedding_backward(float* dwte_local, int v0, int Vl, float* dwpe, const S* dout, const int32_t* tokens, int B,
                        int T, int C, const int32_t* pos) {
#pragma omp parallel
  {
    int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    int lo = int(int64_t(C) * tid / nt), hi = int(int64_t(C) * (tid + 1) / nt);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) {
        const S* d = dout + (int64_t(b) * T + t) * C;
        const int id = tokens[b * T + t] - v0;
        if (id >= 0 && id < Vl) {
          float* e = dwte_local + int64_t(id) * C;
          for (int c = lo; c < hi; ++c) e[c] += ld(d[c]);
        }
        if (dwpe) {
          float* p = dwpe + int64_t(pos ? pos[b * T + t] : t) * C;
          for (int c = lo; c < hi; ++c) p[c] += ld(d[c]);
        }
      }
  }
}

template <class S>
void crossentropy_shard_stats(const S* logits, const int32_t* targets, int N, int Vl, int valid, int v0, float* rowmax,
                              float* target_logit) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const S* l = logits + int64_t(n) * Vl;
    // A shard of padding only (valid = 0) leaves the row's max to the other ranks.
    float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
    for (int v = 0; v < valid; ++v) maxv = std::max(maxv, ld(l[v]));
    rowmax[n] = maxv;
    const int id = targets[n] - v0;
    target_logit[n] = id >= 0 && id < valid ? ld(l[id]) : 0.0f;
  }
}

template <class S>
void crossentropy_shard_sumexp(const S* logits, const float* rowmax, int N, int Vl, int valid, float* sumexp) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const S* l = logits + int64_t(n) * Vl;
    const float maxv = rowmax[n];
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < valid; ++v) sum += exp_approx(ld(l[v]) - maxv);
    sumexp[n] = sum;
  }
}

template <class S>
void crossentropy_shard_finish(S* logits, float* losses, const int32_t* targets, int N, int Vl, int valid, int v0,
                               const float* rowmax, const float* sumexp, const float* target_logit, float dloss) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    losses[n] = std::log(sumexp[n]) + rowmax[n] - target_logit[n];
    if (dloss == 0.0f) continue;
    S* l = logits + int64_t(n) * Vl;
    const float maxv = rowmax[n], scale = dloss / sumexp[n];
    const int id = targets[n] - v0;
    const float target = id >= 0 && id < valid ? ld(l[id]) : 0.0f;
#pragma omp simd
    for (int v = 0; v < valid; ++v) st(l[v], exp_approx(ld(l[v]) - maxv) * scale);
    for (int v = valid; v < Vl; ++v) st(l[v], 0.0f);
    if (id >= 0 && id < valid) st(l[id], exp_approx(target - maxv) * scale - dloss);
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

void widen(float* out, const bf16* in, int64_t n) {
  for_chunks(n, [=](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) out[i] = ld(in[i]);
  });
}

void narrow(bf16* out, const float* in, int64_t n) {
  for_chunks(n, [=](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) st(out[i], in[i]);
  });
}

#define LOOM_ELEMENTWISE(S)                                                                                            \
  template void gelu_forward<S>(S*, const S*, int64_t);                                                                \
  template void gelu_backward<S>(S*, const S*, const S*, int64_t);                                                     \
  template void swiglu_forward<S>(S*, const S*, int, int);                                                             \
  template void swiglu_backward<S>(S*, const S*, const S*, int, int);                                                  \
  template void crossentropy_forward_backward<S>(S*, float*, const int32_t*, int, int, int, float);                    \
  template void embedding_forward<S>(S*, const int32_t*, const S*, int, int, const S*, int, int, int, const int32_t*); \
  template void embedding_backward<S>(float*, int, int, float*, const S*, const int32_t*, int, int, int,               \
                                      const int32_t*);                                                                 \
  template void crossentropy_shard_stats<S>(const S*, const int32_t*, int, int, int, int, float*, float*);             \
  template void crossentropy_shard_sumexp<S>(const S*, const float*, int, int, int, float*);                           \
  template void crossentropy_shard_finish<S>(S*, float*, const int32_t*, int, int, int, int, const float*,             \
                                             const float*, const float*, float);
LOOM_ELEMENTWISE(float)
LOOM_ELEMENTWISE(bf16)

}  // namespace loom::cpu
