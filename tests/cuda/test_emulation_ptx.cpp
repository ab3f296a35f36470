// The emulated PTX primitives of kernels/cuda/mma.cuh (kernels/emu/ptx.h) against plain
// matrix products and loads: mma.sync m16n8k16 with registers built by hand from the PTX
// ISA's fragment layouts, ldmatrix x1/x2/x4 with and without .trans (each lane's registers
// checked element by element), both together in a 16x32 @ 32x16 product, and cp.async,
// whose copies land only at the wait that covers their group.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/cuda/mma.cuh"
#include "tests/cuda/cuda_testing.h"

using namespace loom::testing_cuda;
using loom::cuda::bf16;

namespace {

__device__ uint32_t pair_at(const bf16* m, int ld, int r, int c) {
  uint16_t lo, hi;
  memcpy(&lo, m + r * ld + c, 2);
  memcpy(&hi, m + r * ld + c + 1, 2);
  return uint32_t(lo) | uint32_t(hi) << 16;
}

// d[16][8] = a[16][16] @ bt[8][16]^T + c, registers from the documented layouts.
__global__ void mma_registers_kernel(float* d, const bf16* a, const bf16* bt, const float* c) {
  const int g = threadIdx.x / 4, t = threadIdx.x % 4;
  const uint32_t ra[4] = {pair_at(a, 16, g, 2 * t), pair_at(a, 16, g + 8, 2 * t), pair_at(a, 16, g, 2 * t + 8),
                          pair_at(a, 16, g + 8, 2 * t + 8)};
  const uint32_t rb[2] = {pair_at(bt, 16, g, 2 * t), pair_at(bt, 16, g, 2 * t + 8)};
  const float rc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
  float rd[4];
  loom::cuda::mma_16816(rd, ra, rb, rc);
  d[g * 8 + 2 * t] = rd[0], d[g * 8 + 2 * t + 1] = rd[1];
  d[(g + 8) * 8 + 2 * t] = rd[2], d[(g + 8) * 8 + 2 * t + 1] = rd[3];
}

// Each lane's ldmatrix registers for a 16x16 tile (rows of 16 + 8 padding in shared memory):
// out[lane][0..3] x4, [4..7] x4.trans, [8..9] x2, [10] x1. Lane l addresses row l % 16 at
// column 8 * (l / 16).
__global__ void ldmatrix_kernel(uint32_t* out, const bf16* m) {
  __align__(16) __shared__ bf16 s[16 * 24];
  const int l = threadIdx.x;
  for (int i = l; i < 256; i += 32) s[(i / 16) * 24 + i % 16] = m[i];
  __syncwarp();
  const bf16* row = s + (l % 16) * 24 + 8 * (l / 16);
  uint32_t x4[4], x4t[4], x2[2], x1[1];
  loom::cuda::ldmatrix<4>(x4, row);
  loom::cuda::ldmatrix<4, true>(x4t, row);
  loom::cuda::ldmatrix<2>(x2, row);
  loom::cuda::ldmatrix<1>(x1, row);
  uint32_t* o = out + l * 11;
  for (int i = 0; i < 4; ++i) o[i] = x4[i], o[4 + i] = x4t[i];
  o[8] = x2[0], o[9] = x2[1], o[10] = x1[0];
}

// d[16][16] = a[16][32] @ b[32][16], A by ldmatrix.x4, B by ldmatrix.x4.trans of row-major b
// (trans = true) or ldmatrix.x4 of its transpose bt[16][32] (trans = false), as the kernels do.
__global__ void ldmatrix_mma_kernel(float* d, const bf16* a, const bf16* b, bool trans) {
  __align__(16) __shared__ bf16 sa[16 * 40];
  __align__(16) __shared__ bf16 sb[32 * 40];
  const int l = threadIdx.x, g = l / 4, t = l % 4;
  const int bcols = trans ? 16 : 32;
  for (int i = l; i < 512; i += 32) sa[(i / 32) * 40 + i % 32] = a[i], sb[(i / bcols) * 40 + i % bcols] = b[i];
  __syncwarp();
  float acc[2][4] = {};
  for (int k = 0; k < 32; k += 16) {
    uint32_t ra[4], rb[4];
    loom::cuda::ldmatrix<4>(ra, sa + (l % 16) * 40 + k + 8 * (l / 16));
    if (trans) {
      // matrices: (keys k..k+7, cols 0..7), (k+8.., 0..7), (k.., 8..15), (k+8.., 8..15)
      loom::cuda::ldmatrix<4, true>(rb, sb + (k + l % 8 + 8 * ((l / 8) % 2)) * 40 + 8 * (l / 16));
    } else {
      // sb holds bt: row n, column k; matrices (n 0..7, k..k+7), (0..7, k+8..), (8..15, k..), (8..15, k+8..)
      loom::cuda::ldmatrix<4>(rb, sb + (l % 8 + 8 * (l / 16)) * 40 + k + 8 * ((l / 8) % 2));
    }
    for (int n = 0; n < 2; ++n) {
      const uint32_t bn[2] = {rb[2 * n], rb[2 * n + 1]};
      loom::cuda::mma_16816(acc[n], ra, bn, acc[n]);
    }
  }
  for (int n = 0; n < 2; ++n) {
    d[g * 16 + 8 * n + 2 * t] = acc[n][0], d[g * 16 + 8 * n + 2 * t + 1] = acc[n][1];
    d[(g + 8) * 16 + 8 * n + 2 * t] = acc[n][2], d[(g + 8) * 16 + 8 * n + 2 * t + 1] = acc[n][3];
  }
}

// Two groups of 16-byte copies (a thread's 4 floats each); what shared memory holds before any
// wait, after wait_group 1 and after wait_group 0; the second group's copies of odd threads
// are zero fills. A 4-byte copy per thread in the second group (every third a zero fill)
// writes its word and not the next (out[128..191]).
__global__ void cp_async_kernel(float* out, const float* in) {
  __align__(16) __shared__ float s[2][128];
  __shared__ float w[64];
  const int i = threadIdx.x;
  for (int j = 0; j < 4; ++j) s[0][4 * i + j] = -1.0f, s[1][4 * i + j] = -1.0f;
  w[2 * i] = -1.0f, w[2 * i + 1] = -1.0f;
  loom::cuda::cp_async16(&s[0][4 * i], in + 4 * i, true);
  loom::cuda::cp_async_commit();
  loom::cuda::cp_async16(&s[1][4 * i], in + 128 + 4 * i, i % 2 == 0);
  loom::cuda::cp_async4(&w[2 * i], in + i, i % 3 != 0);
  loom::cuda::cp_async_commit();
  out[i] = s[0][4 * i];
  loom::cuda::cp_async_wait<1>();
  out[32 + i] = s[0][4 * i], out[64 + i] = s[1][4 * i];
  out[128 + i] = w[2 * i];
  loom::cuda::cp_async_wait<0>();
  out[96 + i] = s[1][4 * i];
  out[160 + i] = w[2 * i], out[192 + i] = w[2 * i + 1];
}

float bits_lo(uint32_t r) {
  return __bfloat162float(__nv_bfloat16{uint16_t(r & 0xffffu)});
}
float bits_hi(uint32_t r) {
  return __bfloat162float(__nv_bfloat16{uint16_t(r >> 16)});
}

}  // namespace

