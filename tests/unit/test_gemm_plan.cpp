// The mapping from loom's row-major GEMMs to cuBLASLt's column-major problem
// (kernels/cuda/gemm_plan.h), checked without a GPU: for every transpose, bias, GELU epilogue,
// output type and padded stride, cuBLASLt's documented semantics applied to the plan must give
// what the row-major formula gives. A swapped m and n, a wrong leading dimension, a bias
// broadcast along the wrong axis or an aux laid out unlike C fails here.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/cuda/gemm_plan.h"

using namespace loom;
using namespace loom::cuda;

namespace {

struct Case {
  bool ta, tb, bias, c_f32;
  Gelu gelu;
};

// Row-major reference: C[m, n] = sum_k op(A)[m, k] op(B)[k, n] (+ bias[n]), GELU as asked.
void row_major(const Case& c, int M, int N, int K, const std::vector<double>& A, int lda, const std::vector<double>& B,
               int ldb, std::vector<double>& C, int ldc, double beta, const std::vector<double>& bias,
               std::vector<double>& aux) {
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double acc = 0;
      for (int k = 0; k < K; ++k)
        acc += (c.ta ? A[size_t(k) * lda + m] : A[size_t(m) * lda + k]) *
               (c.tb ? B[size_t(n) * ldb + k] : B[size_t(k) * ldb + n]);
      double x = acc + (beta != 0 ? beta * C[size_t(m) * ldc + n] : 0.0);
      if (c.bias) x += bias[size_t(n)];
      if (c.gelu == Gelu::forward) {
        aux[size_t(m) * ldc + n] = x;
        x = gelu_tanh(x);
      } else if (c.gelu == Gelu::backward) {
        x *= gelu_tanh_grad(aux[size_t(m) * ldc + n]);
      }
      C[size_t(m) * ldc + n] = x;
    }
}

}  // namespace

TEST(GemmPlan, EveryCombinationMatchesTheRowMajorFormula) {
  std::mt19937_64 g(7);
  std::normal_distribution<double> d;
  auto fill = [&](size_t n) {
    std::vector<double> v(n);
    for (auto& x : v) x = d(g);
    return v;
  };
  const int M = 5, N = 16, K = 3;  // N (and ldc) a multiple of 8 for the GELU aux
  int checked = 0;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool bias : {false, true})
        for (bool c_f32 : {false, true})
          for (Gelu gelu : {Gelu::none, Gelu::forward, Gelu::backward}) {
            if (c_f32 && (bias || gelu != Gelu::none)) continue;
            if (bias && gelu == Gelu::backward) continue;
            const Case c{ta, tb, bias, c_f32, gelu};
            // Padded strides: a plan that used the matrix width for ld would read the padding.
            const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 8;
            auto A = fill(size_t(ta ? K : M) * lda), B = fill(size_t(tb ? N : K) * ldb), C0 = fill(size_t(M) * ldc);
            auto bv = fill(N), aux0 = fill(size_t(M) * ldc);
            const double beta = c_f32 ? 1.0 : 0.0;  // weight gradients accumulate; the rest overwrite
            auto want = C0, want_aux = aux0;
            row_major(c, M, N, K, A, lda, B, ldb, want, ldc, beta, bv, want_aux);
            const LtGemm plan = gemm_plan(ta, tb, M, N, K, lda, ldb, ldc, bias, gelu, c_f32);
            auto got = C0, got_aux = aux0;
            lt_reference(plan, 1.0, B.data(), A.data(), beta, got.data(), bv.data(), got_aux.data());
            for (size_t i = 0; i < want.size(); ++i)
              ASSERT_NEAR(got[i], want[i], 1e-12) << plan.describe(M, N, K) << " at " << i;
            for (size_t i = 0; i < want_aux.size(); ++i)
              ASSERT_NEAR(got_aux[i], want_aux[i], 1e-12) << "aux, " << plan.describe(M, N, K);
            ++checked;
          }
  EXPECT_EQ(checked, 2 * 2 * 6);  // per transpose pair: 5 bf16 epilogue combinations and the fp32 C
}

// The bias gradient epilogue: for every transpose and either operand, cuBLASLt's BGRADA/BGRADB
// semantics on the plan give C += op(A) op(B) and the sums over K of the operand asked for
// (op(A): M sums; op(B): N sums). Naming the wrong one of cuBLASLt's operands fails here.
TEST(GemmPlan, BiasGradientSumsTheOperandItNames) {
  std::mt19937_64 g(9);
  std::normal_distribution<double> d;
  auto fill = [&](size_t n) {
    std::vector<double> v(n);
    for (auto& x : v) x = d(g);
    return v;
  };
  const int M = 5, N = 7, K = 4;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (BiasGradOf of : {BiasGradOf::a, BiasGradOf::b}) {
        const int lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 3, ldc = N + 1;
        auto A = fill(size_t(ta ? K : M) * lda), B = fill(size_t(tb ? N : K) * ldb), C0 = fill(size_t(M) * ldc);
        auto want = C0, unused = C0;
        row_major({ta, tb, false, true, Gelu::none}, M, N, K, A, lda, B, ldb, want, ldc, 1.0, {}, unused);
        std::vector<double> want_sums(of == BiasGradOf::a ? M : N, 0.0);
        for (int k = 0; k < K; ++k)
          for (size_t i = 0; i < want_sums.size(); ++i)
            want_sums[i] += of == BiasGradOf::a ? (ta ? A[size_t(k) * lda + i] : A[i * lda + k])
                                                : (tb ? B[i * ldb + k] : B[size_t(k) * ldb + i]);
        const LtGemm plan = gemm_plan_bias_grad(ta, tb, M, N, K, lda, ldb, ldc, of);
        auto got = C0;
        std::vector<double> sums(size_t(std::max(M, N)), 0.0);
        lt_reference<double, double>(plan, 1.0, B.data(), A.data(), 1.0, got.data(), nullptr, nullptr, sums.data());
        for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-12) << plan.describe(M, N, K);
        for (size_t i = 0; i < want_sums.size(); ++i)
          ASSERT_NEAR(sums[i], want_sums[i], 1e-12) << plan.describe(M, N, K) << " sum " << i;
      }
}

