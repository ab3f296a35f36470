// Every collective on every axis of an 8-rank mesh (pp2 x dp2 x tp2), with inputs derived
// from the rank and results checked against closed forms. Run by ctest through
// `mpirun -np 8 --oversubscribe`; every rank runs every test.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "model/backend.h"
#include "model/tensor_parallel.h"
#include "parallel/grad_tree.h"
#include "runtime/comm/mpi_group.h"
#include "runtime/mesh.h"
#include "runtime/trace.h"

using namespace loom;

namespace {
DeviceMesh* g_mesh = nullptr;
int g_rank = 0;
}  // namespace

class Collectives : public ::testing::TestWithParam<Axis> {
 protected:
  ProcessGroup& group() { return g_mesh->group(GetParam()); }
  // World rank of group member j.
  int W(int j) { return group().world_ranks()[size_t(j)]; }
};

TEST_P(Collectives, AllReduceSumMaxAndInt) {
  auto& g = group();
  const int n = g.size(), k = 1000;
  std::vector<float> x(k);
  for (int i = 0; i < k; ++i) x[size_t(i)] = float(g_rank) + 0.5f * float(i);
  std::vector<int32_t> xi(3, g_rank + 1);
  float mx = float(g_rank);
  const int64_t seq0 = g.counters().seq;
  Work a = g.all_reduce(Buf(x.data(), k));
  Work b = g.all_reduce(Buf(xi.data(), 3));
  Work c = g.all_reduce(Buf(&mx, 1), ReduceOp::max);
  a.wait(), b.wait(), c.wait();
  int wsum = 0, wmax = 0;
  for (int j = 0; j < n; ++j) wsum += W(j), wmax = std::max(wmax, W(j));
  for (int i = 0; i < k; ++i) ASSERT_EQ(x[size_t(i)], float(wsum) + float(n) * 0.5f * float(i)) << i;
  EXPECT_EQ(xi, std::vector<int32_t>(3, wsum + n));
  EXPECT_EQ(mx, float(wmax));
  EXPECT_EQ(g.counters().seq - seq0, 3);
}

// The scalars that travel (loss sums, squared norms) reduce in double, and bf16 reduces through
// loom's own MPI ops: sums in fp32, rounded once per pair.
TEST_P(Collectives, AllReduceDoubleAndBf16) {
  auto& g = group();
  const int n = g.size();
  int wsum = 0;
  for (int j = 0; j < n; ++j) wsum += W(j);
  // 1 + 1e-10 (r + 1): a float would round every term to 1.
  std::vector<double> d = {1.0 + 1e-10 * double(g_rank + 1), 1.0 / 3.0};
  g.all_reduce(Buf(d.data(), 2)).wait();
  EXPECT_NEAR(d[0], double(n) + 1e-10 * double(wsum + n), 1e-14);
  EXPECT_NEAR(d[1], double(n) / 3.0, 1e-15);
  std::vector<bf16> h(4);
  for (int i = 0; i < 4; ++i) h[size_t(i)].bits = f32_to_bf16(float(g_rank) + 0.5f * float(i));
  g.all_reduce(Buf(h.data(), 4, DType::bf16, DeviceKind::cpu)).wait();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bf16_to_f32(h[size_t(i)].bits), float(wsum) + float(n) * 0.5f * float(i)) << i;
  bf16 mx{f32_to_bf16(float(g_rank))};
  g.all_reduce(Buf(&mx, 1, DType::bf16, DeviceKind::cpu), ReduceOp::max).wait();
  int wmax = 0;
  for (int j = 0; j < n; ++j) wmax = std::max(wmax, W(j));
  EXPECT_EQ(bf16_to_f32(mx.bits), float(wmax));
}

