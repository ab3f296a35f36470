// Fibers for the CUDA emulation's block scheduler (block.cpp): stacks of their own with a guard
// page, switched by hand (System V x86-64) with the sanitizers told of every switch. Built, as
// block.cpp, without sanitizer instrumentation. Internal to the emulation.
#pragma once
#include <pthread.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>

#if defined(LOOM_EMU_TSAN)
extern "C" {
void* __tsan_get_current_fiber();
void* __tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void* fiber);
void __tsan_switch_to_fiber(void* fiber, unsigned flags);
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
}
#endif
#if defined(LOOM_EMU_ASAN)
extern "C" {
void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, size_t size);
void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old, size_t* size_old);
void __asan_unpoison_memory_region(const volatile void* addr, size_t size);
}
#endif

namespace loom::emu {

#if defined(LOOM_EMU_TSAN)
constexpr size_t kStackBytes = size_t(32) << 10;
#else
constexpr size_t kStackBytes = size_t(256) << 10;
#endif

struct Fiber {
  void* sp = nullptr;
  char* map = nullptr;  // guard page, then the stack
  const void* lo = nullptr;
  size_t size = 0;
  int thread = -1;       // the emulated thread it runs; -1 when idle
  void* tsan = nullptr;  // the sanitizer context of that thread
};

// A fiber whose first switch calls entry(fiber) on its own stack; entry never returns.
std::unique_ptr<Fiber> fiber_make(void (*entry)(void*));
void fiber_unmap(Fiber* f);
// Sets f to start afresh at entry(f) on its next switch (its stack's old frames abandoned).
void fiber_frame(Fiber* f, void (*entry)(void*));
// Saves the running context in `from` and continues `to`.
void switch_fiber(Fiber& from, Fiber& to);

#if defined(LOOM_EMU_TSAN)
// Fiber k mod 4096 (made with `entry` the first time), each with its own stack and sanitizer
// context, made once (a context costs about a millisecond): thread i of block b runs on fiber
// (b n + i) mod 4096, so a stack is reused only by threads its context already orders, and
// only threads that far apart are.
Fiber* tsan_fiber(uint64_t k, void (*entry)(void*));

// Runs `body` on a new OS thread with a small stack (the sanitizer writes its shadow for the
// whole stack when a thread starts) and waits for it.
template <class F>
void run_on_fresh_thread(F&& body) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, size_t(256) << 10);
  pthread_t t;
  auto call = [](void* p) -> void* {
    (*static_cast<F*>(p))();
    return nullptr;
  };
  if (pthread_create(&t, &attr, call, &body) != 0)
    throw std::runtime_error("the CUDA emulation could not start a thread");
  pthread_join(t, nullptr);
  pthread_attr_destroy(&attr);
}
#endif

}  // namespace loom::emu
