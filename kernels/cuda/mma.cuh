// The PTX-level primitives of the flash attention kernels: mma.sync m16n8k16 (bf16 in, fp32
// accumulators), ldmatrix (x1, x2, x4, optionally transposed) and 16- and 4-byte cp.async with
// their groups. Inline PTX under nvcc; under the CPU emulation the same calls go to kernels/emu/ptx.h,
// which implements the PTX ISA's register layouts (written out there), so the kernels that
// use them run and are tested without a GPU.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

#if defined(LOOM_CUDA_EMULATION)
#include "kernels/emu/ptx.h"
#endif

namespace loom::cuda {

// Two bf16 in one register, `lo` in the low half (the element with the smaller index).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat16 l = __float2bfloat16_rn(lo), h = __float2bfloat16_rn(hi);
  uint16_t ul, uh;
  memcpy(&ul, &l, 2);
  memcpy(&uh, &h, 2);
  return uint32_t(ul) | uint32_t(uh) << 16;
}

#if defined(LOOM_CUDA_EMULATION)

// d = a @ b + c (layouts: kernels/emu/ptx.h).
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                          const float (&c)[4]) {
  ::loom::emu::mma_m16n8k16(d, a, b, c, __LINE__);
}
template <int N, bool Trans = false>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[N], const void* row) {
  static_assert(N == 1 || N == 2 || N == 4);
  ::loom::emu::ldmatrix(r, N, Trans, row, __LINE__);
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  ::loom::emu::cp_async(smem, valid ? gmem : nullptr, 16);
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  ::loom::emu::cp_async(smem, valid ? gmem : nullptr, 4);
}
__device__ __forceinline__ void cp_async_commit() {
  ::loom::emu::cp_async_commit();
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  ::loom::emu::cp_async_wait(N);
}
// 2^x (the device's ex2.approx; exact here).
__device__ __forceinline__ float exp2_approx(float x) {
  ::loom::emu::count_mufu();
  return std::exp2(x);
}

#else

__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                          const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
template <int N, bool Trans = false>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[N], const void* row) {
  static_assert(N == 1 || N == 2 || N == 4);
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (N == 1 && !Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(addr));
  if constexpr (N == 1 && Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(addr));
  if constexpr (N == 2 && !Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
  if constexpr (N == 2 && Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr));
  if constexpr (N == 4 && !Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  if constexpr (N == 4 && Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// 16 bytes global -> shared, bypassing L1; zero fill where !valid (gmem is then not read).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(gmem), "r"(src_bytes));
}
// 4 bytes global -> shared (.ca: sizes below 16 have no .cg form); zero fill where !valid.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(addr), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

#endif

}  // namespace loom::cuda