TEST_P(Collectives, ReduceScatterAndAllGather) {
  auto& g = group();
  const int n = g.size(), r = g.rank(), k = 37;
  std::vector<float> in(static_cast<size_t>(n * k)), out(static_cast<size_t>(k));
  for (int b = 0; b < n; ++b)
    for (int i = 0; i < k; ++i) in[size_t(b * k + i)] = float(g_rank * 100 + b * 10 + i);
  g.reduce_scatter(Buf(in.data(), n * k), Buf(out.data(), k)).wait();
  int wsum = 0;
  for (int j = 0; j < n; ++j) wsum += W(j);
  for (int i = 0; i < k; ++i) ASSERT_EQ(out[size_t(i)], float(wsum * 100 + n * (r * 10 + i)));

  std::vector<float> mine(static_cast<size_t>(k)), all(static_cast<size_t>(n * k), -1.0f);
  for (int i = 0; i < k; ++i) mine[size_t(i)] = float(g_rank * 10 + i);
  g.all_gather(Buf(mine.data(), k), Buf(all.data(), n * k)).wait();
  for (int b = 0; b < n; ++b)
    for (int i = 0; i < k; ++i) ASSERT_EQ(all[size_t(b * k + i)], float(W(b) * 10 + i));
  // In place: this rank's block already sits in the output.
  std::vector<float> inplace(static_cast<size_t>(n * k), 0.0f);
  for (int i = 0; i < k; ++i) inplace[size_t(r * k + i)] = float(g_rank);
  g.all_gather(Buf(inplace.data() + r * k, k), Buf(inplace.data(), n * k)).wait();
  for (int b = 0; b < n; ++b) ASSERT_EQ(inplace[size_t(b * k)], float(W(b)));
}

TEST_P(Collectives, BroadcastFromTheLastRank) {
  auto& g = group();
  std::vector<float> x(5, float(g_rank));
  g.broadcast(Buf(x.data(), 5), g.size() - 1).wait();
  EXPECT_EQ(x, std::vector<float>(5, float(W(g.size() - 1))));
}

TEST_P(Collectives, AllToAllVWithSilentRanks) {
  auto& g = group();
  const int n = g.size(), r = g.rank();
  // Rank 0 sends nothing; the last rank receives nothing; the rest send (s + d) % 3 + 1.
  auto cnt = [n](int s, int d) -> int64_t { return s == 0 || d == n - 1 ? 0 : (s + d) % 3 + 1; };
  std::vector<int64_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
  for (int d = 0; d < n; ++d) sc[size_t(d)] = cnt(r, d), rc[size_t(d)] = cnt(d, r);
  std::vector<float> in, out(static_cast<size_t>(std::accumulate(rc.begin(), rc.end(), int64_t{0})), -1.0f);
  for (int d = 0; d < n; ++d)
    for (int e = 0; e < sc[size_t(d)]; ++e) in.push_back(float(r * 1000 + d * 10 + e));
  in.push_back(0);  // never empty storage
  g.all_to_all_v(Buf(in.data(), int64_t(in.size()) - 1), sc, Buf(out.data(), int64_t(out.size())), rc).wait();
  size_t at = 0;
  for (int s = 0; s < n; ++s)
    for (int e = 0; e < rc[size_t(s)]; ++e) ASSERT_EQ(out[at++], float(s * 1000 + r * 10 + e));
  EXPECT_EQ(at, out.size());
}

TEST_P(Collectives, SendRecvRingAndBarrier) {
  auto& g = group();
  const int n = g.size(), r = g.rank();
  if (n == 1) GTEST_SKIP() << "a group of one has no ring";
  float out = float(g_rank), in = -1;
  // One group: every rank receives before it sends, which NCCL's in-order rules allow only
  // when the two progress together.
  g.group_start();
  Work rx = g.recv(Buf(&in, 1), (r + n - 1) % n, 7);
  Work tx = g.send(Buf(&out, 1), (r + 1) % n, 7);
  g.group_end();
  rx.wait(), tx.wait();
  EXPECT_EQ(in, float(W((r + n - 1) % n)));
  g.barrier().wait();
}

