// Each CUDA kernel against its CPU twin (kernels/ops.h) on the same bf16-rounded inputs, at
// shapes that stress bounds: B = 3, T = 257 (a ragged last tile), rows, columns and
// vocabularies that are no multiple of any block size, a vocabulary shard that starts past 0,
// grouped-query heads 8:1 and 4:1, head dims 32, 64 and 128, and attention once at T = 1024.
// Kernels that accumulate (+=) start from non-zero buffers, so one that overwrote would fail.
// The same file runs on a GPU and on the CPU emulation (tests/cuda/cuda_testing.h).
// Tolerances, per element (atol + rtol |want|): bf16 keeps 8 significant bits, so two
// implementations that round once each differ by at most one bf16 ulp, 2^-7 relative: bf16
// outputs get rtol 1e-2. fp32 outputs that sum in another order than the CPU's get an atol
// scaled to the sum's magnitude (stated per check); bitwise ones are compared exactly.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "kernels/clip.h"
#include "kernels/moe_row.h"
#include "kernels/ops.h"
#include "runtime/exact_sum.h"
#include "tests/cuda/cuda_testing.h"

using namespace loom;
using namespace loom::testing_cuda;

namespace {

constexpr int kB = kSanitized ? 1 : 3, kT = kSanitized ? 67 : 257, kN = kB * kT;
// Rows of the column sums (norm and bias gradients): over 128 rows, so they split into chunks.
constexpr int kRows = kSanitized ? 3 * 67 : kN;

std::vector<int32_t> tokens(int n, int V, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(g() % uint64_t(V / 2));  // the lower half only: many repeats
  return t;
}

class Widths : public Cuda, public ::testing::WithParamInterface<int> {};

}  // namespace

namespace {

// LayerNorm and RMSNorm over N rows of C, forward (with and without the fused residual add)
// and backward, against the CPU's; the backward's row blocks at most max_blocks.
void norms_match_cpu(int N, int C, int max_blocks = cuda::kMaxNormGradBlocks) {
  SCOPED_TRACE(::testing::Message() << N << " rows of " << C << ", at most " << max_blocks << " blocks");
  const float* none = nullptr;
  auto x = randn(size_t(N) * C, 10), w = randn(C, 11), bb = randn(C, 12), dy = randn(size_t(N) * C, 13);
  auto dx0 = randn(size_t(N) * C, 17), dw0 = randn(C, 15), db0 = randn(C, 16);
  std::vector<float> out(size_t(N) * C), mean(N), rstd(N), dx = dx0, dw = dw0, db = db0;
  auto xi = x;
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), xi.data(), none, w.data(), bb.data(), N, C, 1e-5f);
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                          C);
  Dev X(x), W(w), Bb(bb), Dy(dy), O(size_t(N) * C), Dx(dx0);
  DevRaw<float> M(N), R(N), Dw(dw0), Db(db0), Part(static_cast<size_t>(cuda::norm_partials_floats(N, C)));
  cuda::layernorm_forward(O.p, M.p, R.p, X.p, nullptr, W.p, Bb.p, N, C, 1e-5f, nullptr);
  LOOM_CUDA_CHECK(cudaGetLastError());
  cuda::layernorm_backward(Dx.p, Dw.p, Db.p, Dy.p, X.p, W.p, M.p, R.p, N, C, Part.p, nullptr, nullptr, max_blocks);
  EXPECT_TRUE(close(O.get(), out, 2e-2, 1e-2)) << "layernorm out";
  EXPECT_TRUE(close(M.get(), mean, 1e-5, 1e-4)) << "mean";
  EXPECT_TRUE(close(R.get(), rstd, 0, 1e-4)) << "rstd";
  EXPECT_TRUE(close(Dx.get(), dx, 3e-2, 1e-2)) << "layernorm dinp (+=)";
  // Sums over N rows of O(1) products: fp32 reordering costs about N * 2^-24 of their scale.
  EXPECT_TRUE(close(Dw.get(), dw, 1e-3, 1e-4)) << "layernorm dweight (+=)";
  EXPECT_TRUE(close(Db.get(), db, 1e-4, 1e-5)) << "layernorm dbias (+=)";

  std::vector<float> rout(size_t(N) * C), rr(N), rdx = dx0, rdw = dw0;
  cpu::rmsnorm_forward(rout.data(), rr.data(), xi.data(), none, w.data(), N, C, 1e-6f);
  cpu::rmsnorm_backward(rdx.data(), rdw.data(), dy.data(), x.data(), w.data(), rr.data(), N, C);
  Dev RO(size_t(N) * C), RDx(dx0);
  DevRaw<float> RDw(dw0);
  cuda::rmsnorm_forward(RO.p, R.p, X.p, nullptr, W.p, N, C, 1e-6f, nullptr);
  cuda::rmsnorm_backward(RDx.p, RDw.p, Dy.p, X.p, W.p, R.p, N, C, Part.p, nullptr, nullptr, max_blocks);
  EXPECT_TRUE(close(RO.get(), rout, 2e-2, 1e-2)) << "rmsnorm out";
  EXPECT_TRUE(close(R.get(), rr, 0, 1e-4)) << "rmsnorm rstd";
  EXPECT_TRUE(close(RDx.get(), rdx, 3e-2, 1e-2)) << "rmsnorm dinp (+=)";
  EXPECT_TRUE(close(RDw.get(), rdw, 1e-3, 1e-4)) << "rmsnorm dweight (+=)";

  // The fused residual add: the input becomes x + a (rounded to bf16) and is normalized.
  auto a = randn(size_t(N) * C, 14);
  std::vector<float> sum(size_t(N) * C), fout(size_t(N) * C), fm(N), fr(N);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = bf16_to_f32(f32_to_bf16(x[i] + a[i]));
  auto si = sum;
  cpu::layernorm_forward(fout.data(), fm.data(), fr.data(), si.data(), none, w.data(), bb.data(), N, C, 1e-5f);
  Dev FX(x), FA(a), FO(size_t(N) * C);
  cuda::layernorm_forward(FO.p, M.p, R.p, FX.p, FA.p, W.p, Bb.p, N, C, 1e-5f, nullptr);
  EXPECT_EQ(FX.get(), sum);
  EXPECT_TRUE(close(FO.get(), fout, 2e-2, 1e-2)) << "layernorm after the residual add";
  cpu::rmsnorm_forward(fout.data(), fr.data(), si.data(), none, w.data(), N, C, 1e-6f);
  Dev RX(x);
  cuda::rmsnorm_forward(FO.p, R.p, RX.p, FA.p, W.p, N, C, 1e-6f, nullptr);
  EXPECT_EQ(RX.get(), sum);
  EXPECT_TRUE(close(FO.get(), fout, 2e-2, 1e-2)) << "rmsnorm after the residual add";
}

}  // namespace

