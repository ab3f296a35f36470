// The emulated device's runtime (kernels/emu/stream.cpp) and cuBLASLt (kernels/emu/cublaslt.cpp)
// keep the semantics that catch host-side bugs: a created stream runs its work on its own worker,
// in order and behind the host; events and cudaStreamWaitEvent order streams; memory is NaN until
// written; a fault in queued work is sticky; cuBLASLt refuses what the real library has no
// algorithm for, misaligned operands included.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <future>
#include <vector>

#include "kernels/cuda/ops_cuda.h"
#include "model/backend.h"
#include "runtime/allocator.h"
#include "runtime/cuda_api.h"
#include "runtime/cuda_check.h"

namespace {

using namespace std::chrono_literals;

// Queues a wait on the host's word on stream s: nothing issued to s after it runs until
// release() (or 10 s: a broken ordering fails the test instead of hanging it).
struct Gate {
  std::promise<void> p;
  std::shared_future<void> f = p.get_future().share();
  void hold(cudaStream_t s) {
    loom::emu::stream_enqueue(s, [f = f] { f.wait_for(10s); });
  }
  void release() { p.set_value(); }
};

__global__ void divergent_barrier_kernel(float* out) {
  if (threadIdx.x < 64)
    __syncthreads();
  else
    __syncthreads();
  out[threadIdx.x] = 1.0f;
}

TEST(EmulatedDevice, StreamsRunBehindTheHostInOrderAndEventsOrderThem) {
  cudaStream_t a, b;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  const int n = 1000;
  float *x, *acc;
  LOOM_CUDA_CHECK(cudaMalloc(&x, n * 4));
  LOOM_CUDA_CHECK(cudaMalloc(&acc, n * 4));
  EXPECT_TRUE(std::isnan(acc[0]) && std::isnan(x[n - 1])) << "fresh device memory is poisoned";
  std::vector<float> ones(n, 1.0f), got(n);
  Gate gate;
  gate.hold(b);
  cudaEvent_t produced;
  LOOM_CUDA_CHECK(cudaEventCreate(&produced));
  LOOM_CUDA_CHECK(cudaMemcpyAsync(x, ones.data(), n * 4, cudaMemcpyHostToDevice, b));
  LOOM_CUDA_CHECK(cudaEventRecord(produced, b));
  // a: acc = 0, then (behind b's copy) acc += x twice.
  LOOM_CUDA_CHECK(cudaMemsetAsync(acc, 0, n * 4, a));
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(a, produced, 0));
  loom::cuda::add_f32(acc, x, n, a);
  loom::cuda::add_f32(acc, x, n, a);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(cudaEventQuery(produced), cudaErrorNotReady) << "the event passed before its stream's work ran";
  EXPECT_TRUE(std::isnan(x[0])) << "b's copy ran before the work queued ahead of it";
  EXPECT_FALSE(acc[0] == 2.0f) << "a ran past its wait on b's event";
  gate.release();
  const uint64_t syncs = loom::emu::host_syncs();
  LOOM_CUDA_CHECK(cudaStreamSynchronize(a));
  EXPECT_EQ(loom::emu::host_syncs(), syncs + 1);
  EXPECT_EQ(cudaEventQuery(produced), cudaSuccess);
  LOOM_CUDA_CHECK(cudaMemcpy(got.data(), acc, n * 4, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) ASSERT_EQ(got[i], 2.0f) << i;
  cudaEventDestroy(produced);
  cudaFree(x);
  cudaFree(acc);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST(EmulatedDevice, EventsTimeTheirStreamAndOutliveTheirDestruction) {
  cudaStream_t s;
  LOOM_CUDA_CHECK(cudaStreamCreate(&s));
  cudaEvent_t t0, t1, pending;
  LOOM_CUDA_CHECK(cudaEventCreate(&t0));
  LOOM_CUDA_CHECK(cudaEventCreate(&t1));
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&pending, cudaEventDisableTiming));
  Gate gate;
  LOOM_CUDA_CHECK(cudaEventRecord(t0, s));
  gate.hold(s);
  LOOM_CUDA_CHECK(cudaEventRecord(t1, s));
  LOOM_CUDA_CHECK(cudaEventRecord(pending, s));
  float ms = 0;
  EXPECT_EQ(cudaEventElapsedTime(&ms, t0, t1), cudaErrorNotReady);
  LOOM_CUDA_CHECK(cudaEventDestroy(pending));  // its marker is still queued
  // t0 has run before the 30 ms start (the stream's thread may reach it late under load).
  LOOM_CUDA_CHECK(cudaEventSynchronize(t0));
  std::this_thread::sleep_for(30ms);
  gate.release();
  LOOM_CUDA_CHECK(cudaEventSynchronize(t1));
  LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
  EXPECT_GE(ms, 25.0f) << "the elapsed time is not the stream's";
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaStreamDestroy(s);
}

