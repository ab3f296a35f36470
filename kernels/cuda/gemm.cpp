// GEMMs through cuBLASLt in bf16 with fp32 accumulation. cuBLASLt is column-major; a row-major
// matrix is the column-major view of its transpose, so C = op(A) op(B) is computed as
// C^T = op(B)^T op(A)^T: cuBLASLt's first operand is B, its second A, and m, n swap. A bias
// rides the epilogue (added per column of the row-major C), and so can GELU (tanh form, as
// GPT-2's): forward keeps its argument in an aux matrix laid out like C, and the backward
// epilogue multiplies the product by GELU' of that aux.
#include <cublasLt.h>

#include <cstdint>

#include "kernels/cuda/check.h"
#include "kernels/cuda/ops_cuda.h"

#define LOOM_CUBLAS_CHECK(call)                                                                                     \
  do {                                                                                                              \
    cublasStatus_t st_ = (call);                                                                                    \
    LOOM_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "{} failed at {}:{}: status {}", #call, __FILE__, __LINE__, int(st_)); \
  } while (0)

namespace loom::cuda {

GemmContext::GemmContext(size_t workspace_bytes) : bytes_(workspace_bytes), owns_(true) {
  cublasLtHandle_t h;
  LOOM_CUBLAS_CHECK(cublasLtCreate(&h));
  handle_ = h;
  LOOM_CUDA_CHECK(cudaMalloc(&workspace_, bytes_));
}

GemmContext::GemmContext(void* workspace, size_t workspace_bytes)
    : workspace_(workspace), bytes_(workspace_bytes), owns_(false) {
  cublasLtHandle_t h;
  LOOM_CUBLAS_CHECK(cublasLtCreate(&h));
  handle_ = h;
}

GemmContext::~GemmContext() {
  if (owns_) cudaFree(workspace_);
  cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

namespace {

enum class Gelu { none, forward, backward };

// The largest power of two up to 256 that divides the address.
uint32_t alignment(const void* p) {
  uint32_t a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

// C is bf16, or fp32 where c_f32 (then no bias and no GELU).
void gemm_epilogue(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
                   const bf16* B, int ldb, float beta, void* C, bool c_f32, int ldc, const bf16* bias, Gelu gelu,
                   const bf16* aux, cudaStream_t s) {
  auto lt = static_cast<cublasLtHandle_t>(ctx.handle());
  cublasLtMatmulDesc_t op;
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &first, sizeof(first)));
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &second, sizeof(second)));
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  if (gelu == Gelu::forward)
    epi = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  else if (gelu == Gelu::backward)
    epi = CUBLASLT_EPILOGUE_DGELU;
  else if (bias)
    epi = CUBLASLT_EPILOGUE_BIAS;
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (bias && gelu != Gelu::backward) {
    const cudaDataType_t bias_type = CUDA_R_16BF;
    LOOM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  if (gelu != Gelu::none) {
    const int64_t aux_ld = ldc;
    const cudaDataType_t aux_type = CUDA_R_16BF;
    LOOM_CHECK(ldc % 8 == 0, "a GELU epilogue needs ldc a multiple of 8, not {}", ldc);
    LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    LOOM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    LOOM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof(aux_type)));
  }
  // Column-major shapes: first = B viewed (N x K, or K x N stored when transposed), second = A.
  cublasLtMatrixLayout_t lb, la, lc;
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, trans_b ? K : N, trans_b ? N : K, ldb));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, trans_a ? M : K, trans_a ? K : M, lda));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, c_f32 ? CUDA_R_32F : CUDA_R_16BF, N, M, ldc));
  cublasLtMatmulPreference_t pref;
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = ctx.workspace_bytes();
  LOOM_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // The heuristics assume 256-byte aligned operands unless told otherwise: give them each
  // pointer's real alignment, so they never choose a kernel these buffers cannot feed.
  const uint32_t align_first = alignment(B), align_second = alignment(A), align_c = alignment(C);
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_first,
                                                         sizeof(align_first)));
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                         &align_second, sizeof(align_second)));
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                         sizeof(align_c)));
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                                         sizeof(align_c)));
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  LOOM_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, lb, la, lc, lc, pref, 1, &heur, &found));
  LOOM_CHECK(found > 0, "cuBLASLt has no algorithm for a bf16 GEMM of {} x {} x {}", M, N, K);
  const float alpha = 1.0f;
  LOOM_CUBLAS_CHECK(
      cublasLtMatmul(lt, op, &alpha, B, lb, A, la, &beta, C, lc, C, lc, &heur.algo, ctx.workspace(), ws, s));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatmulDescDestroy(op);
}

}  // namespace

void gemm(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
          const bf16* B, int ldb, float beta, bf16* C, int ldc, const bf16* bias, cudaStream_t s) {
  gemm_epilogue(ctx, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, false, ldc, bias, Gelu::none, nullptr, s);
}

void gemm_f32out(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
                 const bf16* B, int ldb, float beta, float* C, int ldc, cudaStream_t s) {
  gemm_epilogue(ctx, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, true, ldc, nullptr, Gelu::none, nullptr, s);
}

void gemm_gelu(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
               const bf16* B, int ldb, bf16* C, int ldc, const bf16* bias, bf16* pre, cudaStream_t s) {
  gemm_epilogue(ctx, trans_a, trans_b, M, N, K, A, lda, B, ldb, 0.0f, C, false, ldc, bias, Gelu::forward, pre, s);
}

void gemm_dgelu(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
                const bf16* B, int ldb, bf16* C, int ldc, const bf16* pre, cudaStream_t s) {
  gemm_epilogue(ctx, trans_a, trans_b, M, N, K, A, lda, B, ldb, 0.0f, C, false, ldc, nullptr, Gelu::backward, pre, s);
}

}  // namespace loom::cuda
