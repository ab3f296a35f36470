// GEMMs through cuBLASLt in bf16 with fp32 accumulation: the column-major problem comes from
// gemm_plan (kernels/cuda/gemm_plan.h, tested without a GPU). A bias rides the epilogue (added
// per column of the row-major C), and so can GELU (tanh form, as GPT-2's): forward keeps its
// argument in an aux matrix laid out like C, and the backward epilogue multiplies the product
// by GELU' of that aux. A weight gradient's bias gradient rides BGRADA/BGRADB (fp32, written
// over a scratch). Errors name the GEMM's shape, its epilogue and cuBLASLt's status.
#include <cublasLt.h>

#include <cstdint>

#include "kernels/cuda/gemm_plan.h"
#include "kernels/cuda/ops_cuda.h"
#include "runtime/cuda_check.h"

#define LOOM_CUBLAS_CHECK(call)                                                                   \
  do {                                                                                            \
    cublasStatus_t st_ = (call);                                                                  \
    LOOM_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "{} failed at {}:{}: {}", #call, __FILE__, __LINE__, \
               cublasLtGetStatusName(st_));                                                       \
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

// Descriptors live for one call and are destroyed on every path out of it, a throw included.
struct OpDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~OpDesc() {
    if (d) cublasLtMatmulDescDestroy(d);
  }
};
struct Layout {
  cublasLtMatrixLayout_t d = nullptr;
  ~Layout() {
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};
struct Preference {
  cublasLtMatmulPreference_t d = nullptr;
  ~Preference() {
    if (d) cublasLtMatmulPreferenceDestroy(d);
  }
};

cublasLtEpilogue_t lt_epilogue(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::none:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case LtEpilogue::bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case LtEpilogue::gelu_aux:
      return CUBLASLT_EPILOGUE_GELU_AUX;
    case LtEpilogue::gelu_aux_bias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case LtEpilogue::dgelu:
      return CUBLASLT_EPILOGUE_DGELU;
    case LtEpilogue::bgrada:
      return CUBLASLT_EPILOGUE_BGRADA;
    case LtEpilogue::bgradb:
      return CUBLASLT_EPILOGUE_BGRADB;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// C is bf16, or fp32 where c_f32 (then no bias and no GELU): the shapes come from gemm_plan
// (gemm_plan_batched for a strided batch of more than one; gemm_plan_bias_grad with bias_grad).
// Returns false, having run nothing, where cuBLASLt has no algorithm for a bias gradient's
// epilogue (the caller sums the bias on its own); every other refusal is an error.
bool gemm_epilogue(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
                   const bf16* B, int ldb, float beta, void* C, bool c_f32, int ldc, const bf16* bias, Gelu gelu,
                   const bf16* aux, const GemmBatch& batch, cudaStream_t s, float* bias_grad = nullptr,
                   BiasGradOf of = BiasGradOf::a) {
  const LtGemm g = bias_grad ? gemm_plan_bias_grad(trans_a, trans_b, M, N, K, lda, ldb, ldc, of)
                   : batch.count > 1
                       ? gemm_plan_batched(trans_a, trans_b, M, N, K, lda, ldb, ldc, c_f32, batch)
                       : gemm_plan(trans_a, trans_b, M, N, K, lda, ldb, ldc, bias != nullptr, gelu, c_f32);
  const std::string what = g.describe(M, N, K);
  auto check = [&](cublasStatus_t st, const char* call) {
    LOOM_CHECK(st == CUBLAS_STATUS_SUCCESS, "cuBLASLt {} failed for the GEMM {}: {} ({})", call, what,
               cublasLtGetStatusName(st), cublasLtGetStatusString(st));
  };
  auto lt = static_cast<cublasLtHandle_t>(ctx.handle());
  OpDesc op;
  check(cublasLtMatmulDescCreate(&op.d, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  const cublasOperation_t first = g.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t second = g.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_TRANSA, &first, sizeof(first)), "TRANSA");
  check(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_TRANSB, &second, sizeof(second)), "TRANSB");
  const cublasLtEpilogue_t epi = lt_epilogue(g.epilogue);
  check(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)), "EPILOGUE");
  if (g.epilogue == LtEpilogue::bias || g.epilogue == LtEpilogue::gelu_aux_bias) {
    const cudaDataType_t bias_type = CUDA_R_16BF;
    check(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)),
          "BIAS_DATA_TYPE");
    check(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)), "BIAS_POINTER");
  }
  if (bias_grad) {  // the sums in fp32, C's type
    const cudaDataType_t grad_type = CUDA_R_32F;
    check(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &grad_type, sizeof(grad_type)),
          "BIAS_DATA_TYPE");
    check(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_grad, sizeof(bias_grad)),
          "BIAS_POINTER");
  }
  if (g.aux_ld) {
    const cudaDataType_t aux_type = CUDA_R_16BF;
    check(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)),
          "EPILOGUE_AUX_POINTER");
    check(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g.aux_ld, sizeof(g.aux_ld)),
          "EPILOGUE_AUX_LD");
    check(
        cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof(aux_type)),
        "EPILOGUE_AUX_DATA_TYPE");
  }
  Layout lf, ls, lc;
  check(cublasLtMatrixLayoutCreate(&lf.d, CUDA_R_16BF, uint64_t(g.first.rows), uint64_t(g.first.cols), g.first.ld),
        "MatrixLayoutCreate (first)");
  check(cublasLtMatrixLayoutCreate(&ls.d, CUDA_R_16BF, uint64_t(g.second.rows), uint64_t(g.second.cols), g.second.ld),
        "MatrixLayoutCreate (second)");
  check(cublasLtMatrixLayoutCreate(&lc.d, c_f32 ? CUDA_R_32F : CUDA_R_16BF, uint64_t(g.c.rows), uint64_t(g.c.cols),
                                   g.c.ld),
        "MatrixLayoutCreate (C)");
  if (g.batch > 1) {  // every layout holds the batch's count and its own stride
    for (auto [l, stride] : {std::pair{lf.d, g.first.batch_stride}, std::pair{ls.d, g.second.batch_stride},
                             std::pair{lc.d, g.c.batch_stride}}) {
      check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &g.batch, sizeof(g.batch)),
            "BATCH_COUNT");
      check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
            "STRIDED_BATCH_OFFSET");
    }
  }
  Preference pref;
  check(cublasLtMatmulPreferenceCreate(&pref.d), "MatmulPreferenceCreate");
  const size_t ws = ctx.workspace_bytes();
  check(cublasLtMatmulPreferenceSetAttribute(pref.d, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
        "MAX_WORKSPACE_BYTES");
  // The heuristics assume 256-byte aligned operands unless told otherwise: give them each
  // pointer's real alignment, so they never choose a kernel these buffers cannot feed.
  // In a batch, every matrix's: the base's and the stride's in bytes, whichever is less.
  auto aligned = [&](const void* p, int64_t stride, size_t elem) {
    const uint32_t a = pointer_alignment(p);
    if (g.batch == 1) return a;
    const uint32_t s = pointer_alignment(reinterpret_cast<const void*>(uintptr_t(stride) * elem));
    return a < s ? a : s;
  };
  const uint32_t align_first = aligned(B, g.first.batch_stride, 2), align_second = aligned(A, g.second.batch_stride, 2),
                 align_c = aligned(C, g.c.batch_stride, c_f32 ? 4 : 2);
  auto set_alignment = [&](cublasLtMatmulPreferenceAttributes_t attr, const uint32_t& bytes, const char* name) {
    check(cublasLtMatmulPreferenceSetAttribute(pref.d, attr, &bytes, sizeof(bytes)), name);
  };
  set_alignment(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_first, "MIN_ALIGNMENT_A_BYTES");
  set_alignment(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_second, "MIN_ALIGNMENT_B_BYTES");
  set_alignment(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c, "MIN_ALIGNMENT_C_BYTES");
  set_alignment(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c, "MIN_ALIGNMENT_D_BYTES");
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  check(cublasLtMatmulAlgoGetHeuristic(lt, op.d, lf.d, ls.d, lc.d, lc.d, pref.d, 1, &heur, &found),
        "MatmulAlgoGetHeuristic");
  if (found == 0 && bias_grad) return false;
  LOOM_CHECK(found > 0, "cuBLASLt has no algorithm for the GEMM {} (operand alignments {}, {}, {} bytes)", what,
             align_first, align_second, align_c);
  const float alpha = 1.0f;
  check(cublasLtMatmul(lt, op.d, &alpha, B, lf.d, A, ls.d, &beta, C, lc.d, C, lc.d, &heur.algo, ctx.workspace(), ws, s),
        "Matmul");
  return true;
}

}  // namespace

