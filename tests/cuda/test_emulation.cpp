// The CUDA emulation itself (kernels/emu/): launch limits, barrier and warp semantics, the
// errors it reports where a device would hang or compute garbage, and, in the sanitizer
// builds, that a missing barrier is a race ThreadSanitizer reports and a stray shared-memory
// access one AddressSanitizer reports (death tests: the sanitizer ends the child process).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mma.h>

#include <string>
#include <vector>

#include "tests/cuda/cuda_testing.h"
#include "tests/cuda/launch_shapes.h"

using namespace loom::testing_cuda;

namespace {

__global__ void copy_kernel(float* out, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}

// Reverses each block's 256 values through shared memory: right only with the barrier.
__global__ void reverse_kernel(float* out, const float* in, bool barrier) {
  __shared__ float s[256];
  const int base = blockIdx.x * 256;
  s[threadIdx.x] = in[base + threadIdx.x];
  if (barrier) __syncthreads();
  out[base + threadIdx.x] = s[255 - threadIdx.x];
}

__global__ void divergent_barrier_kernel(float* out) {
  if (threadIdx.x < 64) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1.0f;
}

__global__ void mixed_wait_kernel(float* out) {
  float v = float(threadIdx.x);
  if (threadIdx.x % 32 < 16)
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  else
    __syncthreads();
  out[threadIdx.x] = v;
}

__global__ void exited_lane_kernel(float* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

// Every shuffle and vote, each lane writing what it got.
__global__ void shuffles_kernel(int* out) {
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  int* o = out + (w * 32 + lane) * 8;
  o[0] = __shfl_xor_sync(0xffffffffu, lane * 10, 3);
  o[1] = __shfl_down_sync(0xffffffffu, lane * 10, 5);
  o[2] = __shfl_up_sync(0xffffffffu, lane * 10, 2);
  o[3] = __shfl_sync(0xffffffffu, lane * 10, 7);
  o[4] = __shfl_down_sync(0xffffffffu, lane * 10, 3, 16);
  o[5] = int(__ballot_sync(0xffffffffu, lane % 3 == 0));
  o[6] = __any_sync(0xffffffffu, lane == 31 && w == 1);
  o[7] = __all_sync(0xffffffffu, lane < 32);
}

__global__ void atomics_kernel(int* count, float* sum) {
  atomicAdd(count, 1);
  atomicAdd(sum, 0.5f);
}

__global__ void dynamic_shared_kernel(float* out, int n) {
  LOOM_DYNAMIC_SHARED(float, s, 16);
  for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = float(i % 7);
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0;
    for (int i = 0; i < n; ++i) t += s[i];
    out[blockIdx.x] = t;
  }
}

// One warp: D = A @ B + C on 16x16x16 tiles, B read as column-major (the transpose trick the
// attention kernels use), the accumulator loaded and stored in both layouts.
__global__ void mma_kernel(float* d, const BF* a, const BF* bt, const float* c) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, BF, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, BF, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, bt, 16);
  wmma::load_matrix_sync(acc, c, 16, wmma::mem_col_major);
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

// Swaps neighbours' values twice between two barriers: right only with the middle barrier
// (without it, thread t writes s[t] while thread t ^ 1 may still be reading it).
[[maybe_unused]] __global__ void swap_twice_kernel(float* out, bool barrier) {
  __shared__ float s[64];
  const int t = threadIdx.x;
  s[t] = float(t);
  __syncthreads();
  const float y = s[t ^ 1];
  if (barrier) __syncthreads();
  s[t] = y + 1.0f;
  __syncthreads();
  out[t] = s[t ^ 1];
}

[[maybe_unused]] __global__ void shared_overrun_kernel(float* out) {
  __shared__ float s[32];
  s[threadIdx.x] = 1.0f;  // launched with 33 threads
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x];
}

std::string last_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : cudaGetErrorString(e);
}

}  // namespace

