// The emulated cuBLASLt (kernels/emu/include/cublasLt.h): descriptors and layouts as plain
// data, a heuristic that rejects what the real library has no algorithm for, and a matmul that
// runs in its stream's order: the bf16 operands widened to fp32, multiplied by OpenBLAS (fp32
// accumulation, as cuBLASLt's CUBLAS_COMPUTE_32F), then alpha, beta C, the bias and GELU epilogues
// and the rounding to D's type, per element; BGRADA/BGRADB's bias gradient (the sums over k of
// op(A) or op(B), unscaled) in fp32, each sum over blocks of 256 of k, the blocks added in order.
// What it rejects, each with a message on stderr naming the rule (a few are loom's own, as
// gemm_plan's: nothing here asks for them): a compute type other than fp32; A and B other than
// bf16; C and D of different types; layouts that do not hold op(A) m x k, op(B) k x n and D m x n,
// or leading dimensions shorter than a column; a bias or GELU epilogue with an fp32 D, a bias
// gradient with a bf16 one; a bias, bias gradient or aux epilogue without its pointer; a bias (or
// its gradient) of a type other than D's; any epilogue over a batch; a GELU aux whose leading
// dimension is below m or no multiple of 8; an epilogue it does not compute (only DEFAULT, BIAS,
// GELU_AUX, GELU_AUX_BIAS, DGELU, BGRADA and BGRADB); an alignment preference below the element
// size; and, in cublasLtMatmul, any operand whose address is less aligned than the preferences
// the heuristic chose its algorithm for (256 bytes unless set), which on a GPU is a kernel
// reading vectors past what the pointer allows.
#include "kernels/emu/include/cublasLt.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/gemm_plan.h"
#include "runtime/tensor.h"

namespace loom::emu::rt {

struct cublasLtContext {
  int alive = 1;
};
struct cublasLtMatmulDescOpaque_t {
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  const void* aux = nullptr;
  int64_t aux_ld = 0;
  cudaDataType_t bias_type = CUDA_R_16BF, aux_type = CUDA_R_16BF;
};
struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch = 1;
  int64_t stride = 0;  // elements from one matrix of the batch to the next
};
struct cublasLtMatmulPreferenceOpaque_t {
  uint32_t align[4] = {256, 256, 256, 256};
  size_t workspace = 0;
};

namespace {

std::atomic<uint64_t> n_matmuls{0};

cublasStatus_t refuse(cublasStatus_t s, const std::string& why) {
  std::fprintf(stderr, "emulated cuBLASLt: %s\n", why.c_str());
  return s;
}
size_t type_bytes(cudaDataType_t t) {
  return t == CUDA_R_16BF ? 2 : 4;
}
bool has_bias(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool has_bias_grad(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
}
bool has_aux(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;
}
std::string dims(const cublasLtMatrixLayoutOpaque_t& l) {
  return std::to_string(l.rows) + " x " + std::to_string(l.cols) + " (ld " + std::to_string(l.ld) + ")";
}

// The problem's rules, shared by the heuristic and the matmul.
cublasStatus_t problem_check(const cublasLtMatmulDescOpaque_t& op, const cublasLtMatrixLayoutOpaque_t& a,
                             const cublasLtMatrixLayoutOpaque_t& b, const cublasLtMatrixLayoutOpaque_t& c,
                             const cublasLtMatrixLayoutOpaque_t& d) {
  if (op.epilogue != CUBLASLT_EPILOGUE_DEFAULT && !has_bias(op.epilogue) && !has_aux(op.epilogue) &&
      !has_bias_grad(op.epilogue))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "an epilogue the emulation does not compute");
  if (a.type != CUDA_R_16BF || b.type != CUDA_R_16BF)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "A and B must be bf16 with fp32 compute");
  if (c.type != d.type || c.rows != d.rows || c.cols != d.cols || c.ld != d.ld || c.batch != d.batch ||
      c.stride != d.stride)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "C and D must share type and layout here (D is written over C)");
  if (a.batch != d.batch || b.batch != d.batch)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "the layouts' BATCH_COUNTs differ (" + std::to_string(a.batch) + ", " +
                                                   std::to_string(b.batch) + ", " + std::to_string(d.batch) + ")");
  if (d.batch > 1 && d.stride < d.ld * int64_t(d.cols))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "D's STRIDED_BATCH_OFFSET " + std::to_string(d.stride) +
                                                   " makes the batch's outputs overlap (a matrix is " +
                                                   std::to_string(d.ld * int64_t(d.cols)) + " elements)");
  const uint64_t m = d.rows, n = d.cols;
  const uint64_t ar = op.trans_a == CUBLAS_OP_T ? a.cols : a.rows, ak = op.trans_a == CUBLAS_OP_T ? a.rows : a.cols;
  const uint64_t bk = op.trans_b == CUBLAS_OP_T ? b.cols : b.rows, bc = op.trans_b == CUBLAS_OP_T ? b.rows : b.cols;
  if (ar != m || bc != n || ak != bk)
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  "op(A) " + dims(a) + " times op(B) " + dims(b) + " does not make D " + dims(d));
  if (d.batch > 1 && op.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "the emulation computes no epilogue over a batch");
  if (d.type == CUDA_R_32F && op.epilogue != CUBLASLT_EPILOGUE_DEFAULT && !has_bias_grad(op.epilogue))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "no bias or GELU epilogue with an fp32 D and bf16 A and B");
  if (has_bias_grad(op.epilogue) && d.type != CUDA_R_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "the emulation sums a bias gradient only beside an fp32 D");
  if ((has_bias(op.epilogue) || has_bias_grad(op.epilogue)) && op.bias_type != d.type)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "the bias type must be D's");
  if (has_aux(op.epilogue)) {
    if (op.aux_type != CUDA_R_16BF) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "the GELU aux must be bf16");
    if (op.aux_ld < int64_t(m) || op.aux_ld % 8 != 0)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "EPILOGUE_AUX_LD " + std::to_string(op.aux_ld) +
                                                     " must be at least m = " + std::to_string(m) +
                                                     " and a multiple of 8");
  }
  return CUBLAS_STATUS_SUCCESS;
}