// The four GEMMs a linear layer issues (backend_cuda.cpp), with loom's own strides.
TEST(GemmPlan, TheModelsLinearLayers) {
  const int M = 6, K = 8, N = 16;
  struct Call {
    bool ta, tb;
    int m, n, k, lda, ldb, ldc;
    const char* what;
  };
  const Call calls[] = {{false, true, M, N, K, K, K, N, "forward, [out, in] weight"},
                        {false, false, M, N, K, K, N, N, "forward, [in, out] weight"},
                        {false, false, M, K, N, N, K, K, "input gradient"},
                        {true, false, N, K, M, N, K, K, "weight gradient into fp32"}};
  for (const Call& c : calls) {
    const LtGemm p = gemm_plan(c.ta, c.tb, c.m, c.n, c.k, c.lda, c.ldb, c.ldc, false, Gelu::none, false);
    EXPECT_EQ(p.m, c.n) << c.what;
    EXPECT_EQ(p.n, c.m) << c.what;
    EXPECT_EQ(p.first.ld, c.ldb) << c.what;
    EXPECT_EQ(p.second.ld, c.lda) << c.what;
    EXPECT_EQ(p.c.rows, c.n) << c.what;
    EXPECT_EQ(p.c.cols, c.m) << c.what;
  }
}

// A strided batch (the experts of a MoE layer: their rows, their weights, their outputs and
// fp32 weight gradients), every transpose, against each matrix's row-major formula.
TEST(GemmPlan, StridedBatches) {
  std::mt19937_64 g(11);
  std::normal_distribution<double> d;
  auto fill = [&](size_t n) {
    std::vector<double> v(n);
    for (auto& x : v) x = d(g);
    return v;
  };
  const int M = 5, N = 7, K = 3, count = 4;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool c_f32 : {false, true}) {
        const Case c{ta, tb, false, c_f32, Gelu::none};
        const int lda = (ta ? M : K) + 1, ldb = (tb ? K : N) + 2, ldc = N + 3;
        // Padding between the matrices too: a stride taken as the matrix's size reads it.
        const int64_t sa = int64_t(ta ? K : M) * lda + 5, sb = int64_t(tb ? N : K) * ldb + 6, sc = int64_t(M) * ldc + 7;
        auto A = fill(size_t(sa * count)), B = fill(size_t(sb * count)), C0 = fill(size_t(sc * count));
        const double beta = c_f32 ? 1.0 : 0.0;
        auto want = C0;
        std::vector<double> none;
        for (int b = 0; b < count; ++b) {
          std::vector<double> a(A.begin() + b * sa, A.begin() + (b + 1) * sa),
              bb(B.begin() + b * sb, B.begin() + (b + 1) * sb), cc(want.begin() + b * sc, want.begin() + (b + 1) * sc);
          row_major(c, M, N, K, a, lda, bb, ldb, cc, ldc, beta, none, none);
          std::copy(cc.begin(), cc.end(), want.begin() + b * sc);
        }
        const LtGemm plan = gemm_plan_batched(ta, tb, M, N, K, lda, ldb, ldc, c_f32, GemmBatch{count, sa, sb, sc});
        EXPECT_EQ(plan.batch, count);
        auto got = C0;
        lt_reference(plan, 1.0, B.data(), A.data(), beta, got.data(), (const double*)nullptr, (double*)nullptr);
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 1e-12) << plan.describe(M, N, K) << " at " << i;
      }
  // Outputs that overlap are refused, and the error names the batch.
  try {
    gemm_plan_batched(false, true, 4, 8, 3, 3, 3, 8, false, GemmBatch{2, 12, 24, 31});
    ADD_FAILURE() << "overlapping outputs accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x 2 batched"), std::string::npos) << e.what();
  }
}

TEST(GemmPlan, RefusesWhatCublasLtWould) {
  EXPECT_THROW(gemm_plan(false, false, 4, 12, 3, 3, 12, 12, false, Gelu::forward, false), Error);  // aux ld % 8
  EXPECT_THROW(gemm_plan(false, false, 4, 8, 3, 2, 8, 8, false, Gelu::none, false), Error);        // lda < K
  EXPECT_THROW(gemm_plan(false, false, 4, 8, 3, 3, 8, 8, true, Gelu::none, true), Error);          // bias, fp32 C
  EXPECT_THROW(gemm_plan(false, false, 4, 8, 3, 3, 8, 8, true, Gelu::backward, false), Error);     // bias on DGELU
  try {
    gemm_plan(false, false, 4, 12, 3, 3, 12, 12, false, Gelu::forward, false);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4x12x3"), std::string::npos) << "the error names the shape";
  }
}

#if LOOM_HAVE_CUDA
#include <cublasLt.h>
// cuBLASLt is opened at its first call, not linked (kernels/cuda/cublaslt_lazy.cpp): a call that
// needs no GPU reaches the real library through the stand-in.
TEST(GemmPlan, CublasLtOpensAtItsFirstCall) {
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
}
#endif
