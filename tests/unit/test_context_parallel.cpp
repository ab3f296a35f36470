// Context parallel's pieces on one process: the load-balanced split, the block attention
// kernels run as cp ranks would run them (every rank's queries against every rank's block, in
// ring order or gathered order) against causal attention of the whole sequence in double
// (testing.h's attention_ref) and its finite-difference gradient, the dp x cp group, and the
// refusals.
#include <numeric>

#include "kernels/ops.h"
#include "model/context_parallel.h"
#include "runtime/config.h"
#include "runtime/mesh.h"
#include "testing.h"

using namespace loom;
using namespace loom::test;
using V = std::vector<double>;

namespace {
// The whole sequence's out and dqkv computed as N cp ranks would: rank r holds rows
// cp_positions(T, N, r), meets the blocks in ring order (r, r-1, ...) or gathered order
// (0, 1, ...), and the key/value gradients of each block are summed over every rank's queries.
// doc [B,T] (data.doc_mask's positions in the documents) or null.
struct CpResult {
  std::vector<float> out, dqkv;
};
CpResult attention_as_cp(const std::vector<float>& qkv, const std::vector<float>& dout, int B, int T, int H, int KV,
                         int D, int N, bool ring, const int32_t* doc = nullptr) {
  const int row = (H + 2 * KV) * D, kvrow = 2 * KV * D, Tl = T / N;
  const size_t ranks = size_t(N);
  std::vector<std::vector<int32_t>> pos(ranks), qdoc(ranks, std::vector<int32_t>(size_t(B) * Tl));
  std::vector<std::vector<float>> local(ranks), dlocal(ranks), kv(ranks), outl(ranks), lse(ranks);
  for (int r = 0; r < N; ++r) {
    pos[size_t(r)] = cp_positions(T, N, r);
    local[size_t(r)].resize(size_t(B) * Tl * row);
    dlocal[size_t(r)].resize(size_t(B) * Tl * H * D);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < Tl; ++t) {
        const int g = pos[size_t(r)][size_t(t)];
        if (doc) qdoc[size_t(r)][size_t(b * Tl + t)] = doc[b * T + g];
        std::copy_n(&qkv[size_t((b * T + g) * row)], row, &local[size_t(r)][size_t((b * Tl + t) * row)]);
        std::copy_n(&dout[size_t((b * T + g) * H * D)], H * D, &dlocal[size_t(r)][size_t((b * Tl + t) * H * D)]);
      }
    kv[size_t(r)].resize(size_t(B) * Tl * kvrow);
    cpu::attention_kv_extract(kv[size_t(r)].data(), local[size_t(r)].data(), B, Tl, H, KV, D);
  }
  auto order = [&](int r, int s) { return ring ? (r + N - s) % N : s; };
  std::vector<std::vector<float>> dkv(ranks, std::vector<float>(size_t(B) * Tl * kvrow, 0.0f));
  std::vector<float> scores(size_t(cpu::attention_block_scratch(B, Tl, Tl, H, KV)),
                            NAN);  // what is read is written first
  CpResult res{std::vector<float>(size_t(B) * T * H * D), std::vector<float>(qkv.size())};
  for (int r = 0; r < N; ++r) {
    std::vector<float> acc(size_t(B) * Tl * H * D), ml(size_t(B) * H * Tl * 2);
    outl[size_t(r)].resize(acc.size());
    lse[size_t(r)].resize(size_t(B) * H * Tl);
    for (int s = 0; s < N; ++s) {
      const int j = order(r, s);
      const AttentionBlockShape shape{
          B, Tl, Tl, H, KV, D, pos[size_t(r)].data(), pos[size_t(j)].data(), doc ? qdoc[size_t(r)].data() : nullptr};
      cpu::attention_block_forward(acc.data(), ml.data(), local[size_t(r)].data(), kv[size_t(j)].data(), shape, s == 0,
                                   scores.data());
    }
    cpu::attention_block_finish(outl[size_t(r)].data(), lse[size_t(r)].data(), acc.data(), ml.data(), B, Tl, H, D);
    std::vector<float> delta(size_t(B) * H * Tl), dq(acc.size(), 0.0f);
    cpu::attention_block_delta(delta.data(), dlocal[size_t(r)].data(), outl[size_t(r)].data(), B, Tl, H, D);
    for (int s = 0; s < N; ++s) {
      const int j = order(r, s);
      const AttentionBlockShape shape{
          B, Tl, Tl, H, KV, D, pos[size_t(r)].data(), pos[size_t(j)].data(), doc ? qdoc[size_t(r)].data() : nullptr};
      cpu::attention_block_backward(dq.data(), dkv[size_t(j)].data(), dlocal[size_t(r)].data(), local[size_t(r)].data(),
                                    kv[size_t(j)].data(), lse[size_t(r)].data(), delta.data(), shape, scores.data());
    }
    // The block's kv gradient is complete only once every rank has added to it: store after.
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < Tl; ++t) {
        const int g = pos[size_t(r)][size_t(t)];
        std::copy_n(&outl[size_t(r)][size_t((b * Tl + t) * H * D)], H * D, &res.out[size_t((b * T + g) * H * D)]);
        std::copy_n(&dq[size_t((b * Tl + t) * H * D)], H * D, &res.dqkv[size_t((b * T + g) * row)]);
      }
  }
  for (int r = 0; r < N; ++r)
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < Tl; ++t) {
        const int g = pos[size_t(r)][size_t(t)];
        std::copy_n(&dkv[size_t(r)][size_t((b * Tl + t) * kvrow)], kvrow, &res.dqkv[size_t((b * T + g) * row + H * D)]);
      }
  return res;
}
}  // namespace