// Tensor-parallel conjugate pairs, each on its own, over this rank's tp group.
TEST(ConjugatePairs, EachHalfMatchesItsClosedForm) {
  ProcessGroup& tp = g_mesh->group(Axis::tp);
  const int n = tp.size(), r = tp.rank(), k = 6;
  auto W = [&](int j) { return tp.world_ranks()[size_t(j)]; };
  int wsum = 0;
  for (int j = 0; j < n; ++j) wsum += W(j);
  std::vector<float> g(k);
  for (int i = 0; i < k; ++i) g[size_t(i)] = float(g_rank + i);
  copy_to_tp_backward(tp, Buf(g.data(), k), host_stream());  // identity forward, all-reduce backward
  for (int i = 0; i < k; ++i) EXPECT_EQ(g[size_t(i)], float(wsum + n * i));
  std::vector<float> x(k, float(g_rank));
  reduce_from_tp_forward(tp, Buf(x.data(), k), host_stream());  // all-reduce forward, identity backward
  EXPECT_EQ(x, std::vector<float>(size_t(k), float(wsum)));

  // Sequence parallel: rows split in tp blocks of k elements.
  std::vector<float> shard(k), full(static_cast<size_t>(n * k)), back(k);
  for (int i = 0; i < k; ++i) shard[size_t(i)] = float(g_rank * 100 + i);
  gather_from_sp_forward(tp, Buf(shard.data(), k), Buf(full.data(), n * k), host_stream());
  for (int b = 0; b < n; ++b)
    for (int i = 0; i < k; ++i) EXPECT_EQ(full[size_t(b * k + i)], float(W(b) * 100 + i));
  scatter_to_sp_backward(tp, Buf(shard.data(), k), Buf(full.data(), n * k), host_stream());  // the same all-gather
  for (int b = 0; b < n; ++b) EXPECT_EQ(full[size_t(b * k)], float(W(b) * 100));
  for (int j = 0; j < n * k; ++j) full[size_t(j)] = float(g_rank + j);
  gather_from_sp_backward(tp, Buf(full.data(), n * k), Buf(back.data(), k), host_stream());  // reduce-scatter
  for (int i = 0; i < k; ++i) EXPECT_EQ(back[size_t(i)], float(wsum + n * (r * k + i)));
  std::fill(back.begin(), back.end(), -1.0f);
  scatter_to_sp_forward(tp, Buf(full.data(), n * k), Buf(back.data(), k), host_stream());  // the same reduce-scatter
  for (int i = 0; i < k; ++i) EXPECT_EQ(back[size_t(i)], float(wsum + n * (r * k + i)));
}

namespace {
// Values whose sum depends on the order (2^24 + 1 rounds back to 2^24 in fp32), rotated per
// element so that every pairing is tried.
float order_sensitive(int rank, int64_t e) {
  static const float base[8] = {16777216.0f, 1.0f, -16777216.0f, 1.0f, 16777216.0f, 3.0f, -16777216.0f, 1.0f};
  return base[(rank + e) % 8] * float(1 + e % 3);
}
// The canonical binary tree's sum of v: neighbours first, then pairs of pairs.
float tree_sum(std::vector<float> v) {
  for (size_t w = 1; w < v.size(); w *= 2)
    for (size_t i = 0; i + w < v.size(); i += 2 * w) v[i] = v[i] + v[i + w];
  return v[0];
}
}  // namespace

