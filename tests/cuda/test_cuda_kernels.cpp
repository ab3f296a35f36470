// Each CUDA kernel against its CPU twin (kernels/ops.h) on the same bf16-rounded inputs.
// Tolerances are stated per kernel: bf16 keeps 8 bits of mantissa, so a value carries a
// relative error up to 2^-8 = 0.4% after each rounding; kernels that round once get 1e-2,
// kernels that chain roundings (attention backward, GEMM over long K) get 3e-2. Attention is
// checked per element (|got - want| <= atol + rtol |want|), not against the largest value.
// fp32 outputs (main gradients, statistics, optimizer state) are checked tighter.
// Skips, saying so, where no GPU is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cuda/ops_cuda.h"
#include "kernels/ops.h"
#include "optim/clip.h"
#include "runtime/comm/nccl_group.h"

using namespace loom;
using BF = cuda::bf16;

namespace {

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(d(g)));  // exactly representable in bf16
  return v;
}

// A device buffer of bf16, filled from and read back as fp32.
struct Dev {
  BF* p = nullptr;
  size_t n = 0;
  explicit Dev(const std::vector<float>& h) : n(h.size()) {
    cudaMalloc(&p, std::max<size_t>(n, 1) * 2);
    std::vector<uint16_t> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = f32_to_bf16(h[i]);
    cudaMemcpy(p, b.data(), n * 2, cudaMemcpyHostToDevice);
  }
  explicit Dev(size_t count) : Dev{std::vector<float>(count, 0.0f)} {}
  ~Dev() { cudaFree(p); }
  std::vector<float> get() const {
    std::vector<uint16_t> b(n);
    cudaDeviceSynchronize();
    cudaMemcpy(b.data(), p, n * 2, cudaMemcpyDeviceToHost);
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = bf16_to_f32(b[i]);
    return h;
  }
};
template <class T>
struct DevRaw {
  T* p = nullptr;
  size_t n;
  explicit DevRaw(const std::vector<T>& h) : n(h.size()) {
    cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T));
    cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DevRaw() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    cudaDeviceSynchronize();
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

// max |got - want| over max |want|; NaN or infinity anywhere is an infinite error.
double rel(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) return INFINITY;
    num = std::max(num, double(std::abs(got[i] - want[i])));
    den = std::max(den, double(std::abs(want[i])));
  }
  return num / std::max(den, 1e-3);
}
// The worst element's |got - want| / (atol + rtol |want|): at most 1 passes.
double elem(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) return INFINITY;
    worst = std::max(worst, std::abs(double(got[i]) - want[i]) / (atol + rtol * std::abs(double(want[i]))));
  }
  return worst;
}

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  }
};

}  // namespace

