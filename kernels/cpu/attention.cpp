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
#include <algorithm>
#include <cmath>
#include <type_traits>
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
template <bool Inverse, class S>
void rope_apply(S* qkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D, const int32_t* pos) {
  int row = (H + 2 * KV) * D, half = D / 2;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      S* x = qkv + (int64_t(b) * T + t) * row;
      const int at = pos ? pos[b * T + t] : t;
      const float* c = cos + at * half;
      const float* s = sin + at * half;
      for (int h = 0; h < H + KV; ++h) {  // q heads then k heads: contiguous
        S* xh = x + h * D;
        for (int i = 0; i < half; ++i) {
          float x1 = ld(xh[i]), x2 = ld(xh[i + half]);
          float sn = Inverse ? -s[i] : s[i];
          st(xh[i], x1 * c[i] - x2 * sn);
          st(xh[i + half], x2 * c[i] + x1 * sn);
        }
      }
    }
}

// A [rows, D] slice with row stride ld, as fp32 for the GEMMs: the slice itself for float
// storage, else widened into buf (stride D).
struct F32View {
  const float* p;
  int ld;
};
F32View f32_view(const float* p, int rows, int D, int ld, std::vector<float>&) {
  (void)rows, (void)D;
  return {p, ld};
}
F32View f32_view(const bf16* p, int rows, int D, int ld, std::vector<float>& buf) {
  buf.resize(size_t(rows) * D);
  for (int r = 0; r < rows; ++r)
    for (int d = 0; d < D; ++d) buf[size_t(r) * D + d] = cpu::ld(p[int64_t(r) * ld + d]);
  return {buf.data(), D};
}
// Writes an fp32 [rows, D] result into a strided slice of S (a no-op when they are the same).
void store_slice(float* dst, const float* src, int rows, int D, int ld) {
  (void)dst, (void)src, (void)rows, (void)D, (void)ld;
}
void store_slice(bf16* dst, const float* src, int rows, int D, int ld) {
  for (int r = 0; r < rows; ++r)
    for (int d = 0; d < D; ++d) st(dst[int64_t(r) * ld + d], src[size_t(r) * D + d]);
}
}  // namespace

template <class S>
void rope_forward(S* qkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D, const int32_t* pos) {
  rope_apply<false>(qkv, cos, sin, B, T, H, KV, D, pos);
}
template <class S>
void rope_backward(S* dqkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D,
                   const int32_t* pos) {
  rope_apply<true>(dqkv, cos, sin, B, T, H, KV, D, pos);
}

// Per (batch, head): S = Q K^T as one GEMM over the full T x T square (the masked half is
// wasted work, but a GEMM runs an order of magnitude faster than the scalar loop that would
// skip it), a causal softmax row by row, then O = P V as a second GEMM. Threads own whole
// (batch, head) pairs and call single-threaded GEMMs inside the parallel region. bf16 storage
// widens a pair's q, k, v (and P) into per-thread fp32 buffers and rounds P and O on store.
template <class S>
void attention_forward(S* out, S* probs, const S* qkv, const AttentionShape& shape) {
  const int B = shape.B, T = shape.T, H = shape.H, KV = shape.KV, D = shape.D;
  const int32_t* pos = shape.pos;
  constexpr bool wide = std::is_same_v<S, float>;
  const int row = (H + 2 * KV) * D, group = H / KV;
  const float scale = 1.0f / std::sqrt(float(D));
#pragma omp parallel
  {
    std::vector<float> qb, kb, vb, Pb(wide ? 0 : size_t(T) * T), ob(wide ? 0 : size_t(T) * D);
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        const S* base = qkv + int64_t(b) * T * row;
        const F32View q = f32_view(base + h * D, T, D, row, qb);
        const F32View k = f32_view(base + (H + h / group) * D, T, D, row, kb);
        const F32View v = f32_view(base + (H + KV + h / group) * D, T, D, row, vb);
        S* Ps = probs + (int64_t(b) * H + h) * T * T;
        float* P = wide ? reinterpret_cast<float*>(Ps) : Pb.data();
        gemm(false, true, T, T, D, scale, q.p, q.ld, k.p, k.ld, 0.0f, P, T);
        for (int t = 0; t < T; ++t) {
          float* p = P + int64_t(t) * T;
          const int lo = pos ? t - pos[b * T + t] : 0;  // the first key of t's document
          for (int u = 0; u < lo; ++u) p[u] = 0.0f;
          float maxv = p[lo];
          for (int u = lo + 1; u <= t; ++u) maxv = std::max(maxv, p[u]);
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int u = lo; u <= t; ++u) sum += (p[u] = exp_approx(p[u] - maxv));
          const float inv = 1.0f / sum;
          for (int u = lo; u <= t; ++u) p[u] *= inv;
          for (int u = t + 1; u < T; ++u) p[u] = 0.0f;
        }
        S* o = out + int64_t(b) * T * H * D + h * D;
        if constexpr (wide) {
          gemm(false, false, T, D, T, 1.0f, P, T, v.p, v.ld, 0.0f, o, H * D);
        } else {
          // The stored (rounded) probabilities are what backward will read: use them here too.
          for (int64_t i = 0; i < int64_t(T) * T; ++i) st(Ps[i], P[i]), P[i] = ld(Ps[i]);
          gemm(false, false, T, D, T, 1.0f, P, T, v.p, v.ld, 0.0f, ob.data(), D);
          store_slice(o, ob.data(), T, D, H * D);
        }
      }
  }
}

