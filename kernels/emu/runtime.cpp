// The CUDA emulation's runtime calls: device memory is host memory (aligned as cudaMalloc's,
// sized exactly so AddressSanitizer sees an overrun, and filled with NaN bytes until written),
// copies and memsets run at once, errors carry a message that names what was wrong.
#include "kernels/emu/runtime.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace loom::emu {

namespace {
// What cudaGetLastError returns next (the latest error, as CUDA's), and the message of the
// latest error of each code, which cudaGetErrorString gives for that code.
thread_local cudaError_t last_error = cudaSuccess;
thread_local cudaError_t message_code = cudaSuccess;
thread_local std::string last_message;
}  // namespace

void set_last_error(cudaError_t e, const std::string& message) {
  last_error = e;
  message_code = e;
  last_message = message;
}

size_t device_memory_configured() {  // read each time: a test sizes the device run by run
  const char* s = std::getenv("LOOM_EMULATED_DEVICE_MB");
  if (!s || !*s) return 0;
  char* end = nullptr;
  const double mb = std::strtod(s, &end);
  if (*end != '\0' || !(mb > 0))
    throw std::runtime_error(std::string("LOOM_EMULATED_DEVICE_MB = '") + s +
                             "' is not a positive number of MiB; set it to the emulated device's size, or unset it");
  return size_t(mb * 1024 * 1024);
}

}  // namespace loom::emu

namespace loom::emu::rt {

cudaError_t cudaGetLastError() {
  const cudaError_t e = emu::last_error;
  emu::last_error = cudaSuccess;
  return e != cudaSuccess ? e : emu::device_fault();
}
cudaError_t cudaPeekAtLastError() {
  return emu::last_error != cudaSuccess ? emu::last_error : emu::device_fault();
}

const char* cudaGetErrorString(cudaError_t e) {
  if (e != cudaSuccess && e == emu::message_code) return emu::last_message.c_str();
  if (const char* m = emu::device_fault_message(e)) return m;
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalState:
      return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent:
      return "operation not permitted on an event last recorded in a capturing stream";
  }
  return "unknown error";
}

namespace {
cudaError_t poisoned_alloc(void** p, size_t bytes, const char* call) {
  *p = nullptr;
  if (posix_memalign(p, 256, bytes ? bytes : 1) != 0) {
    emu::set_last_error(cudaErrorMemoryAllocation,
                        std::string(call) + " of " + std::to_string(bytes) + " bytes failed");
    return cudaErrorMemoryAllocation;
  }
  std::memset(*p, 0xff, bytes);  // NaN in fp32 and bf16 until something is written
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (emu::capture_refuse(cudaErrorStreamCaptureUnsupported, "cudaMalloc") != cudaSuccess)
    return cudaErrorStreamCaptureUnsupported;
  if (const size_t total = emu::device_memory_configured(); total && emu::allocated_bytes() + bytes > total) {
    *p = nullptr;
    emu::set_last_error(cudaErrorMemoryAllocation,
                        "cudaMalloc of " + std::to_string(bytes) + " bytes: the emulated device's " +
                            std::to_string(total) + " bytes (LOOM_EMULATED_DEVICE_MB) have " +
                            std::to_string(total - std::min(total, emu::allocated_bytes())) + " free");
    return cudaErrorMemoryAllocation;
  }
  const cudaError_t e = poisoned_alloc(p, bytes, "cudaMalloc");
  if (e == cudaSuccess) emu::allocation_add(*p, bytes);
  return e;
}
// As a device's, cudaFree waits for the device's queued work first (it may still use p).
cudaError_t cudaFree(void* p) {
  if (emu::capture_refuse(cudaErrorStreamCaptureUnsupported, "cudaFree") != cudaSuccess)
    return cudaErrorStreamCaptureUnsupported;
  const cudaError_t e = emu::drain_all();
  if (p) emu::allocation_remove(p);
  std::free(p);
  return e;
}
// Synchronous with respect to the host only: as on a device, it does not wait for work queued on
// created (non-blocking) streams, so reading memory such work is still to write is an error.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (emu::capture_refuse(cudaErrorStreamCaptureUnsupported, "cudaMemcpy") != cudaSuccess)
    return cudaErrorStreamCaptureUnsupported;
  if (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice ||
      (kind == cudaMemcpyDefault && emu::is_device_memory(src)))
    emu::count_host_sync();
  if (bytes) {
    if (const std::string w = emu::pending_writer(src); !w.empty()) {
      emu::set_last_error(cudaErrorInvalidValue,
                          "cudaMemcpy reads device memory that queued work (" + w +
                              ") is still to write: synchronize with the stream that produces it first");
      return cudaErrorInvalidValue;
    }
    std::memmove(dst, src, bytes);
  }
  return emu::device_fault();
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (emu::capture_refuse(cudaErrorStreamCaptureUnsupported, "cudaMemset") != cudaSuccess)
    return cudaErrorStreamCaptureUnsupported;
  if (bytes) std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (const size_t device = emu::device_memory_configured()) {
    *total = device;
    *free = device - std::min(device, emu::allocated_bytes());
    return cudaSuccess;
  }
  const long page = sysconf(_SC_PAGESIZE);
  *free = size_t(sysconf(_SC_AVPHYS_PAGES)) * size_t(page);
  *total = size_t(sysconf(_SC_PHYS_PAGES)) * size_t(page);
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
  return d == 0 ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (d != 0) return cudaErrorInvalidValue;
  *p = cudaDeviceProp{};
  std::strncpy(p->name, "loom emulated sm_90", sizeof(p->name) - 1);
  p->totalGlobalMem = size_t(80) << 30;
  p->major = 9, p->minor = 0, p->multiProcessorCount = 132, p->clockRate = 1980000;
  return cudaSuccess;
}
// Page-locked memory is host memory here, poisoned like device memory until written.
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  if (emu::capture_refuse(cudaErrorStreamCaptureUnsupported, "cudaMallocHost") != cudaSuccess)
    return cudaErrorStreamCaptureUnsupported;
  return poisoned_alloc(p, bytes, "cudaMallocHost");
}
cudaError_t cudaFreeHost(void* p) {
  if (emu::capture_refuse(cudaErrorStreamCaptureUnsupported, "cudaFreeHost") != cudaSuccess)
    return cudaErrorStreamCaptureUnsupported;
  const cudaError_t e = emu::drain_all();  // as cudaFree: queued copies may still use it
  std::free(p);
  return e;
}

cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      size_t(value) > emu::DeviceLimits::shared_optin) {
    emu::set_last_error(cudaErrorInvalidValue, "cudaFuncSetAttribute: " + std::to_string(value) +
                                                   " bytes of dynamic shared memory is past sm_90's 227 KiB per block");
    return cudaErrorInvalidValue;
  }
  emu::set_dynamic_shared_limit(kernel, size_t(value));
  return cudaSuccess;
}

}  // namespace loom::emu::rt