TEST_F(Cuda, GemmEveryTransposeBiasAccumulationAndStrides) {
  cuda::GemmContext ctx;
  const int M = 33, N = 65, K = 47;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      auto a = randn(size_t(M) * K, 1), bm = randn(size_t(K) * N, 2), bias = randn(N, 3);
      std::vector<float> want(size_t(M) * N);
      for (int n = 0; n < N; ++n)
        for (int m = 0; m < M; ++m) want[size_t(m) * N + n] = bias[size_t(n)];
      cpu::gemm(ta, tb, M, N, K, 1.0f, a.data(), ta ? M : K, bm.data(), tb ? K : N, 1.0f, want.data(), N);
      Dev A(a), Bm(bm), Bias(bias), C(size_t(M) * N);
      cuda::gemm(ctx, ta, tb, M, N, K, A.p, ta ? M : K, Bm.p, tb ? K : N, 0.0f, C.p, N, Bias.p, nullptr);
      EXPECT_LT(rel(C.get(), want), 3e-2) << "ta " << ta << " tb " << tb;
      // beta = 1 into an fp32 C that already holds values: the weight-gradient accumulation.
      auto c0 = randn(size_t(M) * N, 4);
      std::vector<float> acc = c0;
      cpu::gemm(ta, tb, M, N, K, 1.0f, a.data(), ta ? M : K, bm.data(), tb ? K : N, 1.0f, acc.data(), N);
      DevRaw<float> C32(c0);
      cuda::gemm_f32out(ctx, ta, tb, M, N, K, A.p, ta ? M : K, Bm.p, tb ? K : N, 1.0f, C32.p, N, nullptr);
      EXPECT_LT(rel(C32.get(), acc), 1e-5) << "fp32 accumulation, ta " << ta << " tb " << tb;
    }
  // Operands 4 elements (8 bytes) past an allocation's start, as views into flat buffers of
  // odd-sized tensors are: the heuristics are told, and pick a kernel that handles them.
  const int o = 4;
  auto a = randn(size_t(M) * K + o, 1), bm = randn(size_t(K) * N + o, 2);
  std::vector<float> want(size_t(M) * N, 0.0f);
  cpu::gemm(false, false, M, N, K, 1.0f, a.data() + o, K, bm.data() + o, N, 0.0f, want.data(), N);
  Dev A(a), Bm(bm), C(size_t(M) * N + o);
  cuda::gemm(ctx, false, false, M, N, K, A.p + o, K, Bm.p + o, N, 0.0f, C.p + o, N, nullptr, nullptr);
  auto got = C.get();
  EXPECT_LT(rel(std::vector<float>(got.begin() + o, got.end()), want), 3e-2);
  // Strided (padded) rows: lda, ldb, ldc wider than the matrices; C's padding untouched.
  const int lda = K + 9, ldb = N + 7, ldc = N + 15;
  auto sa = randn(size_t(M) * lda, 5), sb = randn(size_t(K) * ldb, 6);
  std::vector<float> swant(size_t(M) * ldc, 3.0f);
  cpu::gemm(false, false, M, N, K, 1.0f, sa.data(), lda, sb.data(), ldb, 0.0f, swant.data(), ldc);
  Dev SA(sa), SB(sb), SC(std::vector<float>(size_t(M) * ldc, 3.0f));
  cuda::gemm(ctx, false, false, M, N, K, SA.p, lda, SB.p, ldb, 0.0f, SC.p, ldc, nullptr, nullptr);
  auto sg = SC.get();
  EXPECT_LT(rel(sg, swant), 3e-2);
  for (int m = 0; m < M; ++m)
    for (int n = N; n < ldc; ++n) ASSERT_EQ(sg[size_t(m) * ldc + n], 3.0f);
}

// The GELU epilogues against the CPU's GEMM and GELU, forward (with its kept argument) and
// backward (GELU' applied to the input-gradient GEMM).
TEST_F(Cuda, GemmGeluEpilogues) {
  cuda::GemmContext ctx;
  const int M = 37, N = 64, K = 48;  // the aux matrix's stride must be a multiple of 8
  auto a = randn(size_t(M) * K, 4), w = randn(size_t(K) * N, 5), bias = randn(N, 6), dy = randn(size_t(M) * K, 7);
  std::vector<float> pre(size_t(M) * N), out(size_t(M) * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) pre[size_t(m) * N + n] = bias[size_t(n)];
  cpu::gemm(false, false, M, N, K, 1.0f, a.data(), K, w.data(), N, 1.0f, pre.data(), N);
  cpu::gelu_forward(out.data(), pre.data(), M * N);
  Dev A(a), W(w), Bias(bias), C(size_t(M) * N), Pre(size_t(M) * N);
  cuda::gemm_gelu(ctx, false, false, M, N, K, A.p, K, W.p, N, C.p, N, Bias.p, Pre.p, nullptr);
  EXPECT_LT(rel(Pre.get(), pre), 3e-2);
  EXPECT_LT(rel(C.get(), out), 3e-2);

  // Backward: d[M, N] = dz[M, K] @ W2[N, K]^T, times gelu'(pre), with pre exact in bf16.
  auto w2 = randn(size_t(N) * K, 8);
  for (auto& p : pre) p = bf16_to_f32(f32_to_bf16(p));
  std::vector<float> d(size_t(M) * N, 0.0f), want(size_t(M) * N);
  cpu::gemm(false, true, M, N, K, 1.0f, dy.data(), K, w2.data(), K, 0.0f, d.data(), N);
  cpu::gelu_backward(want.data(), pre.data(), d.data(), M * N);
  Dev Dy(dy), W2(w2), P2(pre), G(size_t(M) * N);
  cuda::gemm_dgelu(ctx, false, true, M, N, K, Dy.p, K, W2.p, K, G.p, N, P2.p, nullptr);
  EXPECT_LT(rel(G.get(), want), 3e-2);
}

