// The access callbacks of the counting build (LOOM_EMU_COUNT): its kernels are compiled with
// -fsanitize=thread's instrumentation (a call before every load and store, none elided, unlike
// the address sanitizer's, which drops a store's check after a load of the same address) but
// no sanitizer runtime: the calls land here and go to count_access with the instruction's
// address as the site; atomics are done as asked. The sanitized test builds never link this.
#include <cstddef>
#include <cstdint>

#include "kernels/emu/counts.h"

namespace {
inline void access(const volatile void* a, size_t n, bool store, void* site) {
  loom::emu::count_access(reinterpret_cast<uintptr_t>(a), n, store, reinterpret_cast<uintptr_t>(site));
}
}  // namespace

#define LOOM_COUNT_HOOK(n)                            \
  void __tsan_read##n(void* a) {                      \
    access(a, n, false, __builtin_return_address(0)); \
  }                                                   \
  void __tsan_write##n(void* a) {                     \
    access(a, n, true, __builtin_return_address(0));  \
  }                                                   \
  void __tsan_unaligned_read##n(void* a) {            \
    access(a, n, false, __builtin_return_address(0)); \
  }                                                   \
  void __tsan_unaligned_write##n(void* a) {           \
    access(a, n, true, __builtin_return_address(0));  \
  }

extern "C" {
LOOM_COUNT_HOOK(1)
LOOM_COUNT_HOOK(2)
LOOM_COUNT_HOOK(4)
LOOM_COUNT_HOOK(8)
LOOM_COUNT_HOOK(16)
void __tsan_read_range(void* a, size_t n) {
  access(a, n, false, __builtin_return_address(0));
}
void __tsan_write_range(void* a, size_t n) {
  access(a, n, true, __builtin_return_address(0));
}
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
// Atomics (shared pointers' counts, the emulation's atomicAdd): sequentially consistent here.
int32_t __tsan_atomic32_fetch_add(volatile int32_t* a, int32_t v, int) {
  return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
}
int64_t __tsan_atomic64_fetch_add(volatile int64_t* a, int64_t v, int) {
  return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
}
int32_t __tsan_atomic32_load(const volatile int32_t* a, int) {
  return __atomic_load_n(a, __ATOMIC_SEQ_CST);
}
int64_t __tsan_atomic64_load(const volatile int64_t* a, int) {
  return __atomic_load_n(a, __ATOMIC_SEQ_CST);
}
void __tsan_atomic32_store(volatile int32_t* a, int32_t v, int) {
  __atomic_store_n(a, v, __ATOMIC_SEQ_CST);
}
void __tsan_atomic64_store(volatile int64_t* a, int64_t v, int) {
  __atomic_store_n(a, v, __ATOMIC_SEQ_CST);
}
int __tsan_atomic32_compare_exchange_strong(volatile int32_t* a, int32_t* c, int32_t v, int, int) {
  return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
int __tsan_atomic64_compare_exchange_strong(volatile int64_t* a, int64_t* c, int64_t v, int, int) {
  return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
int __tsan_atomic32_compare_exchange_weak(volatile int32_t* a, int32_t* c, int32_t v, int, int) {
  return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
int __tsan_atomic64_compare_exchange_weak(volatile int64_t* a, int64_t* c, int64_t v, int, int) {
  return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
int32_t __tsan_atomic32_exchange(volatile int32_t* a, int32_t v, int) {
  return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);
}
int64_t __tsan_atomic64_exchange(volatile int64_t* a, int64_t v, int) {
  return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);
}
void __tsan_atomic_thread_fence(int) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
void __tsan_atomic_signal_fence(int) {}
}
