// The PTX primitives of kernels/cuda/mma.cuh for the CUDA emulation, with the register
// layouts the PTX ISA documents (mma.sync m16n8k16 .bf16, ldmatrix .m8n8 .b16, cp.async):
// a warp-collective exchange (warp_gather) lets every lane publish its fragment registers,
// and each lane then computes its own outputs, so a kernel that assumes the wrong layout
// gets wrong numbers here as on the device. groupID = lane / 4, threadID_in_group = lane % 4.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/emu/bf16.h"
#include "kernels/emu/counts.h"
#include "kernels/emu/device.h"

namespace loom::emu {

inline float bf16_lo(uint32_t r) {
  return __bfloat162float(__nv_bfloat16{uint16_t(r & 0xffffu)});
}
inline float bf16_hi(uint32_t r) {
  return __bfloat162float(__nv_bfloat16{uint16_t(r >> 16)});
}

// d = a @ b + c for a 16x16 (row) times 16x8 (col) tile. Per lane (g = lane / 4, t = lane % 4):
// a[0] A[g][2t..2t+1], a[1] A[g+8][2t..], a[2] A[g][2t+8..], a[3] A[g+8][2t+8..];
// b[0] B[2t..2t+1][g], b[1] B[2t+8..2t+9][g]; c and d: [0..1] C[g][2t..2t+1], [2..3] C[g+8][..].
// Each output sums its 16 products in k order onto c in fp32 (bf16 products are exact).
LOOM_EMU_UNCOUNTED inline void mma_m16n8k16(float* d, const uint32_t* a, const uint32_t* b, const float* c, int line) {
  const uint64_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  const uint64_t* all = warp_gather(mine, 6, line);
  // A[row][k] and B[k][col] read back from the lanes that hold them.
  auto A = [&](int row, int k) {
    const int lane = (row % 8) * 4 + (k % 8) / 2, reg = (row >= 8) + 2 * (k >= 8);
    const uint32_t r = uint32_t(all[lane * 8 + reg]);
    return k % 2 ? bf16_hi(r) : bf16_lo(r);
  };
  auto B = [&](int k, int col) {
    const int lane = col * 4 + (k % 8) / 2, reg = 4 + (k >= 8);
    const uint32_t r = uint32_t(all[lane * 8 + reg]);
    return k % 2 ? bf16_hi(r) : bf16_lo(r);
  };
  const int g = lane_id() / 4, t = lane_id() % 4;
  if (lane_id() == 0) count_mma();
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    float s = c[i];
    for (int k = 0; k < 16; ++k) s += A(row, k) * B(k, col);
    d[i] = s;
  }
}

// ldmatrix.sync.aligned.m8n8.x{n}[.trans].shared.b16: lanes 8i..8i+7 give the row addresses
// of matrix i; this lane gets, in r[i], row lane/4's elements 2(lane%4) and +1 of matrix i,
// or with trans column lane/4's elements in rows 2(lane%4) and +1.
LOOM_EMU_UNCOUNTED inline void ldmatrix(uint32_t* r, int n, bool trans, const void* row, int line) {
  const uint64_t mine[1] = {uint64_t(reinterpret_cast<uintptr_t>(row))};
  const uint64_t* all = warp_gather(mine, 1, line);
  const int lane = lane_id(), g = lane / 4, t = lane % 4;
  if (lane == 0) count_ldmatrix(all, n);
  for (int m = 0; m < n; ++m) {
    // element (rr, cc) of matrix m: row rr's address comes from lane 8 m + rr
    const int r0 = trans ? 2 * t : g, c0 = trans ? g : 2 * t, r1 = trans ? 2 * t + 1 : g, c1 = trans ? g : 2 * t + 1;
    const auto* p0 = reinterpret_cast<const uint16_t*>(uintptr_t(all[(m * 8 + r0) * 8]));
    const auto* p1 = reinterpret_cast<const uint16_t*>(uintptr_t(all[(m * 8 + r1) * 8]));
    r[m] = uint32_t(p0[c0]) | uint32_t(p1[c1]) << 16;
  }
}

// The copy lands: `bytes` from src, or zeros where src is null.
inline void cp_async_land(const CpAsync& c) {
  c.src ? std::memcpy(c.dst, c.src, size_t(c.bytes)) : std::memset(c.dst, 0, size_t(c.bytes));
}
// cp.async.{ca,cg}.shared.global of 4, 8 or 16 bytes (zero fill where src is null), in the
// open group.
LOOM_EMU_UNCOUNTED inline void cp_async(void* dst, const void* src, int bytes) {
  count_cp_async(dst, src, bytes);
  ThreadState& th = *current_thread;
  if (th.cp_async_pending == ThreadState::kCpAsyncSlots) {
    // Full: the oldest copy lands now, which the device may do at any time as well.
    cp_async_land(th.cp_async[0]);
    std::memmove(th.cp_async, th.cp_async + 1, sizeof(CpAsync) * size_t(th.cp_async_pending - 1));
    --th.cp_async_pending;
  }
  th.cp_async[th.cp_async_pending++] = CpAsync{dst, src, th.cp_async_committed, bytes};
}
inline void cp_async_commit() {
  ++current_thread->cp_async_committed;
}
// cp.async.wait_group n: every committed group but the newest n is done.
LOOM_EMU_UNCOUNTED inline void cp_async_wait(int n) {
  ThreadState& th = *current_thread;
  const int before = th.cp_async_pending;
  int kept = 0;
  for (int i = 0; i < th.cp_async_pending; ++i) {
    CpAsync& c = th.cp_async[i];
    if (c.group + unsigned(n) < th.cp_async_committed) {
      cp_async_land(c);
    } else {
      th.cp_async[kept++] = c;
    }
  }
  th.cp_async_pending = kept;
  count_cp_wait(before - kept);
}

}  // namespace loom::emu
