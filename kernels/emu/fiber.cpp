// The emulation's fibers (kernels/emu/fiber.h).
#include "kernels/emu/fiber.h"

#include <sys/mman.h>

#include <mutex>
#include <vector>

namespace loom::emu {

namespace {

// Saves the callee-saved registers and the floating-point control words on the current
// stack, stores its pointer in *save and continues on `next` (System V x86-64).
extern "C" void loom_emu_switch(void** save, void* next);
extern "C" void loom_emu_trampoline();
#if defined(__x86_64__)
asm(R"(
  .pushsection .text
  .globl loom_emu_switch
  .type loom_emu_switch,@function
loom_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size loom_emu_switch,.-loom_emu_switch
  .globl loom_emu_trampoline
  .type loom_emu_trampoline,@function
loom_emu_trampoline:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size loom_emu_trampoline,.-loom_emu_trampoline
  .popsection
)");
#else
#error "the CUDA emulation's fibers are written for x86-64"
#endif

constexpr size_t kGuardBytes = size_t(4) << 10;

}  // namespace

// The first switch to a fiber pops the control words and six registers (r13 the entry, r12
// its argument) and returns into the trampoline, 16-byte aligned as a call expects.
void fiber_frame(Fiber* f, void (*entry)(void*)) {
  uintptr_t top = (uintptr_t(f->map) + kStackBytes) & ~uintptr_t(15);
  auto* sp = reinterpret_cast<uint64_t*>(top - 64 - 16);
  uint32_t csr[2] = {0, 0};
  asm volatile("stmxcsr %0" : "=m"(csr[0]));
  asm volatile("fnstcw %0" : "=m"(csr[1]));
  sp[0] = uint64_t(csr[0]) | (uint64_t(csr[1] & 0xffff) << 32);
  sp[1] = sp[2] = 0;                          // r15, r14
  sp[3] = reinterpret_cast<uint64_t>(entry);  // r13
  sp[4] = reinterpret_cast<uint64_t>(f);      // r12
  sp[5] = sp[6] = 0;                          // rbx, rbp
  sp[7] = reinterpret_cast<uint64_t>(&loom_emu_trampoline);
  f->sp = sp;
  f->thread = -1;
}

std::unique_ptr<Fiber> fiber_make(void (*entry)(void*)) {
  auto f = std::make_unique<Fiber>();
  void* m = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) throw std::runtime_error("the CUDA emulation could not map a fiber stack");
  mprotect(m, kGuardBytes, PROT_NONE);  // a stack overflow faults instead of corrupting
  f->map = static_cast<char*>(m);
  f->lo = f->map + kGuardBytes;
  f->size = kStackBytes - kGuardBytes;
  fiber_frame(f.get(), entry);
#if defined(LOOM_EMU_TSAN)
  f->tsan = __tsan_create_fiber(0);
#endif
  return f;
}

void switch_fiber(Fiber& from, Fiber& to) {
#if defined(LOOM_EMU_TSAN)
  __tsan_switch_to_fiber(to.tsan, 1 /* __tsan_switch_to_fiber_no_sync */);
#endif
#if defined(LOOM_EMU_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, to.lo, to.size);
#endif
  loom_emu_switch(&from.sp, to.sp);
#if defined(LOOM_EMU_ASAN)
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

void fiber_unmap(Fiber* f) {
#if defined(LOOM_EMU_ASAN)
  __asan_unpoison_memory_region(f->lo, f->size);  // frames left behind by an aborted block
#endif
  munmap(f->map, kStackBytes);
}

#if defined(LOOM_EMU_TSAN)
Fiber* tsan_fiber(uint64_t k, void (*entry)(void*)) {
  static std::mutex m;
  static std::vector<std::unique_ptr<Fiber>> pool(4096);
  std::lock_guard<std::mutex> lock(m);
  auto& f = pool[k % pool.size()];
  if (!f) f = fiber_make(entry);
  return f.get();
}
#endif

}  // namespace loom::emu
