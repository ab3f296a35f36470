// parallel.comm = "nccl-emulated" on 4 ranks (dp 2 x tp 2): the rules it keeps, each shown by
// a case that passes over MPI's forgiving groups and fails over the emulation, or the reverse.
//   loom_dist_nccl_emulated                    the gtest cases (every rank)
//   loom_dist_nccl_emulated --scenario NAME [--mpi]   a program that breaks a rule and must be
//       ended by the emulation's verdict (nccl_verdicts.sh); over MPI (--mpi) it finishes
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "runtime/comm/mpi_group.h"
#include "runtime/cuda_api.h"
#include "runtime/error.h"
#include "runtime/mesh.h"
#include "tests/unit/testing.h"

using namespace loom;

namespace {
DeviceMesh* g_mesh = nullptr;
int g_rank = 0;

ProcessGroup& dp() {
  return g_mesh->group(Axis::dp);
}
ProcessGroup& tp() {
  return g_mesh->group(Axis::tp);
}
// The message of the Error that waiting on `w` throws ("" if none).
std::string error_of(const Work& w) {
  return test::error_of([&] { w.wait(); });
}
}  // namespace

// A consumer that forgets to wait reads NaN, even once the op is done (done() does not land
// it); waiting on a later op of the same group lands the earlier one too (one stream runs them
// in order). Over MPI the read would see the sum, and so would an emulation that wrote results
// when the op completed.
TEST(NcclEmulated, ResultsLandOnlyWhenWaitedOn) {
  std::vector<float> a(64, float(g_rank)), b(8, 1.0f);
  Work wa = dp().all_reduce(Buf(a.data(), 64));
  while (!wa.done()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(std::isnan(a[0]) && std::isnan(a[63])) << "an unwaited result must read as poison, got " << a[0];
  Work wb = dp().all_reduce(Buf(b.data(), 8));
  wb.wait();
  const int peer = dp().world_ranks()[size_t(1 - dp().rank())];
  EXPECT_EQ(a[0], float(g_rank + peer));
  EXPECT_EQ(b[7], 2.0f);
  wa.wait();  // waiting again is harmless
  EXPECT_EQ(a[63], float(g_rank + peer));
}

// A send completes only once its peer has started the matching receive.
TEST(NcclEmulated, SendsWaitForTheirReceive) {
  std::vector<float> x(16, 3.0f);
  if (dp().rank() == 0) {
    Work w = dp().send(Buf(x.data(), 16), 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_FALSE(w.done()) << "the send completed before the peer posted its receive";
    w.wait();
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    dp().recv(Buf(x.data(), 16), 0).wait();
  }
  dp().barrier().wait();
}

// NCCL matches sends and receives in issue order, not by tag: the first receive gets the
// first send whatever the tags say (MPI would match by tag and swap them).
TEST(NcclEmulated, SendsMatchReceivesInIssueOrder) {
  std::vector<float> first(4, 1.0f), second(4, 2.0f), in1(4), in2(4);
  if (dp().rank() == 0) {
    Work a = dp().send(Buf(first.data(), 4), 1, 7);
    Work b = dp().send(Buf(second.data(), 4), 1, 8);
    a.wait(), b.wait();
  } else {
    Work a = dp().recv(Buf(in1.data(), 4), 0, 8);
    Work b = dp().recv(Buf(in2.data(), 4), 0, 7);
    a.wait(), b.wait();
    EXPECT_EQ(in1[0], 1.0f);
    EXPECT_EQ(in2[0], 2.0f);
  }
}

// A send and a receive that wait on each other complete inside one group.
TEST(NcclEmulated, GroupedExchangeCompletes) {
  const int peer = 1 - dp().rank();
  std::vector<float> out(32, float(g_rank)), in(32);
  dp().group_start();
  Work s = dp().send(Buf(out.data(), 32), peer);
  Work r = dp().recv(Buf(in.data(), 32), peer);
  dp().group_end();
  r.wait(), s.wait();
  EXPECT_EQ(in[31], float(dp().world_ranks()[size_t(peer)]));
}

// Several sends to one peer in one group arrive in the order they were issued, however their
// transfers interleave (a group's ops progress together, each on its own).
TEST(NcclEmulated, GroupedSendsToOnePeerKeepTheirOrder) {
  const int peer = 1 - dp().rank(), k = 6;
  for (int round = 0; round < 40; ++round) {
    std::vector<std::vector<float>> out(k), in(k, std::vector<float>(3, -1.0f));
    std::vector<Work> w;
    dp().group_start();
    for (int j = 0; j < k; ++j) {
      out[size_t(j)].assign(3, float(100 * round + j));
      w.push_back(dp().send(Buf(out[size_t(j)].data(), 3), peer));
      w.push_back(dp().recv(Buf(in[size_t(j)].data(), 3), peer));
    }
    dp().group_end();
    for (auto& x : w) x.wait();
    for (int j = 0; j < k; ++j) ASSERT_EQ(in[size_t(j)][2], float(100 * round + j)) << "round " << round;
  }
}

// A Work waited on before its group ends would wait forever (its ops start at group_end), and
// an op on another group would join NCCL's group: errors say so; the group still runs.
TEST(NcclEmulated, WaitInsideAnOpenGroupIsRefused) {
  const int peer = 1 - dp().rank();
  float out = 1.0f, in = 0.0f;
  dp().group_start();
  Work s = dp().send(Buf(&out, 1), peer);
  Work r = dp().recv(Buf(&in, 1), peer);
  const std::string e = error_of(r);
  // NCCL's group is the thread's: another group's op would join it.
  const std::string other = test::error_of([&] { tp().all_reduce(Buf(&in, 1)); });
  dp().group_end();
  EXPECT_NE(e.find("between group_start() and group_end()"), std::string::npos) << e;
  EXPECT_NE(other.find("while group 'dp' has a group_start() open"), std::string::npos) << other;
  s.wait(), r.wait();
  EXPECT_EQ(in, 1.0f);
}

// A mesh of its own, torn down right after its last wait with one Work never waited on: the
// device goes with it (on this thread; destroyed on its own executor, it would terminate).
TEST(NcclEmulated, AShortLivedMeshTearsDown) {
  for (int i = 0; i < 5; ++i) {
    DeviceMesh mesh(MeshDims{.pp = 1, .dp = 2, .cp = 1, .tp = 2}, g_rank, 4,
                    MeshOptions{.use_mpi = true, .nccl_emulated = true});
    std::vector<float> x(16, 1.0f), y(16, 1.0f);
    Work dropped = mesh.group(Axis::tp).all_reduce(Buf(x.data(), 16));
    mesh.group(Axis::dp).all_reduce(Buf(y.data(), 16)).wait();
    EXPECT_EQ(y[0], 2.0f);
  }
}

// Members that disagree on a collective get one error that names each member's op.
TEST(NcclEmulated, MismatchedCollectivesAreNamed) {
  std::vector<float> x(100, 1.0f);
  const std::string e = error_of(tp().all_reduce(Buf(x.data(), tp().rank() == 0 ? 100 : 96)));
  EXPECT_NE(e.find("differs"), std::string::npos) << e;
  EXPECT_NE(e.find("all_reduce of 100 f32 (sum)"), std::string::npos) << e;
  EXPECT_NE(e.find("all_reduce of 96 f32 (sum)"), std::string::npos) << e;
  std::vector<int32_t> i(4, 1);
  const std::string k =
      error_of(tp().rank() == 0 ? tp().all_reduce(Buf(i.data(), 4)) : tp().broadcast(Buf(i.data(), 4), 0));
  EXPECT_NE(k.find("all_reduce of 4 i32"), std::string::npos) << k;
  EXPECT_NE(k.find("broadcast of 4 i32 from root 0"), std::string::npos) << k;
}

// A receive of another size than its send fails on the receiver, naming both counts; the
// sender completes.
TEST(NcclEmulated, MismatchedSendAndReceiveAreNamed) {
  std::vector<float> x(10, 1.0f);
  if (dp().rank() == 0) {
    dp().send(Buf(x.data(), 10), 1).wait();
  } else {
    const std::string e = error_of(dp().recv(Buf(x.data(), 8), 0));
    EXPECT_NE(e.find("expects 8 f32"), std::string::npos) << e;
    EXPECT_NE(e.find("carries 10 f32"), std::string::npos) << e;
  }
  dp().barrier().wait();
}

// NCCL reads a send's buffer while the send runs: writing it before the Work is waited on is
// caught when it lands.
TEST(NcclEmulated, InputsWrittenTooEarlyAreCaught) {
  std::vector<float> x(6, 5.0f);
  if (dp().rank() == 0) {
    Work w = dp().send(Buf(x.data(), 6), 1);
    x[2] = -1.0f;
    const std::string e = error_of(w);
    EXPECT_NE(e.find("written before the op completed"), std::string::npos) << e;
  } else {
    dp().recv(Buf(x.data(), 6), 0).wait();
    EXPECT_EQ(x[2], 5.0f);  // the value as issued
  }
  dp().barrier().wait();
}

// A device buffer handed over with the host stream as its producer (the default `after`) is
// refused by every group that carries device buffers: the op would read it unordered with the
// stream that writes it. With that stream it runs: NCCL's emulation here, the MPI group's
// staged path beside it.
TEST(NcclEmulated, DeviceBuffersComeWithTheirStream) {
  const CudaApi& api = cuda_api(DeviceKind::cuda_emulated);
  std::string why;
  auto* p = static_cast<float*>(api.malloc(4 * sizeof(float), &why));
  ASSERT_NE(p, nullptr) << why;
  const Stream s{DeviceKind::cuda_emulated, api.stream_create()};
  const float ones[4] = {1, 1, 1, 1};
  for (ProcessGroup* g : {&dp(), &g_mesh->host_group(Axis::dp)}) {
    SCOPED_TRACE(g->backend());
    const Buf b(p, 4, DType::f32, DeviceKind::cuda_emulated);
    const std::string e = test::error_of([&] { g->all_reduce(b).wait(); });
    EXPECT_NE(e.find("with the host's stream as its producer"), std::string::npos) << e;
    api.memcpy_async(p, ones, sizeof(ones), s.handle);
    g->all_reduce(b, ReduceOp::sum, s).wait_on(s);
    float got[4];
    api.stream_synchronize(s.handle);
    api.memcpy(got, p, sizeof(got));
    EXPECT_EQ(got[3], float(g->size()));
  }
  api.stream_destroy(s.handle);
  api.free(p);
}

namespace {
// Programs that break a rule; the emulation must end them (nccl_verdicts.sh checks how).
int scenario(const std::string& name) {
  std::vector<float> x(1000, 1.0f), y(1000, 1.0f);
  if (name == "recv_first") {  // both ranks of each dp pair receive before they send
    const int peer = 1 - dp().rank();
    Work r = dp().recv(Buf(x.data(), 1000), peer);
    Work s = dp().send(Buf(y.data(), 1000), peer);
    r.wait(), s.wait();
  } else if (name == "dp_tp_order") {  // ranks 0 and 3 reduce over dp first, 1 and 2 over tp
    const bool dp_first = g_rank == 0 || g_rank == 3;
    ProcessGroup& a = dp_first ? dp() : tp();
    ProcessGroup& b = dp_first ? tp() : dp();
    Work wa = a.all_reduce(Buf(x.data(), 1000));
    Work wb = b.all_reduce(Buf(y.data(), 1000));
    wa.wait(), wb.wait();
  } else {
    std::fprintf(stderr, "unknown scenario %s\n", name.c_str());
    return 2;
  }
  std::fprintf(stderr, "rank %d: scenario %s finished\n", g_rank, name.c_str());
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  MpiWorld world(&argc, &argv);
  g_rank = world.rank();
  std::string name;
  bool mpi = false;  // the scenario over MPI's groups instead: the control, which finishes
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--scenario") == 0 && i + 1 < argc) name = argv[i + 1];
    if (std::strcmp(argv[i], "--mpi") == 0) mpi = true;
  }
  if (g_rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc;
  {
    DeviceMesh mesh(MeshDims{.pp = 1, .dp = 2, .cp = 1, .tp = 2}, world.rank(), world.size(),
                    MeshOptions{.use_mpi = true, .nccl_emulated = !mpi, .timeout_s = 60});
    g_mesh = &mesh;
    if (!name.empty()) return scenario(name);
    rc = RUN_ALL_TESTS();
    mesh.world_group().barrier().wait();
    int worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    rc = worst;
  }
  return rc;
}