TEST(ContextParallel, ChunksAreBalancedAndCoverTheSequence) {
  for (int N : {1, 2, 3, 4, 8}) {
    const int T = 16 * N;
    std::vector<int> seen(size_t(T), 0);
    std::vector<int64_t> work;
    for (int r = 0; r < N; ++r) {
      const std::vector<int32_t> p = cp_positions(T, N, r);
      ASSERT_EQ(int(p.size()), T / N);
      // chunks r and 2N-1-r, each in order
      EXPECT_EQ(p.front(), r * T / (2 * N));
      EXPECT_EQ(p[size_t(T / (2 * N))], (2 * N - 1 - r) * T / (2 * N));
      int64_t w = 0;
      for (int32_t x : p) ++seen[size_t(x)], w += x + 1;  // causal keys each query sees
      work.push_back(w);
    }
    for (int c : seen) EXPECT_EQ(c, 1);
    for (int64_t w : work) EXPECT_EQ(w, work.front()) << "cp " << N << ": unequal attention work";
  }
  std::vector<int32_t> in(2 * 8), out(2 * 4);
  std::iota(in.begin(), in.end(), 0);
  cp_select(out.data(), in.data(), 2, 8, 2, 1);  // chunks 1 and 2 of 4: positions 2,3,4,5
  EXPECT_EQ(out, (std::vector<int32_t>{2, 3, 4, 5, 10, 11, 12, 13}));
}

// cp ranks, kv heads, ring order, documents (data.doc_mask: starts at 0, 3, 9 and 10 in the
// first sequence, crossing the ranks' chunks; 0 and 7 in the second).
class CpAttention : public ::testing::TestWithParam<std::tuple<int, int, bool, bool>> {};

// Forward against the whole sequence's attention; backward against its finite differences:
// each rank's queries and the key/value gradients summed over every rank's.
TEST_P(CpAttention, BlocksAsRanksRunThemMatchTheWholeSequence) {
  const auto [N, KV, ring, docs] = GetParam();
  const int B = 2, T = 16, H = 4, D = 4, row = (H + 2 * KV) * D;  // cp 4: runs of 2, partial prefixes
  const auto qkv = randn(size_t(B) * T * row, 300), r = randn(size_t(B) * T * H * D, 301);
  std::vector<int32_t> doc(size_t(B) * T);
  for (int t = 0; t < T; ++t) {
    doc[size_t(t)] = t < 3 ? t : t < 9 ? t - 3 : t < 10 ? 0 : t - 10;
    doc[size_t(T + t)] = t < 7 ? t : t - 7;
  }
  const int32_t* d = docs ? doc.data() : nullptr;
  const CpResult got = attention_as_cp(qkv, r, B, T, H, KV, D, N, ring, d);
  EXPECT_LT(rel_err(got.out, attention_ref(to_double(qkv), B, T, H, KV, D, d)), 1e-5);
  const V g = fd_grad([&](const V& x) { return dot(attention_ref(x, B, T, H, KV, D, d), r); }, to_double(qkv));
  EXPECT_LT(rel_err(got.dqkv, g), 1e-4);
}
INSTANTIATE_TEST_SUITE_P(RanksHeadsOrder, CpAttention,
                         ::testing::Values(std::tuple{1, 4, true, false}, std::tuple{2, 4, true, false},
                                           std::tuple{2, 2, false, false}, std::tuple{4, 1, true, false},
                                           std::tuple{4, 2, false, false}, std::tuple{2, 2, true, true},
                                           std::tuple{4, 1, false, true}));