// parallel.invariant's all-reduce adds in the canonical binary tree over the ranks (rank r is
// leaf r), whatever the buffer's length: order-sensitive values against the tree computed
// here; a left-to-right sum, a ring's or a reversed pairing's gives other bits.
TEST(TreeAllReduce, AddsInTheCanonicalTree) {
  ProcessGroup& g = g_mesh->world_group();
  const int p = g.size(), r = g.rank();
  auto value = order_sensitive;
  auto tree = [&](int64_t e) {
    std::vector<float> v;
    for (int q = 0; q < p; ++q) v.push_back(value(q, e));
    return tree_sum(v);
  };
  Allocator alloc;
  std::unique_ptr<Backend> be = cpu_backend(ModelDims{}, DType::f32, alloc);
  bool order_shows = false;
  for (int64_t n : {1, 3, 8, 13, 1000}) {
    std::vector<float> x(static_cast<size_t>(n)), half(static_cast<size_t>((n + 1) / 2));
    for (int64_t e = 0; e < n; ++e) x[size_t(e)] = value(r, e);
    tree_all_reduce(g, *be, Buf(x.data(), n), Buf(half.data(), int64_t(half.size())));
    for (int64_t e = 0; e < n; ++e) {
      ASSERT_EQ(x[size_t(e)], tree(e)) << "n " << n << ", element " << e;
      float left = 0;
      for (int q = 0; q < p; ++q) left += value(q, e);
      order_shows = order_shows || left != tree(e);
    }
  }
  EXPECT_TRUE(order_shows) << "no element's sum depends on the order: the test could not fail";
}

// The same sums when the buffer is cut into ranges whose tree all-reduces run at once, started
// between polls from the last range down, as DDP's backward starts its units: a range's
// elements pair by the same bits whatever range holds them. Over nccl-emulated the ranges'
// exchanges also have to be issued in the same order on every rank (it pairs them by order).
// Catches: a range's halving cut anywhere but by the tree's bits, two ranges sharing a half
// buffer, exchanges of different ranges paired with each other.
TEST(TreeAllReduce, RangesInFlightTogetherAddAsTheWhole) {
  ProcessGroup& g = g_mesh->world_group();
  const int r = g.rank();
  Allocator alloc;
  std::unique_ptr<Backend> be = cpu_backend(ModelDims{}, DType::f32, alloc);
  const std::vector<int64_t> cuts = {0, 1, 4, 13, 300, 301, 999, 1000};
  const int64_t n = cuts.back();
  auto value = [](int rank, int64_t e) { return (rank % 3 == 1 ? 16777216.0f : 1.0f) * float(1 + (e + rank) % 5); };
  std::vector<float> whole(static_cast<size_t>(n)), cut(static_cast<size_t>(n)), half(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) whole[size_t(e)] = cut[size_t(e)] = value(r, e);
  tree_all_reduce(g, *be, Buf(whole.data(), n), Buf(half.data(), (n + 1) / 2));
  TreeAllReduce t(g, *be, Buf(half.data(), (n + int64_t(cuts.size()) - 1) / 2));
  for (size_t i = cuts.size() - 1; i-- > 0;) {
    t.poll();
    t.start(Buf(cut.data() + cuts[i], cuts[i + 1] - cuts[i]));
  }
  EXPECT_FALSE(t.idle());
  t.finish();
  EXPECT_TRUE(t.idle());
  EXPECT_EQ(std::memcmp(whole.data(), cut.data(), whole.size() * sizeof(float)), 0);
  bool order_shows = false;
  for (int64_t e = 0; e < n; ++e) {
    float left = 0;
    for (int q = 0; q < g.size(); ++q) left += value(q, e);
    order_shows = order_shows || left != whole[size_t(e)];
  }
  EXPECT_TRUE(order_shows || g.size() < 4) << "no element's sum depends on the order: the test could not fail";
}