// A row/column swap anywhere (A's rows, B's columns, C's) fails here: the matrices are random.
TEST(EmulatedPtx, MmaFollowsTheFragmentLayouts) {
  auto a = randn(256, 1), bt = randn(128, 2), c = randn(128, 3);
  Dev A(a), Bt(bt);
  a = A.get(), bt = Bt.get();  // bf16-rounded
  std::vector<double> want(128);
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) {
      double s = c[size_t(r * 8 + n)];
      for (int k = 0; k < 16; ++k) s += double(a[size_t(r * 16 + k)]) * bt[size_t(n * 16 + k)];
      want[size_t(r * 8 + n)] = s;
    }
  DevRaw<float> C(c), D(128);
  LOOM_LAUNCH(mma_registers_kernel, 1, 32, 0, nullptr)(D.p, A.p, Bt.p, C.p);
  LOOM_CUDA_CHECK(cudaGetLastError());
  EXPECT_TRUE(close(D.get(), want, 1e-5, 1e-5));
}

TEST(EmulatedPtx, LdmatrixGivesEachLaneItsElements) {
  auto m = randn(256, 4);
  Dev M(m);
  m = M.get();
  DevRaw<uint32_t> Out(32 * 11);
  LOOM_LAUNCH(ldmatrix_kernel, 1, 32, 0, nullptr)(Out.p, M.p);
  LOOM_CUDA_CHECK(cudaGetLastError());
  const auto out = Out.get();
  auto at = [&](int r, int c) { return m[size_t(r * 16 + c)]; };
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    const uint32_t* o = out.data() + l * 11;
    for (int i = 0; i < 4; ++i) {
      // matrix i: rows 8 (i % 2).., columns 8 (i / 2)..
      const int r0 = 8 * (i % 2), c0 = 8 * (i / 2);
      EXPECT_EQ(bits_lo(o[i]), at(r0 + g, c0 + 2 * t)) << "x4 lane " << l << " reg " << i;
      EXPECT_EQ(bits_hi(o[i]), at(r0 + g, c0 + 2 * t + 1)) << "x4 lane " << l << " reg " << i;
      EXPECT_EQ(bits_lo(o[4 + i]), at(r0 + 2 * t, c0 + g)) << "x4.trans lane " << l << " reg " << i;
      EXPECT_EQ(bits_hi(o[4 + i]), at(r0 + 2 * t + 1, c0 + g)) << "x4.trans lane " << l << " reg " << i;
    }
    for (int i = 0; i < 2; ++i) EXPECT_EQ(o[8 + i], o[i]) << "x2 takes the first two matrices, lane " << l;
    EXPECT_EQ(o[10], o[0]) << "x1, lane " << l;
  }
}