TEST(Emulation, LaunchLimitsAreThoseOfTheDevice) {
  DevRaw<float> A(64), B(64);
  LOOM_LAUNCH(copy_kernel, 0, 64, 0, nullptr)(B.p, A.p, 64);
  EXPECT_NE(last_error().find("copy_kernel with grid (0,1,1) block (64,1,1): a dimension is zero"), std::string::npos);
  LOOM_LAUNCH(copy_kernel, 1, 1025, 0, nullptr)(B.p, A.p, 64);
  EXPECT_NE(last_error().find("more than 1024 threads"), std::string::npos);
  LOOM_LAUNCH(copy_kernel, dim3(1, 65536), 32, 0, nullptr)(B.p, A.p, 64);
  EXPECT_NE(last_error().find("grid dimension"), std::string::npos);
  LOOM_LAUNCH(copy_kernel, dim3(1, 1), dim3(1, 1, 65), 0, nullptr)(B.p, A.p, 64);
  EXPECT_NE(last_error().find("block dimension"), std::string::npos);
  // Past 48 KiB of dynamic shared memory a kernel needs the attribute, at most 227 KiB.
  const int n = 20000;  // 80 000 bytes
  DevRaw<float> Out(2);
  LOOM_LAUNCH(dynamic_shared_kernel, 2, 128, n * 4, nullptr)(Out.p, n);
  EXPECT_NE(last_error().find("past the kernel's limit of 49152"), std::string::npos);
  EXPECT_EQ(cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024),
            cudaErrorInvalidValue);
  EXPECT_NE(last_error().find("227 KiB"), std::string::npos);
  LOOM_CUDA_CHECK(cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n * 4));
  LOOM_LAUNCH(dynamic_shared_kernel, 2, 128, n * 4, nullptr)(Out.p, n);
  LOOM_CUDA_CHECK(cudaGetLastError());
  double want = 0;
  for (int i = 0; i < n; ++i) want += i % 7;  // small integers: the fp32 sum is exact
  EXPECT_EQ(Out.get(), (std::vector<float>{float(want), float(want)}));
}

TEST(Emulation, BarrierOrdersSharedMemoryAndCountsWhatRan) {
  const int blocks = 5;
  std::vector<float> in(blocks * 256);
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(i);
  DevRaw<float> In(in), Out(in.size());
  const auto before = loom::emu::counters();
  LOOM_LAUNCH(reverse_kernel, blocks, 256, 0, nullptr)(Out.p, In.p, true);
  LOOM_CUDA_CHECK(cudaGetLastError());
  const auto after = loom::emu::counters();
  EXPECT_EQ(after.launches - before.launches, 1u);
  EXPECT_EQ(after.blocks - before.blocks, uint64_t(blocks));
  EXPECT_EQ(after.threads - before.threads, uint64_t(blocks * 256));
  auto out = Out.get();
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < 256; ++t) ASSERT_EQ(out[size_t(b * 256 + t)], in[size_t(b * 256 + 255 - t)]);
}

TEST(Emulation, UndefinedBehaviourIsAnError) {
  DevRaw<float> Out(256);
  LOOM_LAUNCH(divergent_barrier_kernel, 1, 128, 0, nullptr)(Out.p);
  EXPECT_NE(last_error().find("divergent barrier"), std::string::npos);
  LOOM_LAUNCH(mixed_wait_kernel, 1, 64, 0, nullptr)(Out.p);
  const std::string deadlock = last_error();
  EXPECT_NE(deadlock.find("deadlock: 32 threads wait at __syncthreads"), std::string::npos) << deadlock;
  EXPECT_NE(deadlock.find("lanes 0x0000ffff of warp 0 wait in a shuffle"), std::string::npos) << deadlock;
  LOOM_LAUNCH(exited_lane_kernel, 1, 32, 0, nullptr)(Out.p);
  const std::string exited = last_error();  // lane 5 leaves while lanes 0-4 wait for it
  EXPECT_NE(exited.find("thread (5,0,0): exits while lanes of its warp wait for it in a shuffle"), std::string::npos)
      << exited;
  // The emulation is usable again after an error.
  LOOM_LAUNCH(reverse_kernel, 1, 256, 0, nullptr)(Out.p, Out.p, true);
  EXPECT_EQ(last_error(), "");
}