TEST_F(Cuda, NormsForwardAndBackward) {
  const int N = 301, C = 96;  // more rows than the weight gradient's 32 row phases, not a multiple
  const float* none = nullptr;
  auto x = randn(size_t(N) * C, 10), w = randn(C, 11), bb = randn(C, 12), dy = randn(size_t(N) * C, 13);
  auto dw0 = randn(C, 15), db0 = randn(C, 16);  // fp32 gradients accumulate onto what is there
  std::vector<float> out(size_t(N) * C), mean(N), rstd(N), dx(size_t(N) * C, 0.0f), dw = dw0, db = db0;
  auto xi = x;
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), xi.data(), none, w.data(), bb.data(), N, C, 1e-5f);
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                          C);
  Dev X(x), W(w), Bb(bb), Dy(dy), O(size_t(N) * C), Dx(size_t(N) * C);
  DevRaw<float> M{std::vector<float>(N)}, R{std::vector<float>(N)}, Dw(dw0), Db(db0);
  cuda::layernorm_forward(O.p, M.p, R.p, X.p, nullptr, W.p, Bb.p, N, C, 1e-5f, nullptr);
  cuda::layernorm_backward(Dx.p, Dw.p, Db.p, Dy.p, X.p, W.p, M.p, R.p, N, C, nullptr);
  EXPECT_LT(rel(O.get(), out), 1e-2);
  EXPECT_LT(rel(Dx.get(), dx), 1e-2);
  EXPECT_LT(rel(Dw.get(), dw), 1e-3);
  EXPECT_LT(rel(Db.get(), db), 1e-5);  // sums of bf16-exact values: rounding of the fp32 sums only

  std::vector<float> rout(size_t(N) * C), rr(N), rdx(size_t(N) * C, 0.0f), rdw = dw0;
  cpu::rmsnorm_forward(rout.data(), rr.data(), xi.data(), none, w.data(), N, C, 1e-6f);
  cpu::rmsnorm_backward(rdx.data(), rdw.data(), dy.data(), x.data(), w.data(), rr.data(), N, C);
  Dev RO(size_t(N) * C), RDx(size_t(N) * C);
  DevRaw<float> RDw(dw0);
  cuda::rmsnorm_forward(RO.p, R.p, X.p, nullptr, W.p, N, C, 1e-6f, nullptr);
  cuda::rmsnorm_backward(RDx.p, RDw.p, Dy.p, X.p, W.p, R.p, N, C, nullptr);
  EXPECT_LT(rel(RO.get(), rout), 1e-2);
  EXPECT_LT(rel(RDx.get(), rdx), 1e-2);
  EXPECT_LT(rel(RDw.get(), rdw), 1e-3);

  // The fused residual add: the input becomes x + a (rounded to bf16) and is normalized.
  auto a = randn(size_t(N) * C, 14);
  std::vector<float> sum(size_t(N) * C), fout(size_t(N) * C), fm(N), fr(N);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = bf16_to_f32(f32_to_bf16(x[i] + a[i]));
  auto si = sum;
  cpu::layernorm_forward(fout.data(), fm.data(), fr.data(), si.data(), none, w.data(), bb.data(), N, C, 1e-5f);
  Dev FX(x), FA(a), FO(size_t(N) * C);
  cuda::layernorm_forward(FO.p, M.p, R.p, FX.p, FA.p, W.p, Bb.p, N, C, 1e-5f, nullptr);
  EXPECT_EQ(FX.get(), sum);
  EXPECT_LT(rel(FO.get(), fout), 1e-2);
  cpu::rmsnorm_forward(fout.data(), fr.data(), si.data(), none, w.data(), N, C, 1e-6f);
  Dev RX(x);
  cuda::rmsnorm_forward(FO.p, R.p, RX.p, FA.p, W.p, N, C, 1e-6f, nullptr);
  EXPECT_EQ(RX.get(), sum);
  EXPECT_LT(rel(FO.get(), fout), 1e-2);
}

