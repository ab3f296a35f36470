// The host side of the CUDA emulation: the runtime calls the kernels' launch code and the
// kernel tests make (memory, copies, errors, function attributes, streams, events) and the launch
// itself, whose configuration is checked against sm_90's limits on the calling thread. Work on
// the legacy stream (nullptr) runs at once on the calling thread; every created stream has a
// worker thread of its own that runs its work in issue order, asynchronously to the host, and
// events and cudaStreamWaitEvent order streams as a device's do (kernels/emu/stream.cpp). A fault
// in queued work is sticky: every later synchronization and error query reports it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/emu/bf16.h"
#include "kernels/emu/device.h"

namespace loom::emu::rt {

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorCapturedEvent = 907,
};
enum { cudaStreamDefault = 0, cudaStreamNonBlocking = 1 };
enum { cudaEventDefault = 0, cudaEventDisableTiming = 2 };
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct CUevent_st;
using cudaEvent_t = CUevent_st*;
struct CUgraph_st;
using cudaGraph_t = CUgraph_st*;
struct CUgraphExec_st;
using cudaGraphExec_t = CUgraphExec_st*;
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2
};
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int major, minor, multiProcessorCount, clockRate;
};

cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaMalloc(void** p, size_t bytes);
template <class T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFree(void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s = nullptr);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaGetDeviceCount(int* n);
// The emulated device's memory: the host's (what it has available, of its physical memory), or
// LOOM_EMULATED_DEVICE_MB's less what is allocated (emu::device_memory_configured).
cudaError_t cudaMemGetInfo(size_t* free, size_t* total);
cudaError_t cudaGetDevice(int* d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d);
cudaError_t cudaMallocHost(void** p, size_t bytes);
template <class T>
cudaError_t cudaMallocHost(T** p, size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b);
// Stream capture and graphs (kernels/emu/graph.cpp): the global capture mode only, one stream
// per capture.
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
// Raises a kernel's dynamic shared memory limit (up to sm_90's 227 KiB per block).
cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attr, int value);
template <class... P>
cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

}  // namespace loom::emu::rt

using namespace loom::emu::rt;

