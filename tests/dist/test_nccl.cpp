// The NCCL backend on GPUs: collectives over the world communicator and a group split from it,
// with rank-derived inputs. Launched with one rank per GPU; skips (exit 0, saying so) where no
// GPU is visible, as on CI machines.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "runtime/comm/mpi_group.h"
#include "runtime/comm/nccl_group.h"
#include "runtime/trace.h"

using namespace loom;

namespace {
std::shared_ptr<NcclWorld> g_world;
int g_rank = 0, g_size = 1;

std::vector<float> run_on_device(std::vector<float> host, size_t out_n, const std::function<Work(float*, float*)>& op) {
  float *in = nullptr, *out = nullptr;
  cudaMalloc(&in, host.size() * 4);
  cudaMalloc(&out, std::max<size_t>(out_n, 1) * 4);
  cudaMemcpy(in, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
  op(in, out).wait();
  std::vector<float> res(out_n);
  cudaMemcpy(res.data(), out_n ? out : in, out_n * 4, cudaMemcpyDeviceToHost);
  cudaFree(in);
  cudaFree(out);
  return res;
}
}  // namespace

TEST(Nccl, WorldCollectives) {
  auto g = nccl_group(g_world, "world", 0, {});
  const int n = g_size, k = 64;
  int wsum = n * (n - 1) / 2;
  auto ar = run_on_device(std::vector<float>(k, float(g_rank)), k, [&](float* in, float* out) {
    cudaMemcpy(out, in, k * 4, cudaMemcpyDeviceToDevice);
    return g->all_reduce(Buf(out, k));
  });
  EXPECT_EQ(ar, std::vector<float>(k, float(wsum)));
  auto ag = run_on_device(std::vector<float>(k, float(g_rank)), size_t(n * k),
                          [&](float* in, float* out) { return g->all_gather(Buf(in, k), Buf(out, n * k)); });
  for (int r = 0; r < n; ++r) EXPECT_EQ(ag[size_t(r * k)], float(r));
  auto rs = run_on_device(std::vector<float>(size_t(n * k), 1.0f), k,
                          [&](float* in, float* out) { return g->reduce_scatter(Buf(in, n * k), Buf(out, k)); });
  EXPECT_EQ(rs, std::vector<float>(k, float(n)));
  auto sub = nccl_group(g_world, "even_odd", g_rank % 2, {});
  EXPECT_EQ(sub->size(), (n + 1 - g_rank % 2) / 2);
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  MpiWorld mpi(&argc, &argv);
  g_rank = mpi.rank(), g_size = mpi.size();
  const int devices = cuda_device_count();
  if (devices < 1) {
    if (g_rank == 0) std::printf("test_nccl: no CUDA device visible; the NCCL tests were skipped\n");
    return 0;
  }
  cudaSetDevice(g_rank % devices);
  int rc;
  {
    Trace trace(false);
    std::vector<int> all(static_cast<size_t>(g_size));
    for (int r = 0; r < g_size; ++r) all[size_t(r)] = r;
    auto world = mpi_group("world", 0, all, &trace);
    g_world = nccl_world_create(*world);
    rc = RUN_ALL_TESTS();
    g_world.reset();
  }
  return rc;
}
