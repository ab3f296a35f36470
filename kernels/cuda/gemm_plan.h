// loom's row-major GEMM as cuBLASLt's column-major problem, as plain data: which operand goes
// first, the transposes, m, n, k, each matrix layout, the epilogue and the GELU aux layout. A
// row-major matrix is the column-major view of its transpose, so C = op(A) op(B) is computed
// as C^T = op(B)^T op(A)^T: cuBLASLt's first operand is loom's B, its second loom's A, and m
// and n swap. Pure (no CUDA): kernels/cuda/gemm.cpp builds descriptors from it, and the unit
// tests check it against a column-major GEMM that follows cuBLASLt's documented semantics.
// A weight gradient's bias gradient (the sums over K of dout) rides its GEMM's epilogue.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "runtime/error.h"

namespace loom::cuda {

enum class Gelu { none, forward, backward };
enum class LtEpilogue { none, bias, gelu_aux, gelu_aux_bias, dgelu, bgrada, bgradb };
// Which of loom's operands a bias gradient sums over K: op(A) (M sums, one per row of C) or
// op(B) (N sums, one per column of C).
enum class BiasGradOf { a, b };

inline const char* epilogue_name(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::none:
      return "DEFAULT";
    case LtEpilogue::bias:
      return "BIAS";
    case LtEpilogue::gelu_aux:
      return "GELU_AUX";
    case LtEpilogue::gelu_aux_bias:
      return "GELU_AUX_BIAS";
    case LtEpilogue::dgelu:
      return "DGELU";
    case LtEpilogue::bgrada:
      return "BGRADA";
    case LtEpilogue::bgradb:
      return "BGRADB";
  }
  return "?";
}

// A column-major matrix as cuBLASLt's layout descriptor holds it; batch_stride: elements from
// one matrix of a strided batch to the next (CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET).
struct LtLayout {
  int64_t rows, cols, ld;
  int64_t batch_stride = 0;
};