TEST(Emulation, ShufflesAndVotesFollowTheDevice) {
  DevRaw<int> Out(64 * 8);
  LOOM_LAUNCH(shuffles_kernel, 1, 64, 0, nullptr)(Out.p);
  LOOM_CUDA_CHECK(cudaGetLastError());
  auto o = Out.get();
  unsigned ballot = 0;
  for (int l = 0; l < 32; l += 3) ballot |= 1u << l;
  for (int w = 0; w < 2; ++w)
    for (int l = 0; l < 32; ++l) {
      const int* r = o.data() + (w * 32 + l) * 8;
      EXPECT_EQ(r[0], (l ^ 3) * 10);
      EXPECT_EQ(r[1], (l + 5 < 32 ? l + 5 : l) * 10);
      EXPECT_EQ(r[2], (l >= 2 ? l - 2 : l) * 10);
      EXPECT_EQ(r[3], 70);
      EXPECT_EQ(r[4], ((l % 16) + 3 < 16 ? l + 3 : l) * 10) << "width 16, lane " << l;
      EXPECT_EQ(unsigned(r[5]), ballot);
      EXPECT_EQ(r[6], w == 1);
      EXPECT_EQ(r[7], 1);
    }
}

TEST(Emulation, AtomicsMmaAndPoisonedMemory) {
  DevRaw<int> Count(1);
  DevRaw<float> Sum(1);
  LOOM_LAUNCH(atomics_kernel, 7, 96, 0, nullptr)(Count.p, Sum.p);
  EXPECT_EQ(Count.get()[0], 7 * 96);
  EXPECT_EQ(Sum.get()[0], 7 * 96 * 0.5f);

  auto a = randn(256, 1), bt = randn(256, 2), c = randn(256, 3);
  std::vector<double> want(256);
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      double s = c[size_t(n * 16 + r)];  // c was loaded column-major
      for (int k = 0; k < 16; ++k) s += double(a[size_t(r * 16 + k)]) * bt[size_t(n * 16 + k)];
      want[size_t(r * 16 + n)] = s;
    }
  Dev A(a), Bt(bt);
  DevRaw<float> C(c), D(256);
  LOOM_LAUNCH(mma_kernel, 1, 32, 0, nullptr)(D.p, A.p, Bt.p, C.p);
  LOOM_CUDA_CHECK(cudaGetLastError());
  EXPECT_TRUE(close(D.get(), want, 1e-5, 1e-5));

  float* p = nullptr;
  LOOM_CUDA_CHECK(cudaMalloc(&p, 64));
  std::vector<float> h(16);
  LOOM_CUDA_CHECK(cudaMemcpy(h.data(), p, 64, cudaMemcpyDeviceToHost));
  for (float x : h) EXPECT_TRUE(std::isnan(x)) << "fresh device memory reads as NaN";
  cudaFree(p);
}

#if defined(LOOM_EMU_TSAN)
// Without the barrier, thread 0 reads s[255] before thread 255 writes it: unordered fibers.
TEST(EmulationSanitized, MissingBarrierIsADataRace) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: the sanitizer's state is clean
  DevRaw<float> In(256), Out(256);
  EXPECT_DEATH(
      {
        LOOM_LAUNCH(reverse_kernel, 1, 256, 0, nullptr)(Out.p, In.p, false);
        cudaDeviceSynchronize();
      },
      "data race");
}
// Between two barriers, a missing third: each barrier orders only what came before it.
TEST(EmulationSanitized, MissingBarrierBetweenBarriersIsADataRace) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DevRaw<float> Out(64);
  LOOM_LAUNCH(swap_twice_kernel, 1, 64, 0, nullptr)(Out.p, true);  // with it: no report
  LOOM_CUDA_CHECK(cudaGetLastError());
  EXPECT_DEATH(
      {
        LOOM_LAUNCH(swap_twice_kernel, 1, 64, 0, nullptr)(Out.p, false);
        cudaDeviceSynchronize();
      },
      "data race");
}
#endif
#if defined(LOOM_EMU_ASAN)
TEST(EmulationSanitized, SharedMemoryOverrunIsReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DevRaw<float> Out(64);
  EXPECT_DEATH(LOOM_LAUNCH(shared_overrun_kernel, 1, 33, 0, nullptr)(Out.p), "global-buffer-overflow");
}
TEST(EmulationSanitized, DeviceMemoryOverrunIsReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DevRaw<float> In(100), Out(100);
  EXPECT_DEATH(LOOM_LAUNCH(copy_kernel, 1, 128, 0, nullptr)(Out.p, In.p, 101), "heap-buffer-overflow");
}
#endif

