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
  auto io = inp;
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), io.data(), (const float*)nullptr, w.data(), b.data(), N,
                         C, 1e-5f);
  EXPECT_EQ(io, inp);  // no residual branch: the input is left as it was
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
  auto io = inp;
  cpu::rmsnorm_forward(out.data(), rstd.data(), io.data(), (const float*)nullptr, w.data(), N, C, 1e-6f);
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
  cpu::embedding_forward(part.data(), tok.data(), wte.data() + C, 1, 2, (const float*)nullptr, B, T, C);
  for (int n = 0; n < B * T; ++n)
    for (int c = 0; c < C; ++c)
      EXPECT_EQ(part[size_t(n * C + c)],
                tok[size_t(n)] == 1 || tok[size_t(n)] == 2 ? wte[size_t(tok[size_t(n)] * C + c)] : 0.0f);
  cpu::embedding_backward(dpart.data(), 1, 2, (float*)nullptr, r.data(), tok.data(), B, T, C);
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

class AttentionTest : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(AttentionTest, ForwardAndBackward) {
  const int B = 2, T = 6, D = 4;
  const auto [H, KV] = GetParam();
  const int n = B * T * (H + 2 * KV) * D;
  auto qkv = randn(n, 50), r = randn(B * T * H * D, 51);
  std::vector<float> out(B * T * H * D), probs(B * H * T * T);
  cpu::attention_forward(out.data(), probs.data(), qkv.data(), {B, T, H, KV, D});
  EXPECT_LT(rel_err(out, attention_ref(to_double(qkv), B, T, H, KV, D)), kFwdTol);
  auto g = fd_grad([&](const V& x) { return dot(attention_ref(x, B, T, H, KV, D), r); }, to_double(qkv));
  std::vector<float> dqkv(n, 99.0f);
  cpu::attention_backward(dqkv.data(), r.data(), qkv.data(), probs.data(), {B, T, H, KV, D});
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
  cpu::crossentropy_forward_backward(l.data(), losses.data(), y.data(), N, Vv, Vv, dloss);
  EXPECT_LT(rel_err(losses, ref(to_double(logits))), kFwdTol);
  auto J = [&](const V& v) {
    double s = 0;
    for (double x : ref(v)) s += x;
    return s * dloss;
  };
  EXPECT_LT(rel_err(l, fd_grad(J, to_double(logits))), kBwdTol);
  // dloss = 0: forward only, logits untouched.
  auto l2 = logits;
  cpu::crossentropy_forward_backward(l2.data(), losses.data(), y.data(), N, Vv, Vv, 0.0f);
  EXPECT_EQ(l2, logits);
}

// A padded vocabulary: columns past `valid` (here large logits, which would dominate the
// softmax) stay out of it and get a zero gradient; the real columns match the unpadded run.
TEST(Kernels, CrossEntropyLeavesPaddedColumnsOut) {
  const int N = 3, Vv = 7, Vp = 12;
  auto logits = randn(N * Vv, 81, 2.0f);
  std::vector<int32_t> y = {0, 6, 2};
  std::vector<float> padded(N * Vp, 50.0f), plain = logits, lp(N), lu(N);
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < Vv; ++v) padded[size_t(n * Vp + v)] = logits[size_t(n * Vv + v)];
  cpu::crossentropy_forward_backward(plain.data(), lu.data(), y.data(), N, Vv, Vv, 0.5f);
  cpu::crossentropy_forward_backward(padded.data(), lp.data(), y.data(), N, Vp, Vv, 0.5f);
  EXPECT_EQ(lp, lu);
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < Vp; ++v)
      EXPECT_EQ(padded[size_t(n * Vp + v)], v < Vv ? plain[size_t(n * Vv + v)] : 0.0f) << n << " " << v;
}

