// Each CPU kernel against a naive double-precision reference, and each backward against
// central differences of that reference (in double, so the differences are exact to ~1e-9).
// Accumulating backwards are called on non-zero gradient buffers to check the `+=`.
#include "kernels/ops.h"
#include "testing.h"

using namespace loom;
using namespace loom::test;
using V = std::vector<double>;

namespace {
constexpr double kFwdTol = 2e-6, kBwdTol = 2e-5;

V sub(const V& x, size_t at, size_t n) {
  return V(x.begin() + long(at), x.begin() + long(at + n));
}
std::vector<float> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> o(a.size());
  for (size_t i = 0; i < a.size(); ++i) o[i] = a[i] - b[i];
  return o;
}

V matmul_ref(const V& x, int M, int K, int N, cpu::WLayout lay, bool bias) {
  const double* inp = x.data();
  const double* w = inp + M * K;
  const double* b = w + K * N;
  V out(size_t(M) * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double s = bias ? b[n] : 0.0;
      for (int k = 0; k < K; ++k) s += inp[m * K + k] * (lay == cpu::WLayout::in_out ? w[k * N + n] : w[n * K + k]);
      out[size_t(m) * N + n] = s;
    }
  return out;
}
}  // namespace

class MatmulTest : public ::testing::TestWithParam<cpu::WLayout> {};

TEST_P(MatmulTest, ForwardAndBackward) {
  const int M = 6, K = 5, N = 7;
  const auto lay = GetParam();
  auto inp = randn(M * K, 1), w = randn(K * N, 2), b = randn(N, 3), r = randn(M * N, 4);
  std::vector<float> out(M * N);
  cpu::matmul_forward(out.data(), inp.data(), w.data(), b.data(), M, K, N, lay);
  V x = to_double(inp);
  for (float v : w) x.push_back(v);
  for (float v : b) x.push_back(v);
  EXPECT_LT(rel_err(out, matmul_ref(x, M, K, N, lay, true)), kFwdTol);

  auto g = fd_grad([&](const V& xx) { return dot(matmul_ref(xx, M, K, N, lay, true), r); }, x);
  std::vector<float> dinp(M * K, 99.0f), dw0 = randn(K * N, 5), db0 = randn(N, 6);
  auto dw = dw0, db = db0;
  cpu::matmul_backward(dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(), M, K, N, lay);
  EXPECT_LT(rel_err(dinp, sub(g, 0, M * K)), kBwdTol);                    // overwritten
  EXPECT_LT(rel_err(minus(dw, dw0), sub(g, M * K, K * N)), kBwdTol);      // accumulated
  EXPECT_LT(rel_err(minus(db, db0), sub(g, M * K + K * N, N)), kBwdTol);  // accumulated
}
INSTANTIATE_TEST_SUITE_P(Layouts, MatmulTest, ::testing::Values(cpu::WLayout::in_out, cpu::WLayout::out_in));

namespace {
V norm_ref(const V& x, int N, int C, bool rms, double eps) {
  V out(size_t(N) * C);
  const double* w = x.data() + N * C;
  const double* b = w + C;
  for (int n = 0; n < N; ++n) {
    const double* r = x.data() + n * C;
    double m = 0, v = 0;
    if (!rms) {
      for (int c = 0; c < C; ++c) m += r[c];
      m /= C;
    }
    for (int c = 0; c < C; ++c) v += (r[c] - m) * (r[c] - m);
    v /= C;
    for (int c = 0; c < C; ++c) out[size_t(n) * C + c] = (r[c] - m) / std::sqrt(v + eps) * w[c] + (rms ? 0.0 : b[c]);
  }
  return out;
}
}  // namespace

