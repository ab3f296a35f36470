// The flash attention kernels (kernels/cuda/attention_flash{,_bwd}.cu) against double precision:
// forward against tests/unit/testing.h's attention_ref, backward against a double-precision
// backward that is itself checked by central differences; head dims 32, 64 and 128,
// grouped-query ratios 1, 2, 4 and 8, ragged last tiles; and two runs give the same bits.
// The WMMA kernels they replaced are held to the same references.
// The same file runs on a GPU and on the CPU emulation (shapes stay small there: a warp's
// mma.sync is a fiber exchange).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/flash_ds.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/unit/testing.h"

using namespace loom;
using namespace loom::testing_cuda;

namespace {

struct FlashShape {
  int B, H, KV, D, T;
};
void PrintTo(const FlashShape& s, std::ostream* os) {
  *os << "B" << s.B << "_H" << s.H << "_KV" << s.KV << "_D" << s.D << "_T" << s.T;
}
class FlashAttention : public Cuda, public ::testing::WithParamInterface<FlashShape> {};

// dqkv of L = sum(out * dy) for causal attention with grouped-query heads, in double.
std::vector<double> attention_backward_ref(const std::vector<double>& qkv, const std::vector<double>& dy, int B, int T,
                                           int H, int KV, int D) {
  const int row = (H + 2 * KV) * D, group = H / KV;
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> dqkv(qkv.size(), 0.0);
  auto at = [&](int b, int t, int col) { return size_t(b * T + t) * size_t(row) + size_t(col); };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const int kc = (H + h / group) * D, vc = (H + KV + h / group) * D, qc = h * D;
      for (int t = 0; t < T; ++t) {
        std::vector<double> p(size_t(t) + 1), dp(size_t(t) + 1);
        double mx = -1e300, sum = 0, pdp = 0;
        for (int u = 0; u <= t; ++u) {
          double s = 0;
          for (int d = 0; d < D; ++d) s += qkv[at(b, t, qc + d)] * qkv[at(b, u, kc + d)];
          p[size_t(u)] = s * scale;
          mx = std::max(mx, p[size_t(u)]);
        }
        for (auto& x : p) sum += (x = std::exp(x - mx));
        const double* g = &dy[size_t(b * T + t) * size_t(H * D) + size_t(h * D)];
        for (int u = 0; u <= t; ++u) {
          p[size_t(u)] /= sum;
          double s = 0;
          for (int d = 0; d < D; ++d) s += g[d] * qkv[at(b, u, vc + d)];
          dp[size_t(u)] = s;
          pdp += p[size_t(u)] * s;
        }
        for (int u = 0; u <= t; ++u) {
          const double ds = p[size_t(u)] * (dp[size_t(u)] - pdp) * scale;
          for (int d = 0; d < D; ++d) {
            dqkv[at(b, t, qc + d)] += ds * qkv[at(b, u, kc + d)];
            dqkv[at(b, u, kc + d)] += ds * qkv[at(b, t, qc + d)];
            dqkv[at(b, u, vc + d)] += p[size_t(u)] * g[d];
          }
        }
      }
    }
  return dqkv;
}

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> u(v.size());
  std::memcpy(u.data(), v.data(), v.size() * 4);
  return u;
}

}  // namespace

// The double-precision backward above is what the kernels are held to: here it meets central
// differences of attention_ref at a shape with two query heads on one kv head.
TEST(FlashAttentionReference, BackwardMatchesFiniteDifferences) {
  const int B = 1, T = 9, H = 2, KV = 1, D = 4;
  const auto qkv = test::to_double(randn(size_t(B) * T * (H + 2 * KV) * D, 50));
  const auto dy = randn(size_t(B) * T * H * D, 51);
  const auto fd = test::fd_grad(
      [&](const std::vector<double>& x) { return test::dot(test::attention_ref(x, B, T, H, KV, D), dy); }, qkv);
  const auto got = attention_backward_ref(qkv, test::to_double(dy), B, T, H, KV, D);
  EXPECT_LT(test::rel_err(got, fd), 1e-6);
}

TEST_P(FlashAttention, MatchesDoublePrecisionAndRepeatsBitwise) {
  const auto [B, H, KV, D, T] = GetParam();
  const size_t nq = size_t(B) * T * (H + 2 * KV) * D, no = size_t(B) * T * H * D;
  Dev Q(randn(nq, 60)), Dy(randn(no, 61));
  const auto qkv = test::to_double(Q.get()), dy = test::to_double(Dy.get());  // bf16-exact
  const auto want_out = test::attention_ref(qkv, B, T, H, KV, D);
  const auto want_dqkv = attention_backward_ref(qkv, dy, B, T, H, KV, D);
  std::vector<float> first_out, first_dqkv, first_lse;
  for (int run = 0; run < 2; ++run) {
    Dev O(no), DQ(std::vector<float>(nq, 7.0f));  // dqkv is overwritten
    DevRaw<float> L(size_t(B) * H * T), S(size_t(B) * H * T);
    cuda::attention_forward(O.p, L.p, Q.p, B, T, H, KV, D, nullptr, nullptr);
    cuda::attention_backward(DQ.p, Dy.p, O.p, Q.p, L.p, S.p, B, T, H, KV, D, nullptr, nullptr);
    LOOM_CUDA_CHECK(cudaGetLastError());
    auto out = O.get(), dqkv = DQ.get(), lse = L.get();
    if (run == 1) {
      EXPECT_EQ(bits(out), bits(first_out)) << "forward, run 2";
      EXPECT_EQ(bits(lse), bits(first_lse)) << "lse, run 2";
      EXPECT_EQ(bits(dqkv), bits(first_dqkv)) << "backward, run 2";
      break;
    }
    // bf16 outputs: one rounding of the output, P rounded to bf16 for PV.
    EXPECT_TRUE(close(out, want_out, 1e-2, 1e-2)) << "forward";
    // P and dS rounded to bf16 for their products, and the bf16 output in delta.
    EXPECT_TRUE(close(dqkv, want_dqkv, 3e-2, 3e-2)) << "backward";
    first_out = out, first_dqkv = dqkv, first_lse = lse;
  }
  if (D == 32) return;
  // The WMMA kernels the flash ones replaced (kept for the benchmark) against the same.
  Dev O(no), DQ(std::vector<float>(nq, 7.0f));
  DevRaw<float> L(size_t(B) * H * T), S(size_t(B) * H * T);
  cuda::reference::attention_forward_wmma(O.p, L.p, Q.p, B, T, H, KV, D, nullptr, nullptr);
  cuda::reference::attention_backward_wmma(DQ.p, Dy.p, O.p, Q.p, L.p, S.p, B, T, H, KV, D, nullptr, nullptr);
  LOOM_CUDA_CHECK(cudaGetLastError());
  EXPECT_TRUE(close(O.get(), want_out, 1e-2, 1e-2)) << "WMMA forward";
  EXPECT_TRUE(close(DQ.get(), want_dqkv, 3e-2, 3e-2)) << "WMMA backward";
}

// One tile and several with a ragged last one; GQA 1:1, 2:1, 4:1 and 8:1; every head dim.
INSTANTIATE_TEST_SUITE_P(
    Heads, FlashAttention,
    ::testing::ValuesIn(
        kSanitized
            ? std::vector<FlashShape>{{1, 2, 1, 64, 70}, {1, 2, 2, 128, 40}, {1, 2, 1, 32, 33}}
            : std::vector<FlashShape>{
                  {1, 2, 2, 32, 96}, {1, 8, 1, 32, 64}, {2, 4, 1, 64, 130}, {1, 2, 2, 64, 256}, {1, 4, 2, 128, 150}}));

// Head dim 64 with a stored dS (kernels/flash_ds.h): dK/dV writes dS, dQ = dS K reads it back.
// The scratch starts as NaN, so a dQ that read a tile dK/dV did not write fails; dqkv must
// carry the bits of the dQ that recomputes S and dP, and repeat them.
class FlashAttentionStoredDs : public Cuda, public ::testing::WithParamInterface<FlashShape> {};

TEST_P(FlashAttentionStoredDs, GivesTheRecomputedBitsAndRepeats) {
  const auto [B, H, KV, D, T] = GetParam();
  const size_t nq = size_t(B) * T * (H + 2 * KV) * D, no = size_t(B) * T * H * D;
  const int64_t ds_elems = flash_ds_elems(B, T, H, D, false);
  ASSERT_GT(ds_elems, 0);
  Dev Q(randn(nq, 60)), Dy(randn(no, 61)), O(no);
  DevRaw<float> L(size_t(B) * H * T), S(size_t(B) * H * T);
  cuda::attention_forward(O.p, L.p, Q.p, B, T, H, KV, D, nullptr, nullptr);
  Dev recomputed(std::vector<float>(nq, 7.0f));
  cuda::attention_backward(recomputed.p, Dy.p, O.p, Q.p, L.p, S.p, B, T, H, KV, D, nullptr, nullptr);
  const auto want = recomputed.get();
  const auto ref = attention_backward_ref(test::to_double(Q.get()), test::to_double(Dy.get()), B, T, H, KV, D);
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    Dev DQ(std::vector<float>(nq, 7.0f)), Ds(std::vector<float>(size_t(ds_elems), NAN));
    DevRaw<float> S2(size_t(B) * H * T);
    cuda::attention_backward(DQ.p, Dy.p, O.p, Q.p, L.p, S2.p, B, T, H, KV, D, nullptr, nullptr, Ds.p, ds_elems);
    LOOM_CUDA_CHECK(cudaGetLastError());
    const auto got = DQ.get();
    EXPECT_TRUE(close(got, ref, 3e-2, 3e-2)) << "against double precision, run " << run + 1;
    EXPECT_EQ(bits(got), bits(want)) << "against the recomputing dQ, run " << run + 1;
    if (run == 1) {
      EXPECT_EQ(bits(got), bits(first)) << "run 2";
    }
    first = got;
  }
}

// A ragged last tile past a key block of 128 (T 130), a 192-row dQ block whose last query tile
// is partial, GQA 4:1 and 2:1.
INSTANTIATE_TEST_SUITE_P(Heads, FlashAttentionStoredDs,
                         ::testing::ValuesIn(kSanitized
                                                 ? std::vector<FlashShape>{{1, 2, 1, 64, 70}}
                                                 : std::vector<FlashShape>{
                                                       {2, 4, 1, 64, 130}, {1, 2, 2, 64, 256}, {1, 2, 1, 64, 300}}));