TEST(EmulatedPtx, LdmatrixAndMmaMultiply) {
  auto a = randn(512, 5), b = randn(512, 6);
  Dev A(a), B(b);
  a = A.get(), b = B.get();
  std::vector<float> bt(512);
  for (int k = 0; k < 32; ++k)
    for (int n = 0; n < 16; ++n) bt[size_t(n * 32 + k)] = b[size_t(k * 16 + n)];
  std::vector<double> want(256);
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      double s = 0;
      for (int k = 0; k < 32; ++k) s += double(a[size_t(r * 32 + k)]) * b[size_t(k * 16 + n)];
      want[size_t(r * 16 + n)] = s;
    }
  Dev Bt(bt);
  DevRaw<float> D1(256), D2(256);
  LOOM_LAUNCH(ldmatrix_mma_kernel, 1, 32, 0, nullptr)(D1.p, A.p, B.p, true);
  LOOM_LAUNCH(ldmatrix_mma_kernel, 1, 32, 0, nullptr)(D2.p, A.p, Bt.p, false);
  LOOM_CUDA_CHECK(cudaGetLastError());
  EXPECT_TRUE(close(D1.get(), want, 1e-4, 1e-5)) << "B by ldmatrix.trans";
  EXPECT_TRUE(close(D2.get(), want, 1e-4, 1e-5)) << "B by ldmatrix of its transpose";
}

TEST(EmulatedPtx, CpAsyncLandsAtItsWait) {
  std::vector<float> in(256);
  for (int i = 0; i < 256; ++i) in[size_t(i)] = float(i + 1);
  DevRaw<float> In(in), Out(224);
  LOOM_LAUNCH(cp_async_kernel, 1, 32, 0, nullptr)(Out.p, In.p);
  LOOM_CUDA_CHECK(cudaGetLastError());
  const auto out = Out.get();
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(out[size_t(i)], -1.0f) << "before any wait, thread " << i;
    EXPECT_EQ(out[size_t(32 + i)], float(4 * i + 1)) << "the first group after wait_group 1";
    EXPECT_EQ(out[size_t(64 + i)], -1.0f) << "the second group is still in flight after wait_group 1";
    EXPECT_EQ(out[size_t(96 + i)], i % 2 ? 0.0f : float(128 + 4 * i + 1)) << "after wait_group 0 (odd: zero fill)";
    EXPECT_EQ(out[size_t(128 + i)], -1.0f) << "a 4-byte copy still in flight after wait_group 1";
    EXPECT_EQ(out[size_t(160 + i)], i % 3 ? float(i + 1) : 0.0f) << "a 4-byte copy after wait_group 0";
    EXPECT_EQ(out[size_t(192 + i)], -1.0f) << "the word after a 4-byte copy";
  }
}