TEST(Kernels, LayerNorm) {
  const int N = 5, C = 9;
  auto inp = randn(N * C, 10), w = randn(C, 11), b = randn(C, 12), r = randn(N * C, 13);
  std::vector<float> out(N * C), mean(N), rstd(N);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C, 1e-5f);
  V x = to_double(inp);
  x.insert(x.end(), w.begin(), w.end());
  x.insert(x.end(), b.begin(), b.end());
  EXPECT_LT(rel_err(out, norm_ref(x, N, C, false, 1e-5)), kFwdTol);
  auto g = fd_grad([&](const V& xx) { return dot(norm_ref(xx, N, C, false, 1e-5), r); }, x);
  auto dinp0 = randn(N * C, 14), dw0 = randn(C, 15), db0 = randn(C, 16);
  auto dinp = dinp0, dw = dw0, db = db0;
  cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(), mean.data(), rstd.data(),
                          N, C);
  EXPECT_LT(rel_err(minus(dinp, dinp0), sub(g, 0, N * C)), kBwdTol);
  EXPECT_LT(rel_err(minus(dw, dw0), sub(g, N * C, C)), kBwdTol);
  EXPECT_LT(rel_err(minus(db, db0), sub(g, N * C + C, C)), kBwdTol);
}

TEST(Kernels, RmsNorm) {
  const int N = 5, C = 9;
  auto inp = randn(N * C, 20), w = randn(C, 21), r = randn(N * C, 23);
  std::vector<float> out(N * C), rstd(N);
  cpu::rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), N, C, 1e-6f);
  V x = to_double(inp);
  x.insert(x.end(), w.begin(), w.end());
  V xb = x;
  xb.resize(x.size() + C, 0.0);  // the reference reads a (zero) bias slot
  EXPECT_LT(rel_err(out, norm_ref(xb, N, C, true, 1e-6)), kFwdTol);
  auto J = [&](const V& xx) {
    V y = xx;
    y.resize(xx.size() + C, 0.0);
    return dot(norm_ref(y, N, C, true, 1e-6), r);
  };
  auto g = fd_grad(J, x);
  auto dinp0 = randn(N * C, 24), dw0 = randn(C, 25);
  auto dinp = dinp0, dw = dw0;
  cpu::rmsnorm_backward(dinp.data(), dw.data(), r.data(), inp.data(), w.data(), rstd.data(), N, C);
  EXPECT_LT(rel_err(minus(dinp, dinp0), sub(g, 0, N * C)), kBwdTol);
  EXPECT_LT(rel_err(minus(dw, dw0), sub(g, N * C, C)), kBwdTol);
}

TEST(Kernels, Embedding) {
  const int B = 2, T = 4, C = 3, Vv = 5;
  std::vector<int32_t> tok = {1, 3, 1, 0, 4, 1, 1, 2};  // repeats exercise the accumulation
  auto wte = randn(Vv * C, 30), wpe = randn(T * C, 31), r = randn(B * T * C, 32);
  std::vector<float> out(B * T * C);
  cpu::embedding_forward(out.data(), tok.data(), wte.data(), 0, Vv, wpe.data(), B, T, C);
  auto ref = [&](const V& x) {
    V o(size_t(B) * T * C);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int c = 0; c < C; ++c)
          o[size_t((b * T + t) * C + c)] = x[size_t(tok[b * T + t] * C + c)] + x[size_t(Vv * C + t * C + c)];
    return o;
  };
  V x = to_double(wte);
  x.insert(x.end(), wpe.begin(), wpe.end());
  EXPECT_LT(rel_err(out, ref(x)), kFwdTol);
  auto g = fd_grad([&](const V& xx) { return dot(ref(xx), r); }, x);
  auto dwte0 = randn(Vv * C, 33), dwpe0 = randn(T * C, 34);
  auto dwte = dwte0, dwpe = dwpe0;
  cpu::embedding_backward(dwte.data(), 0, Vv, dwpe.data(), r.data(), tok.data(), B, T, C);
  EXPECT_LT(rel_err(minus(dwte, dwte0), sub(g, 0, Vv * C)), kBwdTol);
  EXPECT_LT(rel_err(minus(dwpe, dwpe0), sub(g, Vv * C, T * C)), kBwdTol);

  // A vocab-parallel shard holding ids [1, 3): other tokens read zeros and get no gradient.
  std::vector<float> part(B * T * C), dpart(2 * C, 0.0f);
  cpu::embedding_forward(part.data(), tok.data(), wte.data() + C, 1, 2, nullptr, B, T, C);
  for (int n = 0; n < B * T; ++n)
    for (int c = 0; c < C; ++c)
      EXPECT_EQ(part[size_t(n * C + c)],
                tok[size_t(n)] == 1 || tok[size_t(n)] == 2 ? wte[size_t(tok[size_t(n)] * C + c)] : 0.0f);
  cpu::embedding_backward(dpart.data(), 1, 2, nullptr, r.data(), tok.data(), B, T, C);
  EXPECT_LT(rel_err(dpart, sub(g, C, 2 * C)), kBwdTol);
}