// Per (batch, kv head), over its group of query heads in order:
//   dP = dO V^T, dV += P^T dO, dS = P * (dP - rowsum(P * dP)) * scale, dQ = dS K, dK += dS^T Q.
template <class S>
void attention_backward(S* dqkv, const S* dout, const S* qkv, const S* probs, const AttentionShape& shape) {
  const int B = shape.B, T = shape.T, H = shape.H, KV = shape.KV, D = shape.D;  // no pos: P is masked
  constexpr bool wide = std::is_same_v<S, float>;
  const int row = (H + 2 * KV) * D, group = H / KV;
  const float scale = 1.0f / std::sqrt(float(D));
#pragma omp parallel
  {
    std::vector<float> dP(size_t(T) * T), kb, vb, qb, dyb, Pb;
    // fp32 gradients of k and v (summed over the group) and of q, for bf16 storage.
    std::vector<float> dkb(wide ? 0 : size_t(T) * D), dvb(wide ? 0 : size_t(T) * D), dqb(wide ? 0 : size_t(T) * D);
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b)
      for (int kvh = 0; kvh < KV; ++kvh) {
        const S* base = qkv + int64_t(b) * T * row;
        S* dbase = dqkv + int64_t(b) * T * row;
        const F32View k = f32_view(base + (H + kvh) * D, T, D, row, kb);
        const F32View v = f32_view(base + (H + KV + kvh) * D, T, D, row, vb);
        float* dk = wide ? reinterpret_cast<float*>(dbase + (H + kvh) * D) : dkb.data();
        float* dv = wide ? reinterpret_cast<float*>(dbase + (H + KV + kvh) * D) : dvb.data();
        const int ldkv = wide ? row : D;
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
          const F32View P = f32_view(probs + (int64_t(b) * H + h) * T * T, T, T, T, Pb);
          const F32View dy = f32_view(dout + int64_t(b) * T * H * D + h * D, T, D, H * D, dyb);
          const F32View q = f32_view(base + h * D, T, D, row, qb);
          const float beta = h == kvh * group ? 0.0f : 1.0f;  // first head overwrites dk, dv
          gemm(false, true, T, T, D, 1.0f, dy.p, dy.ld, v.p, v.ld, 0.0f, dP.data(), T);
          gemm(true, false, T, D, T, 1.0f, P.p, P.ld, dy.p, dy.ld, beta, dv, ldkv);
          for (int t = 0; t < T; ++t) {
            const float* p = P.p + int64_t(t) * T;
            float* ds = dP.data() + int64_t(t) * T;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int u = 0; u <= t; ++u) dot += p[u] * ds[u];
            for (int u = 0; u <= t; ++u) ds[u] = p[u] * (ds[u] - dot) * scale;
            for (int u = t + 1; u < T; ++u) ds[u] = 0.0f;
          }
          float* dq = wide ? reinterpret_cast<float*>(dbase + h * D) : dqb.data();
          gemm(false, false, T, D, T, 1.0f, dP.data(), T, k.p, k.ld, 0.0f, dq, wide ? row : D);
          gemm(true, false, T, D, T, 1.0f, dP.data(), T, q.p, q.ld, beta, dk, ldkv);
          store_slice(dbase + h * D, dq, T, D, row);
        }
        store_slice(dbase + (H + kvh) * D, dk, T, D, row);
        store_slice(dbase + (H + KV + kvh) * D, dv, T, D, row);
      }
  }
}

