// The device side of the CUDA emulation: what a kernel under kernels/cuda/ may name (thread
// and block indices, __syncthreads, warp shuffles and votes, atomics, bf16, the math
// intrinsics) as host C++. A launch runs each block's threads as fibers on the calling OS
// thread (kernels/emu/block.cpp); a barrier or warp operation switches fibers, so missing
// barriers are races ThreadSanitizer sees and stray accesses are ones AddressSanitizer sees.
// Not a performance path: it exists so every kernel runs, and is tested, without a GPU.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/emu/counts.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ __restrict
#define __align__(n) alignas(n)
#define __launch_bounds__(...)
// Emulation code that stands for the hardware's own accesses (an ldmatrix's reads): in the
// counting build its plain accesses are not the kernel's (counts.h counts them itself).
#if defined(LOOM_EMU_COUNT)
#define LOOM_EMU_UNCOUNTED __attribute__((noinline, no_sanitize_thread))
#else
#define LOOM_EMU_UNCOUNTED
#endif
// Static shared memory: one copy per OS thread, which runs one block at a time. Under
// AddressSanitizer a plain static, which gets redzones (thread-locals do not).
#if defined(LOOM_EMU_ASAN)
#define __shared__ static
#else
#define __shared__ static thread_local
#endif

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) int4 {
  int x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(8) int2 {
  int x, y;
};
inline int4 make_int4(int x, int y, int z, int w) {
  return {x, y, z, w};
}
inline float4 make_float4(float x, float y, float z, float w) {
  return {x, y, z, w};
}
inline float2 make_float2(float x, float y) {
  return {x, y};
}

namespace loom::emu {

// The emulated thread a fiber runs now, and its block: set by the block scheduler each time
// it switches to a fiber.
// A cp.async of 4, 8 or 16 bytes in flight: done at the cp.async.wait_group that covers its
// group (src null: zero fill), so shared memory read before that wait holds the old bytes.
struct CpAsync {
  void* dst;
  const void* src;
  unsigned group;
  int bytes;
};
// Constructed without clearing its slots (only the first cp_async_pending are read): a block
// of 256 threads would otherwise clear 400 KB at each start, which under ThreadSanitizer (a
// fresh block state per block) cost most of a launch of idle blocks.
struct ThreadState {
  ThreadState() {}
  void start(uint3 at, int i) { idx = at, linear = i, cp_async_pending = 0, cp_async_committed = 0; }
  uint3 idx;
  int linear = 0;  // x + y * blockDim.x + z * blockDim.x * blockDim.y
  static constexpr int kCpAsyncSlots = 64;
  CpAsync cp_async[kCpAsyncSlots];
  int cp_async_pending = 0;
  unsigned cp_async_committed = 0;  // groups closed by cp.async.commit_group
};
struct BlockState {
  uint3 idx;
  dim3 dim, grid;
  unsigned char* dynamic_shared = nullptr;
  size_t dynamic_bytes = 0;
};
extern thread_local ThreadState* current_thread;
extern thread_local BlockState* current_block;

// Barriers and warp operations (block.cpp): `line` names the call site in error messages.
void syncthreads(int line);
void syncwarp(unsigned mask, int line);
// Every lane of `mask` publishes `value`; returns lane `src`'s (an error where src is outside
// the mask). A vote reads only the mask's lanes of the value table.
uint64_t warp_shuffle(unsigned mask, uint64_t value, int src, int line);
unsigned warp_ballot(unsigned mask, bool pred, int line);
// Every lane of the (full) warp publishes n <= 8 words; returns the table of all lanes' words,
// lane l's word i < n at [l * 8 + i] (words past n are undefined), valid until this lane's next
// warp operation. The exchange behind the emulated mma.sync and ldmatrix (kernels/emu/ptx.h).
const uint64_t* warp_gather(const uint64_t* words, int n, int line);

template <class T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8);
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}
template <class T>
T from_bits(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}
inline int lane_id() {
  return current_thread->linear % 32;
}

}  // namespace loom::emu