using cuda::pointer_alignment;
using loom::bf16_to_f32;
using loom::f32_to_bf16;

// A column-major bf16 matrix, widened into a packed fp32 one (ld = rows).
std::vector<float> widen(const void* p, const cublasLtMatrixLayoutOpaque_t& l) {
  std::vector<float> out(l.rows * l.cols);
  const auto* h = static_cast<const uint16_t*>(p);
  for (uint64_t j = 0; j < l.cols; ++j)
    for (uint64_t i = 0; i < l.rows; ++i) out[i + j * l.rows] = bf16_to_f32(h[i + j * uint64_t(l.ld)]);
  return out;
}
float gelu(float x) {
  const float u = 0.7978845608f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(u));
}
float gelu_grad(float x) {
  const float u = 0.7978845608f * (x + 0.044715f * x * x * x), t = std::tanh(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);
}

// Matrix `batch` of a strided batch.
template <class P>
P* offset(P* p, const cublasLtMatrixLayoutOpaque_t& l, int32_t batch) {
  using Byte = std::conditional_t<std::is_const_v<P>, const char, char>;
  return reinterpret_cast<P*>(reinterpret_cast<Byte*>(p) + int64_t(batch) * l.stride * int64_t(type_bytes(l.type)));
}

// One matrix of a batch: D = alpha op(A) op(B) + beta C with the epilogue, per element.
void matmul_one(const cublasLtMatmulDescOpaque_t& o, float a, float bt, const void* A,
                const cublasLtMatrixLayoutOpaque_t& lA, const void* B, const cublasLtMatrixLayoutOpaque_t& lB,
                const void* C, void* D, const cublasLtMatrixLayoutOpaque_t& lD) {
  const int m = int(lD.rows), n = int(lD.cols);
  const int k = int(o.trans_a == CUBLAS_OP_T ? lA.rows : lA.cols);
  const std::vector<float> fa = widen(A, lA), fb = widen(B, lB);
  std::vector<float> acc(size_t(m) * n);
  cblas_sgemm(CblasColMajor, o.trans_a == CUBLAS_OP_T ? CblasTrans : CblasNoTrans,
              o.trans_b == CUBLAS_OP_T ? CblasTrans : CblasNoTrans, m, n, k, a, fa.data(), int(lA.rows), fb.data(),
              int(lB.rows), 0.0f, acc.data(), m);
  const bool f32 = lD.type == CUDA_R_32F;
  const auto* bias = static_cast<const uint16_t*>(o.bias);
  auto* aux = static_cast<uint16_t*>(const_cast<void*>(o.aux));
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      const size_t at = size_t(i) + size_t(j) * size_t(lD.ld);
      float x = acc[size_t(i) + size_t(j) * m];
      if (bt != 0.0f)
        x += bt * (f32 ? static_cast<const float*>(C)[at] : bf16_to_f32(static_cast<const uint16_t*>(C)[at]));
      if (has_bias(o.epilogue)) x += bf16_to_f32(bias[i]);
      if (o.epilogue == CUBLASLT_EPILOGUE_GELU_AUX || o.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
        aux[size_t(i) + size_t(j) * o.aux_ld] = f32_to_bf16(x);
        x = gelu(x);
      } else if (o.epilogue == CUBLASLT_EPILOGUE_DGELU) {
        x *= gelu_grad(bf16_to_f32(aux[size_t(i) + size_t(j) * o.aux_ld]));
      }
      if (f32)
        static_cast<float*>(D)[at] = x;
      else
        static_cast<uint16_t*>(D)[at] = f32_to_bf16(x);
    }
  if (has_bias_grad(o.epilogue)) {
    // Sum r over k of op(A) (BGRADA: m sums) or op(B) (BGRADB: n sums), widened from bf16: each
    // block of 256 of k in order, then the blocks in order (an order fixed by the shape).
    const bool of_a = o.epilogue == CUBLASLT_EPILOGUE_BGRADA;
    const std::vector<float>& src = of_a ? fa : fb;
    const bool trans = of_a ? o.trans_a == CUBLAS_OP_T : o.trans_b == CUBLAS_OP_T;
    const int64_t ld = int64_t(of_a ? lA.rows : lB.rows), sums = of_a ? m : n;
    auto* out = static_cast<float*>(const_cast<void*>(o.bias));
    for (int64_t r = 0; r < sums; ++r) {
      float total = 0.0f;
      for (int p0 = 0; p0 < k; p0 += 256) {
        float block = 0.0f;
        for (int p = p0; p < std::min(k, p0 + 256); ++p)
          block += of_a ? src[size_t(trans ? p + r * ld : r + p * ld)] : src[size_t(trans ? r + p * ld : p + r * ld)];
        total += block;
      }
      out[r] = total;
    }
  }
}

}  // namespace