// Context parallel's blocks (ops.h): one thread per (batch, head) forward, per (batch, kv
// head) backward, as above. Positions come in runs (a rank's chunks), so the mask of a (query
// run, key run) pair is nothing, everything or a causal edge: GEMMs run per pair, those wholly
// masked are skipped, and each row's visible keys in a run are a range (a prefix, cut at the
// front by the row's document start with data.doc_mask). Nothing of P is
// kept: backward recomputes it from the log-sum-exp, block by block, as blocks come round.
namespace {
struct Run {
  int at, pos, n;  // rows [at, at + n) at positions pos, pos + 1, ...
};
// Runs of consecutive positions, none longer than half the rows (a rank's two chunks, also
// where they are neighbours): what a task's scores scratch holds at once.
std::vector<Run> runs_of(const int32_t* pos, int n) {
  const int most = (n + 1) / 2;
  std::vector<Run> r;
  for (int i = 0; i < n; ++i)
    if (r.empty() || pos[i] != r.back().pos + r.back().n || r.back().n == most)
      r.push_back({i, pos[i], 1});
    else
      ++r.back().n;
  return r;
}
// Keys of run k visible to the query at position qp: a prefix of the run.
inline int visible(const Run& k, int qp) {
  return std::clamp(qp - k.pos + 1, 0, k.n);
}
// The first key of run k inside a document that starts at position `start`.
inline int first_visible(const Run& k, int start) {
  return std::clamp(start - k.pos, 0, k.n);
}
// Whether any key of run k is visible to any query of run q.
inline bool meets(const Run& q, const Run& k) {
  return k.pos <= q.pos + q.n - 1;
}
}  // namespace

template <class S>
void attention_kv_extract(S* kv, const S* qkv, int B, int T, int H, int KV, int D) {
  const int row = (H + 2 * KV) * D, kvrow = 2 * KV * D;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(B) * T; ++i)
    for (int c = 0; c < kvrow; ++c) kv[i * kvrow + c] = qkv[i * row + H * D + c];
}

int64_t attention_block_scratch(int B, int Tq, int Tk, int H, int KV) {
  // forward: one pair's P per (b, head); backward: one pair's P and dS per (b, kv head)
  return int64_t(B) * std::max(H, 2 * KV) * ((Tq + 1) / 2) * ((Tk + 1) / 2);
}

