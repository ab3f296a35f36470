// Context parallel's CUDA block kernels (attention_block.cu) against their CPU twins
// (kernels/cpu/attention.cpp, themselves tested against the whole sequence's attention in
// double), as one rank of a cp group runs them: its queries against every rank's key/value
// block in ring order (its own first), then the backward over the same blocks, each block's
// fp32 key/value gradient separately and the rank's own dqkv stored. The positions are
// cp_positions' load-balanced chunks, so blocks are wholly visible, wholly masked or masked
// in part; GQA groups of 2 and of 1; and a second run repeats the first's bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/ops.h"
#include "model/context_parallel.h"
#include "tests/cuda/cuda_testing.h"

using namespace loom;
using namespace loom::testing_cuda;

namespace {

// own_first: the ring's order (this rank's block first); else the others' first, own last, so
// that rank 0's first block leaves its first chunk's rows with no visible key (max -inf).
// reversed: each rank's rows hold its positions in descending order (the kernels must not
// assume them sorted: a tile's or a warp's first position is then its last).
// docs: data.doc_mask's documents, of 5, 11, 2, 23, 5, 11, ... tokens (shifted per sequence),
// crossing the ranks' chunks and the kernels' tiles.
struct CpShape {
  int B, H, KV, D, T, cp, rank;
  bool own_first, reversed = false, docs = false;
};
void PrintTo(const CpShape& s, std::ostream* os) {
  *os << "B" << s.B << "_H" << s.H << "_KV" << s.KV << "_D" << s.D << "_T" << s.T << "_cp" << s.cp << "_rank" << s.rank
      << (s.own_first ? "_ring" : "_own_last") << (s.reversed ? "_reversed" : "") << (s.docs ? "_docs" : "");
}
class CudaCp : public Cuda, public ::testing::WithParamInterface<CpShape> {};

}  // namespace