// At the widths of GPT-2 small and LLaMA-7B (rows in registers, 128-bit words), at a width that
// is no multiple of 8 (element by element, columns past C masked), and past the widest row the
// registers hold (the scalar kernels).
TEST_P(Widths, NormsForwardAndBackward) {
  norms_match_cpu(kRows, GetParam());
}

// A row group of more than 32 rows (where N passes 32 rows a group of kMaxNormGradBlocks blocks:
// 131k rows at C 768, 49k at 2048), reached here at a few hundred rows by allowing fewer blocks:
// each lane's mean and rstd are fetched again every 32 rows, and the last group ends past N.
TEST_F(Cuda, NormBackwardRowGroupsPast32Rows) {
  norms_match_cpu(1000, 768, 2);  // 8 groups a block: 63 rows a group
  norms_match_cpu(700, 2048, 3);  // 3 groups a block: 78 rows a group
}

// Fewer rows than a block's warps, and rows narrower than a warp's first words: lanes and warps
// with nothing to do.
TEST_F(Cuda, NormsOverFewNarrowRows) {
  norms_match_cpu(3, 40);
  norms_match_cpu(2, 13);
  norms_match_cpu(5, 264);   // a second word for the first lane only
  norms_match_cpu(3, 4104);  // past the register rows (the scalar kernels), aligned words
}

// A tensor off 16 bytes takes the element-by-element path: the same bits as the 16-byte words,
// and the kernel and tensor named to the caller's ScalarPaths, once each (the backend's warns).
TEST_F(Cuda, AMisalignedTensorIsNamedOnceAndGivesTheSameBits) {
  const int N = 5, C = 64;
  auto x = randn(size_t(N) * C, 40), w = randn(C, 41), bb = randn(C, 42);
  std::vector<float> shifted(1, 0.0f);
  shifted.insert(shifted.end(), x.begin(), x.end());
  Dev X(x), Xs(shifted), W(w), Bb(bb), O(size_t(N) * C), Os(size_t(N) * C), G(size_t(N) * C), Gs(size_t(N) * C + 1);
  DevRaw<float> M(N), R(N);
  std::vector<std::string> said;
  cuda::ScalarPathsOnce paths([&](const std::string& line) { said.push_back(line); });
  cuda::layernorm_forward(O.p, M.p, R.p, X.p, nullptr, W.p, Bb.p, N, C, 1e-5f, nullptr, &paths);
  cuda::gelu_forward(G.p, X.p, int64_t(N) * C, nullptr, &paths);
  EXPECT_TRUE(said.empty()) << said.front();
  for (int run = 0; run < 2; ++run) {
    cuda::layernorm_forward(Os.p, M.p, R.p, Xs.p + 1, nullptr, W.p, Bb.p, N, C, 1e-5f, nullptr, &paths);
    cuda::gelu_forward(Gs.p + 1, X.p, int64_t(N) * C, nullptr, &paths);
  }
  LOOM_CUDA_CHECK(cudaGetLastError());
  EXPECT_EQ(O.get(), Os.get()) << "layernorm, inp off 16 bytes";
  auto gs = Gs.get();
  EXPECT_EQ(G.get(), std::vector<float>(gs.begin() + 1, gs.end())) << "gelu, out off 16 bytes";
  ASSERT_EQ(said.size(), 2u) << "once per kernel and tensor";
  EXPECT_NE(said[0].find("layernorm_forward: inp does not start on 16 bytes"), std::string::npos) << said[0];
  EXPECT_NE(said[1].find("gelu_forward: out does not start on 16 bytes"), std::string::npos) << said[1];
}