const char* cublasLtGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
const char* cublasLtGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an unsupported value or parameter was passed to the function";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
  }
  return "unknown status";
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
  if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "only fp32 compute and scale are emulated");
  *d = new cublasLtMatmulDescOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t bytes) {
  auto take = [&](auto& field) {
    if (bytes != sizeof(field)) return refuse(CUBLAS_STATUS_INVALID_VALUE, "attribute of the wrong size");
    std::memcpy(&field, buf, bytes);
    return CUBLAS_STATUS_SUCCESS;
  };
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return take(d->trans_a);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return take(d->trans_b);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return take(d->epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return take(d->bias);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      return take(d->aux);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      return take(d->aux_ld);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
      return take(d->aux_type);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      return take(d->bias_type);
  }
  return refuse(CUBLAS_STATUS_INVALID_VALUE, "unknown matmul descriptor attribute");
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (type != CUDA_R_16BF && type != CUDA_R_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "only bf16 and fp32 matrices are emulated");
  if (rows == 0 || cols == 0 || ld < int64_t(rows))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "a layout of " + std::to_string(rows) + " x " + std::to_string(cols) +
                                                   " with ld " + std::to_string(ld) + " (ld must be at least rows)");
  *l = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t bytes) {
  if (!l || !buf) return refuse(CUBLAS_STATUS_INVALID_VALUE, "a null layout or attribute buffer");
  if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT) {
    if (bytes != sizeof(int32_t)) return refuse(CUBLAS_STATUS_INVALID_VALUE, "BATCH_COUNT is an int32_t");
    std::memcpy(&l->batch, buf, bytes);
    if (l->batch < 1) return refuse(CUBLAS_STATUS_INVALID_VALUE, "a BATCH_COUNT below 1");
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET) {
    if (bytes != sizeof(int64_t)) return refuse(CUBLAS_STATUS_INVALID_VALUE, "STRIDED_BATCH_OFFSET is an int64_t");
    std::memcpy(&l->stride, buf, bytes);
    return CUBLAS_STATUS_SUCCESS;
  }
  return refuse(CUBLAS_STATUS_INVALID_VALUE, "a matrix layout attribute the emulation does not know");
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = new cublasLtMatmulPreferenceOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t bytes) {
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
    if (bytes != sizeof(size_t)) return refuse(CUBLAS_STATUS_INVALID_VALUE, "workspace preference size");
    std::memcpy(&p->workspace, buf, bytes);
    return CUBLAS_STATUS_SUCCESS;
  }
  const int i = int(attr) - int(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES);
  if (i < 0 || i > 3 || bytes != sizeof(uint32_t))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "unknown matmul preference attribute");
  std::memcpy(&p->align[i], buf, bytes);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* found) {
  *found = 0;
  if (!h || !op || !a || !b || !c || !d || !pref || requested < 1)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "a null handle or descriptor");
  if (const cublasStatus_t s = problem_check(*op, *a, *b, *c, *d); s != CUBLAS_STATUS_SUCCESS) return s;
  const size_t elem[4] = {type_bytes(a->type), type_bytes(b->type), type_bytes(c->type), type_bytes(d->type)};
  for (int i = 0; i < 4; ++i)
    if (pref->align[i] < elem[i]) {
      refuse(CUBLAS_STATUS_NOT_SUPPORTED, "an alignment preference below the element size");
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
  results[0] = cublasLtMatmulHeuristicResult_t{};
  std::memcpy(results[0].algo.align, pref->align, sizeof(pref->align));
  results[0].algo.workspace = pref->workspace;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t la, const void* B, cublasLtMatrixLayout_t lb, const void* beta,
                              const void* C, cublasLtMatrixLayout_t lc, void* D, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  if (!h || !op || !la || !lb || !lc || !ld || !algo || !alpha || !beta)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "a null handle, descriptor, algorithm or scalar");
  if (const cublasStatus_t s = problem_check(*op, *la, *lb, *lc, *ld); s != CUBLAS_STATUS_SUCCESS) return s;
  if (C != D) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "only D written over C is emulated");
  const void* ptrs[4] = {A, B, C, D};
  const cublasLtMatrixLayoutOpaque_t* lays[4] = {la, lb, lc, ld};
  for (int i = 0; i < 4; ++i)
    for (int32_t batch = 0; batch < lays[i]->batch; ++batch)  // every matrix of a batch
      if (const void* p = offset(ptrs[i], *lays[i], batch); pointer_alignment(p) < algo->align[i])
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                      std::string("operand ") + "ABCD"[i] + (batch ? " (batch " + std::to_string(batch) + ")" : "") +
                          " is " + std::to_string(pointer_alignment(p)) +
                          "-byte aligned, but the algorithm was chosen for " + std::to_string(algo->align[i]) +
                          " bytes (set CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*)");
  if (workspace_bytes > 0 && !workspace) return refuse(CUBLAS_STATUS_INVALID_VALUE, "a null workspace");
  if (has_bias(op->epilogue) && !op->bias) return refuse(CUBLAS_STATUS_INVALID_VALUE, "a bias epilogue without a bias");
  if (has_bias_grad(op->epilogue) && !op->bias)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "a bias gradient epilogue without its output (BIAS_POINTER)");
  if (has_aux(op->epilogue) && !op->aux) return refuse(CUBLAS_STATUS_INVALID_VALUE, "a GELU epilogue without its aux");
  if (launch_recorder()) return CUBLAS_STATUS_SUCCESS;  // walking shapes: nothing runs
  const float a = *static_cast<const float*>(alpha), bt = *static_cast<const float*>(beta);
  const cublasLtMatmulDescOpaque_t o = *op;  // descriptors may go once the call returns
  const cublasLtMatrixLayoutOpaque_t lA = *la, lB = *lb, lD = *ld;
  auto writes = std::make_shared<PendingWrites>();
  const bool tracked = stream && !stream_capturing(stream);  // a graph's replay is not tracked
  if (tracked) writes->add(D, "cublasLtMatmul");
  if (tracked && (o.epilogue == CUBLASLT_EPILOGUE_GELU_AUX || o.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS))
    writes->add(o.aux, "cublasLtMatmul");
  if (stream && has_bias_grad(o.epilogue)) writes->add(o.bias, "cublasLtMatmul");
  stream_enqueue(stream, [=] {
    for (int32_t batch = 0; batch < lD.batch; ++batch)
      matmul_one(o, a, bt, offset(A, lA, batch), lA, offset(B, lB, batch), lB, offset(C, lD, batch),
                 offset(D, lD, batch), lD);
    ++n_matmuls;
    writes->done();
  });
  return CUBLAS_STATUS_SUCCESS;
}
uint64_t cublaslt_emulated_matmuls() {
  return n_matmuls.load();
}

}  // namespace loom::emu::rt