// A strided batch of `count` GEMMs of one shape, each operand of loom's (A, B, C) `stride_*`
// elements after the one before (the experts of a MoE layer, their rows and weights).
struct GemmBatch {
  int count = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

struct LtGemm {
  bool trans_first, trans_second;  // CUBLASLT_MATMUL_DESC_TRANSA / TRANSB
  int64_t m, n, k;                 // D is m x n
  LtLayout first, second, c;       // first = loom's B, second = loom's A; C and D alike
  LtEpilogue epilogue;
  int64_t aux_ld;  // the GELU aux (laid out like D), 0 without GELU
  bool c_f32;
  int batch = 1;  // CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT of every layout
  // One line naming the problem, for errors: loom's shape and cuBLASLt's.
  std::string describe(int M, int N, int K) const {
    return fmt::format("{}x{}x{}{} (cuBLASLt m {} n {} k {}, op {}{}, ld {} {} {}, epilogue {}, C {})", M, N, K,
                       batch > 1 ? fmt::format(" x {} batched", batch) : "", m, n, k, trans_first ? 'T' : 'N',
                       trans_second ? 'T' : 'N', first.ld, second.ld, c.ld, epilogue_name(epilogue),
                       c_f32 ? "fp32" : "bf16");
  }
};

// Row-major C[M, N] = op(A)[M, K] @ op(B)[K, N] (+ bias[N]), with GELU fused forward (its
// argument kept in aux, laid out like C) or backward (the product times GELU' of aux).
// Refuses what cuBLASLt would (or loom never asks for): leading dimensions shorter than a row,
// an aux whose leading dimension is no multiple of 8, a bias or GELU with an fp32 C, a bias on
// GELU's backward.
inline LtGemm gemm_plan(bool trans_a, bool trans_b, int M, int N, int K, int lda, int ldb, int ldc, bool bias,
                        Gelu gelu, bool c_f32) {
  LOOM_CHECK(M > 0 && N > 0 && K > 0, "GEMM {}x{}x{}: every dimension must be positive", M, N, K);
  LOOM_CHECK(lda >= (trans_a ? M : K), "GEMM {}x{}x{}: lda {} is shorter than a row of A", M, N, K, lda);
  LOOM_CHECK(ldb >= (trans_b ? K : N), "GEMM {}x{}x{}: ldb {} is shorter than a row of B", M, N, K, ldb);
  LOOM_CHECK(ldc >= N, "GEMM {}x{}x{}: ldc {} is shorter than a row of C", M, N, K, ldc);
  LOOM_CHECK(!c_f32 || (!bias && gelu == Gelu::none), "GEMM {}x{}x{}: an fp32 C takes no bias and no GELU", M, N, K);
  LOOM_CHECK(!(bias && gelu == Gelu::backward), "GEMM {}x{}x{}: GELU's backward epilogue takes no bias", M, N, K);
  LOOM_CHECK(gelu == Gelu::none || ldc % 8 == 0, "GEMM {}x{}x{}: a GELU epilogue needs ldc a multiple of 8, not {}", M,
             N, K, ldc);
  LtGemm g;
  g.trans_first = trans_b;
  g.trans_second = trans_a;
  g.m = N, g.n = M, g.k = K;
  g.first = {trans_b ? K : N, trans_b ? N : K, ldb};
  g.second = {trans_a ? M : K, trans_a ? K : M, lda};
  g.c = {N, M, ldc};
  g.epilogue = gelu == Gelu::forward    ? (bias ? LtEpilogue::gelu_aux_bias : LtEpilogue::gelu_aux)
               : gelu == Gelu::backward ? LtEpilogue::dgelu
               : bias                   ? LtEpilogue::bias
                                        : LtEpilogue::none;
  g.aux_ld = gelu == Gelu::none ? 0 : ldc;
  g.c_f32 = c_f32;
  return g;
}

// A weight gradient into an fp32 C with the bias gradient from its epilogue: the sums over K of
// op(A) (of) or op(B), written (not added) as fp32 into the bias pointer. cuBLASLt's first
// operand is loom's B, so loom's B is BGRADA (m = N sums) and loom's A BGRADB (n = M sums).
inline LtGemm gemm_plan_bias_grad(bool trans_a, bool trans_b, int M, int N, int K, int lda, int ldb, int ldc,
                                  BiasGradOf of) {
  LtGemm g = gemm_plan(trans_a, trans_b, M, N, K, lda, ldb, ldc, false, Gelu::none, true);
  g.epilogue = of == BiasGradOf::b ? LtEpilogue::bgrada : LtEpilogue::bgradb;
  return g;
}

// The same over a strided batch (no bias, no GELU: the expert GEMMs have neither). The outputs
// must not overlap; inputs may be shared (stride 0).
inline LtGemm gemm_plan_batched(bool trans_a, bool trans_b, int M, int N, int K, int lda, int ldb, int ldc, bool c_f32,
                                const GemmBatch& b) {
  LtGemm g = gemm_plan(trans_a, trans_b, M, N, K, lda, ldb, ldc, false, Gelu::none, c_f32);
  LOOM_CHECK(b.count >= 1, "GEMM {}x{}x{}: a batch of {} GEMMs", M, N, K, b.count);
  LOOM_CHECK(b.stride_a >= 0 && b.stride_b >= 0, "GEMM {}x{}x{}: negative batch strides", M, N, K);
  LOOM_CHECK(b.count == 1 || b.stride_c >= int64_t(M) * ldc,
             "GEMM {}x{}x{} x {} batched: C's stride {} is shorter than a matrix of C ({} x ld {}), so outputs overlap",
             M, N, K, b.count, b.stride_c, M, ldc);
  g.batch = b.count;
  g.first.batch_stride = b.stride_b;
  g.second.batch_stride = b.stride_a;
  g.c.batch_stride = b.stride_c;
  return g;
}

// The largest power of two up to 256 that divides the address: what cuBLASLt's alignment
// preferences say of an operand (kernels/cuda/gemm.cpp tells them; the emulation checks them).
inline uint32_t pointer_alignment(const void* p) {
  uint32_t a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

// GPT-2's tanh GELU and its derivative, as the epilogues compute them.
inline double gelu_tanh(double x) {
  const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}
inline double gelu_tanh_grad(double x) {
  const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x), t = std::tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

// cuBLASLt's documented semantics on column-major operands, in double: D = alpha op(first)
// op(second) + beta C; BIAS adds bias[i] (one per row of D) to every column; GELU_AUX keeps the
// pre-activation in aux and applies GELU; DGELU multiplies by GELU' of aux; BGRADA (BGRADB)
// writes the sums over k of op(first) (op(second)) into bias_grad, m (n) of them. D overwrites C.
// Its layouts are checked as cuBLASLt checks them against m, n, k and the transposes.
template <class T, class Out>
void lt_reference(const LtGemm& g, double alpha, const T* first, const T* second, double beta, Out* c, const T* bias,
                  T* aux, Out* bias_grad = nullptr) {
  auto shape = [](const LtLayout& l, bool trans, int64_t rows, int64_t cols, const char* what) {
    LOOM_CHECK(l.rows == (trans ? cols : rows) && l.cols == (trans ? rows : cols) && l.ld >= l.rows,
               "the {} operand's layout {} x {} (ld {}) does not hold op(it) = {} x {}", what, l.rows, l.cols, l.ld,
               rows, cols);
  };
  shape(g.first, g.trans_first, g.m, g.k, "first");
  shape(g.second, g.trans_second, g.k, g.n, "second");
  shape(g.c, false, g.m, g.n, "C");
  auto at = [](const T* p, const LtLayout& l, bool trans, int64_t i, int64_t j) {
    return double(trans ? p[j + i * l.ld] : p[i + j * l.ld]);  // element (i, j) of op(matrix)
  };
  if (g.batch > 1) {  // each matrix of the batch as a GEMM of its own
    LOOM_CHECK(g.epilogue == LtEpilogue::none, "a batched GEMM with an epilogue");
    LtGemm one = g;
    one.batch = 1;
    for (int b = 0; b < g.batch; ++b)
      lt_reference(one, alpha, first + b * g.first.batch_stride, second + b * g.second.batch_stride, beta,
                   c + b * g.c.batch_stride, bias, aux);
    return;
  }
  for (int64_t j = 0; j < g.n; ++j)
    for (int64_t i = 0; i < g.m; ++i) {
      double acc = 0;
      for (int64_t p = 0; p < g.k; ++p)
        acc += at(first, g.first, g.trans_first, i, p) * at(second, g.second, g.trans_second, p, j);
      double x = alpha * acc + (beta != 0 ? beta * double(c[i + j * g.c.ld]) : 0.0);
      if (g.epilogue == LtEpilogue::bias || g.epilogue == LtEpilogue::gelu_aux_bias) x += double(bias[i]);
      if (g.epilogue == LtEpilogue::gelu_aux || g.epilogue == LtEpilogue::gelu_aux_bias) {
        aux[i + j * g.aux_ld] = T(x);
        x = gelu_tanh(x);
      } else if (g.epilogue == LtEpilogue::dgelu) {
        x *= gelu_tanh_grad(double(aux[i + j * g.aux_ld]));
      }
      c[i + j * g.c.ld] = Out(x);
    }
  if (g.epilogue == LtEpilogue::bgrada)
    for (int64_t i = 0; i < g.m; ++i) {
      double sum = 0;
      for (int64_t p = 0; p < g.k; ++p) sum += at(first, g.first, g.trans_first, i, p);
      bias_grad[i] = Out(sum);
    }
  if (g.epilogue == LtEpilogue::bgradb)
    for (int64_t j = 0; j < g.n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < g.k; ++p) sum += at(second, g.second, g.trans_second, p, j);
      bias_grad[j] = Out(sum);
    }
}

}  // namespace loom::cuda
