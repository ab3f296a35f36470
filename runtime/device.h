// Streams and events: the order of work on a device. A CPU stream runs work inline, so its
// events are complete the moment they are recorded and carry the host time; a CUDA stream (real
// or emulated, runtime/cuda_api.h) is a cudaStream_t and its events are timed cudaEvents. Layers, parallel code and the step clock
// hand work between compute and communication through these on every device, so none of them
// asks which device it runs on. A Stream is a handle; its owner (a backend, a group) makes and
// destroys the real stream.
#pragma once
#include <chrono>

#include "runtime/tensor.h"

namespace loom {

struct Stream {
  DeviceKind kind = DeviceKind::cpu;
  void* handle = nullptr;  // cudaStream_t
  void synchronize() const;
};
// The CPU's stream: work issued to it has run when the call returns.
const Stream& host_stream();

class Event {
 public:
  explicit Event(DeviceKind kind = DeviceKind::cpu);
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(const Stream& s);
  void synchronize() const;             // the host waits until the stream passed the record
  void wait_on(const Stream& s) const;  // work issued to s from now on runs after the record
  bool done() const;
  // Milliseconds between two recorded events of one device; synchronizes on b.
  static double elapsed_ms(const Event& a, const Event& b);

 private:
  DeviceKind kind_;
  void* ev_ = nullptr;  // cudaEvent_t
  std::chrono::steady_clock::time_point at_{};
};

// Copies `bytes` in the order of stream s: inline on the CPU, cudaMemcpyAsync (any direction)
// on CUDA.
void stream_copy(const Stream& s, void* dst, const void* src, size_t bytes);

// What this build has on the CUDA side, one line each: the runtime and driver versions and
// every visible GPU (name, memory, compute capability); "" without CUDA.
std::string cuda_describe();

// Host floats that a device copies into: page-locked where the device is CUDA (copies run at
// full speed and may be asynchronous), ordinary memory on the CPU. Move-only.
class HostBuffer {
 public:
  HostBuffer() = default;
  ~HostBuffer() { release(); }
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  // At least n floats for copies from `device` (contents not kept).
  void resize(size_t n, DeviceKind device);
  void release();
  float* data() { return p_; }
  size_t size() const { return n_; }

 private:
  float* p_ = nullptr;
  size_t n_ = 0;
  bool pinned_ = false;
  DeviceKind device_ = DeviceKind::cpu;
};

// Streams of a CUDA device (cuda, or the emulated one) for their owners (non-blocking with
// respect to the legacy stream). A real CUDA stream in a build without CUDA fails with a message.
Stream cuda_stream_create(DeviceKind kind);
void cuda_stream_destroy(Stream& s);

}  // namespace loom
