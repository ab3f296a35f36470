// Device groups on GPUs: NCCL collectives over the world communicator and a group split from
// it, and MPI collectives on CUDA buffers (the staged path that checks multi-rank layouts on
// one GPU), all with rank-derived inputs against closed forms, issued after a compute stream's
// work and landed on it. NCCL takes one rank per GPU: its cases skip where ranks share GPUs.
// Everything skips (exit 0, saying so) where no GPU is visible, as on CI machines.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "runtime/comm/mpi_group.h"
#include "runtime/comm/nccl_group.h"
#include "runtime/trace.h"

using namespace loom;

namespace {
std::shared_ptr<NcclWorld> g_world;
std::unique_ptr<ProcessGroup> g_mpi;
int g_rank = 0, g_size = 1;
bool g_nccl = false;

// Runs op on device copies of `host` (and an output of out_n elements, or in place when 0)
// produced and consumed on a compute stream; returns the result.
std::vector<float> run_on_device(const std::vector<float>& host, size_t out_n,
                                 const std::function<Work(float*, float*, const Stream&)>& op) {
  Stream s = cuda_stream_create(DeviceKind::cuda);
  float *in = nullptr, *out = nullptr;
  cudaMalloc(&in, host.size() * 4);
  cudaMalloc(&out, std::max<size_t>(out_n, 1) * 4);
  cudaMemcpyAsync(in, host.data(), host.size() * 4, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(s.handle));
  op(in, out, s).wait_on(s);
  std::vector<float> res(out_n ? out_n : host.size());
  cudaMemcpyAsync(res.data(), out_n ? out : in, res.size() * 4, cudaMemcpyDeviceToHost,
                  static_cast<cudaStream_t>(s.handle));
  s.synchronize();
  cudaFree(in);
  cudaFree(out);
  cuda_stream_destroy(s);
  return res;
}

void check_collectives(ProcessGroup& g) {
  const int n = g.size(), r = g.rank(), k = 64;
  int wsum = 0;
  for (int j = 0; j < n; ++j) wsum += j;
  std::vector<float> x(k);
  for (int i = 0; i < k; ++i) x[size_t(i)] = float(r * 100 + i);
  auto ar = run_on_device(x, 0, [&](float* in, float*, const Stream& s) {
    return g.all_reduce(Buf(in, k, DType::f32, DeviceKind::cuda), ReduceOp::sum, s);
  });
  for (int i = 0; i < k; ++i) ASSERT_EQ(ar[size_t(i)], float(wsum * 100 + n * i)) << i;
  auto ag = run_on_device(x, size_t(n * k), [&](float* in, float* out, const Stream& s) {
    return g.all_gather(Buf(in, k, DType::f32, DeviceKind::cuda), Buf(out, n * k, DType::f32, DeviceKind::cuda), s);
  });
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < k; ++i) ASSERT_EQ(ag[size_t(q * k + i)], float(q * 100 + i));
  std::vector<float> blocks(size_t(n * k));
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < k; ++i) blocks[size_t(q * k + i)] = float(r * 1000 + q * 10 + i);
  auto rs = run_on_device(blocks, k, [&](float* in, float* out, const Stream& s) {
    return g.reduce_scatter(Buf(in, n * k, DType::f32, DeviceKind::cuda), Buf(out, k, DType::f32, DeviceKind::cuda), s);
  });
  for (int i = 0; i < k; ++i) ASSERT_EQ(rs[size_t(i)], float(wsum * 1000 + n * (r * 10 + i))) << i;
}
}  // namespace

TEST(DeviceGroups, NcclWorldAndSplit) {
  if (!g_nccl) GTEST_SKIP() << "ranks share GPUs: NCCL takes one rank per GPU";
  auto g = nccl_group(g_world, "world", 0, {});
  check_collectives(*g);
  auto sub = nccl_group(g_world, "even_odd", g_rank % 2, {});
  EXPECT_EQ(sub->size(), (g_size + 1 - g_rank % 2) / 2);
  check_collectives(*sub);
  auto tp = nccl_group(g_world, "tp", 0, {}, NcclOptions{.on_caller_stream = true});
  check_collectives(*tp);
}

TEST(DeviceGroups, MpiStagesCudaBuffers) {
  check_collectives(*g_mpi);
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  MpiWorld mpi(&argc, &argv);
  g_rank = mpi.rank(), g_size = mpi.size();
  const int devices = cuda_device_count();
  if (devices < 1) {
    if (g_rank == 0) std::printf("test_nccl: no CUDA device visible; the device group tests were skipped\n");
    return 0;
  }
  cudaSetDevice(g_rank % devices);
  int rc;
  {
    Trace trace(false);
    std::vector<int> all(static_cast<size_t>(g_size));
    for (int r = 0; r < g_size; ++r) all[size_t(r)] = r;
    g_mpi = mpi_group("world", 0, all, &trace);
    g_nccl = mpi_local_size() <= devices;
    if (g_nccl) g_world = nccl_world_create(*g_mpi, {});
    rc = RUN_ALL_TESTS();
    g_world.reset();
    g_mpi.reset();
  }
  return rc;
}
