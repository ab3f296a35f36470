#include "runtime/device.h"

#include <cstdlib>
#include <cstring>

#if LOOM_HAVE_CUDA
#include "kernels/cuda/check.h"
#endif

namespace loom {

namespace {
#if LOOM_HAVE_CUDA
cudaStream_t cu(const Stream& s) {
  return static_cast<cudaStream_t>(s.handle);
}
#endif
#if !LOOM_HAVE_CUDA
[[noreturn]] void no_cuda() {
  fail("this build has no CUDA; rebuild with the CUDA toolkit (LOOM_CUDA=ON)");
}
#endif
}  // namespace

const Stream& host_stream() {
  static const Stream s{};
  return s;
}

void Stream::synchronize() const {
  if (kind == DeviceKind::cpu) return;
#if LOOM_HAVE_CUDA
  LOOM_CUDA_CHECK(cudaStreamSynchronize(cu(*this)));
#endif
}

void stream_copy(const Stream& s, void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  if (s.kind == DeviceKind::cpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if LOOM_HAVE_CUDA
  LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cu(s)));
#endif
}

std::string cuda_describe() {
#if LOOM_HAVE_CUDA
  int rt = 0, drv = 0, n = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  std::string out = fmt::format("CUDA runtime {}.{}, driver {}", rt / 1000, rt % 1000 / 10,
                                drv ? fmt::format("{}.{}", drv / 1000, drv % 1000 / 10) : std::string("none"));
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  out += fmt::format("; {} GPU(s) visible", n);
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

Stream cuda_stream_create() {
#if LOOM_HAVE_CUDA
  cudaStream_t s;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream{DeviceKind::cuda, s};
#else
  no_cuda();
#endif
}

void cuda_stream_destroy(Stream& s) {
#if LOOM_HAVE_CUDA
  if (s.kind == DeviceKind::cuda && s.handle) {
    cudaStreamSynchronize(cu(s));
    cudaStreamDestroy(cu(s));
  }
#endif
  s.handle = nullptr;
}

Event::Event(DeviceKind kind) : kind_(kind) {
  if (kind_ == DeviceKind::cpu) return;
#if LOOM_HAVE_CUDA
  cudaEvent_t e;
  LOOM_CUDA_CHECK(cudaEventCreate(&e));
  ev_ = e;
#else
  no_cuda();
#endif
}

Event::~Event() {
#if LOOM_HAVE_CUDA
  if (ev_) cudaEventDestroy(static_cast<cudaEvent_t>(ev_));
#endif
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
#if LOOM_HAVE_CUDA
  LOOM_ASSERT(s.kind == DeviceKind::cuda);
  LOOM_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(ev_), cu(s)));
#else
  (void)s;
#endif
}

void Event::synchronize() const {
#if LOOM_HAVE_CUDA
  if (kind_ == DeviceKind::cuda) LOOM_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(ev_)));
#endif
}

void Event::wait_on(const Stream& s) const {
  if (s.kind == DeviceKind::cpu) {
    synchronize();  // an inline stream runs its next work on the host
    return;
  }
#if LOOM_HAVE_CUDA
  if (kind_ == DeviceKind::cuda) LOOM_CUDA_CHECK(cudaStreamWaitEvent(cu(s), static_cast<cudaEvent_t>(ev_), 0));
#endif
}

bool Event::done() const {
#if LOOM_HAVE_CUDA
  if (kind_ == DeviceKind::cuda) return cudaEventQuery(static_cast<cudaEvent_t>(ev_)) == cudaSuccess;
#endif
  return true;
}

double Event::elapsed_ms(const Event& a, const Event& b) {
  LOOM_ASSERT(a.kind_ == b.kind_);
  if (a.kind_ == DeviceKind::cpu) return std::chrono::duration<double, std::milli>(b.at_ - a.at_).count();
#if LOOM_HAVE_CUDA
  b.synchronize();
  float ms = 0.0f;
  LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a.ev_), static_cast<cudaEvent_t>(b.ev_)));
  return double(ms);
#else
  return 0.0;
#endif
}

HostBuffer::HostBuffer(HostBuffer&& o) noexcept : p_(o.p_), n_(o.n_), pinned_(o.pinned_) {
  o.p_ = nullptr, o.n_ = 0;
}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    release();
    p_ = o.p_, n_ = o.n_, pinned_ = o.pinned_;
    o.p_ = nullptr, o.n_ = 0;
  }
  return *this;
}

void HostBuffer::resize(size_t n, DeviceKind device) {
  const bool pin = device == DeviceKind::cuda;
  if (n <= n_ && pin == pinned_) return;
  release();
  pinned_ = pin;
#if LOOM_HAVE_CUDA
  if (pin) {
    void* p = nullptr;
    LOOM_CUDA_CHECK(cudaMallocHost(&p, n * sizeof(float)));
    p_ = static_cast<float*>(p);
  }
#endif
  if (!pin) {
    p_ = static_cast<float*>(std::malloc(n * sizeof(float)));
    LOOM_CHECK(p_ || n == 0, "out of host memory allocating {} MB", n * sizeof(float) / 1e6);
  }
  LOOM_CHECK(p_ || n == 0, "this build has no CUDA for page-locked host memory");
  n_ = n;
}

void HostBuffer::release() {
#if LOOM_HAVE_CUDA
  if (p_ && pinned_) cudaFreeHost(p_);
#endif
  if (p_ && !pinned_) std::free(p_);
  p_ = nullptr;
  n_ = 0;
}

}  // namespace loom