// ZeRO-2/3's reduce-scatter under parallel.invariant: rank r holds leaf r, each block's sum is
// the canonical tree over the ranks (r and r ^ 1 first), and rank r ends with block r, for
// block lengths that do not divide evenly into the halves.
// Catches: pairing from the highest bit (the old leaf mapping's tree), the blocks' permutation
// left out or applied twice (a rank would keep another rank's shard).
TEST(TreeReduceScatter, AddsInTheCanonicalTreeAndLeavesRankRShardR) {
  ProcessGroup& g = g_mesh->world_group();
  const int p = g.size(), r = g.rank();
  auto value = order_sensitive;
  auto tree = [&](int64_t e) {
    std::vector<float> v;
    for (int q = 0; q < p; ++q) v.push_back(value(q, e));
    return tree_sum(v);
  };
  Allocator alloc;
  std::unique_ptr<Backend> be = cpu_backend(ModelDims{}, DType::f32, alloc);
  bool order_shows = false;
  int64_t wrong = 0;  // (counted, not asserted: a rank leaving early would hang the others)
  for (int64_t n : {1, 5, 64}) {
    std::vector<float> in(static_cast<size_t>(n * p)), out(static_cast<size_t>(n), -1.0f);
    std::vector<float> half(static_cast<size_t>(n * p / 2 + 1));
    for (int64_t e = 0; e < n * p; ++e) in[size_t(e)] = value(r, e);
    tree_reduce_scatter(g, *be, Buf(in.data(), n * p), Buf(out.data(), n), Buf(half.data(), n * p / 2 + 1));
    for (int64_t e = 0; e < n; ++e) {
      const int64_t at = int64_t(r) * n + e;
      wrong += out[size_t(e)] != tree(at);
      std::vector<float> v;  // the pairing from the highest bit: r with r ^ p / 2 first
      for (int q = 0; q < p; ++q) v.push_back(value(bit_reverse(q, p), at));
      const float high_first = tree_sum(v);
      order_shows = order_shows || high_first != tree(at);
    }
  }
  EXPECT_EQ(wrong, 0) << "elements off the canonical tree's sum on rank " << r;
  EXPECT_TRUE(order_shows || p < 4) << "no element's sum depends on the pairing: the test could not fail";
}

// The same over a sub-group (ZeRO-2/3 with cp: the dp ranks alone, stride cp, then the cp
// ranks): the ranks that differ only in the bits [stride, stride x size) sum in their own tree
// and sub-rank k ends with block k.
// Catches: peers taken in the whole group (other ranks' values mixed in), the sub-rank read
// from the wrong bits (a rank would keep another block).
TEST(TreeReduceScatter, OverASubGroupPairsOnlyItsBits) {
  ProcessGroup& g = g_mesh->world_group();
  const int p = g.size(), r = g.rank();
  auto value = [](int rank, int64_t e) { return float(1 << (rank % 8)) * 0.25f + float(e % 7) * 16777216.0f; };
  Allocator alloc;
  std::unique_ptr<Backend> be = cpu_backend(ModelDims{}, DType::f32, alloc);
  int64_t wrong = 0;  // (counted, not asserted: a rank leaving early would hang the others)
  for (int stride = 1; stride < p; stride *= 2) {
    const int size = stride == 1 ? 2 : p / stride, k = (r / stride) % size, first = r - k * stride;
    const int64_t n = 5;
    std::vector<float> in(static_cast<size_t>(n * size)), out(static_cast<size_t>(n), -1.0f);
    std::vector<float> half(static_cast<size_t>(n * size / 2 + 1));
    for (int64_t e = 0; e < n * size; ++e) in[size_t(e)] = value(r, e);
    tree_reduce_scatter(g, *be, Buf(in.data(), n * size), Buf(out.data(), n), Buf(half.data(), n * size / 2 + 1),
                        stride, size);
    for (int64_t e = 0; e < n; ++e) {
      std::vector<float> v;
      for (int q = 0; q < size; ++q) v.push_back(value(first + q * stride, k * n + e));
      wrong += out[size_t(e)] != tree_sum(v);
    }
  }
  EXPECT_EQ(wrong, 0) << "elements off their sub-group's tree sum on rank " << r;
}