// The residual add fused into the norm: inp += add in place, then the norm of the sum.
TEST(Kernels, NormAddsTheResidualBranchFirst) {
  const int N = 4, C = 8;
  auto x = randn(N * C, 85), a = randn(N * C, 86), w = randn(C, 87), b = randn(C, 88);
  auto sum = x;
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += a[i];
  std::vector<float> want(N * C), got(N * C), m1(N), r1(N), m2(N), r2(N);
  auto io = sum;
  cpu::layernorm_forward(want.data(), m1.data(), r1.data(), io.data(), (const float*)nullptr, w.data(), b.data(), N, C,
                         1e-5f);
  io = x;
  cpu::layernorm_forward(got.data(), m2.data(), r2.data(), io.data(), a.data(), w.data(), b.data(), N, C, 1e-5f);
  EXPECT_EQ(io, sum);
  EXPECT_EQ(got, want);
  io = x;
  cpu::rmsnorm_forward(got.data(), r2.data(), io.data(), a.data(), w.data(), N, C, 1e-5f);
  EXPECT_EQ(io, sum);
  auto io2 = sum;
  cpu::rmsnorm_forward(want.data(), r1.data(), io2.data(), (const float*)nullptr, w.data(), N, C, 1e-5f);
  EXPECT_EQ(got, want);
}

