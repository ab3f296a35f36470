// data.doc_mask's CUDA kernels against their CPU twins: the position embedding and RoPE by
// each token's position in its document, and attention that keeps each query inside its
// document (tensor-core and row-wise kernels, forward and backward). Documents of one token,
// documents that cross a 64-row tile, one that starts on a tile's first row, and a sequence
// that is one document (the causal mask alone).
#include <gtest/gtest.h>

#include "kernels/ops.h"
#include "tests/cuda/cuda_testing.h"

using namespace loom;
using namespace loom::testing_cuda;

namespace {

// pos [B*T]: sequence b's documents start at starts[b % starts.size()] (and at 0).
std::vector<int32_t> doc_pos(int B, int T, const std::vector<std::vector<int>>& starts) {
  std::vector<int32_t> pos(size_t(B) * T);
  for (int b = 0; b < B; ++b) {
    const auto& s = starts[size_t(b) % starts.size()];
    int first = 0;
    for (int t = 0; t < T; ++t) {
      for (int x : s)
        if (x == t) first = t;
      pos[size_t(b) * T + t] = t - first;
    }
  }
  return pos;
}
const std::vector<std::vector<int>> kStarts = {{3, 4, 5, 60, 64, 65, 140, 199}, {}, {128, 129, 250}};

}  // namespace

TEST(CudaHost, PositionIndexGroupsRowsByPosition) {
  const std::vector<int32_t> pos = {0, 1, 2, 0, 1, 0};  // T = 4: position 3 has no row
  EXPECT_EQ(cuda::position_index(pos.data(), 6, 4), (std::vector<int32_t>{0, 3, 5, 6, 6, /*rows*/ 0, 3, 5, 1, 4, 2}));
  const std::vector<int32_t> bad = {0, 4};
  EXPECT_THROW(cuda::position_index(bad.data(), 2, 4), Error);
}

TEST_F(Cuda, DocMaskEmbeddingAndRope) {
  const int B = 3, T = kSanitized ? 70 : 257, C = 96, V = 50;
  const auto pos = doc_pos(B, T, kStarts);
  std::vector<int32_t> tok(size_t(B) * T);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t(i * 7 % V);
  auto wte = randn(size_t(V) * C, 40), wpe = randn(size_t(T) * C, 41), dy = randn(size_t(B) * T * C, 42);
  auto dwpe0 = randn(size_t(T) * C, 43);
  std::vector<float> out(size_t(B) * T * C), dwte(size_t(V) * C, 0.0f), dwpe = dwpe0;
  cpu::embedding_forward(out.data(), tok.data(), wte.data(), 0, V, wpe.data(), B, T, C, pos.data());
  cpu::embedding_backward(dwte.data(), 0, V, dwpe.data(), dy.data(), tok.data(), B, T, C, pos.data());
  int U = 0;
  DevRaw<int32_t> Tok(tok), Pos(pos), Index(cuda::token_index(tok.data(), B * T, 0, V, &U)),
      PosIndex(cuda::position_index(pos.data(), B * T, T));
  Dev Wte(wte), Wpe(wpe), Dy(dy), O(out.size());
  DevRaw<float> Dwte(dwte.size()), Dwpe(dwpe0), Part(size_t(cuda::embedding_partials_floats(C)));
  cuda::embedding_forward(O.p, Tok.p, Wte.p, 0, V, Wpe.p, B, T, C, Pos.p, nullptr);
  cuda::embedding_backward(Dwte.p, Dwpe.p, Dy.p, Index.p, U, B * T, B, T, C, PosIndex.p, Part.p, nullptr);
  EXPECT_TRUE(close(O.get(), out, 1e-3, 1e-2)) << "forward: wpe by position";
  EXPECT_TRUE(close(Dwpe.get(), dwpe, 1e-5, 1e-5)) << "dwpe (+=) by position";

  const int H = 4, KV = 2, D = 64;
  auto qkv = randn(size_t(B) * T * (H + 2 * KV) * D, 44);
  std::vector<float> cs(size_t(T) * D / 2), sn(size_t(T) * D / 2);
  cpu::rope_table(cs.data(), sn.data(), T, D, 10000.0f);
  auto fwd = qkv, bwd = qkv;
  cpu::rope_forward(fwd.data(), cs.data(), sn.data(), B, T, H, KV, D, pos.data());
  cpu::rope_backward(bwd.data(), cs.data(), sn.data(), B, T, H, KV, D, pos.data());
  Dev Q(qkv), G(qkv);
  DevRaw<float> Cs(cs), Sn(sn);
  cuda::rope_forward(Q.p, Cs.p, Sn.p, B, T, H, KV, D, Pos.p, nullptr);
  cuda::rope_backward(G.p, Cs.p, Sn.p, B, T, H, KV, D, Pos.p, nullptr);
  EXPECT_TRUE(close(Q.get(), fwd, 1e-3, 1e-2)) << "rope by position";
  EXPECT_TRUE(close(G.get(), bwd, 1e-3, 1e-2)) << "rope backward by position";
}