TEST(EmulatedDevice, ABadLaunchFailsAtOnceOnTheHostAndQueuesNothing) {
  cudaStream_t s;
  LOOM_CUDA_CHECK(cudaStreamCreate(&s));
  const uint64_t launches = loom::emu::counters().launches;
  float* acc;
  LOOM_CUDA_CHECK(cudaMalloc(&acc, 4));
  Gate gate;
  gate.hold(s);  // nothing on s runs: the error cannot come from the worker
  LOOM_LAUNCH(divergent_barrier_kernel, 1, 2048, 0, s)(acc);  // 2048 threads in a block
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  gate.release();
  LOOM_CUDA_CHECK(cudaStreamSynchronize(s));  // not sticky
  EXPECT_EQ(loom::emu::counters().launches, launches);
  cudaFree(acc);
  cudaStreamDestroy(s);
}

// A fault in queued work is the device's from then on: every later synchronization and error
// query reports it, and work queued after it does not run (in a child process: it would fail
// every later test here).
TEST(EmulatedDeviceDeathTest, AFaultInQueuedWorkIsSticky) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        cudaStream_t s;
        cudaStreamCreate(&s);
        float* out;
        cudaMalloc(&out, 128 * 4);
        float* later;
        cudaMalloc(&later, 4);
        cudaMemset(later, 0, 4);
        LOOM_LAUNCH(divergent_barrier_kernel, 1, 128, 0, s)(out);
        cudaMemsetAsync(later, 0xff, 4, s);  // queued behind the fault: a device never runs it
        const cudaError_t first = cudaStreamSynchronize(s);
        const std::string said = cudaGetErrorString(first);
        const bool sticky =
            cudaStreamSynchronize(s) == first && cudaGetLastError() == first && cudaMemsetAsync(out, 0, 4, s) == first;
        std::fprintf(stderr, "%s\n", said.c_str());
        const bool skipped = *later == 0.0f;
        std::exit(first == cudaErrorLaunchFailure && sticky && skipped && said.find("queued work failed") == 0 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "barrier");
}

// A re-recorded event is a new point: a wait issued before the re-record still waits for the
// first, although the second passed first.
TEST(EmulatedDevice, AWaitKeepsTheRecordItWasIssuedAfter) {
  cudaStream_t a, b, c;
  for (cudaStream_t* s : {&a, &b, &c}) LOOM_CUDA_CHECK(cudaStreamCreate(s));
  cudaEvent_t e;
  LOOM_CUDA_CHECK(cudaEventCreate(&e));
  float* v;
  LOOM_CUDA_CHECK(cudaMalloc(&v, 4));
  LOOM_CUDA_CHECK(cudaMemset(v, 0, 4));
  Gate gate;
  gate.hold(a);
  LOOM_CUDA_CHECK(cudaEventRecord(e, a));  // behind the gate
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(c, e, 0));
  LOOM_CUDA_CHECK(cudaMemsetAsync(v, 0xff, 4, c));
  LOOM_CUDA_CHECK(cudaEventRecord(e, b));  // passes at once
  LOOM_CUDA_CHECK(cudaStreamSynchronize(b));
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess) << "the event is its latest record";
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(loom::emu::pending_writer(v), "cudaMemsetAsync") << "c ran past its wait on the first record";
  gate.release();
  LOOM_CUDA_CHECK(cudaStreamSynchronize(c));
  EXPECT_TRUE(std::isnan(*v));
  cudaFree(v);
  cudaEventDestroy(e);
  for (cudaStream_t s : {a, b, c}) cudaStreamDestroy(s);
}

