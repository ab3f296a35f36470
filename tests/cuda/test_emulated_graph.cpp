// Stream capture and CUDA graphs on the emulated device (kernels/emu/graph.cpp): captured work is
// recorded, not run; a graph's launch replays it in order, to the eager run's bits, as one launch
// from the host; what CUDA's global capture mode forbids fails and invalidates the capture.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/cuda/ops_cuda.h"
#include "runtime/cuda_check.h"

namespace {

namespace cuda = loom::cuda;
using bf16 = cuda::bf16;

__global__ void fill_kernel(float* out) {
  out[threadIdx.x] = 1.0f;
}

// A norm, a GEMM with a bias, GELU and a residual add in bf16: kernels and a cuBLASLt call.
struct Block {
  static constexpr int N = 64, C = 96;
  bf16 *x, *w, *nw, *nb, *normed, *h, *g;
  float *mean, *rstd;
  Block() {
    std::vector<bf16> host(C * C);  // the weight's size, the largest
    for (size_t i = 0; i < host.size(); ++i) host[i] = __float2bfloat16(float((i * 37) % 101) / 50.0f - 1.0f);
    for (bf16** p : {&x, &w, &nw, &nb, &normed, &h, &g}) {
      const size_t bytes = (p == &w ? C : N) * C * sizeof(bf16);
      LOOM_CUDA_CHECK(cudaMalloc(p, bytes));
      LOOM_CUDA_CHECK(cudaMemcpy(*p, host.data(), bytes, cudaMemcpyHostToDevice));
    }
    LOOM_CUDA_CHECK(cudaMalloc(&mean, N * 4));
    LOOM_CUDA_CHECK(cudaMalloc(&rstd, N * 4));
  }
  ~Block() {
    for (void* p :
         {(void*)x, (void*)w, (void*)nw, (void*)nb, (void*)normed, (void*)h, (void*)g, (void*)mean, (void*)rstd})
      cudaFree(p);
  }
  void run(const cuda::GemmContext& ctx, cudaStream_t s) {
    cuda::layernorm_forward(normed, mean, rstd, x, nullptr, nw, nb, N, C, 1e-5f, s);
    cuda::gemm(ctx, false, true, N, C, C, normed, C, w, C, 0.0f, h, C, nb, s);
    cuda::gelu_forward(g, h, int64_t(N) * C, s);
    cuda::add_bf16(x, g, int64_t(N) * C, s);  // x changes: a second replay computes on the first's
  }
  std::vector<uint16_t> bits() {
    std::vector<uint16_t> out(N * C);
    LOOM_CUDA_CHECK(cudaMemcpy(out.data(), x, out.size() * 2, cudaMemcpyDeviceToHost));
    return out;
  }
};

TEST(EmulatedGraph, ReplayGivesTheEagerBitsAsOneLaunch) {
  cudaStream_t s;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cuda::GemmContext ctx;
  Block eager, graphed;
  for (int i = 0; i < 2; ++i) eager.run(ctx, s);
  LOOM_CUDA_CHECK(cudaStreamSynchronize(s));

  const std::vector<uint16_t> before = graphed.bits();
  const uint64_t ops0 = loom::emu::device_ops(), launches0 = loom::emu::counters().launches;
  LOOM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  graphed.run(ctx, s);
  cudaGraph_t graph;
  LOOM_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  LOOM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  EXPECT_EQ(graphed.bits(), before) << "captured work ran during the capture";
  EXPECT_EQ(loom::emu::device_ops(), ops0) << "captured work was issued to the device";
  EXPECT_EQ(loom::emu::counters().launches, launches0);

  const uint64_t graphs0 = loom::emu::graph_launches();
  for (int i = 0; i < 2; ++i) LOOM_CUDA_CHECK(cudaGraphLaunch(exec, s));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(graphed.bits(), eager.bits());
  EXPECT_EQ(loom::emu::graph_launches(), graphs0 + 2);
  EXPECT_EQ(loom::emu::device_ops(), ops0) << "a replay issued its nodes one call at a time";
  // The norm's, GELU's and the add's kernels ran twice each, inside the two launches.
  EXPECT_GE(loom::emu::counters().launches, launches0 + 6);
  LOOM_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LOOM_CUDA_CHECK(cudaGraphDestroy(graph));
  LOOM_CUDA_CHECK(cudaStreamDestroy(s));
}

// Each call CUDA refuses inside a global-mode capture fails, and the capture ends invalidated.
TEST(EmulatedGraph, AnIllegalCallInACaptureFailsAndInvalidatesIt) {
  cudaStream_t s;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Block b;
  auto refused = [&](auto call, cudaError_t want) {
    LOOM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cuda::gelu_forward(b.g, b.h, int64_t(Block::N) * Block::C, s);
    EXPECT_EQ(call(), want);
    cudaGetLastError();
    cudaStreamCaptureStatus status;
    LOOM_CUDA_CHECK(cudaStreamIsCapturing(s, &status));
    EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
    cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(1);
    EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(graph, nullptr);
    cudaGetLastError();
  };
  refused([&] { return cudaStreamSynchronize(s); }, cudaErrorStreamCaptureUnsupported);
  refused([&] { return cudaDeviceSynchronize(); }, cudaErrorStreamCaptureUnsupported);
  void* p = nullptr;
  refused([&] { return cudaMalloc(&p, 64); }, cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(p, nullptr);
  std::vector<uint16_t> host(16);
  refused([&] { return cudaMemcpy(host.data(), b.x, 32, cudaMemcpyDeviceToHost); }, cudaErrorStreamCaptureUnsupported);
  refused(
      [&] {
        LOOM_LAUNCH(fill_kernel, 1, 32, 0, nullptr)(b.mean);  // the legacy stream
        return cudaGetLastError();
      },
      cudaErrorStreamCaptureImplicit);
  // A record taken into the capture cannot be waited on by the host.
  cudaEvent_t e;
  LOOM_CUDA_CHECK(cudaEventCreate(&e));
  LOOM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  LOOM_CUDA_CHECK(cudaEventRecord(e, s));
  EXPECT_EQ(cudaEventSynchronize(e), cudaErrorCapturedEvent);
  cudaGetLastError();
  cudaGraph_t graph;
  LOOM_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  LOOM_CUDA_CHECK(cudaGraphDestroy(graph));
  LOOM_CUDA_CHECK(cudaEventDestroy(e));
  // The legacy stream cannot capture; after all this the stream works as before.
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported);
  cudaGetLastError();
  cuda::gelu_forward(b.g, b.h, int64_t(Block::N) * Block::C, s);
  LOOM_CUDA_CHECK(cudaStreamSynchronize(s));
  LOOM_CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace
