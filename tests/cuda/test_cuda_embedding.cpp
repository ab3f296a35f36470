// The token embedding's gradient on skewed batches: a token of 700 positions and others past
// kEmbeddingPiece, against a double-precision sum, bitwise against the order the kernels
// promise (a token's positions in order; a frequent token's pieces in order), and bitwise from
// run to run. Not here: the uniform batches (test_cuda_kernels.cpp) and the positions' gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "tests/cuda/cuda_testing.h"

using namespace loom;
using namespace loom::testing_cuda;

namespace {

// The promised sums in fp32: each token's rows in order, from 0; a frequent token (one of the
// first kMaxFrequentTokens ids token_index puts first) in pieces of L positions, L doubled from
// kEmbeddingPiece until the pieces fit kMaxEmbeddingPieces, the pieces added in order. Then
// added once onto dwte.
std::vector<float> promised(const std::vector<int32_t>& index, int U, const std::vector<float>& dy,
                            std::vector<float> dwte, int C) {
  const int32_t *ids = index.data(), *starts = ids + U, *pos = starts + U + 1;
  int K = 0;
  while (K < std::min(U, cuda::kMaxFrequentTokens) && starts[K + 1] - starts[K] > cuda::kEmbeddingPiece) ++K;
  int L = cuda::kEmbeddingPiece;
  for (;; L *= 2) {
    int total = 0;
    for (int u = 0; u < K; ++u) total += (starts[u + 1] - starts[u] + L - 1) / L;
    if (total <= cuda::kMaxEmbeddingPieces) break;
  }
  for (int u = 0; u < U; ++u)
    for (int c = 0; c < C; ++c) {
      const int piece = u < K ? L : starts[u + 1] - starts[u];
      float d = 0.0f;
      for (int k0 = starts[u]; k0 < starts[u + 1]; k0 += piece) {
        float part = 0.0f;
        for (int k = k0; k < std::min(k0 + piece, starts[u + 1]); ++k) part += dy[size_t(pos[k]) * C + c];
        d = u < K ? d + part : part;
      }
      dwte[size_t(ids[u]) * C + c] += d;
    }
  return dwte;
}

// Runs the backward over `tok` twice from the same dwte and checks the three promises.
void check_batch(const std::vector<int32_t>& tok, int V, int C, const char* what) {
  SCOPED_TRACE(what);
  const int N = int(tok.size());
  auto dy = randn(size_t(N) * C, 60), dwte0 = randn(size_t(V) * C, 61);
  int U = 0;
  const auto index = cuda::token_index(tok.data(), N, 0, V, &U);
  std::vector<double> exact(dwte0.begin(), dwte0.end());
  std::vector<double> sums(size_t(V) * C, 0.0);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) sums[size_t(tok[size_t(n)]) * C + c] += double(dy[size_t(n) * C + c]);
  for (size_t i = 0; i < exact.size(); ++i) exact[i] += sums[i];
  DevRaw<int32_t> Index(index);
  Dev Dy(dy);
  DevRaw<float> Part(size_t(cuda::embedding_partials_floats(C)));
  std::vector<float> runs[2];
  for (auto& got : runs) {
    DevRaw<float> Dwte(dwte0);
    cuda::embedding_backward(Dwte.p, nullptr, Dy.p, Index.p, U, N, 1, N, C, nullptr, Part.p, nullptr);
    got = Dwte.get();
  }
  // fp32 sums of up to ~1000 unit terms: a few 2^-24 of their running magnitude.
  EXPECT_TRUE(close(runs[0], exact, 2e-4, 1e-5)) << "against the double sums";
  EXPECT_EQ(runs[0], promised(index, U, dy, dwte0, C)) << "the promised order of the sums";
  EXPECT_EQ(runs[0], runs[1]) << "run to run";
}

}  // namespace

// Zipf-like text: a token of 700 positions (11 pieces), one of 130 (3 pieces: 64, 64, 2), one of
// exactly kEmbeddingPiece (not cut), the rest spread thinly.
TEST_F(Cuda, EmbeddingBackwardCutsFrequentTokensIntoPieces) {
  const int V = 500, C = kSanitized ? 24 : 72;
  std::vector<int32_t> tok;
  tok.insert(tok.end(), 700, 417);
  tok.insert(tok.end(), 130, 3);
  tok.insert(tok.end(), cuda::kEmbeddingPiece, 450);  // (the spread ones are below 400)
  std::mt19937_64 g(62);
  for (int i = 0; i < (kSanitized ? 200 : 1200); ++i) tok.push_back(int32_t(g() % 400));
  std::shuffle(tok.begin(), tok.end(), g);
  int U = 0;
  const auto index = cuda::token_index(tok.data(), int(tok.size()), 0, V, &U);
  EXPECT_EQ(index[0], 3) << "the frequent ids first, ascending";
  EXPECT_EQ(index[1], 417);
  EXPECT_NE(index[2], 450) << "a token of exactly kEmbeddingPiece positions is not cut";
  check_batch(tok, V, C, "skewed");
}

// More frequent tokens than kMaxFrequentTokens (the rest walk their positions in one block),
// and more pieces of kEmbeddingPiece than kMaxEmbeddingPieces (the pieces double to 128).
TEST_F(Cuda, EmbeddingBackwardBoundsItsPieces) {
  if (kSanitized) GTEST_SKIP() << "25k rows: the plain emulation covers it";
  const int V = 300, C = 8, frequent = cuda::kMaxFrequentTokens + 4;
  std::vector<int32_t> tok;
  for (int v = 0; v < frequent; ++v) tok.insert(tok.end(), 2 * cuda::kEmbeddingPiece + 1 + v % 3, v);
  for (int v = frequent; v < V; ++v) tok.push_back(v);
  std::mt19937_64 g(63);
  std::shuffle(tok.begin(), tok.end(), g);
  check_batch(tok, V, C, "many frequent tokens");
}