// token_index is host code: it runs (and is checked) without a GPU.
TEST(CudaHost, TokenIndexGroupsPositionsByTokenInOrder) {
  const std::vector<int32_t> tok = {5, 3, 5, 9, 3, 5, 7};
  int U = 0;
  auto idx = cuda::token_index(tok.data(), int(tok.size()), 0, 10, &U);
  EXPECT_EQ(U, 4);
  EXPECT_EQ(idx, (std::vector<int32_t>{3, 5, 7, 9, /*starts*/ 0, 2, 5, 6, 7, /*positions*/ 1, 4, 0, 2, 5, 6, 3}));
  // A vocab shard [4, 8) keeps ids 5 and 7 only, as local ids 1 and 3.
  idx = cuda::token_index(tok.data(), int(tok.size()), 4, 4, &U);
  EXPECT_EQ(U, 2);
  EXPECT_EQ(idx, (std::vector<int32_t>{1, 3, 0, 3, 4, 0, 2, 5, 6}));
}

TEST_F(Cuda, EmbeddingRopeAndPointwise) {
  const int B = 2, T = 8, C = 64, V = 50, H = 4, KV = 2, D = 16;
  std::vector<int32_t> tok(B * T);
  for (int i = 0; i < B * T; ++i) tok[size_t(i)] = (i * 7) % 11;  // repeated ids
  auto wte = randn(size_t(V) * C, 20), wpe = randn(size_t(T) * C, 21), dy = randn(size_t(B) * T * C, 22);
  auto dwte0 = randn(size_t(V) * C, 26), dwpe0 = randn(size_t(T) * C, 27);
  std::vector<float> out(size_t(B) * T * C), dwte = dwte0, dwpe = dwpe0;
  cpu::embedding_forward(out.data(), tok.data(), wte.data(), 0, V, wpe.data(), B, T, C);
  cpu::embedding_backward(dwte.data(), 0, V, dwpe.data(), dy.data(), tok.data(), B, T, C);
  int U = 0;
  DevRaw<int32_t> Tok(tok), Index(cuda::token_index(tok.data(), B * T, 0, V, &U));
  Dev Wte(wte), Wpe(wpe), Dy(dy), O(size_t(B) * T * C);
  DevRaw<float> Dwte(dwte0), Dwpe(dwpe0);
  cuda::embedding_forward(O.p, Tok.p, Wte.p, 0, V, Wpe.p, B, T, C, nullptr);
  cuda::embedding_backward(Dwte.p, Dwpe.p, Dy.p, Index.p, U, B, T, C, nullptr);
  EXPECT_LT(rel(O.get(), out), 1e-2);
  EXPECT_LT(rel(Dwte.get(), dwte), 1e-5);  // fp32 sums of bf16-exact rows, in the same order
  EXPECT_LT(rel(Dwpe.get(), dwpe), 1e-5);

  const size_t nq = size_t(B) * T * (H + 2 * KV) * D;
  auto qkv = randn(nq, 23);
  std::vector<float> cs(T * D / 2), sn(T * D / 2);
  cpu::rope_table(cs.data(), sn.data(), T, D, 10000.0f);
  auto want = qkv;
  cpu::rope_forward(want.data(), cs.data(), sn.data(), B, T, H, KV, D);
  Dev Q(qkv);
  DevRaw<float> Cs(cs), Sn(sn);
  cuda::rope_forward(Q.p, Cs.p, Sn.p, B, T, H, KV, D, nullptr);
  EXPECT_LT(rel(Q.get(), want), 1e-2);

  const int n = 4096;
  auto x = randn(n, 24, 2.0f), g = randn(n, 25);
  std::vector<float> go(n), gd(n);
  cpu::gelu_forward(go.data(), x.data(), n);
  cpu::gelu_backward(gd.data(), x.data(), g.data(), n);
  Dev X(x), G(g), GO(n), GD(n);
  cuda::gelu_forward(GO.p, X.p, n, nullptr);
  cuda::gelu_backward(GD.p, X.p, G.p, n, nullptr);
  EXPECT_LT(rel(GO.get(), go), 1e-2);
  EXPECT_LT(rel(GD.get(), gd), 1e-2);
  std::vector<float> so(n / 2), sd(n);
  cpu::swiglu_forward(so.data(), x.data(), n / 64, 32);
  cpu::swiglu_backward(sd.data(), x.data(), g.data(), n / 64, 32);
  Dev SO(n / 2), SD(n);
  cuda::swiglu_forward(SO.p, X.p, n / 64, 32, nullptr);
  cuda::swiglu_backward(SD.p, X.p, G.p, n / 64, 32, nullptr);
  EXPECT_LT(rel(SO.get(), so), 1e-2);
  EXPECT_LT(rel(SD.get(), sd), 1e-2);

  // The residual add (bf16, rounded once) and the fp32 add the data-parallel code uses.
  std::vector<float> sum(n);
  for (int i = 0; i < n; ++i) sum[size_t(i)] = bf16_to_f32(f32_to_bf16(x[size_t(i)] + g[size_t(i)]));
  Dev Ax(x), Ag(g);
  cuda::add_bf16(Ax.p, Ag.p, n, nullptr);
  EXPECT_EQ(Ax.get(), sum);
  std::vector<float> f32sum(n);
  for (int i = 0; i < n; ++i) f32sum[size_t(i)] = x[size_t(i)] + g[size_t(i)];
  DevRaw<float> Fx(x), Fg(g);
  cuda::add_f32(Fx.p, Fg.p, n, nullptr);
  EXPECT_EQ(Fx.get(), f32sum);
}

