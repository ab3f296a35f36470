#include "runtime/device.h"

#include <cstdlib>
#include <cstring>

#include "runtime/cuda_api.h"

#if LOOM_HAVE_CUDA
#include "runtime/cuda_check.h"
#endif

namespace loom {

const CudaApi& cuda_api(DeviceKind kind) {
  LOOM_ASSERT(kind != DeviceKind::cpu);
  if (kind == DeviceKind::cuda_emulated) return cuda_api_emulated();
#if LOOM_HAVE_CUDA
  return cuda_api_real();
#else
  fail(
      "this build has no CUDA; rebuild with the CUDA toolkit (LOOM_CUDA=ON), or train on the emulated device "
      "(train.device = \"cuda-emulated\")");
#endif
}

const Stream& host_stream() {
  static const Stream s{};
  return s;
}

void Stream::synchronize() const {
  if (kind == DeviceKind::cpu) return;
  cuda_api(kind).stream_synchronize(handle);
}

void stream_copy(const Stream& s, void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  if (s.kind == DeviceKind::cpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
  cuda_api(s.kind).memcpy_async(dst, src, bytes, s.handle);
}

std::string cuda_describe() {
#if LOOM_HAVE_CUDA
  int rt = 0, drv = 0, n = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  std::string out = fmt::format("CUDA runtime {}.{}, driver {}", rt / 1000, rt % 1000 / 10,
                                drv ? fmt::format("{}.{}", drv / 1000, drv % 1000 / 10) : std::string("none"));
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  out += fmt::format("; {} visible", plural(n, "GPU"));
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out += fmt::format("\n  cuda:{}: {}, {:.1f} GiB, compute capability {}.{}", i, p.name,
                       double(p.totalGlobalMem) / (1 << 30), p.major, p.minor);
  }
  return out;
#else
  return "";
#endif
}

Stream cuda_stream_create(DeviceKind kind) {
  return Stream{kind, cuda_api(kind).stream_create()};
}

void cuda_stream_destroy(Stream& s) {
  if (s.kind != DeviceKind::cpu && s.handle) cuda_api(s.kind).stream_destroy(s.handle);
  s.handle = nullptr;
}

Event::Event(DeviceKind kind) : kind_(kind) {
  if (kind_ != DeviceKind::cpu) ev_ = cuda_api(kind_).event_create();
}

Event::~Event() {
  if (ev_) cuda_api(kind_).event_destroy(ev_);
}

Event::Event(Event&& o) noexcept : kind_(o.kind_), ev_(o.ev_), at_(o.at_) {
  o.ev_ = nullptr;
}

Event& Event::operator=(Event&& o) noexcept {
  std::swap(kind_, o.kind_);
  std::swap(ev_, o.ev_);
  std::swap(at_, o.at_);
  return *this;
}

void Event::record(const Stream& s) {
  if (kind_ == DeviceKind::cpu) {
    at_ = std::chrono::steady_clock::now();
    return;
  }
  LOOM_ASSERT(s.kind == kind_);
  cuda_api(kind_).event_record(ev_, s.handle);
}

void Event::synchronize() const {
  if (kind_ != DeviceKind::cpu) cuda_api(kind_).event_synchronize(ev_);
}

void Event::wait_on(const Stream& s) const {
  if (s.kind == DeviceKind::cpu) {
    synchronize();  // an inline stream runs its next work on the host
    return;
  }
  if (kind_ != DeviceKind::cpu) cuda_api(kind_).stream_wait_event(s.handle, ev_);
}

bool Event::done() const {
  return kind_ == DeviceKind::cpu || cuda_api(kind_).event_query(ev_);
}

double Event::elapsed_ms(const Event& a, const Event& b) {
  LOOM_ASSERT(a.kind_ == b.kind_);
  if (a.kind_ == DeviceKind::cpu) return std::chrono::duration<double, std::milli>(b.at_ - a.at_).count();
  return cuda_api(a.kind_).event_elapsed_ms(a.ev_, b.ev_);
}

HostBuffer::HostBuffer(HostBuffer&& o) noexcept : p_(o.p_), n_(o.n_), pinned_(o.pinned_), device_(o.device_) {
  o.p_ = nullptr, o.n_ = 0;
}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    release();
    p_ = o.p_, n_ = o.n_, pinned_ = o.pinned_, device_ = o.device_;
    o.p_ = nullptr, o.n_ = 0;
  }
  return *this;
}

void HostBuffer::resize(size_t n, DeviceKind device) {
  const bool pin = device != DeviceKind::cpu;
  if (n <= n_ && pin == pinned_ && (!pin || device == device_)) return;
  release();
  pinned_ = pin;
  device_ = device;
  if (pin) {
    p_ = static_cast<float*>(cuda_api(device).malloc_host(n * sizeof(float)));
  } else {
    p_ = static_cast<float*>(std::malloc(n * sizeof(float)));
    LOOM_CHECK(p_ || n == 0, "out of host memory allocating {} MB", n * sizeof(float) / 1e6);
  }
  n_ = n;
}

void HostBuffer::release() {
  if (p_ && pinned_) cuda_api(device_).free_host(p_);
  if (p_ && !pinned_) std::free(p_);
  p_ = nullptr;
  n_ = 0;
}

}  // namespace loom