namespace {
struct MaskShape {
  int B, H, KV, D, T;
};
void PrintTo(const MaskShape& s, std::ostream* os) {
  *os << "B" << s.B << "_H" << s.H << "_KV" << s.KV << "_D" << s.D << "_T" << s.T;
}
class CudaDocMask : public Cuda, public ::testing::WithParamInterface<MaskShape> {};
}  // namespace

// Against the CPU twin with the same positions (whose backward reads its masked
// probabilities); the tensor-core kernels also against the row-wise ones.
TEST_P(CudaDocMask, AttentionStaysInsideEachDocument) {
  const auto [B, H, KV, D, T] = GetParam();
  const auto pos = doc_pos(B, T, kStarts);
  const size_t nq = size_t(B) * T * (H + 2 * KV) * D, no = size_t(B) * T * H * D;
  auto qkv = randn(nq, 50), dy = randn(no, 51);
  std::vector<float> out(no), probs(size_t(B) * H * T * T), dqkv(nq);
  cpu::attention_forward(out.data(), probs.data(), qkv.data(), {B, T, H, KV, D, pos.data()});
  cpu::attention_backward(dqkv.data(), dy.data(), qkv.data(), probs.data(), {B, T, H, KV, D});
  DevRaw<int32_t> Pos(pos);
  Dev Q(qkv), Dy(dy), O(no), DQ(std::vector<float>(nq, 7.0f));
  DevRaw<float> L(size_t(B) * H * T), S(size_t(B) * H * T);
  cuda::attention_forward(O.p, L.p, Q.p, B, T, H, KV, D, Pos.p, nullptr);
  cuda::attention_backward(DQ.p, Dy.p, O.p, Q.p, L.p, S.p, B, T, H, KV, D, Pos.p, nullptr);
  const auto o = O.get(), dq = DQ.get();
  EXPECT_TRUE(close(o, out, 1e-2, 1e-2)) << "forward";
  EXPECT_TRUE(close(dq, dqkv, 3e-2, 3e-2)) << "backward";
  if (D == 32) return;  // the row-wise kernels were the path
  Dev RO(no), RDQ(nq);
  DevRaw<float> RL(size_t(B) * H * T);
  cuda::reference::attention_forward_rowwise(RO.p, RL.p, Q.p, B, T, H, KV, D, Pos.p, nullptr);
  cuda::reference::attention_backward_rowwise(RDQ.p, Dy.p, O.p, Q.p, RL.p, S.p, B, T, H, KV, D, Pos.p, nullptr);
  EXPECT_TRUE(close(o, RO.get(), 1e-2, 1e-2)) << "tensor-core forward vs row-wise";
  EXPECT_TRUE(close(dq, RDQ.get(), 3e-2, 3e-2)) << "tensor-core backward vs row-wise";
  EXPECT_TRUE(close(L.get(), RL.get(), 1e-3, 1e-3)) << "lse";
}
INSTANTIATE_TEST_SUITE_P(Heads, CudaDocMask,
                         ::testing::ValuesIn(kSanitized
                                                 ? std::vector<MaskShape>{{3, 2, 1, 64, 70}, {3, 2, 2, 32, 70}}
                                                 : std::vector<MaskShape>{
                                                       {3, 2, 1, 64, 257}, {3, 2, 2, 128, 200}, {3, 2, 2, 32, 130}}));