#define threadIdx (::loom::emu::current_thread->idx)
#define blockIdx (::loom::emu::current_block->idx)
#define blockDim (::loom::emu::current_block->dim)
#define gridDim (::loom::emu::current_block->grid)
#define __syncthreads() ::loom::emu::syncthreads(__LINE__)
#define __syncwarp(...) ::loom::emu::syncwarp(::loom::emu::warp_mask(__VA_ARGS__), __LINE__)
#define __shfl_sync(mask, v, src, ...) ::loom::emu::shfl_idx(mask, v, src, __LINE__, ##__VA_ARGS__)
#define __shfl_xor_sync(mask, v, lm, ...) ::loom::emu::shfl_xor(mask, v, lm, __LINE__, ##__VA_ARGS__)
#define __shfl_down_sync(mask, v, d, ...) ::loom::emu::shfl_down(mask, v, d, __LINE__, ##__VA_ARGS__)
#define __shfl_up_sync(mask, v, d, ...) ::loom::emu::shfl_up(mask, v, d, __LINE__, ##__VA_ARGS__)
#define __ballot_sync(mask, p) ::loom::emu::warp_ballot(mask, bool(p), __LINE__)
#define __any_sync(mask, p) (::loom::emu::warp_ballot(mask, bool(p), __LINE__) != 0u)
#define __all_sync(mask, p) (::loom::emu::warp_ballot(mask, bool(p), __LINE__) == unsigned(mask))

namespace loom::emu {

inline unsigned warp_mask(unsigned mask = 0xffffffffu) {
  return mask;
}

// CUDA's shuffles within segments of `width` lanes; a source outside the segment reads the
// lane's own value (down/up), as the hardware does.
template <class T>
T shfl_idx(unsigned mask, T v, int src, int line, int width = 32) {
  const int lane = lane_id(), base = lane & ~(width - 1);
  return from_bits<T>(warp_shuffle(mask, to_bits(v), base + (src & (width - 1)), line));
}
template <class T>
T shfl_xor(unsigned mask, T v, int lane_mask, int line, int width = 32) {
  const int lane = lane_id(), src = lane ^ lane_mask;
  return from_bits<T>(warp_shuffle(mask, to_bits(v), (src & ~(width - 1)) != (lane & ~(width - 1)) ? lane : src, line));
}
template <class T>
T shfl_down(unsigned mask, T v, unsigned delta, int line, int width = 32) {
  const int lane = lane_id(), src = lane + int(delta);
  return from_bits<T>(warp_shuffle(mask, to_bits(v), (src & ~(width - 1)) != (lane & ~(width - 1)) ? lane : src, line));
}
template <class T>
T shfl_up(unsigned mask, T v, unsigned delta, int line, int width = 32) {
  const int lane = lane_id(), src = lane - int(delta);
  return from_bits<T>(warp_shuffle(mask, to_bits(v), src < (lane & ~(width - 1)) ? lane : src, line));
}

}  // namespace loom::emu

// Atomics: relaxed read-modify-writes, as the device's are (fibers of one block run on one OS
// thread, and a sanitizer sees them as atomics, not races).
template <class T>
inline T atomicAdd(T* p, T v) {
  if constexpr (std::is_integral_v<T>) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
  } else {
    using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
    U* u = reinterpret_cast<U*>(p);
    U expect = __atomic_load_n(u, __ATOMIC_RELAXED);
    for (;;) {
      const T old = ::loom::emu::from_bits<T>(expect);
      const U want = U(::loom::emu::to_bits(T(old + v)));
      if (__atomic_compare_exchange_n(u, &expect, want, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return old;
    }
  }
}
template <class T>
inline T atomicMax(T* p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
template <class T>
inline T atomicExch(T* p, T v) {
  return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);
}
template <class T>
inline T atomicCAS(T* p, T compare, T v) {
  __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return compare;
}
inline void __threadfence() {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
inline void __threadfence_block() {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

// The fast intrinsics, computed at full precision: the device's are approximations (CUDA gives
// __expf within 2 + floor(|1.173 x|) ulp), so results that lean on them differ on a GPU.
inline float __expf(float x) {
  ::loom::emu::count_mufu();
  return std::exp(x);
}
inline float __logf(float x) {
  ::loom::emu::count_mufu();
  return std::log(x);
}
inline float __fdividef(float a, float b) {
  return a / b;
}
inline float rsqrtf(float x) {
  ::loom::emu::count_mufu();
  return 1.0f / std::sqrt(x);
}
inline double rsqrt(double x) {
  return 1.0 / std::sqrt(x);
}
inline float __int_as_float(int i) {
  return ::loom::emu::from_bits<float>(uint32_t(i));
}
inline int __float_as_int(float x) {
  return int(uint32_t(::loom::emu::to_bits(x)));
}
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