TEST(ContextParallel, BlockOrderChangesOnlyRounding) {
  const int B = 1, T = 16, H = 2, KV = 1, D = 8, row = (H + 2 * KV) * D;
  const auto qkv = randn(size_t(B) * T * row, 310, 2.0f), r = randn(size_t(B) * T * H * D, 311);
  const CpResult ring = attention_as_cp(qkv, r, B, T, H, KV, D, 4, true);
  const CpResult gathered = attention_as_cp(qkv, r, B, T, H, KV, D, 4, false);
  EXPECT_LT(rel_err(ring.out, gathered.out), 1e-6);
  EXPECT_LT(rel_err(ring.dqkv, gathered.dqkv), 1e-5);
}

TEST(ContextParallel, DpTimesCpIsOneGroupInDpCpOrder) {
  MeshDims d{.pp = 2, .dp = 2, .cp = 2, .tp = 2};
  // rank = ((pp * dp + dp_i) * cp + cp_i) * tp + tp_i
  EXPECT_EQ(mesh_group(d, Axis::cp, 5).ranks, (std::vector<int>{5, 7}));
  EXPECT_EQ(mesh_group(d, Axis::dp, 5).ranks, (std::vector<int>{1, 5}));
  EXPECT_EQ(mesh_group(d, Axis::dcp, 5).ranks, (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(mesh_group(d, Axis::dcp, 12).ranks, (std::vector<int>{8, 10, 12, 14}));
  // ep carved out of dp x cp: blocks of ep consecutive (dp, cp) places
  MeshDims e{.pp = 1, .dp = 2, .cp = 2, .tp = 1, .ep = 2};
  EXPECT_EQ(mesh_group(e, Axis::ep, 2).ranks, (std::vector<int>{2, 3}));
  EXPECT_EQ(mesh_group(e, Axis::edp, 2).ranks, (std::vector<int>{0, 2}));
  // without cp, dcp is dp
  MeshDims f{.pp = 2, .dp = 2, .cp = 1, .tp = 2};
  EXPECT_EQ(mesh_group(f, Axis::dcp, 5).ranks, mesh_group(f, Axis::dp, 5).ranks);
}

TEST(ContextParallel, BadLayoutsAreRefusedWithWhatToChange) {
  auto refuses = [](std::vector<std::string> sets, const std::string& says) {
    Config c = config_defaults();
    try {  // refused where the value is read, or where the keys' relations are checked
      for (auto& s : sets) config_set(c, s);
      config_validate(c);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted: " << sets.front();
  };
  refuses({"parallel.cp=3", "model.seq_len=128"}, "pick seq_len a multiple of 6");
  refuses({"parallel.cp=0"}, "parallel.cp = 0 must be positive");
  refuses({"parallel.cp=2", "parallel.cp_attention=alltoall"}, "parallel.cp_attention = 'alltoall' is not one of");
  refuses({"parallel.cp_attention=allgather"}, "parallel.cp = 1, so it would do nothing");
  refuses({"parallel.cp_overlap=false"}, "parallel.cp = 1, so it would do nothing");
  refuses({"parallel.cp=2", "model.arch=llama", "model.moe.num_experts=4", "parallel.ep=4"},
          "parallel.ep = 4 does not divide parallel.dp x parallel.cp = 1 x 2");
  Config ok = config_defaults();
  for (const char* s : {"parallel.cp=2", "parallel.ep=2", "model.arch=llama", "model.moe.num_experts=4"})
    config_set(ok, s);
  EXPECT_NO_THROW(config_validate(ok));  // ep carved from cp alone
  Config docs = config_defaults();
  for (const char* s : {"parallel.cp=2", "data.doc_mask=true", "data.doc_token=5"}) config_set(docs, s);
  EXPECT_NO_THROW(config_validate(docs));  // documents may cross the ranks' chunks
  EXPECT_EQ(ok.local_seq(), ok.model.seq_len / 2);
  EXPECT_EQ(ok.world(), 2);
  EXPECT_THROW(mesh_validate(MeshDims{.pp = 1, .dp = 2, .cp = 2, .tp = 1}, 2), Error);
}
