// The cuBLASLt GEMMs against the CPU's OpenBLAS GEMM: on a GPU (skipping, saying so, where
// none is visible) and on the emulated cuBLASLt (kernels/emu/cublaslt.cpp), whose checks the
// wrappers' descriptors must pass as the real library's.
#include <gtest/gtest.h>

#include "kernels/cuda/gemm_plan.h"
#include "kernels/ops.h"
#include "tests/cuda/cuda_testing.h"

using namespace loom;
using namespace loom::testing_cuda;

namespace {
// max |got - want| over max |want|: a GEMM's error scales with the row's magnitude.
double rel(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) return INFINITY;
    num = std::max(num, double(std::abs(got[i] - want[i])));
    den = std::max(den, double(std::abs(want[i])));
  }
  return num / std::max(den, 1e-3);
}
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

// A weight gradient's GEMM with its bias gradient from the epilogue, as the backend calls it in
// both weight layouts: dW += (fp32, beta 1) and the bias gradient, dout's column sums over the M
// rows, written over what the buffer held (the backend adds it into dbias); twice to the bit.
// M spans several of the emulation's blocks of 256.
TEST_F(Cuda, GemmWeightGradientWritesTheBiasGradient) {
  cuda::GemmContext ctx;
  const int M = kSanitized ? 300 : 700, K = 40, N = 24;
  const auto dout = randn(size_t(M) * N, 11), inp = randn(size_t(M) * K, 12);
  std::vector<double> sums(N, 0.0);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) sums[size_t(n)] += dout[size_t(m) * N + n];
  Dev Dout(dout), Inp(inp);
  for (bool out_in : {true, false}) {
    // W [N, K]: dW += dout^T inp, the sums of op(A); W [K, N]: dW += inp^T dout, of op(B).
    const int m = out_in ? N : K, n = out_in ? K : N;
    const auto w0 = randn(size_t(m) * n, 13);
    std::vector<float> want = w0;
    cpu::gemm(true, false, m, n, M, 1.0f, (out_in ? dout : inp).data(), m, (out_in ? inp : dout).data(), n, 1.0f,
              want.data(), n);
    std::vector<float> first_w, first_b;
    for (int run = 0; run < 2; ++run) {
      DevRaw<float> W(w0), Bg(std::vector<float>(size_t(N), 7.0f));
      const bool ran =
          cuda::gemm_f32out_bias_grad(ctx, true, false, m, n, M, out_in ? Dout.p : Inp.p, m, out_in ? Inp.p : Dout.p, n,
                                      1.0f, W.p, n, out_in ? cuda::BiasGradOf::a : cuda::BiasGradOf::b, Bg.p, nullptr);
      ASSERT_TRUE(ran) << "cuBLASLt has no algorithm for the bias-gradient epilogue here: training falls back to "
                          "its own bias pass (slower, same kind of sum)";
      const auto w = W.get(), b = Bg.get();
      EXPECT_LT(rel(w, want), 1e-5) << "dW, out_in " << out_in;
      EXPECT_TRUE(close(b, sums, 1e-3, 1e-5)) << "the bias gradient, written over the 7s, out_in " << out_in;
      if (run == 0) {
        first_w = w, first_b = b;
      } else {
        EXPECT_EQ(w, first_w) << "dW again, out_in " << out_in;
        EXPECT_EQ(b, first_b) << "the bias gradient again, out_in " << out_in;
      }
    }
  }
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

// The experts' GEMMs as one strided batch (a MoE layer's forward, input gradient and fp32
// weight gradient): each matrix against its own OpenBLAS GEMM. Gaps between the matrices make
// a stride taken for the matrix's size read the wrong rows.
TEST_F(Cuda, GemmStridedBatchOfExperts) {
  cuda::GemmContext ctx;
  const int G = 3, M = 21, K = 40, N = 24;  // per expert: M rows, [N, K] weights
  const int64_t sa = int64_t(M) * K + 8, sw = int64_t(N) * K + 16, sc = int64_t(M) * N + 8;
  auto x = randn(size_t(sa * G), 20), w = randn(size_t(sw * G), 21), dy = randn(size_t(sc * G), 22);
  auto dw0 = randn(size_t(sw * G), 23);
  std::vector<float> y(size_t(sc * G), 0.0f), dx(size_t(sa * G), 0.0f), dw = dw0;
  for (int g = 0; g < G; ++g) {
    cpu::gemm(false, true, M, N, K, 1.0f, x.data() + g * sa, K, w.data() + g * sw, K, 0.0f, y.data() + g * sc, N);
    cpu::gemm(false, false, M, K, N, 1.0f, dy.data() + g * sc, N, w.data() + g * sw, K, 0.0f, dx.data() + g * sa, K);
    cpu::gemm(true, false, N, K, M, 1.0f, dy.data() + g * sc, N, x.data() + g * sa, K, 1.0f, dw.data() + g * sw, K);
  }
  Dev X(x), W(w), Dy(dy), Y(std::vector<float>(y.size(), 0.0f)), Dx(std::vector<float>(dx.size(), 0.0f));
  DevRaw<float> Dw(dw0);
  cuda::gemm_batched(ctx, false, true, M, N, K, X.p, K, W.p, K, 0.0f, Y.p, N, cuda::GemmBatch{G, sa, sw, sc}, nullptr);
  cuda::gemm_batched(ctx, false, false, M, K, N, Dy.p, N, W.p, K, 0.0f, Dx.p, K, cuda::GemmBatch{G, sc, sw, sa},
                     nullptr);
  cuda::gemm_batched_f32out(ctx, true, false, N, K, M, Dy.p, N, X.p, K, 1.0f, Dw.p, K, cuda::GemmBatch{G, sc, sa, sw},
                            nullptr);
  // Whole buffers: the gaps between the matrices hold what they held (zeros, dw0's values).
  EXPECT_LT(rel(Y.get(), y), 3e-2) << "forward";
  EXPECT_LT(rel(Dx.get(), dx), 3e-2) << "input gradient";
  EXPECT_LT(rel(Dw.get(), dw), 1e-5) << "fp32 weight gradient (+=)";
  const std::vector<float> got = Y.get();
  for (int g = 0; g + 1 < G; ++g)
    for (int64_t i = int64_t(M) * N; i < sc; ++i) ASSERT_EQ(got[size_t(g * sc + i)], 0.0f) << "a gap was written";
}