class CudaAttention : public Cuda, public ::testing::WithParamInterface<std::tuple<int, int, int, int>> {};

// Against the CPU twin, and the tensor-core kernels (D 64, 128) against the row-wise ones,
// element by element: a wrong value among small ones is not hidden by a large one elsewhere.
TEST_P(CudaAttention, MatchesTheCpuTwin) {
  const auto [H, KV, D, T] = GetParam();
  const int B = 2;
  const size_t nq = size_t(B) * T * (H + 2 * KV) * D, no = size_t(B) * T * H * D;
  auto qkv = randn(nq, 30), dy = randn(no, 31);
  std::vector<float> out(no), probs(size_t(B) * H * T * T), dqkv(nq);
  cpu::attention_forward(out.data(), probs.data(), qkv.data(), B, T, H, KV, D);
  cpu::attention_backward(dqkv.data(), dy.data(), qkv.data(), probs.data(), B, T, H, KV, D);
  Dev Q(qkv), Dy(dy), O(no), DQ(nq);
  DevRaw<float> L{std::vector<float>(size_t(B) * H * T)}, S{std::vector<float>(size_t(B) * H * T)};
  cuda::attention_forward(O.p, L.p, Q.p, B, T, H, KV, D, nullptr);
  auto o = O.get();
  EXPECT_LE(elem(o, out, 1e-2, 1e-2), 1.0);
  // Backward reads the bf16 output the forward wrote; the CPU twin used fp32; P and dS are
  // rounded to bf16 before their products (as FlashAttention does).
  cuda::attention_backward(DQ.p, Dy.p, O.p, Q.p, L.p, S.p, B, T, H, KV, D, nullptr);
  auto dq = DQ.get();
  EXPECT_LE(elem(dq, dqkv, 3e-2, 3e-2), 1.0);
  Dev RO(no), RDQ(nq);
  DevRaw<float> RL{std::vector<float>(size_t(B) * H * T)};
  cuda::attention_forward_rowwise(RO.p, RL.p, Q.p, B, T, H, KV, D, nullptr);
  cuda::attention_backward_rowwise(RDQ.p, Dy.p, O.p, Q.p, RL.p, S.p, B, T, H, KV, D, nullptr);
  EXPECT_LE(elem(o, RO.get(), 1e-2, 1e-2), 1.0);
  EXPECT_LE(elem(dq, RDQ.get(), 3e-2, 3e-2), 1.0);
  auto lse = L.get(), rlse = RL.get();
  for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], rlse[i], 1e-3f * (1.0f + std::abs(rlse[i]))) << i;
}
// T: inside one 64-row tile, and across several with a ragged last tile.
INSTANTIATE_TEST_SUITE_P(Heads, CudaAttention,
                         ::testing::Values(std::tuple{4, 4, 64, 37}, std::tuple{4, 2, 64, 200},
                                           std::tuple{8, 2, 128, 37}, std::tuple{4, 1, 128, 130},
                                           std::tuple{2, 2, 32, 70}));