// Every kernel's launch at every model shape from the default job to a 70B LLaMA at eight
// sequences of 8192 (grids past 2^31 blocks, a grid.y past 65535, a block past 1024 threads
// or shared memory past 227 KiB fail), recorded by the real wrappers without running them.
TEST(LaunchShapes, EveryKernelFitsTheDeviceAtEveryModelShape) {
  for (const ModelShape& s : model_shapes()) {
    loom::emu::LaunchRecorder rec;
    const int want = call_every_kernel(s);
    EXPECT_EQ(last_error(), "") << s.name;
    // Refused launches are not recorded: every launch the wrappers made fits.
    EXPECT_EQ(int(rec.records().size()), want) << s.name << ": a wrapper skipped a launch, or the device refused one";
  }
}

// A grid past 2^31 - 1 blocks is refused before its count wraps into a valid-looking one.
TEST(LaunchShapes, AGridPastTheLimitIsRefusedNotWrapped) {
  loom::emu::LaunchRecorder rec;
  auto* x = reinterpret_cast<BF*>(uintptr_t(1) << 12);
  auto* f = reinterpret_cast<float*>(uintptr_t(1) << 12);
  // 256 threads a block, 8 elements a thread.
  EXPECT_THROW(loom::cuda::to_bf16(x, f, (int64_t(1) << 31) * 256 * 8 + 1, nullptr), loom::Error);
  EXPECT_TRUE(rec.records().empty());
}

// The recorder catches what the limits forbid: a grid.y past 65535 (a head count there).
TEST(LaunchShapes, TheRecorderRefusesWhatTheDeviceWould) {
  loom::emu::LaunchRecorder rec;
  LOOM_LAUNCH(copy_kernel, dim3(1, 70000), 32, 0, nullptr)(nullptr, nullptr, 0);
  EXPECT_NE(last_error().find("grid dimension"), std::string::npos);
  EXPECT_TRUE(rec.records().empty());
}

// The column sums spread over row chunks: the weight gradient of a 768-wide norm over 8192
// rows on enough blocks for 132 SMs (a block per 32 columns walking every row gave 24), the
// router's sums over 8 experts and 65536 tokens on 64 blocks (one gave 1).
TEST(LaunchShapes, ColumnSumsFillTheDevice) {
  loom::emu::LaunchRecorder rec;
  auto* fake = reinterpret_cast<float*>(uintptr_t(1) << 12);
  auto* x = reinterpret_cast<BF*>(uintptr_t(1) << 12);
  loom::cuda::layernorm_backward(nullptr, fake, fake, x, x, x, fake, fake, 8192, 768, fake, nullptr);
  loom::cuda::column_sums(fake, fake, 65536, 8, fake, nullptr);
  ASSERT_EQ(last_error(), "");
  unsigned long long norm_blocks = 0, router_blocks = 0;
  for (const auto& r : rec.records())
    if (r.kernel.rfind("column_partials_kernel", 0) == 0 || r.kernel.rfind("column_word_partials_kernel", 0) == 0) {
      const unsigned long long b = 1ull * r.grid.x * r.grid.y * r.grid.z;
      (norm_blocks ? router_blocks : norm_blocks) = b;
    }
  EXPECT_GE(norm_blocks, 2u * 132) << "norm weight gradient";
  EXPECT_GE(router_blocks, 64u) << "router column sums";
}