// Pointwise kernels over a length that is no multiple of the block size, the conversions, the
// adds, and the bias gradient (+=) over columns that are no multiple of its 32-column blocks.
TEST_P(Widths, PointwiseConversionsAndBiasBackward) {
  const int C = GetParam();
  const int64_t n = int64_t(kN) * C + 7;
  auto x = randn(size_t(n), 24, 2.0f), g = randn(size_t(n), 25);
  std::vector<float> go(static_cast<size_t>(n)), gd(static_cast<size_t>(n));
  cpu::gelu_forward(go.data(), x.data(), n);
  cpu::gelu_backward(gd.data(), x.data(), g.data(), n);
  Dev X(x), G(g), GO(static_cast<size_t>(n)), GD(static_cast<size_t>(n));
  cuda::gelu_forward(GO.p, X.p, n, nullptr);
  cuda::gelu_backward(GD.p, X.p, G.p, n, nullptr);
  EXPECT_TRUE(close(GO.get(), go, 1e-3, 1e-2)) << "gelu";
  EXPECT_TRUE(close(GD.get(), gd, 1e-3, 1e-2)) << "gelu backward";

  // swiglu's input is [N, 2F], its output [N, F]: F a multiple of 8 (128-bit words) or not.
  for (const int F : {C / 2 + 3, C / 16 * 8}) {
    const int N = kN;
    auto gu = randn(size_t(N) * 2 * F, 28, 2.0f), dgu = randn(size_t(N) * F, 29);
    std::vector<float> so(size_t(N) * F), sd(size_t(N) * 2 * F);
    cpu::swiglu_forward(so.data(), gu.data(), N, F);
    cpu::swiglu_backward(sd.data(), gu.data(), dgu.data(), N, F);
    Dev GU(gu), DGU(dgu), SO(so.size()), SD(std::vector<float>(sd.size(), 5.0f));  // overwritten, not added to
    cuda::swiglu_forward(SO.p, GU.p, N, F, nullptr);
    cuda::swiglu_backward(SD.p, GU.p, DGU.p, N, F, nullptr);
    EXPECT_TRUE(close(SO.get(), so, 1e-3, 1e-2)) << "swiglu, F " << F;
    EXPECT_TRUE(close(SD.get(), sd, 1e-3, 1e-2)) << "swiglu backward, F " << F;
  }

  // The residual add (bf16, rounded once) and the fp32 add: bitwise.
  std::vector<float> sum(static_cast<size_t>(n)), f32sum(static_cast<size_t>(n)), g3(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    sum[size_t(i)] = bf16_to_f32(f32_to_bf16(x[size_t(i)] + g[size_t(i)]));
    g3[size_t(i)] = g[size_t(i)] * 0.3f;  // not bf16-exact: the fp32 add must keep every bit
    f32sum[size_t(i)] = x[size_t(i)] + g3[size_t(i)];
  }
  Dev Ax(x), Ag(g);
  cuda::add_bf16(Ax.p, Ag.p, n, nullptr);
  EXPECT_EQ(Ax.get(), sum);
  DevRaw<float> Fx(x), Fg(g3);
  cuda::add_f32(Fx.p, Fg.p, n, nullptr);
  EXPECT_EQ(Fx.get(), f32sum);

  // to_bf16 rounds to nearest even (ties included), to_f32 widens exactly.
  std::vector<float> fine(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) fine[size_t(i)] = x[size_t(i)] * (1.0f + float(i % 97) / 512.0f);
  fine[0] = 1.00390625f;  // halfway between two bf16 values: rounds to the even one, 1.0
  DevRaw<float> Fine(fine), Back(static_cast<size_t>(n));
  Dev Narrow(static_cast<size_t>(n));
  cuda::to_bf16(Narrow.p, Fine.p, n, nullptr);
  cuda::to_f32(Back.p, Narrow.p, n, nullptr);
  auto want = rounded(fine);
  EXPECT_EQ(want[0], 1.0f);
  EXPECT_EQ(Narrow.get(), want);
  EXPECT_EQ(Back.get(), want);

  // dbias += column sums over M rows; N columns, no multiple of 32: a multiple of 8 (128-bit
  // words) or not (element by element).
  for (const int Nc : {C + 5, (C / 8 + 1) * 8}) {
    const int M = kRows;
    auto dout = randn(size_t(M) * Nc, 26), db0 = randn(size_t(Nc), 27);
    std::vector<float> db = db0;
    cpu::bias_backward(db.data(), dout.data(), M, Nc);
    Dev Dout(dout);
    DevRaw<float> Db(db0), Part(static_cast<size_t>(cuda::column_partials_floats(M, Nc)));
    cuda::bias_backward(Db.p, Dout.p, M, Nc, Part.p, nullptr);
    EXPECT_TRUE(close(Db.get(), db, 1e-4, 1e-5)) << "bias_backward (+=), " << Nc << " columns";
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, Widths,
                         ::testing::ValuesIn(kSanitized ? std::vector<int>{96, 200, 37}
                                                        : std::vector<int>{768, 4096, 771, 4100}));

// The token embedding over the whole vocabulary and over a shard that starts past 0, with
// and without positions; gradients (+=) against the CPU's, summed in the same order.
TEST_F(Cuda, EmbeddingWholeAndVocabShard) {
  const int B = kB, T = kT, C = kSanitized ? 96 : 768, V = 1003;
  auto tok = tokens(B * T, 2 * V, 20);  // ids up to V - 1
  for (auto& t : tok) t = t % V;
  for (auto [v0, Vl, positions] : {std::tuple{0, V, true}, std::tuple{347, V - 347, false}}) {
    auto wte = randn(size_t(Vl) * C, 21), wpe = randn(size_t(T) * C, 22), dy = randn(size_t(B) * T * C, 23);
    auto dwte0 = randn(size_t(Vl) * C, 24), dwpe0 = randn(size_t(T) * C, 25);
    std::vector<float> out(size_t(B) * T * C), dwte = dwte0, dwpe = dwpe0;
    cpu::embedding_forward(out.data(), tok.data(), wte.data(), v0, Vl, positions ? wpe.data() : nullptr, B, T, C);
    cpu::embedding_backward(dwte.data(), v0, Vl, positions ? dwpe.data() : nullptr, dy.data(), tok.data(), B, T, C);
    int U = 0;
    DevRaw<int32_t> Tok(tok), Index(cuda::token_index(tok.data(), B * T, v0, Vl, &U));
    Dev Wte(wte), Wpe(wpe), Dy(dy), O(size_t(B) * T * C);
    DevRaw<float> Dwte(dwte0), Dwpe(dwpe0), Part(size_t(cuda::embedding_partials_floats(C)));
    cuda::embedding_forward(O.p, Tok.p, Wte.p, v0, Vl, positions ? Wpe.p : nullptr, B, T, C, nullptr, nullptr);
    cuda::embedding_backward(Dwte.p, positions ? Dwpe.p : nullptr, Dy.p, Index.p, U, B * T, B, T, C, nullptr, Part.p,
                             nullptr);
    EXPECT_TRUE(close(O.get(), out, 1e-3, 1e-2)) << "v0 " << v0;
    EXPECT_TRUE(close(Dwte.get(), dwte, 1e-5, 1e-5)) << "dwte (+=), v0 " << v0;
    EXPECT_TRUE(close(Dwpe.get(), dwpe, 1e-5, 1e-5)) << "dwpe (+=, untouched without positions), v0 " << v0;
  }
}

// token_index is host code: it runs (and is checked) without a GPU.
TEST(CudaHost, TokenIndexGroupsPositionsByTokenInOrder) {
  const std::vector<int32_t> tok = {5, 3, 5, 9, 3, 5, 7};
  int U = 0;
  auto idx = cuda::token_index(tok.data(), int(tok.size()), 0, 10, &U);
  EXPECT_EQ(U, 4);
  EXPECT_EQ(idx, (std::vector<int32_t>{3, 5, 7, 9, /*starts*/ 0, 2, 5, 6, 7, /*positions*/ 1, 4, 0, 2, 5, 6, 3}));
  // A vocab shard [4, 8) keeps ids 5 and 7 only, as local ids 1 and 3.
  idx = cuda::token_index(tok.data(), int(tok.size()), 4, 4, &U);
  EXPECT_EQ(U, 2);
  EXPECT_EQ(idx, (std::vector<int32_t>{1, 3, 0, 3, 4, 0, 2, 5, 6}));
}

// RoPE forward and backward on q and k of packed qkv (v untouched), GQA 8:1 and 4:1.
TEST_F(Cuda, RopeForwardAndBackward) {
  const int B = kB, T = kT, H = 8;
  for (auto [KV, D] : {std::pair{1, 64}, std::pair{2, 128}}) {
    const size_t nq = size_t(B) * T * (H + 2 * KV) * D;
    auto qkv = randn(nq, 23);
    std::vector<float> cs(size_t(T) * D / 2), sn(size_t(T) * D / 2);
    cpu::rope_table(cs.data(), sn.data(), T, D, 10000.0f);
    auto fwd = qkv, bwd = qkv;
    cpu::rope_forward(fwd.data(), cs.data(), sn.data(), B, T, H, KV, D);
    cpu::rope_backward(bwd.data(), cs.data(), sn.data(), B, T, H, KV, D);
    Dev Q(qkv), G(qkv);
    DevRaw<float> Cs(cs), Sn(sn);
    cuda::rope_forward(Q.p, Cs.p, Sn.p, B, T, H, KV, D, nullptr, nullptr);
    cuda::rope_backward(G.p, Cs.p, Sn.p, B, T, H, KV, D, nullptr, nullptr);
    EXPECT_TRUE(close(Q.get(), fwd, 1e-3, 1e-2)) << "KV " << KV << " D " << D;
    EXPECT_TRUE(close(G.get(), bwd, 1e-3, 1e-2)) << "backward, KV " << KV << " D " << D;
  }
}

namespace {

struct AttnShape {
  int B, H, KV, D, T;
};
void PrintTo(const AttnShape& s, std::ostream* os) {
  *os << "B" << s.B << "_H" << s.H << "_KV" << s.KV << "_D" << s.D << "_T" << s.T;
}
class CudaAttention : public Cuda, public ::testing::WithParamInterface<AttnShape> {};

}  // namespace

// Against the CPU twin; at D = 32 the row-wise kernels are the path, at 64 and 128 the
// tensor-core ones, which are also checked against the row-wise ones where that is cheap.
TEST_P(CudaAttention, MatchesTheCpuTwin) {
  const auto [B, H, KV, D, T] = GetParam();
  const size_t nq = size_t(B) * T * (H + 2 * KV) * D, no = size_t(B) * T * H * D;
  auto qkv = randn(nq, 30), dy = randn(no, 31);
  std::vector<float> out(no), probs(size_t(B) * H * T * T), dqkv(nq);
  cpu::attention_forward(out.data(), probs.data(), qkv.data(), {B, T, H, KV, D});
  cpu::attention_backward(dqkv.data(), dy.data(), qkv.data(), probs.data(), {B, T, H, KV, D});
  Dev Q(qkv), Dy(dy), O(no), DQ(std::vector<float>(nq, 7.0f));  // dqkv is overwritten
  DevRaw<float> L(size_t(B) * H * T), S(size_t(B) * H * T);
  cuda::attention_forward(O.p, L.p, Q.p, B, T, H, KV, D, nullptr, nullptr);
  LOOM_CUDA_CHECK(cudaGetLastError());
  auto o = O.get();
  EXPECT_TRUE(close(o, out, 1e-2, 1e-2)) << "forward";
  // Backward reads the bf16 output the forward wrote; the CPU twin used fp32; P and dS are
  // rounded to bf16 before their products (as FlashAttention does).
  cuda::attention_backward(DQ.p, Dy.p, O.p, Q.p, L.p, S.p, B, T, H, KV, D, nullptr, nullptr);
  LOOM_CUDA_CHECK(cudaGetLastError());
  auto dq = DQ.get();
  EXPECT_TRUE(close(dq, dqkv, 3e-2, 3e-2)) << "backward";
  if (D == 32 || int64_t(B) * H * T > 2048) return;  // the row-wise kernels cost T^2 warp shuffles
  Dev RO(no), RDQ(nq);
  DevRaw<float> RL(size_t(B) * H * T);
  cuda::reference::attention_forward_rowwise(RO.p, RL.p, Q.p, B, T, H, KV, D, nullptr, nullptr);
  cuda::reference::attention_backward_rowwise(RDQ.p, Dy.p, O.p, Q.p, RL.p, S.p, B, T, H, KV, D, nullptr, nullptr);
  EXPECT_TRUE(close(o, RO.get(), 1e-2, 1e-2)) << "tensor-core forward vs row-wise";
  EXPECT_TRUE(close(dq, RDQ.get(), 3e-2, 3e-2)) << "tensor-core backward vs row-wise";
  EXPECT_TRUE(close(L.get(), RL.get(), 1e-3, 1e-3)) << "lse";
}
// Inside one 64-row tile, across several with a ragged last tile (T = 257), GQA 8:1 and 4:1,
// and once a long sequence.
INSTANTIATE_TEST_SUITE_P(
    Heads, CudaAttention,
    ::testing::ValuesIn(kSanitized ? std::vector<AttnShape>{{1, 4, 1, 64, 130}, {1, 2, 2, 128, 37}, {1, 2, 1, 32, 40}}
                                   : std::vector<AttnShape>{{2, 4, 4, 64, 37},
                                                            {1, 4, 4, 64, 200},
                                                            {kB, 8, 1, 64, kT},
                                                            {kB, 8, 2, 128, kT},
                                                            {2, 8, 2, 128, 37},
                                                            {2, 2, 2, 32, 70},
                                                            {1, 4, 1, 128, 1024}}));

// The fused loss over a vocabulary that is no multiple of the block (and over one padded:
// the padding is out of the softmax and gets a zero gradient), with dloss = 0 (the logits are
// left alone), its vocab-parallel phases on a shard that starts past 0, and the loss sum.
// The row held in shared memory (up to 56312 real ids) and read twice past that, on a few rows:
// a vocabulary of 60000 real ids padded to 60007, and rows of 5 real ids in 13 (every row starting
// at another offset within a 16-byte word); the same bits on a second run.
TEST_F(Cuda, CrossEntropyHeldAndWideRows) {
  const int N = 5;
  for (auto [V, valid] : {std::pair{60007, 60000}, std::pair{13, 5}, std::pair{56320, 56312}}) {
    auto logits = randn(size_t(N) * V, 44, 3.0f);
    std::vector<int32_t> y(N);
    for (int i = 0; i < N; ++i) y[size_t(i)] = (i * 7919) % valid;
    auto l = logits;
    std::vector<float> losses(N);
    cpu::crossentropy_forward_backward(l.data(), losses.data(), y.data(), N, V, valid, 0.5f);
    std::vector<float> runs[2];
    for (auto& grad : runs) {
      Dev Lg(logits);
      DevRaw<int32_t> Y(y);
      DevRaw<float> Ls(N);
      cuda::crossentropy_forward_backward(Lg.p, Ls.p, Y.p, N, V, valid, 0.5f, nullptr);
      EXPECT_TRUE(close(Ls.get(), losses, 1e-4, 1e-4)) << "losses, V " << V;
      grad = Lg.get();
      EXPECT_TRUE(close(grad, l, 1e-5, 1e-2)) << "gradient, V " << V;
    }
    EXPECT_EQ(runs[0], runs[1]) << "V " << V;
  }
}

TEST_F(Cuda, CrossEntropyWholeAndVocabParallel) {
  const int N = kN;
  for (auto [V, valid] : {std::pair{1003, 1003}, std::pair{1024, 1000}}) {
    auto logits = randn(size_t(N) * V, 40, 3.0f);
    for (int i = 0; i < N; ++i)
      for (int v = valid; v < V; ++v) logits[size_t(i) * V + size_t(v)] = 40.0f;  // would dominate a softmax
    std::vector<int32_t> y(N);
    for (int i = 0; i < N; ++i) y[size_t(i)] = (i * 113) % valid;
    for (float dloss : {0.5f, 0.0f}) {
      auto l = logits;
      std::vector<float> losses(N);
      cpu::crossentropy_forward_backward(l.data(), losses.data(), y.data(), N, V, valid, dloss);
      Dev Lg(logits);
      DevRaw<int32_t> Y(y);
      DevRaw<float> Ls(N);
      cuda::crossentropy_forward_backward(Lg.p, Ls.p, Y.p, N, V, valid, dloss, nullptr);
      EXPECT_TRUE(close(Ls.get(), losses, 1e-4, 1e-4)) << "losses, V " << V << " dloss " << dloss;
      auto grad = Lg.get();
      if (dloss == 0.0f) {
        EXPECT_EQ(grad, logits) << "dloss 0 leaves the logits alone";
        continue;
      }
      EXPECT_TRUE(close(grad, l, 1e-5, 1e-2)) << "gradient, V " << V;
      for (int i = 0; i < N; ++i)
        for (int v = valid; v < V; ++v) ASSERT_EQ(grad[size_t(i) * V + size_t(v)], 0.0f);
    }
  }

  // Shard 1 of 2 of a 1003-id vocabulary padded to 1024: ids [512, 1024), 491 of them real.
  // The three phases, without the reductions between them (one rank's view).
  const int V = 1024, valid = 1003, Vl = 512, v0 = 512, sv = valid - v0;
  auto shard = randn(size_t(N) * Vl, 41, 3.0f);
  std::vector<int32_t> y(N);
  for (int i = 0; i < N; ++i) y[size_t(i)] = (i * 113) % valid;  // some in the shard, some not
  std::vector<float> mx(N), tg(N), se(N), sl(N), sg = shard;
  cpu::crossentropy_shard_stats(shard.data(), y.data(), N, Vl, sv, v0, mx.data(), tg.data());
  cpu::crossentropy_shard_sumexp(shard.data(), mx.data(), N, Vl, sv, se.data());
  cpu::crossentropy_shard_finish(sg.data(), sl.data(), y.data(), N, Vl, sv, v0, mx.data(), se.data(), tg.data(), 0.5f);
  Dev Sh(shard);
  DevRaw<int32_t> Y(y);
  DevRaw<float> Mx(N), Tg(N), Se(N), Sl(N);
  cuda::crossentropy_shard_stats(Sh.p, Y.p, N, Vl, sv, v0, Mx.p, Tg.p, nullptr);
  cuda::crossentropy_shard_sumexp(Sh.p, Mx.p, N, Vl, sv, Se.p, nullptr);
  cuda::crossentropy_shard_finish(Sh.p, Sl.p, Y.p, N, Vl, sv, v0, Mx.p, Se.p, Tg.p, 0.5f, nullptr);
  EXPECT_EQ(Mx.get(), mx);  // a max of bf16-exact values is exact
  EXPECT_EQ(Tg.get(), tg);
  EXPECT_TRUE(close(Se.get(), se, 0, 1e-5)) << "sumexp";
  EXPECT_TRUE(close(Sl.get(), sl, 1e-5, 1e-5)) << "shard losses";
  EXPECT_TRUE(close(Sh.get(), sg, 1e-5, 1e-2)) << "shard gradient";
  (void)V;

  // The loss sum accumulates on the device as exact digits, onto what is there: each call's sum
  // (in double) added exactly, so the total is the same whichever way the calls are grouped.
  std::vector<float> ls = randn(size_t(N), 42);
  DevRaw<float> Ls(ls);
  ExactSum two;
  two.add(2.0);
  std::vector<double> start(kExactDigits);
  two.digits_to(start.data());
  DevRaw<double> Acc(start);
  cuda::loss_accumulate(Acc.p, Ls.p, N, nullptr);
  cuda::loss_accumulate(Acc.p, Ls.p, N, nullptr);
  double want = 2.0;
  for (float x : ls) want += 2.0 * double(x);
  EXPECT_NEAR(ExactSum::value_of(Acc.get().data()), want, 1e-12 * std::abs(want) + 1e-12);
}

// The optimizer over a chunk table whose three index spaces differ (as ZeRO's do): AdamW with
// fp32 master weights against the formula, and the squared norm of the chunks it counts.
TEST_F(Cuda, AdamWAndNormOverTheChunkTable) {
  // State (moments, master) at k, bf16 weights `pshift` further on, gradients `shift` further
  // on: a kernel that mixed them up fails.
  const int n = 20000, split = 12000, shift = 100, pshift = 37;
  auto p = randn(n, 41), g = randn(n + shift, 42);
  std::vector<float> m(n, 0.0f), v(n, 0.0f), master = p;
  DevRaw<float> Master(master), Mm(m), Vv(v), G(g), One(std::vector<float>{1.0f});
  std::vector<float> p_at(size_t(n + pshift), 0.5f);
  std::copy(p.begin(), p.end(), p_at.begin() + pshift);
  Dev P(p_at);
  // Two tensors, the first (longer than one chunk) decaying and counted in the norm, the
  // second neither (a replicated tensor on a tp rank other than 0).
  std::vector<cuda::OptChunkDev> table;
  auto add = [&](int lo, int hi, int16_t flag) {
    for (int k = lo; k < hi; k += 8192) table.push_back({k, k + pshift, k + shift, std::min(8192, hi - k), flag, flag});
  };
  add(0, split, 1);
  add(split, n, 0);
  std::vector<int32_t> raw(table.size() * sizeof(cuda::OptChunkDev) / 4);
  std::memcpy(raw.data(), table.data(), table.size() * sizeof(cuda::OptChunkDev));
  DevRaw<int32_t> Chunks(raw);
  auto* chunks = reinterpret_cast<const cuda::OptChunkDev*>(Chunks.p);
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  for (int step = 1; step <= 3; ++step) {
    const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    cuda::adamw_multi(Master.p, P.p, G.p, Mm.p, Vv.p, chunks, int(table.size()), float(lr / bc1), float(std::sqrt(bc2)),
                      float(b1), float(b2), float(eps), float(1 - lr * wd), One.p, nullptr);
    for (int i = 0; i < n; ++i) {
      const float gi = g[size_t(i + shift)];
      master[size_t(i)] *= i < split ? float(1 - lr * wd) : 1.0f;
      m[size_t(i)] += (gi - m[size_t(i)]) * float(1 - b1);
      v[size_t(i)] = v[size_t(i)] * float(b2) + float(1 - b2) * gi * gi;
      master[size_t(i)] -=
          float(lr / bc1) * (m[size_t(i)] / (std::sqrt(v[size_t(i)]) / float(std::sqrt(bc2)) + float(eps)));
    }
  }
  EXPECT_TRUE(close(Master.get(), master, 1e-6, 1e-5));
  std::vector<float> want_p(size_t(n + pshift), 0.5f);  // before pshift: untouched
  const auto got_master = Master.get();
  for (int i = 0; i < n; ++i) want_p[size_t(i + pshift)] = bf16_to_f32(f32_to_bf16(got_master[size_t(i)]));
  EXPECT_EQ(P.get(), want_p);  // the bf16 weights are the master's rounding

  // The norm: each chunk's sum in double, the sums exactly, whatever the table's order (a sum
  // in table order gives other bits for the reversed table).
  DevRaw<double> Out(kExactDigits), Scratch(kExactDigits + 1);
  DevRaw<float> Scale(1);
  cuda::sum_squares_table(Out.p, G.p, chunks, int(table.size()), Scratch.p, nullptr);
  ExactSum want;
  for (const auto& ch : table) {
    double s = 0;
    for (int k = 0; k < ch.n; ++k) s += ch.norm ? double(g[size_t(ch.grad + k)]) * g[size_t(ch.grad + k)] : 0.0;
    if (ch.norm) want.add(s);
  }
  ExactSum got;
  const auto digits = Out.get();
  got.digits_from(digits.data());
  EXPECT_EQ(got.value(), want.value());
  std::vector<cuda::OptChunkDev> reversed(table.rbegin(), table.rend());
  std::memcpy(raw.data(), reversed.data(), reversed.size() * sizeof(cuda::OptChunkDev));
  DevRaw<int32_t> Reversed(raw);
  DevRaw<double> Out2(kExactDigits);
  cuda::sum_squares_table(Out2.p, G.p, reinterpret_cast<const cuda::OptChunkDev*>(Reversed.p), int(table.size()),
                          Scratch.p, nullptr);
  EXPECT_EQ(Out2.get(), digits) << "the digits depend on the table's order";
  cuda::grad_clip_scale(Scale.p, Out.p, 1.0, nullptr);
  EXPECT_NEAR(Scale.get()[0], clip_coef(std::sqrt(want.value()), 1.0), 1e-7);
  cuda::grad_clip_scale(Scale.p, Out.p, 0.0, nullptr);
  EXPECT_EQ(Scale.get()[0], 1.0f);
  // A non-finite gradient makes every digit NaN (the norm NaN: the step is skipped).
  std::vector<float> bad = g;
  bad[size_t(shift + 5)] = std::numeric_limits<float>::infinity();
  DevRaw<float> Bad(bad);
  cuda::sum_squares_table(Out.p, Bad.p, chunks, int(table.size()), Scratch.p, nullptr);
  for (double d : Out.get()) ASSERT_TRUE(std::isnan(d));
}

// Every MoE kernel against its CPU twin: routing (the assignments bitwise), the permutation
// of rows into expert order with some assignments dropped by a capacity, the combination and
// its backward, the scatter-add (+=), the router's backward, and the column sums.
TEST_F(Cuda, MoeKernels) {
  const int N = kN, E = 8, k = 2, C = kSanitized ? 96 : 768, cap = N * k / E - 5;  // a few dropped
  auto logits = randn(size_t(N) * E, 50, 2.0f);
  std::vector<float> probs(size_t(N) * E), w(size_t(N) * k);
  std::vector<int32_t> idx(size_t(N) * k);
  cpu::moe_route(probs.data(), idx.data(), w.data(), logits.data(), N, E, k);
  Dev Lg(logits);
  DevRaw<float> Probs(size_t(N) * E), W(size_t(N) * k);
  DevRaw<int32_t> Idx(size_t(N) * k);
  cuda::moe_route(Probs.p, Idx.p, W.p, Lg.p, N, E, k, nullptr);
  EXPECT_EQ(Idx.get(), idx) << "the assignments";
  EXPECT_TRUE(close(Probs.get(), probs, 1e-7, 1e-6));
  EXPECT_TRUE(close(W.get(), w, 1e-7, 1e-6));

  // Rows in expert order, at most `cap` per expert in token order; the rest dropped (-1).
  std::vector<int32_t> row_of(size_t(N) * k, -1), token_of_row;
  int dropped = 0;
  for (int e = 0; e < E; ++e) {
    int taken = 0;
    for (int a = 0; a < N * k; ++a)
      if (idx[size_t(a)] == e) {
        if (taken++ >= cap) {
          ++dropped;
          continue;
        }
        row_of[size_t(a)] = int32_t(token_of_row.size());
        token_of_row.push_back(a / k);
      }
  }
  ASSERT_GT(dropped, 0);
  const int R = int(token_of_row.size());
  auto x = randn(size_t(N) * C, 51), rows_in = randn(size_t(R) * C, 52), dout = randn(size_t(N) * C, 53);
  auto dx0 = randn(size_t(N) * C, 54), drows_in = randn(size_t(R) * C, 55);
  std::vector<float> rows(size_t(R) * C), out(size_t(N) * C), drows(size_t(R) * C), dw(size_t(N) * k), dx = dx0;
  cpu::moe_gather(rows.data(), x.data(), token_of_row.data(), R, C);
  cpu::moe_combine(out.data(), rows_in.data(), row_of.data(), w.data(), N, k, C);
  cpu::moe_combine_backward(drows.data(), dw.data(), dout.data(), rows_in.data(), row_of.data(), w.data(), N, k, C);
  cpu::moe_scatter_add(dx.data(), drows_in.data(), row_of.data(), N, k, C);
  Dev X(x), Rows(size_t(R) * C), RowsIn(rows_in), Out(size_t(N) * C), Dout(dout),
      Drows(std::vector<float>(rows.size(), 3.0f)), Dx(dx0), DrowsIn(drows_in);
  DevRaw<int32_t> RowOf(row_of), TokenOf(token_of_row);
  DevRaw<float> Dw(std::vector<float>(size_t(N) * k, 9.0f));  // overwritten, dropped ones to 0
  cuda::moe_gather(Rows.p, X.p, TokenOf.p, R, C, nullptr);
  cuda::moe_combine(Out.p, RowsIn.p, RowOf.p, W.p, N, k, C, nullptr);
  cuda::moe_combine_backward(Drows.p, Dw.p, Dout.p, RowsIn.p, RowOf.p, W.p, N, k, C, nullptr);
  cuda::moe_scatter_add(Dx.p, DrowsIn.p, RowOf.p, N, k, C, nullptr);
  EXPECT_EQ(Rows.get(), rows) << "gather copies rows";
  EXPECT_TRUE(close(Out.get(), out, 1e-3, 1e-2)) << "combine";
  EXPECT_TRUE(close(Drows.get(), drows, 1e-3, 1e-2)) << "combine backward: drows";
  // Dot products over C of bf16-exact values: fp32 reordering, about C * 2^-24 of their scale.
  EXPECT_TRUE(close(Dw.get(), dw, 1e-4, 1e-4)) << "combine backward: dw";
  EXPECT_TRUE(close(Dx.get(), dx, 1e-3, 1e-2)) << "scatter add (+=)";

  auto gw = randn(size_t(N) * k, 56), aux = randn(size_t(E), 57, 0.1f);
  std::vector<float> dlogits(size_t(N) * E), sums(static_cast<size_t>(E));
  cpu::moe_router_backward(dlogits.data(), probs.data(), idx.data(), w.data(), gw.data(), aux.data(), N, E, k);
  cpu::column_sums(sums.data(), probs.data(), N, E);
  Dev Dl(std::vector<float>(size_t(N) * E, 4.0f));
  DevRaw<float> Gw(gw), Aux(aux), Sums(std::vector<float>(size_t(E), 6.0f));
  cuda::moe_router_backward(Dl.p, Probs.p, Idx.p, W.p, Gw.p, Aux.p, N, E, k, nullptr);
  DevRaw<float> Part(static_cast<size_t>(cuda::column_partials_floats(N, E)));
  cuda::column_sums(Sums.p, Probs.p, N, E, Part.p, nullptr);
  EXPECT_TRUE(close(Dl.get(), dlogits, 1e-4, 1e-2)) << "router backward";
  EXPECT_TRUE(close(Sums.get(), sums, 1e-5, 1e-5)) << "column sums";
}

// The routing plan on the device against the CPU's, bitwise: rows, tokens and counts, in the
// padded layout (a capacity that drops, slots wider than it) and the compact one (dropless and
// with a capacity), over several chunks of assignments with a ragged last one, experts that get
// nothing, and more experts than the scan's threads.
TEST_F(Cuda, MoePlan) {
  struct Case {
    int N, E, k, cap, slot;
    const char* what;
  };
  const int N = kSanitized ? 301 : 1289;
  const Case cases[] = {{N, 8, 2, N * 2 / 8 - 7, N * 2 / 8 - 7, "padded, a capacity that drops"},
                        {N, 8, 2, N * 2 / 8 - 7, N, "padded, slots wider than the capacity"},
                        {N, 8, 2, N * 2, 0, "compact, dropless"},
                        {N, 8, 1, N / 8 + 3, 0, "compact, a capacity"},
                        {N, 300, 4, N * 4, 0, "compact, 300 experts"},
                        {7, 4, 2, 14, 0, "fewer assignments than a chunk"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const int A = c.N * c.k, rows = c.slot > 0 ? c.E * c.slot : A;
    // k distinct experts per token, skewed towards the low ones; experts past E/2 + 3 get none
    // (where the scan's threads cover E at once; past them, and in the last case, every expert
    // may get some).
    const int span = c.N > 7 && c.E <= 256 ? c.E / 2 + 3 : c.E;
    std::mt19937_64 g(uint64_t(c.E) * 31 + uint64_t(c.k));
    std::vector<int32_t> idx(static_cast<size_t>(A));
    for (int t = 0; t < c.N; ++t)
      for (int j = 0; j < c.k; ++j) {
        int e;
        bool taken;
        do {
          e = int(g() % uint64_t(span)) / (1 + int(g() % 2));
          taken = false;
          for (int i = 0; i < j; ++i) taken = taken || idx[size_t(t * c.k + i)] == e;
        } while (taken);
        idx[size_t(t * c.k + j)] = e;
      }
    std::vector<int32_t> row_of(static_cast<size_t>(A)), token_of(static_cast<size_t>(rows)),
        counts(static_cast<size_t>(2 * c.E));
    cpu::moe_plan(row_of.data(), token_of.data(), counts.data(), idx.data(), c.N, c.E, c.k, c.cap, c.slot, rows);
    DevRaw<int32_t> Idx(idx), RowOf(std::vector<int32_t>(size_t(A), 77)),
        TokenOf(std::vector<int32_t>(size_t(rows), 77)), Counts(std::vector<int32_t>(size_t(2 * c.E), 77)),
        Scratch(std::vector<int32_t>(size_t(moe_row::plan_scratch_ints(A, c.E)), 77));
    cuda::moe_plan(RowOf.p, TokenOf.p, Counts.p, Idx.p, c.N, c.E, c.k, c.cap, c.slot, rows, Scratch.p, nullptr);
    EXPECT_EQ(Counts.get(), counts) << "routed and kept per expert";
    EXPECT_EQ(RowOf.get(), row_of) << "each assignment's row";
    EXPECT_EQ(TokenOf.get(), token_of) << "each row's token";
    int dropped = 0, idle = 0, past_256 = 0;
    for (int e = 0; e < c.E; ++e) {
      dropped += counts[size_t(e)] - counts[size_t(c.E + e)], idle += counts[size_t(e)] == 0;
      if (e >= 256) past_256 += counts[size_t(e)];
    }
    if (c.cap < A) {
      EXPECT_GT(dropped, 0) << "the case drops nothing";
    }
    if (span < c.E) {
      EXPECT_GT(idle, 0) << "every expert got assignments";
    }
    if (c.E > 256) {
      EXPECT_GT(past_256, 0) << "no expert past the scan's first pass of threads got assignments";
    }
  }
}

// The expert-parallel maps (received rows source-major <-> expert-major) against the CPU's, for
// counts with empty runs and for the padded layout; the statistics and the load-balancing
// gradient bitwise; the gather's zero rows.
TEST_F(Cuda, MoeMapsStatsAndGather) {
  const int P = 3, El = 4;
  std::vector<int32_t> from = {5, 0, 2, 9, 0, 0, 3, 1, 7, 4, 0, 6};
  for (const bool padded : {false, true}) {
    SCOPED_TRACE(padded ? "padded" : "counts");
    const int slot = 5;
    int64_t Rr = 0;
    for (int32_t n : from) Rr += padded ? slot : n;
    std::vector<int32_t> in(static_cast<size_t>(Rr)), out(static_cast<size_t>(Rr));
    cpu::moe_ep_maps(in.data(), out.data(), padded ? nullptr : from.data(), P, El, slot);
    DevRaw<int32_t> From(from), In(std::vector<int32_t>(size_t(Rr), -7)), Out(std::vector<int32_t>(size_t(Rr), -7));
    cuda::moe_ep_maps(In.p, Out.p, padded ? nullptr : From.p, P, El, slot, nullptr);
    EXPECT_EQ(In.get(), in);
    EXPECT_EQ(Out.get(), out);
    for (int64_t p = 0; p < Rr; ++p) ASSERT_EQ(in[size_t(out[size_t(p)])], p) << "the maps are each other's inverse";
  }

  const int N = 97, E = 8, k = 2;
  std::vector<int32_t> counts = {40, 0, 31, 50, 25, 9, 20, 19, 40, 0, 30, 30, 25, 9, 20, 19};
  auto sums = randn(size_t(E), 60, 10.0f);
  const std::vector<double> st0 = {3, 8, 1, 190, 2};  // integers, as the statistics always hold
  std::vector<double> st = st0;
  std::vector<float> g(static_cast<size_t>(E), 3.0f);
  cpu::moe_stats_add(st.data(), counts.data(), sums.data(), N, E, k);
  cpu::moe_aux_grad(g.data(), counts.data(), 0.0123, N, E, k);
  DevRaw<int32_t> Counts(counts);
  DevRaw<float> Sums(sums), G(std::vector<float>(size_t(E), 4.0f));
  DevRaw<double> St(st0);
  cuda::moe_stats_add(St.p, Counts.p, Sums.p, N, E, k, nullptr);
  cuda::moe_aux_grad(G.p, Counts.p, 0.0123, N, E, k, nullptr);
  // The same arithmetic in the same order; a GPU compiler may fuse a multiply and an add the
  // CPU's does not, so the loss may round to the neighbouring unit; the counts are exact.
  const std::vector<double> got = St.get();
  ASSERT_EQ(got.size(), size_t(moe_row::kStats));
  EXPECT_NEAR(got[0], st[0], 1.0) << "the load-balancing loss, in units of 2^-32";
  for (int i = 1; i < moe_row::kStats; ++i) EXPECT_EQ(got[size_t(i)], st[size_t(i)]) << i;
  EXPECT_EQ(G.get(), g) << "the load-balancing gradient";
  EXPECT_EQ(st[4], 3.0) << "micro-batches";
  EXPECT_EQ(st[3], 190.0 + N * k) << "assignments";
  EXPECT_EQ(st[2], 1.0 + 21) << "dropped assignments";
  EXPECT_EQ(st[1], 8.0 + E * 50) << "E times the busiest expert's";
  EXPECT_EQ(st[0], std::rint(st[0])) << "the loss in whole units";

  const int C = 70, R = 6;
  auto x = randn(size_t(4) * C, 61);
  std::vector<int32_t> token_of = {2, -1, 0, 3, -1, 2};
  std::vector<float> rows(size_t(R) * C, 5.0f);
  cpu::moe_gather(rows.data(), x.data(), token_of.data(), R, C);
  Dev X(x), Rows(std::vector<float>(size_t(R) * C, 5.0f));
  DevRaw<int32_t> TokenOf(token_of);
  cuda::moe_gather(Rows.p, X.p, TokenOf.p, R, C, nullptr);
  EXPECT_EQ(Rows.get(), rows);
  EXPECT_EQ(rows[size_t(1) * C + 3], 0.0f) << "a row no token took is zero";
}
