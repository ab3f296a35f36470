// libcublasLt loaded at its first call rather than at every start: its start-up costs about half
// a second, which every loom command paid (twice with the wait-policy re-exec) although only a
// CUDA device ever multiplies through it. These definitions of the functions loom calls stand
// in for the library's at link time and forward to it.
#include <cublasLt.h>
#include <dlfcn.h>

#include "runtime/error.h"

namespace {

#define LOOM_STR2(x) #x
#define LOOM_STR(x) LOOM_STR2(x)

void* library() {
  static void* handle = [] {
    std::string tried;
    // The library CMake found, then the toolkit's soname on the loader's own path.
    for (const char* path : {LOOM_CUBLASLT_PATH, "libcublasLt.so." LOOM_STR(CUBLAS_VER_MAJOR)}) {
      if (!*path) continue;
      if (void* h = ::dlopen(path, RTLD_NOW | RTLD_LOCAL)) return h;
      tried += fmt::format("{}{} ({})", tried.empty() ? "" : ", ", path, ::dlerror());
    }
    loom::fail(
        "cannot load cuBLASLt, which the CUDA GEMMs need: tried {}; install the CUDA toolkit's libraries or "
        "add them to LD_LIBRARY_PATH",
        tried);
  }();
  return handle;
}

template <class F>
F resolve(const char* name) {
  void* s = ::dlsym(library(), name);
  LOOM_CHECK(s, "cuBLASLt has no {}: {}", name, ::dlerror());
  return reinterpret_cast<F>(s);
}

}  // namespace

// Each resolves once; the call goes straight to the library after that.
#define LOOM_FORWARD(name, ...)                          \
  static const auto f = resolve<decltype(&name)>(#name); \
  return f(__VA_ARGS__)

extern "C" {

const char* CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status) {
  LOOM_FORWARD(cublasLtGetStatusName, status);
}
const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) {
  LOOM_FORWARD(cublasLtGetStatusString, status);
}
cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* handle) {
  LOOM_FORWARD(cublasLtCreate, handle);
}
cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t handle) {
  LOOM_FORWARD(cublasLtDestroy, handle);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                                     cudaDataType_t scale) {
  LOOM_FORWARD(cublasLtMatmulDescCreate, desc, compute, scale);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  LOOM_FORWARD(cublasLtMatmulDescDestroy, desc);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                           cublasLtMatmulDescAttributes_t attr, const void* buf,
                                                           size_t bytes) {
  LOOM_FORWARD(cublasLtMatmulDescSetAttribute, desc, attr, buf, bytes);
}
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                                       uint64_t cols, int64_t ld) {
  LOOM_FORWARD(cublasLtMatrixLayoutCreate, layout, type, rows, cols, ld);
}
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  LOOM_FORWARD(cublasLtMatrixLayoutDestroy, layout);
}
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                             cublasLtMatrixLayoutAttribute_t attr, const void* buf,
                                                             size_t bytes) {
  LOOM_FORWARD(cublasLtMatrixLayoutSetAttribute, layout, attr, buf, bytes);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  LOOM_FORWARD(cublasLtMatmulPreferenceCreate, pref);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  LOOM_FORWARD(cublasLtMatmulPreferenceDestroy, pref);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr,
                                                                 const void* buf, size_t bytes) {
  LOOM_FORWARD(cublasLtMatmulPreferenceSetAttribute, pref, attr, buf, bytes);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                                                           cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                           cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                                           cublasLtMatmulPreference_t pref, int requested,
                                                           cublasLtMatmulHeuristicResult_t results[], int* returned) {
  LOOM_FORWARD(cublasLtMatmulAlgoGetHeuristic, handle, op, a, b, c, d, pref, requested, results, returned);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, const void* alpha,
                                           const void* A, cublasLtMatrixLayout_t a, const void* B,
                                           cublasLtMatrixLayout_t b, const void* beta, const void* C,
                                           cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                                           const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                                           cudaStream_t stream) {
  LOOM_FORWARD(cublasLtMatmul, handle, op, alpha, A, a, B, b, beta, C, c, D, d, algo, workspace, workspace_bytes,
               stream);
}

}  // extern "C"