// ZeRO-2/3's per-unit reduce-scatters in flight together, as its backward's hooks drive them:
// runs of several lengths (one over a sub-group, as cp's), started between polls, finished
// partly in start order then all, give the canonical tree's sums, each in its own half.
// Catches: finish_through(k) returning before run k is summed, a run's out copied before its
// last halving, runs' exchanges paired across runs (other sums, or a hang over nccl-emulated).
TEST(TreeReduceScatter, RunsInFlightTogetherGiveTheTreeSums) {
  ProcessGroup& g = g_mesh->world_group();
  const int p = g.size(), r = g.rank();
  auto value = [](int rank, int64_t e) { return (rank % 3 == 1 ? 16777216.0f : 1.0f) * float(1 + (e * 7 + rank) % 5); };
  Allocator alloc;
  std::unique_ptr<Backend> be = cpu_backend(ModelDims{}, DType::f32, alloc);
  struct Case {
    int64_t n;
    int stride, size;
  };
  const std::vector<Case> cases = {{1, 1, 0}, {13, 1, 0}, {64, 2, p / 2}, {5, 1, 0}, {300, 1, 0}};
  std::vector<std::vector<float>> ins, want, got, halves;
  for (const Case& c : cases) {
    const int size = c.size > 0 ? c.size : p / c.stride;
    std::vector<float> in(static_cast<size_t>(c.n * size));
    for (size_t e = 0; e < in.size(); ++e) in[e] = value(r, int64_t(e));
    ins.push_back(in);
    // (the tree's sums computed here: the blocking function is the engine's start and finish)
    const int k = (r / c.stride) % size, first = r - k * c.stride;
    std::vector<float> out(static_cast<size_t>(c.n));
    for (int64_t e = 0; e < c.n; ++e) {
      std::vector<float> v;
      for (int q = 0; q < size; ++q) v.push_back(value(first + q * c.stride, k * c.n + e));
      out[size_t(e)] = tree_sum(v);
    }
    want.push_back(out);
    got.emplace_back(static_cast<size_t>(c.n), -1.0f);
    halves.emplace_back(in.size() / 2 + 1, 0.0f);
  }
  TreeReduceScatter t(g, *be);
  std::vector<int64_t> ids;
  int most = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    if (i < 3) t.poll();  // (runs 0 and 1 an exchange apart, both in flight at finish_through)
    ids.push_back(t.start(Buf(ins[i].data(), int64_t(ins[i].size())), Buf(got[i].data(), cases[i].n),
                          Buf(halves[i].data(), int64_t(halves[i].size())), cases[i].stride, cases[i].size));
    most = std::max(most, t.in_flight());
  }
  t.finish_through(ids[1]);
  const bool first_two = got[0] == want[0] && got[1] == want[1];
  t.finish();
  EXPECT_TRUE(t.idle());
  EXPECT_TRUE(first_two) << "finish_through left a run unfinished on rank " << r;
  EXPECT_GT(most, 1) << "no two runs were ever in flight: the test could not fail";
  EXPECT_GT(t.overlapped(), 0);
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(got[i], want[i]) << "run " << i << " on rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Axes, Collectives, ::testing::Values(Axis::pp, Axis::dp, Axis::tp, Axis::embed),
                         [](const auto& info) { return std::string(axis_name(info.param)); });

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  MpiWorld world(&argc, &argv);
  g_rank = world.rank();
  if (g_rank != 0) {  // one rank reports; the others speak only through the exit status
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  // --nccl-emulated: the same cases over NCCL's rules (parallel.comm = CommChoice::nccl_emulated).
  bool emulated = false;
  for (int i = 1; i < argc; ++i) emulated = emulated || std::string(argv[i]) == "--nccl-emulated";
  int rc;
  {
    Trace trace(false);
    DeviceMesh mesh(MeshDims{.pp = 2, .dp = 2, .cp = 1, .tp = 2}, world.rank(), world.size(),
                    MeshOptions{.use_mpi = true, .nccl_emulated = emulated, .trace = &trace});
    g_mesh = &mesh;
    rc = RUN_ALL_TESTS();
    mesh.world_group().barrier().wait();
    int worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);  // fail everywhere if any rank failed
    rc = worst;
  }
  return rc;
}
