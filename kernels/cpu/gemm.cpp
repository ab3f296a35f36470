// GEMMs through OpenBLAS for every transpose that forward and backward need. OpenBLAS
// splits a GEMM the same way for the same thread count, so results are reproducible.
#include <cblas.h>
#include <omp.h>

#include "kernels/ops.h"

namespace loom::cpu {

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha,
              A, lda, B, ldb, beta, C, ldc);
}

void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int M, int K, int N,
                    WLayout layout) {
  float beta = 0.0f;
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) out[int64_t(m) * N + n] = bias[n];
    beta = 1.0f;
  }
  if (layout == WLayout::out_in)
    gemm(false, true, M, N, K, 1.0f, inp, K, w, K, beta, out, N);
  else
    gemm(false, false, M, N, K, 1.0f, inp, K, w, N, beta, out, N);
}

void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w, int M,
                     int K, int N, WLayout layout) {
  if (layout == WLayout::out_in) {
    if (dinp) gemm(false, false, M, K, N, 1.0f, dout, N, w, K, 0.0f, dinp, K);
    if (dw) gemm(true, false, N, K, M, 1.0f, dout, N, inp, K, 1.0f, dw, K);
  } else {
    if (dinp) gemm(false, true, M, K, N, 1.0f, dout, N, w, N, 0.0f, dinp, K);
    if (dw) gemm(true, false, K, N, M, 1.0f, inp, K, dout, N, 1.0f, dw, N);
  }
  if (dbias) bias_backward(dbias, dout, M, N);
}

void bias_backward(float* dbias, const float* dout, int M, int N) {
  // Each thread owns a range of columns and walks the rows in order: no shared sums.
#pragma omp parallel
  {
    int nt = omp_get_num_threads(), id = omp_get_thread_num();
    int lo = int(int64_t(N) * id / nt), hi = int(int64_t(N) * (id + 1) / nt);
    for (int m = 0; m < M; ++m) {
      const float* row = dout + int64_t(m) * N;
      for (int n = lo; n < hi; ++n) dbias[n] += row[n];
    }
  }
}

}  // namespace loom::cpu
