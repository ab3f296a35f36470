// GEMMs through OpenBLAS for every transpose that forward and backward need. OpenBLAS's sums
// follow how it splits a GEMM over its threads, so loom splits it itself: C in blocks of rows
// or columns whose count depends on the shape alone, each block one single-threaded OpenBLAS
// call (inside an active OpenMP region its OpenMP build runs on the calling thread). The
// threads only choose who computes a block: the same bits at any thread count.
#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "kernels/ops.h"

namespace loom::cpu {

namespace {
// Blocks of a dimension of `n`: a power of two up to 16 (enough for 16 threads, even for 2, 4
// and 8), each at least 256 wide: fewer, larger calls cost less than OpenBLAS packing the
// other operand again for each (measured on the default job: 64 wide, 6% slower than
// OpenBLAS threading itself; 256, no slower).
int gemm_blocks(int n) {
  int b = 1;
  while (b < 16 && n / (2 * b) >= 256) b *= 2;
  return b;
}
}  // namespace

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc) {
  // Each block packs the other operand again: split the side whose operand is the larger (rows
  // when M > N: B, K x N, is packed again per block, not A, M x K).
  const bool rows = M > N;
  const int dim = rows ? M : N, blocks = gemm_blocks(dim);
  const auto op = [](bool t) { return t ? CblasTrans : CblasNoTrans; };
#pragma omp parallel for schedule(static)  // (one block too: an active region keeps OpenBLAS on one thread)
  for (int b = 0; b < blocks; ++b) {
    const int lo = int(int64_t(dim) * b / blocks), n = int(int64_t(dim) * (b + 1) / blocks) - lo;
    if (rows) {  // rows lo.. of op(A) and of C
      const float* Ab = trans_a ? A + lo : A + int64_t(lo) * lda;
      cblas_sgemm(CblasRowMajor, op(trans_a), op(trans_b), n, N, K, alpha, Ab, lda, B, ldb, beta, C + int64_t(lo) * ldc,
                  ldc);
    } else {  // columns lo.. of op(B) and of C
      const float* Bb = trans_b ? B + int64_t(lo) * ldb : B + lo;
      cblas_sgemm(CblasRowMajor, op(trans_a), op(trans_b), M, n, K, alpha, A, lda, Bb, ldb, beta, C + lo, ldc);
    }
  }
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