// The fused loss over a padded vocabulary (the padding is out of the softmax and gets a zero
// gradient), its vocab-parallel phases against the CPU's, and the loss sum in fp64.
TEST_F(Cuda, CrossEntropyWholeAndVocabParallel) {
  const int N = 9, V = 1024, valid = 1000;
  auto logits = randn(size_t(N) * V, 40, 3.0f);
  for (int i = 0; i < N; ++i)
    for (int v = valid; v < V; ++v) logits[size_t(i) * V + size_t(v)] = 40.0f;  // would dominate a softmax
  std::vector<int32_t> y(N);
  for (int i = 0; i < N; ++i) y[size_t(i)] = (i * 113) % valid;
  auto l = logits;
  std::vector<float> losses(N);
  cpu::crossentropy_forward_backward(l.data(), losses.data(), y.data(), N, V, valid, 0.5f);
  Dev Lg(logits);
  DevRaw<int32_t> Y(y);
  DevRaw<float> Ls{std::vector<float>(N)};
  cuda::crossentropy_forward_backward(Lg.p, Ls.p, Y.p, N, V, valid, 0.5f, nullptr);
  EXPECT_LT(rel(Ls.get(), losses), 1e-3);
  auto grad = Lg.get();
  EXPECT_LT(rel(grad, l), 1e-2);
  for (int i = 0; i < N; ++i)
    for (int v = valid; v < V; ++v) ASSERT_EQ(grad[size_t(i) * V + size_t(v)], 0.0f);

  // Shard 1 of 2 (ids [512, 1024), 488 of them real): the three phases, without the
  // reductions between them (one rank's view), against the CPU's phases.
  const int Vl = 512, v0 = 512, sv = valid - v0;
  std::vector<float> shard(size_t(N) * Vl);
  for (int i = 0; i < N; ++i) std::copy_n(logits.begin() + int64_t(i) * V + v0, Vl, shard.begin() + int64_t(i) * Vl);
  std::vector<float> mx(N), tg(N), se(N), sl(N), sg = shard;
  cpu::crossentropy_shard_stats(shard.data(), y.data(), N, Vl, sv, v0, mx.data(), tg.data());
  cpu::crossentropy_shard_sumexp(shard.data(), mx.data(), N, Vl, sv, se.data());
  cpu::crossentropy_shard_finish(sg.data(), sl.data(), y.data(), N, Vl, sv, v0, mx.data(), se.data(), tg.data(), 0.5f);
  Dev Sh(shard);
  DevRaw<float> Mx{std::vector<float>(N)}, Tg{std::vector<float>(N)}, Se{std::vector<float>(N)},
      Sl{std::vector<float>(N)};
  cuda::crossentropy_shard_stats(Sh.p, Y.p, N, Vl, sv, v0, Mx.p, Tg.p, nullptr);
  cuda::crossentropy_shard_sumexp(Sh.p, Mx.p, N, Vl, sv, Se.p, nullptr);
  cuda::crossentropy_shard_finish(Sh.p, Sl.p, Y.p, N, Vl, sv, v0, Mx.p, Se.p, Tg.p, 0.5f, nullptr);
  EXPECT_EQ(Mx.get(), mx);  // a max of bf16-exact values is exact
  EXPECT_EQ(Tg.get(), tg);
  EXPECT_LT(rel(Se.get(), se), 1e-3);
  EXPECT_LT(rel(Sl.get(), sl), 1e-3);
  EXPECT_LT(rel(Sh.get(), sg), 1e-2);

  // The loss sum accumulates on the device, in double.
  DevRaw<double> Acc{std::vector<double>{2.0}};
  cuda::loss_accumulate(Acc.p, Ls.p, N, nullptr);
  cuda::loss_accumulate(Acc.p, Ls.p, N, nullptr);
  double want = 2.0;
  for (float x : Ls.get()) want += 2.0 * double(x);
  EXPECT_NEAR(Acc.get()[0], want, 1e-12 * want);
}

