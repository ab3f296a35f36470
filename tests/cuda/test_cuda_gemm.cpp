// The cuBLASLt GEMMs against the CPU's OpenBLAS GEMM: on a GPU (skipping, saying so, where
// none is visible) and on the emulated cuBLASLt (kernels/emu/cublaslt.cpp), whose checks the
// wrappers' descriptors must pass as the real library's.
#include <gtest/gtest.h>

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