// A synchronous copy does not wait for created streams: reading memory their queued work is
// still to write is an error naming the writer (a device would hand over stale bytes).
TEST(EmulatedDevice, AHostReadBeforeItsProducerRanIsAnError) {
  cudaStream_t s;
  LOOM_CUDA_CHECK(cudaStreamCreate(&s));
  const int n = 256;
  float *acc, *x;
  LOOM_CUDA_CHECK(cudaMalloc(&acc, n * 4));
  LOOM_CUDA_CHECK(cudaMalloc(&x, n * 4));
  LOOM_CUDA_CHECK(cudaMemset(acc, 0, n * 4));
  LOOM_CUDA_CHECK(cudaMemset(x, 0, n * 4));
  std::vector<float> host(n);
  Gate gate;
  gate.hold(s);
  loom::cuda::add_f32(acc, x, n, s);
  const cudaError_t e = cudaMemcpy(host.data(), acc, n * 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(e, cudaErrorInvalidValue);
  EXPECT_NE(std::string(cudaGetErrorString(e)).find("add_kernel<float>"), std::string::npos) << cudaGetErrorString(e);
  cudaGetLastError();
  EXPECT_EQ(cudaMemcpy(host.data(), x, n * 4, cudaMemcpyDeviceToHost), cudaSuccess) << "x is only read";
  gate.release();
  LOOM_CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(cudaMemcpy(host.data(), acc, n * 4, cudaMemcpyDeviceToHost), cudaSuccess) << "after the synchronization";
  cudaFree(acc);
  cudaFree(x);
  cudaStreamDestroy(s);
}

// The raw emulated cuBLASLt: D (m x n) = A (m x k) B (k x n), column-major, bf16.
struct Lt {
  cublasLtHandle_t h{};
  cublasLtMatmulDesc_t op{};
  cublasLtMatrixLayout_t la{}, lb{}, lc{};
  cublasLtMatmulPreference_t pref{};
  Lt(int m, int n, int k, cudaDataType_t c_type = CUDA_R_16BF) {
    cublasLtCreate(&h);
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, m, k, m);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k);
    cublasLtMatrixLayoutCreate(&lc, c_type, m, n, m);
    cublasLtMatmulPreferenceCreate(&pref);
  }
  ~Lt() {
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(h);
  }
  cublasStatus_t heuristic(cublasLtMatmulHeuristicResult_t* r) {
    int found = 0;
    return cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, r, &found);
  }
  void epilogue(cublasLtEpilogue_t e) {
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e));
  }
};

TEST(EmulatedCublasLt, RefusesWhatTheLibraryHasNoAlgorithmFor) {
  cublasLtMatmulHeuristicResult_t r;
  {
    Lt lt(16, 16, 16, CUDA_R_32F);
    lt.epilogue(CUBLASLT_EPILOGUE_BIAS);
    EXPECT_EQ(lt.heuristic(&r), CUBLAS_STATUS_NOT_SUPPORTED) << "a bias epilogue with an fp32 D";
  }
  {
    Lt lt(16, 16, 16);
    lt.epilogue(CUBLASLT_EPILOGUE_GELU_AUX);
    const int64_t ld = 20;
    cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld));
    EXPECT_EQ(lt.heuristic(&r), CUBLAS_STATUS_INVALID_VALUE) << "an aux leading dimension no multiple of 8";
  }
  {
    Lt lt(16, 16, 16);
    cublasLtMatrixLayoutDestroy(lt.lb);
    cublasLtMatrixLayoutCreate(&lt.lb, CUDA_R_16BF, 15, 16, 16);
    EXPECT_EQ(lt.heuristic(&r), CUBLAS_STATUS_INVALID_VALUE) << "op(A) k does not meet op(B) k";
  }
  cublasLtMatrixLayout_t l;
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, 16, 4, 8), CUBLAS_STATUS_INVALID_VALUE) << "ld < rows";
}