// bf16 storage, fp32 arithmetic: each kernel on bf16-exact inputs against its fp32 twin. A
// bf16 result rounds once (relative error 2^-9); attention rounds its probabilities before the
// second product, so it gets twice the budget.
TEST(KernelsBf16, MatchTheirFp32Twins) {
  constexpr double tol = 8e-3;
  const int N = 6, C = 16, B = 2, T = 6, H = 4, KV = 2, D = 4, F = 8;
  auto x = bf16_exact(randn(N * C, 100)), a = bf16_exact(randn(N * C, 101)), w = bf16_exact(randn(C, 102));
  auto bias = bf16_exact(randn(C, 103)), dy = bf16_exact(randn(N * C, 104));
  {  // LayerNorm with the fused add, forward and backward
    std::vector<float> o(N * C), m(N), r(N), dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
    auto io = x;
    cpu::layernorm_forward(o.data(), m.data(), r.data(), io.data(), a.data(), w.data(), bias.data(), N, C, 1e-5f);
    cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), io.data(), w.data(), m.data(), r.data(), N, C);
    auto xb = to_bf16(x), ab = to_bf16(a), wb = to_bf16(w), bb = to_bf16(bias), dyb = to_bf16(dy);
    std::vector<bf16> ob(N * C), dxb(N * C, bf16{0});
    std::vector<float> mb(N), rb(N), dwb(C, 0.0f), dbb(C, 0.0f);
    cpu::layernorm_forward(ob.data(), mb.data(), rb.data(), xb.data(), ab.data(), wb.data(), bb.data(), N, C, 1e-5f);
    cpu::layernorm_backward(dxb.data(), dwb.data(), dbb.data(), dyb.data(), xb.data(), wb.data(), mb.data(), rb.data(),
                            N, C);
    EXPECT_LT(rel_err(from_bf16(xb), io), tol);
    EXPECT_LT(rel_err(from_bf16(ob), o), tol);
    EXPECT_LT(rel_err(from_bf16(dxb), dx), tol);
    EXPECT_LT(rel_err(dwb, dw), tol);
    EXPECT_LT(rel_err(dbb, db), tol);
  }
  {  // attention, forward and backward
    const int n = B * T * (H + 2 * KV) * D;
    auto qkv = bf16_exact(randn(n, 110)), r = bf16_exact(randn(B * T * H * D, 111));
    std::vector<float> o(B * T * H * D), p(B * H * T * T), dq(n);
    cpu::attention_forward(o.data(), p.data(), qkv.data(), {B, T, H, KV, D});
    cpu::attention_backward(dq.data(), r.data(), qkv.data(), p.data(), {B, T, H, KV, D});
    auto qb = to_bf16(qkv), rb = to_bf16(r);
    std::vector<bf16> ob(o.size()), pb(p.size()), dqb(dq.size());
    cpu::attention_forward(ob.data(), pb.data(), qb.data(), {B, T, H, KV, D});
    cpu::attention_backward(dqb.data(), rb.data(), qb.data(), pb.data(), {B, T, H, KV, D});
    EXPECT_LT(rel_err(from_bf16(ob), o), 2 * tol);
    EXPECT_LT(rel_err(from_bf16(dqb), dq), 2 * tol);
  }
  {  // GELU, SwiGLU, cross-entropy (padded), embedding backward, RoPE
    auto g = bf16_exact(randn(N * 2 * F, 120)), gy = bf16_exact(randn(N * F, 121));
    std::vector<float> go(N * F), gd(N * F), so(N * F), sd(N * 2 * F);
    cpu::gelu_forward(go.data(), g.data(), N * F);
    cpu::gelu_backward(gd.data(), g.data(), gy.data(), N * F);
    cpu::swiglu_forward(so.data(), g.data(), N, F);
    cpu::swiglu_backward(sd.data(), g.data(), gy.data(), N, F);
    auto gb = to_bf16(g), gyb = to_bf16(gy);
    std::vector<bf16> gob(go.size()), gdb(gd.size()), sob(so.size()), sdb(sd.size());
    cpu::gelu_forward(gob.data(), gb.data(), N * F);
    cpu::gelu_backward(gdb.data(), gb.data(), gyb.data(), N * F);
    cpu::swiglu_forward(sob.data(), gb.data(), N, F);
    cpu::swiglu_backward(sdb.data(), gb.data(), gyb.data(), N, F);
    EXPECT_LT(rel_err(from_bf16(gob), go), tol);
    EXPECT_LT(rel_err(from_bf16(gdb), gd), tol);
    EXPECT_LT(rel_err(from_bf16(sob), so), tol);
    EXPECT_LT(rel_err(from_bf16(sdb), sd), tol);

    const int Vv = 12, valid = 9;
    auto l = bf16_exact(randn(N * Vv, 130, 2.0f));
    std::vector<int32_t> y = {1, 8, 0, 3, 5, 7};
    std::vector<float> loss(N), lossb(N);
    auto lf = l;
    auto lb = to_bf16(l);
    cpu::crossentropy_forward_backward(lf.data(), loss.data(), y.data(), N, Vv, valid, 0.5f);
    cpu::crossentropy_forward_backward(lb.data(), lossb.data(), y.data(), N, Vv, valid, 0.5f);
    EXPECT_LT(rel_err(lossb, loss), tol);
    EXPECT_LT(rel_err(from_bf16(lb), lf), tol);

    std::vector<int32_t> tok = {1, 3, 1, 0, 2, 1};
    std::vector<float> de(4 * C, 0.0f), deb(4 * C, 0.0f);
    cpu::embedding_backward(de.data(), 0, 4, (float*)nullptr, dy.data(), tok.data(), 1, N, C);
    cpu::embedding_backward(deb.data(), 0, 4, (float*)nullptr, to_bf16(dy).data(), tok.data(), 1, N, C);
    EXPECT_EQ(deb, de);  // fp32 sums of bf16-exact values: the same bits

    const int rn = B * T * (H + 2 * KV) * D;
    auto q = bf16_exact(randn(rn, 140));
    std::vector<float> cs(T * D / 2), sn(T * D / 2);
    cpu::rope_table(cs.data(), sn.data(), T, D, 10000.0f);
    auto qf = q;
    auto qb = to_bf16(q);
    cpu::rope_forward(qf.data(), cs.data(), sn.data(), B, T, H, KV, D);
    cpu::rope_forward(qb.data(), cs.data(), sn.data(), B, T, H, KV, D);
    EXPECT_LT(rel_err(from_bf16(qb), qf), tol);
    auto rf = q;
    auto rb = to_bf16(q);
    cpu::rope_backward(rf.data(), cs.data(), sn.data(), B, T, H, KV, D);
    cpu::rope_backward(rb.data(), cs.data(), sn.data(), B, T, H, KV, D);
    EXPECT_LT(rel_err(from_bf16(rb), rf), tol);
  }
  {  // RMSNorm with the fused add, forward and backward
    std::vector<float> o(N * C), r(N), dx(N * C, 0.0f), dw(C, 0.0f);
    auto io = x;
    cpu::rmsnorm_forward(o.data(), r.data(), io.data(), a.data(), w.data(), N, C, 1e-5f);
    cpu::rmsnorm_backward(dx.data(), dw.data(), dy.data(), io.data(), w.data(), r.data(), N, C);
    auto xb = to_bf16(x), ab = to_bf16(a), wb = to_bf16(w), dyb = to_bf16(dy);
    std::vector<bf16> ob(N * C), dxb(N * C, bf16{0});
    std::vector<float> rb(N), dwb(C, 0.0f);
    cpu::rmsnorm_forward(ob.data(), rb.data(), xb.data(), ab.data(), wb.data(), N, C, 1e-5f);
    cpu::rmsnorm_backward(dxb.data(), dwb.data(), dyb.data(), xb.data(), wb.data(), rb.data(), N, C);
    EXPECT_LT(rel_err(from_bf16(xb), io), tol);
    EXPECT_LT(rel_err(from_bf16(ob), o), tol);
    EXPECT_LT(rel_err(from_bf16(dxb), dx), tol);
    EXPECT_LT(rel_err(dwb, dw), tol);
  }
  {  // embedding forward over a vocabulary shard [2, 6) with positions
    const int V0 = 2, Vl = 4;
    auto wte = bf16_exact(randn(Vl * C, 150)), wpe = bf16_exact(randn(T * C, 151));
    std::vector<int32_t> tok = {2, 5, 0, 3, 7, 4, 5, 2, 1, 3, 4, 2};
    std::vector<float> o(B * T * C);
    std::vector<bf16> ob(o.size());
    cpu::embedding_forward(o.data(), tok.data(), wte.data(), V0, Vl, wpe.data(), B, T, C);
    cpu::embedding_forward(ob.data(), tok.data(), to_bf16(wte).data(), V0, Vl, to_bf16(wpe).data(), B, T, C);
    EXPECT_LT(rel_err(from_bf16(ob), o), tol);
  }
  {  // vocab-parallel cross-entropy phases over one shard (the caller's reductions are identities)
    const int Vl = 12, valid = 10, V0 = 4;
    auto l = bf16_exact(randn(N * Vl, 160, 2.0f));
    std::vector<int32_t> y = {4, 13, 20, 6, 9, 1};  // 20 and 1 fall outside this shard
    auto phases = [&](auto* logits, std::vector<float>& loss) {
      std::vector<float> mx(N), tl(N), se(N);
      cpu::crossentropy_shard_stats(logits, y.data(), N, Vl, valid, V0, mx.data(), tl.data());
      cpu::crossentropy_shard_sumexp(logits, mx.data(), N, Vl, valid, se.data());
      cpu::crossentropy_shard_finish(logits, loss.data(), y.data(), N, Vl, valid, V0, mx.data(), se.data(), tl.data(),
                                     0.5f);
    };
    auto lf = l;
    auto lb = to_bf16(l);
    std::vector<float> loss(N), lossb(N);
    phases(lf.data(), loss);
    phases(lb.data(), lossb);
    EXPECT_LT(rel_err(lossb, loss), tol);
    EXPECT_LT(rel_err(from_bf16(lb), lf), tol);
  }
}

TEST(Kernels, SumSquaresIsExactAndThreadIndependent) {
  auto x = randn(200000, 90);
  double want = 0;
  for (float v : x) want += double(v) * v;
  EXPECT_NEAR(cpu::sum_squares(x.data(), int64_t(x.size())), want, 1e-9 * want);
}
