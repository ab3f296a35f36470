// The CUDA runtime calls loom's host code makes outside the backend (device and pinned memory,
// streams, events, copies), as a table per device kind: the real runtime's (a build with CUDA)
// and the emulated device's (kernels/emu, every build). Both come from one source,
// runtime/cuda_api.cpp, compiled against the toolkit's headers and against the emulation's. A
// failed call throws with the call and the runtime's words, except `malloc`, whose caller
// words its own out-of-memory message.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/tensor.h"

namespace loom {

struct CudaApi {
  const char* name;                                   // "CUDA" or "emulated CUDA"
  void* (*malloc)(size_t bytes, std::string* error);  // nullptr (and *error) on failure
  void (*free)(void* p);
  void* (*malloc_host)(size_t bytes);  // page-locked
  void (*free_host)(void* p);
  void (*memcpy)(void* dst, const void* src, size_t bytes);  // synchronous, any direction
  void (*memcpy_async)(void* dst, const void* src, size_t bytes, void* stream);
  void (*memset_async)(void* p, int value, size_t bytes, void* stream);
  void* (*stream_create)();  // non-blocking with respect to the legacy stream
  void (*stream_destroy)(void* stream);
  void (*stream_synchronize)(void* stream);
  void* (*event_create)();
  void (*event_destroy)(void* event);
  void (*event_record)(void* event, void* stream);
  void (*event_synchronize)(void* event);
  bool (*event_query)(void* event);  // done
  void (*stream_wait_event)(void* stream, void* event);
  double (*event_elapsed_ms)(void* a, void* b);
  int (*device_count)();
  size_t (*mem_free)();  // bytes the device has free now
};

// The table for a CUDA device kind (cuda or cuda_emulated); cuda in a build without CUDA fails.
const CudaApi& cuda_api(DeviceKind kind);
const CudaApi& cuda_api_emulated();
#if LOOM_HAVE_CUDA
const CudaApi& cuda_api_real();
#endif

// Host synchronizations on the emulated device since the process started: stream, event and
// device synchronizations and synchronous copies from the device (a test counts them per step).
uint64_t cuda_emulated_host_syncs();
// Device work the host issued one call at a time on the emulated device (kernels, GEMMs, async
// copies and memsets), and graph launches, since the process started.
uint64_t cuda_emulated_device_ops();
uint64_t cuda_emulated_graph_launches();

}  // namespace loom