// The heuristic's algorithm assumes 256-byte operands unless the preferences say less; a
// pointer 2 bytes into an allocation then fails, as a vectorized kernel would on a GPU. The
// wrappers tell the heuristic each pointer's alignment, so the same GEMM goes through them.
TEST(EmulatedCublasLt, MisalignedOperandsFailUnlessThePreferencesSaySo) {
  const int m = 8, n = 8, k = 8;
  uint16_t *a, *b, *c;
  LOOM_CUDA_CHECK(cudaMalloc(&a, (m * k + 8) * 2));
  LOOM_CUDA_CHECK(cudaMalloc(&b, k * n * 2));
  LOOM_CUDA_CHECK(cudaMalloc(&c, m * n * 2));
  LOOM_CUDA_CHECK(cudaMemset(a, 0, (m * k + 8) * 2));
  LOOM_CUDA_CHECK(cudaMemset(b, 0, k * n * 2));
  Lt lt(m, n, k);
  cublasLtMatmulHeuristicResult_t r;
  ASSERT_EQ(lt.heuristic(&r), CUBLAS_STATUS_SUCCESS);
  const float one = 1, zero = 0;
  EXPECT_EQ(cublasLtMatmul(lt.h, lt.op, &one, a + 1, lt.la, b, lt.lb, &zero, c, lt.lc, c, lt.lc, &r.algo, nullptr, 0,
                           nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(
      cublasLtMatmul(lt.h, lt.op, &one, a, lt.la, b, lt.lb, &zero, c, lt.lc, c, lt.lc, &r.algo, nullptr, 0, nullptr),
      CUBLAS_STATUS_SUCCESS);
  using bf = loom::cuda::bf16;
  loom::cuda::GemmContext ctx(size_t(1) << 20);
  const uint64_t before = cublaslt_emulated_matmuls();
  loom::cuda::gemm(ctx, false, false, m, n, k, reinterpret_cast<const bf*>(a + 1), k, reinterpret_cast<const bf*>(b), n,
                   0.0f, reinterpret_cast<bf*>(c), n, nullptr, nullptr);
  EXPECT_EQ(cublaslt_emulated_matmuls(), before + 1);
  // On a created stream, behind a gate: the call's descriptors are gone when the GEMM runs.
  std::vector<uint16_t> ones(size_t(m * k + 8), 0x3f80), got(size_t(m * n));  // bf16 1.0
  LOOM_CUDA_CHECK(cudaMemcpy(a, ones.data(), ones.size() * 2, cudaMemcpyHostToDevice));
  LOOM_CUDA_CHECK(cudaMemcpy(b, ones.data(), size_t(k * n) * 2, cudaMemcpyHostToDevice));
  cudaStream_t s;
  LOOM_CUDA_CHECK(cudaStreamCreate(&s));
  Gate gate;
  gate.hold(s);
  loom::cuda::gemm(ctx, false, false, m, n, k, reinterpret_cast<const bf*>(a + 1), k, reinterpret_cast<const bf*>(b), n,
                   0.0f, reinterpret_cast<bf*>(c), n, nullptr, s);
  gate.release();
  LOOM_CUDA_CHECK(cudaStreamSynchronize(s));
  LOOM_CUDA_CHECK(cudaMemcpy(got.data(), c, got.size() * 2, cudaMemcpyDeviceToHost));
  for (uint16_t v : got) ASSERT_EQ(v, 0x4100) << "8 ones summed is 8.0 in bf16";
  cudaStreamDestroy(s);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
}

TEST(EmulatedDevice, TheRuntimeTableSynchronizesAndCounts) {
  const loom::CudaApi& api = loom::cuda_api_emulated();
  EXPECT_STREQ(api.name, "emulated CUDA");
  void* s = api.stream_create();
  std::string error;
  auto* p = static_cast<float*>(api.malloc(64, &error));
  ASSERT_TRUE(p) << error;
  api.memset_async(p, 0, 64, s);
  const uint64_t syncs = loom::cuda_emulated_host_syncs();
  api.stream_synchronize(s);
  EXPECT_EQ(p[15], 0.0f);
  EXPECT_EQ(loom::cuda_emulated_host_syncs(), syncs + 1);
  api.free(p);
  api.stream_destroy(s);
}

}  // namespace

// The CUDA backend's linear_backward with dW and dbias launches one kernel besides its GEMMs,
// dbias += the weight gradient's BGRADA/BGRADB sums, in both weight layouts; without dW the bias
// takes its own pass over dout (the column sums' two launches, which this test sees there).
// Bias gradients back in a pass of their own beside dW fail here.
TEST(EmulatedDevice, LinearBackwardLaunchesNoBiasPass) {
  loom::ModelDims dims;
  dims.B = 1, dims.T = 64, dims.C = 64, dims.H = 2, dims.KV = 2, dims.D = 32, dims.F = 256, dims.vocab = 96;
  loom::Stream stream = loom::cuda_stream_create(loom::DeviceKind::cuda_emulated);
  {
    loom::Allocator alloc(loom::DeviceKind::cuda_emulated, stream);
    auto backend = loom::cuda_emulated_backend(dims, alloc);
    char* fake = reinterpret_cast<char*>(uintptr_t(1) << 12);  // never dereferenced: nothing runs
    const loom::Ptr bf(fake, 2);
    auto* f = reinterpret_cast<float*>(fake);
    for (auto layout : {loom::WLayout::out_in, loom::WLayout::in_out})
      for (bool with_dw : {true, false}) {
        loom::emu::LaunchRecorder rec;
        backend->linear_backward(bf, with_dw ? f : nullptr, f, bf, bf, bf, 64, 64, 192, layout);
        std::vector<std::string> kernels;
        for (const auto& r : rec.records()) kernels.push_back(r.kernel.substr(0, r.kernel.find('<')));
        if (with_dw) {
          EXPECT_EQ(kernels, std::vector<std::string>{"add_kernel"}) << "dbias += the GEMM epilogue's sums, alone";
        } else {
          EXPECT_EQ(kernels.size(), 2u) << "the column sums' two launches";
          for (const auto& k : kernels) EXPECT_EQ(k.rfind("column_", 0), 0u) << k;
        }
      }
  }
  loom::cuda_stream_destroy(stream);
}