// The optimizer over a chunk table whose three index spaces differ (as ZeRO's do): AdamW with
// fp32 master weights against the formula, and the squared norm of the chunks it counts.
TEST_F(Cuda, AdamWAndNormOverTheChunkTable) {
  // Three index spaces, as ZeRO has them: state (moments, master) at k, bf16 weights `pshift`
  // further on, gradients `shift` further on; a kernel that mixed them up fails.
  const int n = 20000, split = 12000, shift = 100, pshift = 37;
  auto p = randn(n, 41), g = randn(n + shift, 42);
  std::vector<float> m(n, 0.0f), v(n, 0.0f), master = p;
  DevRaw<float> Master(master), Mm(m), Vv(v), G(g), One{std::vector<float>{1.0f}};
  std::vector<float> p_at(size_t(n + pshift), 0.5f);
  std::copy(p.begin(), p.end(), p_at.begin() + pshift);
  Dev P(p_at);
  // Two tensors, the first (longer than one chunk) decaying and counted in the norm, the
  // second neither (a replicated tensor on a tp rank other than 0).
  std::vector<cuda::OptChunkDev> table;
  auto add = [&](int lo, int hi, int16_t flag) {
    for (int k = lo; k < hi; k += 8192) table.push_back({k, k + pshift, k + shift, std::min(8192, hi - k), flag, flag});
  };
  add(0, split, 1);
  add(split, n, 0);
  std::vector<int32_t> raw(table.size() * sizeof(cuda::OptChunkDev) / 4);
  std::memcpy(raw.data(), table.data(), table.size() * sizeof(cuda::OptChunkDev));
  DevRaw<int32_t> Chunks(raw);
  auto* chunks = reinterpret_cast<const cuda::OptChunkDev*>(Chunks.p);
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  for (int step = 1; step <= 3; ++step) {
    const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    cuda::adamw_multi(Master.p, P.p, G.p, Mm.p, Vv.p, chunks, int(table.size()), float(lr / bc1), float(std::sqrt(bc2)),
                      float(b1), float(b2), float(eps), float(1 - lr * wd), One.p, nullptr);
    for (int i = 0; i < n; ++i) {
      const float gi = g[size_t(i + shift)];
      master[size_t(i)] *= i < split ? float(1 - lr * wd) : 1.0f;
      m[size_t(i)] += (gi - m[size_t(i)]) * float(1 - b1);
      v[size_t(i)] = v[size_t(i)] * float(b2) + float(1 - b2) * gi * gi;
      master[size_t(i)] -=
          float(lr / bc1) * (m[size_t(i)] / (std::sqrt(v[size_t(i)]) / float(std::sqrt(bc2)) + float(eps)));
    }
  }
  EXPECT_LT(rel(Master.get(), master), 1e-5);
  std::vector<float> rounded(size_t(n + pshift), 0.5f);  // before pshift: untouched
  for (int i = 0; i < n; ++i) rounded[size_t(i + pshift)] = bf16_to_f32(f32_to_bf16(Master.get()[size_t(i)]));
  EXPECT_EQ(P.get(), rounded);  // the bf16 weights are the master's rounding

  DevRaw<double> Out{std::vector<double>(1)}, Scratch{std::vector<double>(1024)};
  DevRaw<float> Scale{std::vector<float>(1)};
  cuda::sum_squares_table(Out.p, G.p, chunks, int(table.size()), Scratch.p, nullptr);
  double ss = 0;
  for (int i = 0; i < split; ++i) ss += double(g[size_t(i + shift)]) * g[size_t(i + shift)];
  EXPECT_NEAR(Out.get()[0], ss, 1e-12 * ss);
  cuda::grad_clip_scale(Scale.p, Out.p, 1.0, nullptr);
  EXPECT_NEAR(Scale.get()[0], clip_coef(std::sqrt(ss), 1.0), 1e-7);
  cuda::grad_clip_scale(Scale.p, Out.p, 0.0, nullptr);
  EXPECT_EQ(Scale.get()[0], 1.0f);
}