namespace loom::emu {

// sm_90's limits, which every launch is checked against.
struct DeviceLimits {
  static constexpr unsigned threads_per_block = 1024;
  static constexpr unsigned block_dim[3] = {1024, 1024, 64};
  static constexpr unsigned long long grid_dim[3] = {2147483647ull, 65535, 65535};
  static constexpr size_t shared_default = 48 * 1024;
  static constexpr size_t shared_optin = 227 * 1024;
};

struct LaunchConfig {
  dim3 grid, block;
  size_t dynamic_shared = 0;
  cudaStream_t stream = nullptr;
  const char* name = "";
  const void* kernel = nullptr;
  const char* signature = "";  // kernel_signature's: the instantiation, for counts (counts.h)
};
// The compiler's name of this function, which spells out K with its template arguments
// ("... [with auto K = loom::cuda::attention_forward_flash_kernel<64>]").
template <auto K>
const char* kernel_signature() {
  return __PRETTY_FUNCTION__;
}
// Checks the configuration (a failure becomes the thread's last error, as a bad launch is on
// a device), then runs every block: `thread(ctx)` runs one emulated thread's kernel body.
void launch(const LaunchConfig& cfg, void (*thread)(void*), void* ctx);
// The two halves of launch: the check (false when the launch must not run: a bad configuration,
// or a LaunchRecorder that recorded it) and the blocks (a fault becomes the thread's last error).
bool launch_check(const LaunchConfig& cfg);
void launch_blocks(const LaunchConfig& cfg, void (*thread)(void*), void* ctx);
// Runs `work` in the order of stream s: at once on the legacy stream (nullptr), else on s's
// worker after everything issued to s before it.
void stream_enqueue(cudaStream_t s, std::function<void()> work);

// Device allocations that queued work will write (a kernel's non-const pointer arguments, an
// async copy's or memset's destination, a GEMM's D). A synchronous copy that reads one before
// that work ran is an error naming the writer, where a device would hand the host stale bytes:
// the host read it without a synchronization that covers its producer.
void allocation_add(void* p, size_t bytes);
void allocation_remove(void* p);
size_t allocated_bytes();  // of the allocations held now
// The emulated device's memory: LOOM_EMULATED_DEVICE_MB where set (a device of that many MiB:
// cudaMalloc past it fails and cudaMemGetInfo counts down from it, so a run can be tried on a
// small device), else 0: the host's memory, as before.
size_t device_memory_configured();
class PendingWrites {
 public:
  PendingWrites() = default;
  PendingWrites(const PendingWrites&) = delete;
  PendingWrites& operator=(const PendingWrites&) = delete;
  ~PendingWrites() { done(); }
  void add(const void* p, const char* writer);  // p's allocation, if p is device memory
  void done();                                  // the work ran
 private:
  std::vector<uintptr_t> allocs_;
};
bool is_device_memory(const void* p);  // inside a live cudaMalloc allocation
// The writer of queued work still to write the allocation holding p ("" if none).
std::string pending_writer(const void* p);
// Host synchronizations since the process started (stream, event, device, synchronous copies).
uint64_t host_syncs();
// Device work the host issued one call at a time (kernels, GEMMs, async copies and memsets: what
// a launch gap is paid on), and graph launches; work a graph replays is neither.
uint64_t device_ops();
uint64_t graph_launches();
void count_device_op();
// Stream capture (graph.cpp): takes `work` into s's graph when s captures (true: not to run now);
// whether s captures; and, while any stream captures, refuses `call` (an implicit
// synchronization or allocation) with `code`, invalidating the captures (cudaSuccess: allowed).
bool capture_take(cudaStream_t s, std::function<void()>& work, bool control);
bool stream_capturing(cudaStream_t s);
cudaError_t capture_refuse(cudaError_t code, const std::string& call);
// Queues a graph's replay on s, uncounted as a device op.
void stream_enqueue_graph(cudaStream_t s, std::function<void()> work);

// LOOM_LAUNCH(kernel, grid, block, smem, stream)(args...): the arguments convert to the
// kernel's parameter types once, as a launch's do, and every thread calls the kernel on them.
template <class... P>
struct Launcher {
  void (*kernel)(P...);
  LaunchConfig cfg;
  template <class T>
  void note_write(PendingWrites& w, const T& arg) const {
    if constexpr (std::is_pointer_v<T> && !std::is_const_v<std::remove_pointer_t<T>>) w.add(arg, cfg.name);
  }
  template <class... A>
  void operator()(A&&... a) const {
    struct Call {
      void (*kernel)(P...);
      std::tuple<P...> args;
    };
    if (!launch_check(cfg)) return;
    if (!cfg.stream) count_device_op();
    auto call = std::make_shared<Call>(Call{kernel, std::tuple<P...>(std::forward<A>(a)...)});
    void (*body)(void*) = [](void* c) { std::apply(static_cast<Call*>(c)->kernel, static_cast<Call*>(c)->args); };
    if (!cfg.stream) return launch_blocks(cfg, body, call.get());
    auto writes = std::make_shared<PendingWrites>();
    // Captured work's writes are not tracked: a graph's replay runs it (see graph.cpp).
    if (!stream_capturing(cfg.stream))
      std::apply([&](const auto&... arg) { (note_write(*writes, arg), ...); }, call->args);
    stream_enqueue(cfg.stream, [cfg = cfg, call, body, writes] {
      launch_blocks(cfg, body, call.get());
      writes->done();
    });
  }
};
template <class... P>
Launcher<P...> make_launcher(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, const char* name,
                             const char* signature) {
  return {kernel, LaunchConfig{grid, block, smem, s, name, reinterpret_cast<const void*>(kernel), signature}};
}
unsigned char* dynamic_shared();
// Internal to the emulation: the error cudaGetLastError returns next, with its message, and
// the dynamic shared memory a kernel may launch with.
void set_last_error(cudaError_t e, const std::string& message);
// The device's sticky fault (the first failure of queued work; cudaSuccess while there is none)
// and its message for its code (nullptr for another code).
cudaError_t device_fault();
const char* device_fault_message(cudaError_t e);
void count_host_sync();
// Waits for every stream's queued work, uncounted; the device's fault.
cudaError_t drain_all();
size_t dynamic_shared_limit(const void* kernel);
void set_dynamic_shared_limit(const void* kernel, size_t bytes);

// While a LaunchRecorder lives on a thread, its launches are checked against the device's
// limits and recorded, and nothing runs: the wrappers' host code can be walked at shapes far
// too large to execute here (a 70B model), pointers unused.
struct LaunchRecord {
  std::string kernel;
  dim3 grid, block;
  size_t dynamic_shared;
};
class LaunchRecorder {
 public:
  LaunchRecorder();
  ~LaunchRecorder();
  LaunchRecorder(const LaunchRecorder&) = delete;
  LaunchRecorder& operator=(const LaunchRecorder&) = delete;
  const std::vector<LaunchRecord>& records() const { return records_; }
  void add(LaunchRecord r) { records_.push_back(std::move(r)); }

 private:
  std::vector<LaunchRecord> records_;
  LaunchRecorder* outer_;
};
LaunchRecorder* launch_recorder();

// Launches and emulated threads run since the process started (a test reads them to know the
// emulation ran what it claims).
struct Counters {
  uint64_t launches = 0, blocks = 0, threads = 0;
};
Counters counters();

}  // namespace loom::emu

#define LOOM_LAUNCH(kernel, grid, block, smem, stream)                               \
  ::loom::emu::make_launcher(kernel, dim3(grid), dim3(block), smem, stream, #kernel, \
                             ::loom::emu::kernel_signature<kernel>())
#define LOOM_DYNAMIC_SHARED(T, name, align) T* name = reinterpret_cast<T*>(::loom::emu::dynamic_shared())