TEST_P(CudaCp, BlockAttentionMatchesTheCpuTwin) {
  const auto [B, H, KV, D, T, cp, rank, own_first, reversed, docs] = GetParam();
  const int Tl = T / cp;
  const size_t nq = size_t(B) * Tl * (H + 2 * KV) * D, no = size_t(B) * Tl * H * D, nkv = size_t(B) * Tl * 2 * KV * D;
  std::vector<int32_t> table;
  for (int r = 0; r < cp; ++r) {
    const auto p = cp_positions(T, cp, r);
    if (reversed)
      table.insert(table.end(), p.rbegin(), p.rend());
    else
      table.insert(table.end(), p.begin(), p.end());
  }
  auto pos = [&](const int32_t* base, int r) { return base + size_t(r) * Tl; };
  // This rank's queries' positions in their documents, [B, Tl].
  std::vector<int32_t> qdoc(size_t(B) * Tl);
  for (int b = 0; b < B; ++b) {
    const int lengths[] = {5, 11, 2, 23};
    std::vector<int32_t> in_doc(static_cast<size_t>(T));
    for (int t = 0, d = b, at = 0; t < T; ++t) {
      if (t - at == lengths[d % 4]) at = t, ++d;
      in_doc[size_t(t)] = t - at;
    }
    for (int t = 0; t < Tl; ++t) qdoc[size_t(b * Tl + t)] = in_doc[size_t(pos(table.data(), rank)[t])];
  }
  const int32_t* qd = docs ? qdoc.data() : nullptr;
  // Every rank's qkv; this rank's queries, every rank's keys and values.
  std::vector<std::vector<float>> qkv;
  std::vector<std::vector<float>> kv(static_cast<size_t>(cp), std::vector<float>(nkv));
  for (int r = 0; r < cp; ++r) {
    qkv.push_back(randn(nq, 60 + uint64_t(r)));
    cpu::attention_kv_extract(kv[size_t(r)].data(), qkv[size_t(r)].data(), B, Tl, H, KV, D);
  }
  const auto dy = randn(no, 70);
  const std::vector<float>& q = qkv[size_t(rank)];
  std::vector<int> order;
  for (int s = 0; s < cp; ++s) order.push_back(own_first ? (rank + cp - s) % cp : (rank + 1 + s) % cp);

  // CPU twin.
  std::vector<float> acc(no), ml(size_t(B) * H * Tl * 2), out(no), lse(size_t(B) * H * Tl), delta(lse.size());
  std::vector<float> scratch(size_t(cpu::attention_block_scratch(B, Tl, Tl, H, KV)));
  for (int s = 0; s < cp; ++s)
    cpu::attention_block_forward(
        acc.data(), ml.data(), q.data(), kv[size_t(order[size_t(s)])].data(),
        {B, Tl, Tl, H, KV, D, pos(table.data(), rank), pos(table.data(), order[size_t(s)]), qd}, s == 0,
        scratch.data());
  cpu::attention_block_finish(out.data(), lse.data(), acc.data(), ml.data(), B, Tl, H, D);
  const auto out_b = rounded(out);  // what the CUDA path keeps (bf16), for both backwards
  cpu::attention_block_delta(delta.data(), dy.data(), out_b.data(), B, Tl, H, D);
  std::vector<float> dq(no, 0.0f), dqkv(nq);
  std::vector<std::vector<float>> dkv;  // nonzero to start with: backward adds into them
  for (int r = 0; r < cp; ++r) dkv.push_back(randn(nkv, 80 + uint64_t(r), 0.1f));
  for (int src : order)
    cpu::attention_block_backward(
        dq.data(), dkv[size_t(src)].data(), dy.data(), q.data(), kv[size_t(src)].data(), lse.data(), delta.data(),
        {B, Tl, Tl, H, KV, D, pos(table.data(), rank), pos(table.data(), src), qd}, scratch.data());
  cpu::attention_block_grads_store(dqkv.data(), dq.data(), dkv[size_t(rank)].data(), B, Tl, H, KV, D);

  // CUDA: the same calls, the key/value blocks extracted on the device.
  DevRaw<int32_t> Table(table), Qdoc(qdoc);
  const int32_t* Qd = docs ? Qdoc.p : nullptr;
  Dev Q(q), Dy(dy), Ob(out_b);
  std::vector<std::unique_ptr<Dev>> Qr, KVr;
  for (int r = 0; r < cp; ++r) {
    Qr.push_back(std::make_unique<Dev>(qkv[size_t(r)]));
    KVr.push_back(std::make_unique<Dev>(nkv));
    cuda::attention_kv_extract(KVr.back()->p, Qr.back()->p, B, Tl, H, KV, D, nullptr);
  }
  EXPECT_TRUE(close(KVr[size_t(rank)]->get(), kv[size_t(rank)], 0, 0)) << "kv_extract";
  // Forward and backward; the backward from the CPU's forward (bf16 output, its lse), so the
  // gradients carry their own error only. Run twice: the second must repeat the first's bits.
  struct Got {
    std::vector<float> out, lse, delta, dq, dqkv;
    std::vector<std::vector<float>> dkv;
  };
  auto run = [&] {
    Got got;
    DevRaw<float> Acc(std::vector<float>(no, NAN)), Ml(std::vector<float>(ml.size(), NAN)), L(lse.size()),
        Delta(lse.size()), DQ(std::vector<float>(no, 0.0f)), Lc(lse);
    Dev O(out_b.size()), DQKV(std::vector<float>(nq, 7.0f));
    for (int s = 0; s < cp; ++s)
      cuda::attention_block_forward(Acc.p, Ml.p, Q.p, KVr[size_t(order[size_t(s)])]->p,
                                    {B, Tl, Tl, H, KV, D, pos(Table.p, rank), pos(Table.p, order[size_t(s)]), Qd},
                                    s == 0, nullptr);
    cuda::attention_block_finish(O.p, L.p, Acc.p, Ml.p, B, Tl, H, D, nullptr);
    cuda::attention_block_delta(Delta.p, Dy.p, Ob.p, B, Tl, H, D, nullptr);
    std::vector<std::unique_ptr<DevRaw<float>>> DKV;
    for (int r = 0; r < cp; ++r) DKV.push_back(std::make_unique<DevRaw<float>>(randn(nkv, 80 + uint64_t(r), 0.1f)));
    for (int src : order)
      cuda::attention_block_backward(DQ.p, DKV[size_t(src)]->p, Dy.p, Q.p, KVr[size_t(src)]->p, Lc.p, Delta.p,
                                     {B, Tl, Tl, H, KV, D, pos(Table.p, rank), pos(Table.p, src), Qd}, nullptr);
    cuda::attention_block_grads_store(DQKV.p, DQ.p, DKV[size_t(rank)]->p, B, Tl, H, KV, D, nullptr);
    got.out = O.get(), got.lse = L.get(), got.delta = Delta.get(), got.dq = DQ.get(), got.dqkv = DQKV.get();
    for (auto& d : DKV) got.dkv.push_back(d->get());
    return got;
  };
  const Got got = run();
  EXPECT_TRUE(close(got.out, out, 1e-2, 1e-2)) << "forward";
  EXPECT_TRUE(close(got.lse, lse, 1e-4, 1e-4)) << "lse";
  EXPECT_TRUE(close(got.delta, delta, 1e-4, 1e-4)) << "delta";
  // P and dS rounded to bf16 for their tensor-core products (the CPU twin keeps fp32): each
  // element within 1e-2, and the whole within 3e-3 of the twin's norm (these shapes: 1.0-1.8e-3).
  auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0, n = 0;
    for (size_t i = 0; i < a.size(); ++i) d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), n += double(b[i]) * b[i];
    return std::sqrt(d / n);
  };
  EXPECT_TRUE(close(got.dq, dq, 1e-2, 1e-2)) << "dq";
  EXPECT_LT(rel(got.dq, dq), 3e-3) << "dq";
  for (int r = 0; r < cp; ++r) {
    EXPECT_TRUE(close(got.dkv[size_t(r)], dkv[size_t(r)], 1e-2, 1e-2)) << "dkv of rank " << r;
    EXPECT_LT(rel(got.dkv[size_t(r)], dkv[size_t(r)]), 3e-3) << "dkv of rank " << r;
  }
  EXPECT_TRUE(close(got.dqkv, dqkv, 1e-2, 1e-2)) << "dqkv";
  if (kSanitized) return;  // the repeat is a property of the plain build's arithmetic
  const Got again = run();
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same(again.out, got.out) && same(again.lse, got.lse)) << "forward, run 2";
  EXPECT_TRUE(same(again.dq, got.dq) && same(again.dqkv, got.dqkv)) << "dq, run 2";
  for (int r = 0; r < cp; ++r) EXPECT_TRUE(same(again.dkv[size_t(r)], got.dkv[size_t(r)])) << "dkv " << r << ", run 2";
}
// Partial tiles everywhere (Tl < 64), and Tl = 160: three key tiles, the last ragged, so the
// running state and the double buffers cross tiles.
INSTANTIATE_TEST_SUITE_P(Ranks, CudaCp,
                         ::testing::ValuesIn(kSanitized
                                                 ? std::vector<CpShape>{{2, 2, 1, 32, 16, 2, 0, false},
                                                                        {2, 2, 2, 64, 16, 2, 1, true},
                                                                        {1, 2, 1, 32, 144, 2, 0, true, true, true}}
                                                 : std::vector<CpShape>{{2, 4, 2, 32, 64, 2, 0, true},
                                                                        {2, 4, 2, 32, 64, 2, 0, false},
                                                                        {2, 4, 2, 32, 64, 2, 1, true},
                                                                        {2, 2, 1, 64, 96, 4, 1, true},
                                                                        {1, 2, 2, 128, 64, 4, 3, false},
                                                                        {1, 2, 1, 64, 320, 2, 1, true},
                                                                        {1, 2, 1, 128, 144, 2, 1, true},
                                                                        {2, 4, 2, 32, 64, 2, 1, true, true},
                                                                        {2, 4, 2, 32, 64, 2, 0, true, false, true},
                                                                        {1, 2, 1, 64, 320, 2, 1, false, true, true},
                                                                        {1, 2, 1, 128, 144, 2, 0, true, false, true},
                                                                        {1, 2, 1, 64, 320, 2, 0, false, true}}));