namespace {
// Rotate-half RoPE in double, for the q and k heads of packed qkv.
V rope_ref(const V& qkv, int B, int T, int H, int KV, int D, double theta) {
  V out = qkv;
  const int row = (H + 2 * KV) * D, half = D / 2;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H + KV; ++h)
        for (int i = 0; i < half; ++i) {
          double ang = t * std::pow(theta, -2.0 * i / D);
          size_t at = size_t((b * T + t) * row + h * D + i);
          double x1 = qkv[at], x2 = qkv[at + size_t(half)];
          out[at] = x1 * std::cos(ang) - x2 * std::sin(ang);
          out[at + size_t(half)] = x2 * std::cos(ang) + x1 * std::sin(ang);
        }
  return out;
}
}  // namespace

TEST(Kernels, Rope) {
  const int B = 2, T = 5, H = 4, KV = 2, D = 6;
  const int n = B * T * (H + 2 * KV) * D;
  auto qkv = randn(n, 40), r = randn(n, 41);
  std::vector<float> cs(T * D / 2), sn(T * D / 2);
  cpu::rope_table(cs.data(), sn.data(), T, D, 10000.0f);
  auto out = qkv;
  cpu::rope_forward(out.data(), cs.data(), sn.data(), B, T, H, KV, D);
  EXPECT_LT(rel_err(out, rope_ref(to_double(qkv), B, T, H, KV, D, 10000.0)), 1e-5);
  auto g = fd_grad([&](const V& x) { return dot(rope_ref(x, B, T, H, KV, D, 10000.0), r); }, to_double(qkv));
  auto d = r;
  cpu::rope_backward(d.data(), cs.data(), sn.data(), B, T, H, KV, D);
  EXPECT_LT(rel_err(d, g), 1e-5);
}

namespace {
V attention_ref(const V& qkv, int B, int T, int H, int KV, int D) {
  const int row = (H + 2 * KV) * D, group = H / KV;
  V out(size_t(B) * T * H * D, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t) {
        const double* q = &qkv[size_t((b * T + t) * row + h * D)];
        std::vector<double> s(size_t(t) + 1);
        double mx = -1e300, sum = 0;
        for (int u = 0; u <= t; ++u) {
          const double* k = &qkv[size_t((b * T + u) * row + (H + h / group) * D)];
          double a = 0;
          for (int d = 0; d < D; ++d) a += q[d] * k[d];
          s[size_t(u)] = a / std::sqrt(double(D));
          mx = std::max(mx, s[size_t(u)]);
        }
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int u = 0; u <= t; ++u) {
          const double* v = &qkv[size_t((b * T + u) * row + (H + KV + h / group) * D)];
          for (int d = 0; d < D; ++d) out[size_t((b * T + t) * H * D + h * D + d)] += s[size_t(u)] / sum * v[d];
        }
      }
  return out;
}
}  // namespace

class AttentionTest : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(AttentionTest, ForwardAndBackward) {
  const int B = 2, T = 6, D = 4;
  const auto [H, KV] = GetParam();
  const int n = B * T * (H + 2 * KV) * D;
  auto qkv = randn(n, 50), r = randn(B * T * H * D, 51);
  std::vector<float> out(B * T * H * D), probs(B * H * T * T);
  cpu::attention_forward(out.data(), probs.data(), qkv.data(), B, T, H, KV, D);
  EXPECT_LT(rel_err(out, attention_ref(to_double(qkv), B, T, H, KV, D)), kFwdTol);
  auto g = fd_grad([&](const V& x) { return dot(attention_ref(x, B, T, H, KV, D), r); }, to_double(qkv));
  std::vector<float> dqkv(n, 99.0f);
  cpu::attention_backward(dqkv.data(), r.data(), qkv.data(), probs.data(), B, T, H, KV, D);
  EXPECT_LT(rel_err(dqkv, g), kBwdTol);
}
INSTANTIATE_TEST_SUITE_P(Heads, AttentionTest, ::testing::Values(std::pair{2, 2}, std::pair{4, 2}, std::pair{4, 1}));