template <class S>
void attention_block_forward(float* acc, float* ml, const S* qkv, const S* kv, const AttentionBlockShape& shape,
                             bool first, float* scratch) {
  const int B = shape.B, Tq = shape.Tq, Tk = shape.Tk, H = shape.H, KV = shape.KV, D = shape.D;
  const int32_t *qpos = shape.qpos, *kpos = shape.kpos, *qdoc = shape.qdoc;
  const int row = (H + 2 * KV) * D, kvrow = 2 * KV * D, group = H / KV;
  const float scale = 1.0f / std::sqrt(float(D));
  const std::vector<Run> qr = runs_of(qpos, Tq), kr = runs_of(kpos, Tk);
  const int64_t pair = int64_t((Tq + 1) / 2) * ((Tk + 1) / 2);  // the scores of one (query run, key run) pair
#pragma omp parallel
  {
    std::vector<float> qb, kb, vb;
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        const F32View q = f32_view(qkv + int64_t(b) * Tq * row + h * D, Tq, D, row, qb);
        const S* kvb = kv + int64_t(b) * Tk * kvrow;
        const F32View k = f32_view(kvb + (h / group) * D, Tk, D, kvrow, kb);
        const F32View v = f32_view(kvb + (KV + h / group) * D, Tk, D, kvrow, vb);
        float* o = acc + int64_t(b) * Tq * H * D + h * D;
        float* st0 = ml + (int64_t(b) * H + h) * Tq * 2;
        float* P = scratch + (int64_t(b) * H + h) * pair;
        if (first)
          for (int t = 0; t < Tq; ++t) {
            st0[2 * t] = -INFINITY, st0[2 * t + 1] = 0.0f;
            for (int d = 0; d < D; ++d) o[int64_t(t) * H * D + d] = 0.0f;
          }
        // Each (query run, key run) pair merges into the running max, sum and output in turn.
        for (const Run& x : qr)
          for (const Run& y : kr) {
            if (!meets(x, y)) continue;
            gemm(false, true, x.n, y.n, D, scale, q.p + int64_t(x.at) * q.ld, q.ld, k.p + int64_t(y.at) * k.ld, k.ld,
                 0.0f, P, y.n);
            for (int i = 0; i < x.n; ++i) {
              // Keys [u0, n) of the run: at or before t, and inside its document.
              const int t = x.at + i, n = visible(y, qpos[t]);
              const int u0 = qdoc ? first_visible(y, qpos[t] - qdoc[int64_t(b) * Tq + t]) : 0;
              float* p = P + int64_t(i) * y.n;
              float* st = st0 + 2 * t;
              if (u0 >= n) {  // nothing of this run is visible from t
                for (int u = 0; u < y.n; ++u) p[u] = 0.0f;
                continue;
              }
              float mb = p[u0];
              for (int u = u0 + 1; u < n; ++u) mb = std::max(mb, p[u]);
              const float m = std::max(st[0], mb), alpha = st[0] == -INFINITY ? 0.0f : exp_approx(st[0] - m);
              float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
              for (int u = u0; u < n; ++u) sum += (p[u] = exp_approx(p[u] - m));
              for (int u = 0; u < u0; ++u) p[u] = 0.0f;
              for (int u = n; u < y.n; ++u) p[u] = 0.0f;
              st[0] = m, st[1] = st[1] * alpha + sum;
              float* ot = o + int64_t(t) * H * D;
              for (int d = 0; d < D; ++d) ot[d] *= alpha;
            }
            gemm(false, false, x.n, D, y.n, 1.0f, P, y.n, v.p + int64_t(y.at) * v.ld, v.ld, 1.0f,
                 o + int64_t(x.at) * H * D, H * D);
          }
      }
  }
}

template <class S>
void attention_block_finish(S* out, float* lse, const float* acc, const float* ml, int B, int Tq, int H, int D) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < Tq; ++t) {
        const int64_t i = (int64_t(b) * H + h) * Tq + t, at = (int64_t(b) * Tq + t) * H * D + h * D;
        const float inv = 1.0f / ml[2 * i + 1];
        for (int d = 0; d < D; ++d) st(out[at + d], acc[at + d] * inv);
        lse[i] = ml[2 * i] + std::log(ml[2 * i + 1]);
      }
}

template <class S>
void attention_block_delta(float* delta, const S* dout, const S* out, int B, int Tq, int H, int D) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < Tq; ++t) {
        const int64_t at = (int64_t(b) * Tq + t) * H * D + h * D;
        float s = 0.0f;
        for (int d = 0; d < D; ++d) s += ld(dout[at + d]) * ld(out[at + d]);
        delta[(int64_t(b) * H + h) * Tq + t] = s;
      }
}

