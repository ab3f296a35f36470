// nvcuda::wmma for the CUDA emulation: 16x16x16 tiles, bf16 inputs
// and fp32 accumulators. Each lane owns elements lane + 32 j (j < 8) of the row-major tile,
// as the hardware gives each lane 8 opaque elements: loads and stores touch only the lane's
// own elements (so a missing __syncwarp before a load is a race), and mma_sync exchanges the
// operands across the warp (block.cpp) and computes each lane's 8 outputs.
#pragma once
#include "kernels/emu/bf16.h"
#include "kernels/emu/device.h"

namespace loom::emu {
// d[8] = c[8] + (a @ b) at this lane's elements; a and b are this lane's 8 elements of each.
void warp_mma(float* d, const float* c, const float* a, const float* b, int line);
}  // namespace loom::emu

namespace nvcuda::wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation has 16x16x16 tiles only");
  static constexpr int num_elements = 8;
  T x[8];
};

namespace detail {
inline int lane() {
  return ::loom::emu::lane_id();
}
// Element j of this lane: (row, column) of the 16x16 tile.
inline int row_of(int j) {
  return (lane() + 32 * j) / 16;
}
inline int col_of(int j) {
  return (lane() + 32 * j) % 16;
}
template <class T>
float widen(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(v);
  else
    return float(v);
}

template <class T>
T narrow(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(v);
  else
    return T(v);
}
}  // namespace detail

template <class Use, int M, int N, int K, class T, class L, class V>
inline void fill_fragment(fragment<Use, M, N, K, T, L>& f, V v) {
  for (int j = 0; j < 8; ++j) f.x[j] = detail::narrow<T>(float(v));
}

// Operand tiles: element (r, c) at p[r * ldm + c] (row_major) or p[c * ldm + r] (col_major).
template <class Use, int M, int N, int K, class T, class L>
LOOM_EMU_UNCOUNTED inline void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const T* p, unsigned ldm) {
  if (detail::lane() == 0) ::loom::emu::count_wmma_tile(p, ldm, sizeof(T), !std::is_same_v<L, row_major>);
  for (int j = 0; j < 8; ++j) {
    const int r = detail::row_of(j), c = detail::col_of(j);
    f.x[j] = std::is_same_v<L, row_major> ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
  }
}
template <int M, int N, int K>
LOOM_EMU_UNCOUNTED inline void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm,
                                                layout_t l) {
  if (detail::lane() == 0) ::loom::emu::count_wmma_tile(p, ldm, 4, l == mem_col_major);
  for (int j = 0; j < 8; ++j) {
    const int r = detail::row_of(j), c = detail::col_of(j);
    f.x[j] = l == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
  }
}
template <int M, int N, int K>
LOOM_EMU_UNCOUNTED inline void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm,
                                                 layout_t l) {
  if (detail::lane() == 0) ::loom::emu::count_wmma_tile(p, ldm, 4, l == mem_col_major);
  for (int j = 0; j < 8; ++j) {
    const int r = detail::row_of(j), c = detail::col_of(j);
    (l == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r]) = f.x[j];
  }
}

// Called through the mma_sync macro below, which passes the caller's line for errors.
template <int M, int N, int K, class TA, class LA, class TB, class LB>
inline void mma_sync_at(int line, fragment<accumulator, M, N, K, float>& d,
                        const fragment<matrix_a, M, N, K, TA, LA>& a, const fragment<matrix_b, M, N, K, TB, LB>& b,
                        const fragment<accumulator, M, N, K, float>& c) {
  float fa[8], fb[8];
  if (detail::lane() == 0) ::loom::emu::count_wmma();
  for (int j = 0; j < 8; ++j) fa[j] = detail::widen(a.x[j]), fb[j] = detail::widen(b.x[j]);
  ::loom::emu::warp_mma(d.x, c.x, fa, fb, line);
}

}  // namespace nvcuda::wmma

#define mma_sync(...) mma_sync_at(__LINE__, __VA_ARGS__)
