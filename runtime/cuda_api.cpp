// One source for both tables of runtime/cuda_api.h: compiled into loom_core against the CUDA
// toolkit (cuda_api_real) and into the emulation library against kernels/emu's stand-in headers
// (cuda_api_emulated, LOOM_CUDA_EMULATION).
#include "runtime/cuda_api.h"

#include <cuda_runtime.h>

#include "runtime/cuda_check.h"

namespace loom {

namespace {

cudaStream_t cu(void* s) {
  return static_cast<cudaStream_t>(s);
}
cudaEvent_t ev(void* e) {
  return static_cast<cudaEvent_t>(e);
}

void* api_malloc(size_t bytes, std::string* error) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaSuccess) return p;
  cudaGetLastError();  // not sticky: the caller reports it
  if (error) *error = cudaGetErrorString(e);
  return nullptr;
}
void api_free(void* p) {
  cudaFree(p);
}
void* api_malloc_host(size_t bytes) {
  void* p = nullptr;
  LOOM_CUDA_CHECK(cudaMallocHost(&p, bytes));
  return p;
}
void api_free_host(void* p) {
  cudaFreeHost(p);
}
void api_memcpy(void* dst, const void* src, size_t bytes) {
  LOOM_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}
void api_memcpy_async(void* dst, const void* src, size_t bytes, void* s) {
  LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cu(s)));
}
void api_memset_async(void* p, int value, size_t bytes, void* s) {
  LOOM_CUDA_CHECK(cudaMemsetAsync(p, value, bytes, cu(s)));
}
void* api_stream_create() {
  cudaStream_t s;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}
void api_stream_destroy(void* s) {
  cudaStreamSynchronize(cu(s));
  cudaStreamDestroy(cu(s));
}
void api_stream_synchronize(void* s) {
  LOOM_CUDA_CHECK(cudaStreamSynchronize(cu(s)));
}
void* api_event_create() {
  cudaEvent_t e;
  LOOM_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}
void api_event_destroy(void* e) {
  cudaEventDestroy(ev(e));
}
void api_event_record(void* e, void* s) {
  LOOM_CUDA_CHECK(cudaEventRecord(ev(e), cu(s)));
}
void api_event_synchronize(void* e) {
  LOOM_CUDA_CHECK(cudaEventSynchronize(ev(e)));
}
bool api_event_query(void* e) {
  return cudaEventQuery(ev(e)) == cudaSuccess;
}
void api_stream_wait_event(void* s, void* e) {
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(cu(s), ev(e), 0));
}
double api_event_elapsed_ms(void* a, void* b) {
  LOOM_CUDA_CHECK(cudaEventSynchronize(ev(b)));
  float ms = 0.0f;
  LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, ev(a), ev(b)));
  return double(ms);
}
int api_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}
size_t api_mem_free() {
  size_t free = 0, total = 0;
  LOOM_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

#if defined(LOOM_CUDA_EMULATION)
constexpr const char* kName = "emulated CUDA";
#else
constexpr const char* kName = "CUDA";
#endif
const CudaApi kApi{kName,
                   api_malloc,
                   api_free,
                   api_malloc_host,
                   api_free_host,
                   api_memcpy,
                   api_memcpy_async,
                   api_memset_async,
                   api_stream_create,
                   api_stream_destroy,
                   api_stream_synchronize,
                   api_event_create,
                   api_event_destroy,
                   api_event_record,
                   api_event_synchronize,
                   api_event_query,
                   api_stream_wait_event,
                   api_event_elapsed_ms,
                   api_device_count,
                   api_mem_free};

}  // namespace

#if defined(LOOM_CUDA_EMULATION)
const CudaApi& cuda_api_emulated() {
  return kApi;
}
uint64_t cuda_emulated_host_syncs() {
  return emu::host_syncs();
}
uint64_t cuda_emulated_device_ops() {
  return emu::device_ops();
}
uint64_t cuda_emulated_graph_launches() {
  return emu::graph_launches();
}
#else
const CudaApi& cuda_api_real() {
  return kApi;
}
#endif

}  // namespace loom