// A dropless MoE layer's expert GEMMs, sized on the device: runs of rows from two sources'
// counts, an expert with none, runs longer than a tile and not a multiple of it, K and N past
// a tile's edge; against double sums. Rows past the runs are not written; an expert with no
// rows keeps its gradient; a second call is bitwise the first.
TEST_F(Cuda, GemmRaggedRunsSizedOnTheDevice) {
  const int El = 4, S = 2, K = 40, N = 72;
  // [S x El]: runs of 8, 0, 130 and 65 rows (8, 0, 70 and 15 under a sanitizer)
  const std::vector<int32_t> counts =
      kSanitized ? std::vector<int32_t>{5, 0, 40, 1, 3, 0, 30, 14} : std::vector<int32_t>{5, 0, 70, 1, 3, 0, 60, 64};
  std::vector<int64_t> r0(El + 1, 0);
  for (int e = 0; e < El; ++e) r0[e + 1] = r0[e] + counts[e] + counts[El + e];
  const int64_t R = r0[El], pad = 3;  // rows past R hold a sentinel
  const int64_t sw = int64_t(N) * K + 16;
  auto x = randn(size_t((R + pad) * K), 30), w = randn(size_t(sw * El), 31), dy = randn(size_t((R + pad) * N), 32);
  auto dw0 = randn(size_t(sw * El), 33);
  std::vector<double> y(size_t((R + pad) * N), 7.0), dx(size_t((R + pad) * K), 7.0);
  std::vector<double> dw(dw0.begin(), dw0.end());
  for (int e = 0; e < El; ++e)
    for (int64_t r = r0[e]; r < r0[e + 1]; ++r) {
      const float *xr = x.data() + r * K, *dyr = dy.data() + r * N, *we = w.data() + e * sw;
      for (int n = 0; n < N; ++n) {
        double s = 0;
        for (int k = 0; k < K; ++k) s += double(xr[k]) * we[n * K + k];
        y[size_t(r * N + n)] = s;
      }
      for (int k = 0; k < K; ++k) {
        double s = 0;
        for (int n = 0; n < N; ++n) s += double(dyr[n]) * we[n * K + k];
        dx[size_t(r * K + k)] = s;
      }
      for (int n = 0; n < N; ++n)
        for (int k = 0; k < K; ++k) dw[size_t(e * sw + n * K + k)] += double(dyr[n]) * xr[k];
    }
  Dev X(x), W(w), Dy(dy), Y(std::vector<float>(y.size(), 7.0f)), Dx(std::vector<float>(dx.size(), 7.0f));
  DevRaw<float> Dw(dw0);
  DevRaw<int32_t> Counts(counts);
  cuda::gemm_ragged_rows(Y.p, X.p, W.p, sw, true, Counts.p, S, El, R, K, N, nullptr);
  cuda::gemm_ragged_rows(Dx.p, Dy.p, W.p, sw, false, Counts.p, S, El, R, N, K, nullptr);
  cuda::gemm_ragged_wgrad(Dw.p, Dy.p, X.p, sw, Counts.p, S, El, N, K, nullptr);
  const std::vector<float> got_y = Y.get(), got_dw = Dw.get();
  EXPECT_TRUE(close(got_y, y, 3e-2, 8e-3)) << "forward";
  EXPECT_TRUE(close(Dx.get(), dx, 3e-2, 8e-3)) << "input gradient";
  EXPECT_TRUE(close(got_dw, dw, 1e-4, 1e-5)) << "fp32 weight gradient (+=)";
  for (int64_t i = 0; i < sw; ++i) ASSERT_EQ(got_dw[size_t(sw + i)], dw0[size_t(sw + i)]) << "expert 1 has no rows";
  // Again over the same outputs: overwritten, bitwise the same.
  cuda::gemm_ragged_rows(Y.p, X.p, W.p, sw, true, Counts.p, S, El, R, K, N, nullptr);
  EXPECT_EQ(Y.get(), got_y);
}