template <class S>
void attention_block_backward(float* dq, float* dkv, const S* dout, const S* qkv, const S* kv, const float* lse,
                              const float* delta, const AttentionBlockShape& shape, float* scratch) {
  const int B = shape.B, Tq = shape.Tq, Tk = shape.Tk, H = shape.H, KV = shape.KV, D = shape.D;
  const int32_t *qpos = shape.qpos, *kpos = shape.kpos, *qdoc = shape.qdoc;
  const int row = (H + 2 * KV) * D, kvrow = 2 * KV * D, group = H / KV;
  const float scale = 1.0f / std::sqrt(float(D));
  const std::vector<Run> qr = runs_of(qpos, Tq), kr = runs_of(kpos, Tk);
  const int64_t pair = int64_t((Tq + 1) / 2) * ((Tk + 1) / 2);
#pragma omp parallel
  {
    std::vector<float> qb, kb, vb, dyb;
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b)
      for (int kvh = 0; kvh < KV; ++kvh) {
        const S* kvb = kv + int64_t(b) * Tk * kvrow;
        const F32View k = f32_view(kvb + kvh * D, Tk, D, kvrow, kb);
        const F32View v = f32_view(kvb + (KV + kvh) * D, Tk, D, kvrow, vb);
        float* dk = dkv + int64_t(b) * Tk * kvrow + kvh * D;
        float* dv = dk + KV * D;
        float* Pxy = scratch + (int64_t(b) * KV + kvh) * 2 * pair;  // one pair's P and dS
        float* dSxy = Pxy + pair;
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
          const F32View q = f32_view(qkv + int64_t(b) * Tq * row + h * D, Tq, D, row, qb);
          const F32View dy = f32_view(dout + int64_t(b) * Tq * H * D + h * D, Tq, D, H * D, dyb);
          const float* ls = lse + (int64_t(b) * H + h) * Tq;
          const float* dl = delta + (int64_t(b) * H + h) * Tq;
          float* dqh = dq + int64_t(b) * Tq * H * D + h * D;
          for (const Run& x : qr)
            for (const Run& y : kr) {
              if (!meets(x, y)) continue;
              const float *qx = q.p + int64_t(x.at) * q.ld, *dyx = dy.p + int64_t(x.at) * dy.ld;
              const float *ky = k.p + int64_t(y.at) * k.ld, *vy = v.p + int64_t(y.at) * v.ld;
              gemm(false, true, x.n, y.n, D, scale, qx, q.ld, ky, k.ld, 0.0f, Pxy, y.n);
              gemm(false, true, x.n, y.n, D, 1.0f, dyx, dy.ld, vy, v.ld, 0.0f, dSxy, y.n);
              for (int i = 0; i < x.n; ++i) {
                const int t = x.at + i, n = visible(y, qpos[t]);
                const int u0 = qdoc ? first_visible(y, qpos[t] - qdoc[int64_t(b) * Tq + t]) : 0;
                float* p = Pxy + int64_t(i) * y.n;
                float* ds = dSxy + int64_t(i) * y.n;
                const float l = ls[t], dlt = dl[t];
#pragma omp simd
                for (int u = u0; u < n; ++u) {
                  p[u] = exp_approx(p[u] - l);
                  ds[u] = p[u] * (ds[u] - dlt) * scale;
                }
                for (int u = 0; u < std::min(u0, n); ++u) p[u] = 0.0f, ds[u] = 0.0f;
                for (int u = n; u < y.n; ++u) p[u] = 0.0f, ds[u] = 0.0f;
              }
              gemm(true, false, y.n, D, x.n, 1.0f, Pxy, y.n, dyx, dy.ld, 1.0f, dv + int64_t(y.at) * kvrow, kvrow);
              gemm(false, false, x.n, D, y.n, 1.0f, dSxy, y.n, ky, k.ld, 1.0f, dqh + int64_t(x.at) * H * D, H * D);
              gemm(true, false, y.n, D, x.n, 1.0f, dSxy, y.n, qx, q.ld, 1.0f, dk + int64_t(y.at) * kvrow, kvrow);
            }
        }
      }
  }
}

template <class S>
void attention_block_grads_store(S* dqkv, const float* dq, const float* dkv, int B, int T, int H, int KV, int D) {
  const int row = (H + 2 * KV) * D, kvrow = 2 * KV * D;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(B) * T; ++i) {
    for (int c = 0; c < H * D; ++c) st(dqkv[i * row + c], dq[i * H * D + c]);
    for (int c = 0; c < kvrow; ++c) st(dqkv[i * row + H * D + c], dkv[i * kvrow + c]);
  }
}

#define LOOM_ATTENTION(S)                                                                                             \
  template void rope_forward<S>(S*, const float*, const float*, int, int, int, int, int, const int32_t*);             \
  template void rope_backward<S>(S*, const float*, const float*, int, int, int, int, int, const int32_t*);            \
  template void attention_forward<S>(S*, S*, const S*, const AttentionShape&);                                        \
  template void attention_backward<S>(S*, const S*, const S*, const S*, const AttentionShape&);                       \
  template void attention_kv_extract<S>(S*, const S*, int, int, int, int, int);                                       \
  template void attention_block_forward<S>(float*, float*, const S*, const S*, const AttentionBlockShape&, bool,      \
                                           float*);                                                                   \
  template void attention_block_finish<S>(S*, float*, const float*, const float*, int, int, int, int);                \
  template void attention_block_delta<S>(float*, const S*, const S*, int, int, int, int);                             \
  template void attention_block_backward<S>(float*, float*, const S*, const S*, const S*, const float*, const float*, \
                                            const AttentionBlockShape&, float*);                                      \
  template void attention_block_grads_store<S>(S*, const float*, const float*, int, int, int, int, int);
LOOM_ATTENTION(float)
LOOM_ATTENTION(bf16)

}  // namespace loom::cpu