TEST(Kernels, Gelu) {
  const int n = 40;
  auto x = randn(n, 60, 2.0f), r = randn(n, 61);
  auto ref = [](const V& v) {
    V o(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      o[i] = 0.5 * v[i] * (1 + std::tanh(std::sqrt(2 / M_PI) * (v[i] + 0.044715 * v[i] * v[i] * v[i])));
    return o;
  };
  std::vector<float> out(n), din(n);
  cpu::gelu_forward(out.data(), x.data(), n);
  EXPECT_LT(rel_err(out, ref(to_double(x))), kFwdTol);
  cpu::gelu_backward(din.data(), x.data(), r.data(), n);
  EXPECT_LT(rel_err(din, fd_grad([&](const V& v) { return dot(ref(v), r); }, to_double(x))), kBwdTol);
}

TEST(Kernels, SwiGlu) {
  const int N = 3, F = 5;
  auto x = randn(N * 2 * F, 70, 2.0f), r = randn(N * F, 71);
  auto ref = [&](const V& v) {
    V o(size_t(N) * F);
    for (int n = 0; n < N; ++n)
      for (int f = 0; f < F; ++f) {
        double g = v[size_t(n * 2 * F + f)], u = v[size_t(n * 2 * F + F + f)];
        o[size_t(n * F + f)] = g / (1 + std::exp(-g)) * u;
      }
    return o;
  };
  std::vector<float> out(N * F), din(N * 2 * F);
  cpu::swiglu_forward(out.data(), x.data(), N, F);
  EXPECT_LT(rel_err(out, ref(to_double(x))), kFwdTol);
  cpu::swiglu_backward(din.data(), x.data(), r.data(), N, F);
  EXPECT_LT(rel_err(din, fd_grad([&](const V& v) { return dot(ref(v), r); }, to_double(x))), kBwdTol);
}

TEST(Kernels, CrossEntropy) {
  const int N = 4, Vv = 11;
  auto logits = randn(N * Vv, 80, 3.0f);
  std::vector<int32_t> y = {3, 0, 10, 3};
  auto ref = [&](const V& l) {
    V loss(N);
    for (int n = 0; n < N; ++n) {
      double mx = -1e300, s = 0;
      for (int v = 0; v < Vv; ++v) mx = std::max(mx, l[size_t(n * Vv + v)]);
      for (int v = 0; v < Vv; ++v) s += std::exp(l[size_t(n * Vv + v)] - mx);
      loss[size_t(n)] = std::log(s) + mx - l[size_t(n * Vv + y[size_t(n)])];
    }
    return loss;
  };
  std::vector<float> losses(N);
  auto l = logits;
  const float dloss = 0.25f;
  cpu::crossentropy_forward_backward(l.data(), losses.data(), y.data(), N, Vv, dloss);
  EXPECT_LT(rel_err(losses, ref(to_double(logits))), kFwdTol);
  auto J = [&](const V& v) {
    double s = 0;
    for (double x : ref(v)) s += x;
    return s * dloss;
  };
  EXPECT_LT(rel_err(l, fd_grad(J, to_double(logits))), kBwdTol);
  // dloss = 0: forward only, logits untouched.
  auto l2 = logits;
  cpu::crossentropy_forward_backward(l2.data(), losses.data(), y.data(), N, Vv, 0.0f);
  EXPECT_EQ(l2, logits);
}

TEST(Kernels, SumSquaresIsExactAndThreadIndependent) {
  auto x = randn(200000, 90);
  double want = 0;
  for (float v : x) want += double(v) * v;
  EXPECT_NEAR(cpu::sum_squares(x.data(), int64_t(x.size())), want, 1e-9 * want);
}
