// Helpers for the CUDA kernel tests, which build twice from one source: against the CUDA
// runtime (on a GPU) and against the CPU emulation (kernels/emu/, everywhere; also under
// ThreadSanitizer and AddressSanitizer). Every allocation, copy and synchronization is
// checked. Comparisons are per element: |got - want| <= atol + rtol |want| for every element,
// so a wrong small value is not hidden by a large one elsewhere.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/reference/attention_reference.h"
#include "runtime/cuda_check.h"
#include "runtime/tensor.h"

namespace loom::testing_cuda {

using BF = cuda::bf16;

// Sanitizer builds run the same tests at smaller shapes (each emulated thread costs more).
#if defined(LOOM_EMU_ASAN) || defined(LOOM_EMU_TSAN)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(d(g)));  // exactly representable in bf16
  return v;
}
inline std::vector<float> rounded(std::vector<float> v) {
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

// A device buffer of bf16, filled from and read back as fp32.
struct Dev {
  BF* p = nullptr;
  size_t n = 0;
  explicit Dev(const std::vector<float>& h) : n(h.size()) {
    LOOM_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * 2));
    std::vector<uint16_t> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = f32_to_bf16(h[i]);
    LOOM_CUDA_CHECK(cudaMemcpy(p, b.data(), n * 2, cudaMemcpyHostToDevice));
  }
  explicit Dev(size_t count) : Dev{std::vector<float>(count, 0.0f)} {}
  Dev(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
  std::vector<float> get() const {
    std::vector<uint16_t> b(n);
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    LOOM_CUDA_CHECK(cudaMemcpy(b.data(), p, n * 2, cudaMemcpyDeviceToHost));
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = bf16_to_f32(b[i]);
    return h;
  }
};
template <class T>
struct DevRaw {
  T* p = nullptr;
  size_t n;
  explicit DevRaw(const std::vector<T>& h) : n(h.size()) {
    LOOM_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    LOOM_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  explicit DevRaw(size_t count) : DevRaw{std::vector<T>(count, T(0))} {}
  DevRaw(const DevRaw&) = delete;
  ~DevRaw() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    LOOM_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// Every element within atol + rtol |want|; NaN or infinity anywhere fails. The message names
// the worst element and how many missed.
template <class A, class B>
::testing::AssertionResult close(const std::vector<A>& got, const std::vector<B>& want, double atol, double rtol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << want.size();
  double worst = 0;
  size_t at = 0, missed = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = double(got[i]), w = double(want[i]);
    const double r = std::isfinite(g) && std::isfinite(w) ? std::abs(g - w) / (atol + rtol * std::abs(w)) : INFINITY;
    if (r > 1) ++missed;
    if (r > worst || (i == 0 && !(r <= worst))) worst = r, at = i;
  }
  if (missed == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << missed << " of " << want.size() << " elements off; worst [" << at << "]: got "
                                       << double(got[at]) << ", want " << double(want[at]) << " (atol " << atol
                                       << ", rtol " << rtol << ")";
}

// The kernels need a device: the emulated one is always there. On a GPU build a machine with no
// GPU skips, but one whose GPU is there and whose driver fails is a failure.
class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
#if !defined(LOOM_CUDA_EMULATION)
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    const bool gpu_here = access("/dev/nvidiactl", F_OK) == 0 || access("/dev/nvidia0", F_OK) == 0;
    if (e == cudaErrorNoDevice || (e != cudaSuccess && !gpu_here) || (e == cudaSuccess && n == 0))
      GTEST_SKIP() << "no CUDA device visible (" << cudaGetErrorString(e) << ")";
    ASSERT_EQ(e, cudaSuccess) << "an NVIDIA device node exists but CUDA fails: " << cudaGetErrorString(e);
#endif
  }
};

}  // namespace loom::testing_cuda