void gemm(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
          const bf16* B, int ldb, float beta, bf16* C, int ldc, const bf16* bias, cudaStream_t s) {
  gemm_epilogue(ctx, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, false, ldc, bias, Gelu::none, nullptr, {}, s);
}

void gemm_f32out(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
                 const bf16* B, int ldb, float beta, float* C, int ldc, cudaStream_t s) {
  gemm_epilogue(ctx, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, true, ldc, nullptr, Gelu::none, nullptr, {},
                s);
}

bool gemm_f32out_bias_grad(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A,
                           int lda, const bf16* B, int ldb, float beta, float* C, int ldc, BiasGradOf of,
                           float* bias_grad, cudaStream_t s) {
  return gemm_epilogue(ctx, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, true, ldc, nullptr, Gelu::none, nullptr,
                       {}, s, bias_grad, of);
}

void gemm_batched(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
                  const bf16* B, int ldb, float beta, bf16* C, int ldc, const GemmBatch& batch, cudaStream_t s) {
  gemm_epilogue(ctx, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, false, ldc, nullptr, Gelu::none, nullptr,
                batch, s);
}

void gemm_batched_f32out(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A,
                         int lda, const bf16* B, int ldb, float beta, float* C, int ldc, const GemmBatch& batch,
                         cudaStream_t s) {
  gemm_epilogue(ctx, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, true, ldc, nullptr, Gelu::none, nullptr, batch,
                s);
}

void gemm_gelu(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
               const bf16* B, int ldb, bf16* C, int ldc, const bf16* bias, bf16* pre, cudaStream_t s) {
  gemm_epilogue(ctx, trans_a, trans_b, M, N, K, A, lda, B, ldb, 0.0f, C, false, ldc, bias, Gelu::forward, pre, {}, s);
}

void gemm_dgelu(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
                const bf16* B, int ldb, bf16* C, int ldc, const bf16* pre, cudaStream_t s) {
  gemm_epilogue(ctx, trans_a, trans_b, M, N, K, A, lda, B, ldb, 0.0f, C, false, ldc, nullptr, Gelu::backward, pre, {},
                s);
}

}  // namespace loom::cuda
