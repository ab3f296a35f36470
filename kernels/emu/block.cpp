// The block scheduler of the CUDA emulation. A launch runs its blocks one after another (on
// the calling OS thread; under ThreadSanitizer each on a fresh one); a block's threads run as
// fibers with stacks of their own, switched only at __syncthreads, __syncwarp, shuffles, votes
// and mma_sync, so a block behaves as one on a device whose warps interleave only at those
// points. A fiber that finishes its thread without waiting goes on to the next unstarted
// thread, so kernels without barriers cost one fiber, not one per thread.
// Checked as a device would fail, or as CUDA leaves undefined: threads of one block waiting at
// __syncthreads calls on different lines, warp operations whose masks leave out the caller,
// name lanes that exited or do not exist, or differ between lanes, and deadlocks (reported
// with what every waiting thread waits for).
// This file is built without sanitizer instrumentation. Under ThreadSanitizer each emulated
// thread runs in a sanitizer context of its own (of 4096 taken in turn), and each block on a
// fresh OS thread with an executor of its own (fresh thread-locals: its static __shared__
// arrays), so nothing orders two threads but __syncthreads and __syncwarp (each generation
// its own sync object), sharing a context (threads 4096 apart) and the end of a launch (all
// before the next): a race between threads, or between nearby blocks, is reported.
// Shuffles and mma_sync move values through tables here that the sanitizer does not see, as
// registers move on a device.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/emu/counts.h"
#include "kernels/emu/fiber.h"
#include "kernels/emu/runtime.h"
#include "runtime/error.h"

// A sanitizer build of the emulation stops at its first report, whatever the environment says:
// a race or an overrun is a failed test, not a warning in a log.
#if defined(LOOM_EMU_TSAN)
extern "C" const char* __tsan_default_options() {
  return "halt_on_error=1";
}
#endif
#if defined(LOOM_EMU_ASAN)
extern "C" const char* __asan_default_options() {
  return "halt_on_error=1:detect_leaks=1";
}
#endif

namespace loom::emu {

thread_local ThreadState* current_thread = nullptr;
thread_local BlockState* current_block = nullptr;

namespace {

// Under TSan a fiber runs one emulated thread per start, each fiber with a sanitizer context of
// its own (tsan_fiber, kernels/emu/fiber.h).
#if defined(LOOM_EMU_TSAN)
constexpr bool kOneThreadPerStart = true;
#else
constexpr bool kOneThreadPerStart = false;
#endif

enum class Wait : uint8_t { none, barrier, warp, done };
enum class WarpOp : uint8_t { shuffle, vote, syncwarp, mma, gather };
const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::shuffle:
      return "a shuffle";
    case WarpOp::vote:
      return "a vote";
    case WarpOp::syncwarp:
      return "__syncwarp";
    case WarpOp::mma:
      return "wmma::mma_sync";
    case WarpOp::gather:
      return "mma.sync or ldmatrix";
  }
  return "?";
}

// The tables are not cleared at a block's start (each operation reads only what its lanes
// wrote), for the reason ThreadState's slots are not (device.h).
struct Warp {
  Warp() {}
  void start(unsigned lanes) {
    present = lanes, exited = 0, waiting = 0, mask = 0, op = WarpOp::shuffle, line = 0, cur = 0;
  }
  unsigned present = 0;  // lanes that exist (a block's last warp may be partial)
  unsigned exited = 0;
  unsigned waiting = 0;  // lanes arrived at the pending operation
  unsigned mask = 0;
  WarpOp op = WarpOp::shuffle;
  int line = 0;
  int cur = 0;  // which half of the tables the pending operation uses
  uint64_t value[2][32];
  float a[2][256], b[2][256];
  uint64_t words[2][32 * 8];
};

struct Executor {
  Fiber main;
  std::vector<std::unique_ptr<Fiber>> fibers;
  std::vector<Fiber*> idle;
  // The block being run.
  const LaunchConfig* cfg = nullptr;
  void (*body)(void*) = nullptr;
  void* ctx = nullptr;
  BlockState block;
  int n = 0, next = 0, done = 0;
  std::vector<ThreadState> threads;
  std::vector<Wait> wait;
  std::vector<Fiber*> fiber_of;
  std::vector<int> ready;  // a ring of n slots: no allocation while fibers run
  size_t ready_head = 0, ready_size = 0;
  int bar_arrived = 0, bar_line = 0;
  uint64_t bar_gen = 0;  // barriers completed in this block
  std::vector<Warp> warps;
  std::string error;
  // TSan sync objects, one per parity of barrier (and of warp operation) generations, so a
  // barrier orders what came before it and nothing before the one after: [0, 1] the block's
  // barriers, [2 + 2 w + p] warp w's __syncwarp.
  char* tokens = nullptr;
  char* done_token = nullptr;
  char* start_token = nullptr;
  uint64_t block_linear = 0;
  std::vector<unsigned char> dyn;  // not used under sanitizers (malloc'd per block there)
  unsigned char* dyn_ptr = nullptr;
  bool counted = false;  // a block of a counted launch (counts.h)
  ~Executor();
};
Executor::~Executor() {
  for (auto& f : fibers) fiber_unmap(f.get());
#if defined(LOOM_EMU_TSAN)
  std::free(dyn_ptr);  // after the launch: its threads read it
#endif
}
thread_local std::unique_ptr<Executor> tls_owned;
thread_local Executor* tls_executor = nullptr;  // under TSan, one the launch owns per block

Executor& executor() {
  if (!tls_executor) {
    tls_owned = std::make_unique<Executor>();
    tls_executor = tls_owned.get();
  }
  return *tls_executor;
}

[[noreturn]] void device_fail(Executor& ex, const std::string& what) {
  const ThreadState* t = current_thread;
  const BlockState& b = ex.block;
  char where[160];
  std::snprintf(where, sizeof where, "%s block (%u,%u,%u) thread (%u,%u,%u): ", ex.cfg ? ex.cfg->name : "?", b.idx.x,
                b.idx.y, b.idx.z, t ? t->idx.x : 0, t ? t->idx.y : 0, t ? t->idx.z : 0);
  throw std::runtime_error(where + what);
}

void thread_exit(Executor& ex, int t);
void run_threads(Executor& ex, Fiber* self);

// Runs emulated threads, then waits idle until the scheduler starts it again (perhaps for
// another block's executor, under TSan). It touches no container: allocations here would be
// accesses the sanitizer sees from an unordered context.
void fiber_entry(void* arg) {
  Fiber* self = static_cast<Fiber*>(arg);
#if defined(LOOM_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &executor().main.lo, &executor().main.size);
#endif
  for (;;) {
    Executor& ex = executor();
    run_threads(ex, self);
    self->thread = -1;
    switch_fiber(*self, ex.main);
  }
}

[[maybe_unused]] Fiber* fiber_new(Executor& ex) {
  ex.fibers.push_back(fiber_make(&fiber_entry));
  return ex.fibers.back().get();
}

[[maybe_unused]] void fiber_free(Executor& ex, Fiber* f) {
  fiber_unmap(f);
  for (auto& p : ex.fibers)
    if (p.get() == f) {
      p = std::move(ex.fibers.back());
      ex.fibers.pop_back();
      break;
    }
}

void resume(Executor& ex, Fiber* f) {
  current_thread = f->thread >= 0 ? &ex.threads[size_t(f->thread)] : nullptr;
  current_block = &ex.block;
  switch_fiber(ex.main, *f);
#if !defined(LOOM_EMU_TSAN)
  if (f->thread < 0) ex.idle.push_back(f);
#endif
}

void run_threads(Executor& ex, Fiber* self) {
  while (ex.next < ex.n && ex.error.empty()) {
    const int t = ex.next++;
    self->thread = t;
    ex.fiber_of[size_t(t)] = self;
    current_thread = &ex.threads[size_t(t)];
#if defined(LOOM_EMU_TSAN)
    __tsan_acquire(ex.start_token);  // after the host's writes and this block's start only
#endif
    try {
      ex.body(ex.ctx);
      thread_exit(ex, t);
    } catch (const std::exception& e) {
      if (ex.error.empty()) ex.error = e.what();
#if defined(LOOM_EMU_TSAN)
      __tsan_release(ex.done_token);  // the block's thread reads the message
#endif
      return;
    }
    if (kOneThreadPerStart) return;
  }
}

// Suspends the running emulated thread until the scheduler resumes it.
void block_current(Executor& ex) {
  const int t = current_thread->linear;
  switch_fiber(*ex.fiber_of[size_t(t)], ex.main);
  if (!ex.error.empty()) throw std::runtime_error("aborted");  // never resumed after an error
}

void make_ready(Executor& ex, int t) {
  ex.wait[size_t(t)] = Wait::none;
  ex.ready[(ex.ready_head + ex.ready_size++) % ex.ready.size()] = t;
}

void release_barrier(Executor& ex) {
  count_barrier();
  for (int t = 0; t < ex.n; ++t)
    if (ex.wait[size_t(t)] == Wait::barrier) make_ready(ex, t);
  ex.bar_arrived = 0;
  ++ex.bar_gen;
}

void thread_exit(Executor& ex, int t) {
#if defined(LOOM_EMU_TSAN)
  __tsan_release(ex.done_token);
#endif
  ex.wait[size_t(t)] = Wait::done;
  ++ex.done;
  Warp& w = ex.warps[size_t(t / 32)];
  const unsigned bit = 1u << (t % 32);
  w.exited |= bit;
  if (w.waiting && (w.mask & bit))
    device_fail(ex, "exits while lanes of its warp wait for it in " + std::string(op_name(w.op)) + " (line " +
                        std::to_string(w.line) + ")");
  // Exited threads no longer count at a barrier (as on the device since Volta).
  if (ex.bar_arrived > 0 && ex.bar_arrived == ex.n - ex.done) release_barrier(ex);
}

std::string hex(unsigned m) {
  char s[16];
  std::snprintf(s, sizeof s, "0x%08x", m);
  return s;
}

// Arrives at the warp's pending operation (or opens it); returns the half of the tables it
// uses, valid until this lane's next warp operation. The caller has written its own slots.
int warp_arrive(Executor& ex, unsigned mask, WarpOp op, int line, int half) {
  const int t = current_thread->linear, lane = t % 32;
  Warp& w = ex.warps[size_t(t / 32)];
  const unsigned bit = 1u << lane;
  if (!(mask & bit))
    device_fail(ex, std::string(op_name(op)) + " with mask " + hex(mask) + " that leaves out lane " +
                        std::to_string(lane) + ", the caller");
  if (mask & ~w.present)
    device_fail(ex, std::string(op_name(op)) + " with mask " + hex(mask) + " names lanes " + hex(mask & ~w.present) +
                        " that this block does not have");
  if (mask & w.exited)
    device_fail(ex, std::string(op_name(op)) + " (line " + std::to_string(line) + ") with mask " + hex(mask) +
                        " names lanes " + hex(mask & w.exited) + " that have exited");
  count_lane_wait();
  if (w.waiting == 0) {
    w.mask = mask, w.op = op, w.line = line;
  } else if (w.mask != mask || w.op != op) {
    device_fail(ex, std::string(op_name(op)) + " (line " + std::to_string(line) + ", mask " + hex(mask) +
                        ") while lanes " + hex(w.waiting) + " of its warp wait in " + op_name(w.op) + " (line " +
                        std::to_string(w.line) + ", mask " + hex(w.mask) + ")");
  }
  w.waiting |= bit;
  if (w.waiting == mask) {
    w.waiting = 0;
    w.cur ^= 1;
    count_warp_done(t / 32);
    if (op != WarpOp::gather && op != WarpOp::mma) count_warp_op();
    for (int l = 0; l < 32; ++l)
      if ((mask >> l & 1u) && l != lane) make_ready(ex, (t / 32) * 32 + l);
  } else {
    ex.wait[size_t(t)] = Wait::warp;
    block_current(ex);
  }
  return half;
}

std::string deadlock_report(Executor& ex) {
  int at_barrier = 0;
  for (int t = 0; t < ex.n; ++t) at_barrier += ex.wait[size_t(t)] == Wait::barrier;
  std::string s = "deadlock:";
  if (at_barrier)
    s +=
        fmt::format(" {} at __syncthreads (line {});", plural(at_barrier, "thread waits", "threads wait"), ex.bar_line);
  for (size_t w = 0; w < ex.warps.size(); ++w)
    if (ex.warps[w].waiting)
      s += fmt::format(" lanes {} of warp {} wait in {} (line {}, mask {});", hex(ex.warps[w].waiting), w,
                       op_name(ex.warps[w].op), ex.warps[w].line, hex(ex.warps[w].mask));
  return s + fmt::format(" {} of {} threads have exited", ex.done, ex.n);
}

void run_block(Executor& ex, uint3 idx) {
  ex.block.idx = idx;
  ex.next = ex.done = 0;
  ex.bar_arrived = 0;
  ex.bar_gen = 0;
  ex.ready_head = ex.ready_size = 0;
  for (auto& w : ex.warps) w.exited = w.waiting = w.mask = 0, w.cur = 0;
  std::fill(ex.wait.begin(), ex.wait.end(), Wait::none);
#if defined(LOOM_EMU_TSAN)
  ex.tokens = new char[2 + 2 * ex.warps.size()];
#endif
  const size_t dyn = ex.cfg->dynamic_shared;
#if defined(LOOM_EMU_ASAN) || defined(LOOM_EMU_TSAN)
  ex.dyn_ptr = dyn ? static_cast<unsigned char*>(std::malloc(dyn)) : nullptr;  // exact size: overruns are seen
#else
  ex.dyn.resize(dyn);
  ex.dyn_ptr = ex.dyn.data();
#endif
  if (dyn) std::memset(ex.dyn_ptr, 0xff, dyn);  // uninitialized shared memory reads as NaN
  ex.block.dynamic_shared = ex.dyn_ptr;
  ex.block.dynamic_bytes = dyn;
  if (ex.counted) count_block_begin(ex.n, ex.block);
#if defined(LOOM_EMU_TSAN)
  __tsan_release(ex.start_token);  // what this thread did for the block, before any of its threads
#endif
  while (ex.done < ex.n && ex.error.empty()) {
    if (ex.ready_size) {
      const int t = ex.ready[ex.ready_head];
      ex.ready_head = (ex.ready_head + 1) % ex.ready.size();
      --ex.ready_size;
      resume(ex, ex.fiber_of[size_t(t)]);
    } else if (ex.next < ex.n) {
      Fiber* f = nullptr;
#if defined(LOOM_EMU_TSAN)
      f = tsan_fiber(ex.block_linear * uint64_t(ex.n) + uint64_t(ex.next), &fiber_entry);
#else
      if (!ex.idle.empty()) {
        f = ex.idle.back();
        ex.idle.pop_back();
      } else {
        f = fiber_new(ex);
      }
#endif
      resume(ex, f);
    } else {
      ex.error = ex.cfg->name + std::string(" block (") + std::to_string(idx.x) + "," + std::to_string(idx.y) + "," +
                 std::to_string(idx.z) + "): " + deadlock_report(ex);
    }
  }
  if (!ex.error.empty()) {
    // Threads left suspended mid-kernel: their fibers are dropped, never resumed.
    std::vector<Fiber*> busy;
    for (int t = 0; t < ex.n; ++t)
      if (ex.fiber_of[size_t(t)] && ex.wait[size_t(t)] != Wait::done && ex.fiber_of[size_t(t)]->thread == t)
        busy.push_back(ex.fiber_of[size_t(t)]);
#if defined(LOOM_EMU_TSAN)
    for (Fiber* f : busy) {  // each releases what it read, as a finished thread does, and starts afresh
      __tsan_switch_to_fiber(f->tsan, 1);
      __tsan_release(ex.done_token);
      __tsan_switch_to_fiber(ex.main.tsan, 1);
      fiber_frame(f, &fiber_entry);
    }
#else
    for (Fiber* f : busy) fiber_free(ex, f);
#endif
  }
#if defined(LOOM_EMU_TSAN)
  delete[] ex.tokens;
  ex.tokens = nullptr;
#endif
#if defined(LOOM_EMU_ASAN)
  std::free(ex.dyn_ptr);
  ex.dyn_ptr = nullptr;
#endif
}

// Per-kernel dynamic shared memory limits raised by cudaFuncSetAttribute.
std::mutex attr_mutex;
std::unordered_map<const void*, size_t>& shared_limits() {
  static std::unordered_map<const void*, size_t> m;
  return m;
}
// Under ASan static __shared__ arrays are plain statics, one copy for the process.
[[maybe_unused]] std::mutex launch_mutex;
std::atomic<uint64_t> n_launches{0}, n_blocks{0}, n_threads{0};

}  // namespace

size_t dynamic_shared_limit(const void* kernel) {
  std::lock_guard<std::mutex> lock(attr_mutex);
  auto it = shared_limits().find(kernel);
  return it == shared_limits().end() ? DeviceLimits::shared_default : it->second;
}
void set_dynamic_shared_limit(const void* kernel, size_t bytes) {
  std::lock_guard<std::mutex> lock(attr_mutex);
  shared_limits()[kernel] = bytes;
}

unsigned char* dynamic_shared() {
  return current_block->dynamic_shared;
}

namespace {
thread_local LaunchRecorder* tls_recorder = nullptr;
}
LaunchRecorder::LaunchRecorder() : outer_(tls_recorder) {
  tls_recorder = this;
}
LaunchRecorder::~LaunchRecorder() {
  tls_recorder = outer_;
}
LaunchRecorder* launch_recorder() {
  return tls_recorder;
}

Counters counters() {
  return {n_launches.load(), n_blocks.load(), n_threads.load()};
}

void syncthreads(int line) {
  Executor& ex = executor();
  const int t = current_thread->linear;
  if (ex.bar_arrived == 0) {
    ex.bar_line = line;
  } else if (line != ex.bar_line) {
    device_fail(ex, "__syncthreads at line " + std::to_string(line) + " while " + std::to_string(ex.bar_arrived) +
                        " threads wait at the one at line " + std::to_string(ex.bar_line) + " (divergent barrier)");
  }
  count_lane_wait();
  // A thread can be one barrier ahead of another (the last to arrive runs on), never two.
  [[maybe_unused]] char* token = ex.tokens + (ex.bar_gen & 1);
#if defined(LOOM_EMU_TSAN)
  __tsan_release(token);
#endif
  if (++ex.bar_arrived == ex.n - ex.done) {
    release_barrier(ex);
  } else {
    ex.wait[size_t(t)] = Wait::barrier;
    block_current(ex);
  }
#if defined(LOOM_EMU_TSAN)
  __tsan_acquire(token);
#endif
}

void syncwarp(unsigned mask, int line) {
  Executor& ex = executor();
  const int w = current_thread->linear / 32;
  [[maybe_unused]] char* token = ex.tokens + 2 + 2 * w + ex.warps[size_t(w)].cur;
#if defined(LOOM_EMU_TSAN)
  __tsan_release(token);
#endif
  warp_arrive(ex, mask, WarpOp::syncwarp, line, 0);
#if defined(LOOM_EMU_TSAN)
  __tsan_acquire(token);
#endif
}

namespace {
// Publishes this lane's value for a shuffle or vote and waits for the mask's lanes: the table
// of their values, valid until this lane's next warp operation.
const uint64_t* warp_exchange(Executor& ex, unsigned mask, uint64_t value, WarpOp op, int line) {
  const int t = current_thread->linear;
  Warp& w = ex.warps[size_t(t / 32)];
  const int half = w.cur;
  w.value[half][t % 32] = value;
  warp_arrive(ex, mask, op, line, half);
  return w.value[half];
}
}  // namespace

uint64_t warp_shuffle(unsigned mask, uint64_t value, int src, int line) {
  Executor& ex = executor();
  const uint64_t* values = warp_exchange(ex, mask, value, WarpOp::shuffle, line);
  if (src < 0 || src >= 32 || !(mask >> src & 1u))
    device_fail(ex, "a shuffle (line " + std::to_string(line) + ") reads lane " + std::to_string(src) +
                        ", outside its mask " + hex(mask));
  return values[src];
}

unsigned warp_ballot(unsigned mask, bool pred, int line) {
  const uint64_t* values = warp_exchange(executor(), mask, pred, WarpOp::vote, line);
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l)
    if ((mask >> l & 1u) && values[l]) bits |= 1u << l;
  return bits;
}

const uint64_t* warp_gather(const uint64_t* words, int n, int line) {
  Executor& ex = executor();
  const int t = current_thread->linear, lane = t % 32;
  Warp& w = ex.warps[size_t(t / 32)];
  const int half = w.cur;
  for (int i = 0; i < n; ++i) w.words[half][lane * 8 + i] = words[i];
  warp_arrive(ex, 0xffffffffu, WarpOp::gather, line, half);
  return w.words[half];
}

void warp_mma(float* d, const float* c, const float* a, const float* b, int line) {
  Executor& ex = executor();
  const int t = current_thread->linear, lane = t % 32;
  Warp& w = ex.warps[size_t(t / 32)];
  const int half = w.cur;
  for (int j = 0; j < 8; ++j) w.a[half][lane + 32 * j] = a[j], w.b[half][lane + 32 * j] = b[j];
  warp_arrive(ex, 0xffffffffu, WarpOp::mma, line, half);
  const float* A = w.a[half];
  const float* B = w.b[half];
  for (int j = 0; j < 8; ++j) {
    const int e = lane + 32 * j, r = e / 16, col = e % 16;
    float s = c[j];
    for (int k = 0; k < 16; ++k) s += A[r * 16 + k] * B[k * 16 + col];
    d[j] = s;
  }
}

namespace {
void launch_prepare(Executor& ex, const LaunchConfig& cfg, void (*thread)(void*), void* ctx) {
  const dim3 bd = cfg.block;
  const size_t nthreads = size_t(bd.x) * bd.y * bd.z;
  ex.cfg = &cfg;
  ex.body = thread;
  ex.ctx = ctx;
  ex.error.clear();
  ex.n = int(nthreads);
  ex.block.dim = bd;
  ex.block.grid = cfg.grid;
  ex.threads.resize(nthreads);
  for (unsigned z = 0, i = 0; z < bd.z; ++z)
    for (unsigned y = 0; y < bd.y; ++y)
      for (unsigned x = 0; x < bd.x; ++x, ++i) ex.threads[i].start(uint3{x, y, z}, int(i));
  ex.wait.assign(nthreads, Wait::none);
  ex.fiber_of.assign(nthreads, nullptr);
  ex.ready.assign(nthreads, 0);
  ex.warps.resize((nthreads + 31) / 32);
  for (size_t w = 0; w < ex.warps.size(); ++w) {
    const size_t lanes = std::min<size_t>(32, nthreads - 32 * w);
    ex.warps[w].start(lanes == 32 ? 0xffffffffu : (1u << lanes) - 1);
  }
}
}  // namespace

bool launch_check(const LaunchConfig& cfg) {
  const dim3 g = cfg.grid, bd = cfg.block;
  const unsigned long long nthreads = 1ull * bd.x * bd.y * bd.z;
  auto bad = [&](const std::string& why) {
    set_last_error(cudaErrorInvalidConfiguration, std::string("launch of ") + cfg.name + " with grid (" +
                                                      std::to_string(g.x) + "," + std::to_string(g.y) + "," +
                                                      std::to_string(g.z) + ") block (" + std::to_string(bd.x) + "," +
                                                      std::to_string(bd.y) + "," + std::to_string(bd.z) + "): " + why);
    return false;
  };
  if (!cfg.stream && capture_refuse(cudaErrorStreamCaptureImplicit,
                                    std::string("a launch of ") + cfg.name + " on the legacy stream") != cudaSuccess)
    return false;
  if (g.x == 0 || g.y == 0 || g.z == 0 || bd.x == 0 || bd.y == 0 || bd.z == 0) return bad("a dimension is zero");
  if (nthreads > DeviceLimits::threads_per_block) return bad("more than 1024 threads in a block");
  if (bd.x > DeviceLimits::block_dim[0] || bd.y > DeviceLimits::block_dim[1] || bd.z > DeviceLimits::block_dim[2])
    return bad("a block dimension past (1024, 1024, 64)");
  if (g.x > DeviceLimits::grid_dim[0] || g.y > DeviceLimits::grid_dim[1] || g.z > DeviceLimits::grid_dim[2])
    return bad("a grid dimension past (2^31 - 1, 65535, 65535)");
  if (cfg.dynamic_shared > dynamic_shared_limit(cfg.kernel))
    return bad(std::to_string(cfg.dynamic_shared) + " bytes of dynamic shared memory, past the kernel's limit of " +
               std::to_string(dynamic_shared_limit(cfg.kernel)) + " (cudaFuncSetAttribute raises it)");
  if (LaunchRecorder* r = launch_recorder()) {
    r->add({cfg.name, g, bd, cfg.dynamic_shared});
    return false;
  }
  return true;
}

void launch(const LaunchConfig& cfg, void (*thread)(void*), void* ctx) {
  if (launch_check(cfg)) launch_blocks(cfg, thread, ctx);
}

void launch_blocks(const LaunchConfig& cfg, void (*thread)(void*), void* ctx) {
  const dim3 g = cfg.grid, bd = cfg.block;
  const unsigned long long nthreads = 1ull * bd.x * bd.y * bd.z;
#if defined(LOOM_EMU_ASAN)
  std::lock_guard<std::mutex> lock(launch_mutex);
#endif
  ++n_launches;
  std::string error;
#if defined(LOOM_EMU_TSAN)
  // Each block on a fresh OS thread with an executor of its own; the host acquires what every
  // emulated thread released when it finished, then unmaps the launch's stacks.
  // The executors live until then too: their threads read them. One launch at a time (the
  // fibers are the process's).
  static std::mutex tsan_launch;
  std::lock_guard<std::mutex> lock(tsan_launch);
  char* done_token = new char[1];
  std::vector<std::unique_ptr<Executor>> executors;
  for (unsigned z = 0; z < g.z && error.empty(); ++z)
    for (unsigned y = 0; y < g.y && error.empty(); ++y)
      for (unsigned x = 0; x < g.x && error.empty(); ++x) {
        executors.push_back(std::make_unique<Executor>());
        run_on_fresh_thread([&, exp = executors.back().get()] {
          Executor& ex = *exp;
          tls_executor = exp;
          ex.main.tsan = __tsan_get_current_fiber();
          launch_prepare(ex, cfg, thread, ctx);
          ex.done_token = done_token;
          ex.start_token = new char[1];
          ex.block_linear = (uint64_t(z) * g.y + y) * g.x + x;
          run_block(ex, uint3{x, y, z});
          if (!ex.error.empty()) __tsan_acquire(done_token);  // the launch ends here
          error = ex.error;
        });
        ++n_blocks;
        n_threads += nthreads;
      }
  __tsan_acquire(done_token);
  delete[] done_token;
  for (auto& e : executors) delete[] e->start_token;
  executors.clear();
#else
  Executor& ex = executor();
  launch_prepare(ex, cfg, thread, ctx);
  if (CountSession* session = count_session()) {
    // Counted: the sampled blocks, each standing for its strata (counts.h).
    LaunchCounts rec;
    rec.kernel = kernel_instance(cfg.signature);
    rec.grid[0] = g.x, rec.grid[1] = g.y, rec.grid[2] = g.z;
    rec.block[0] = bd.x, rec.block[1] = bd.y, rec.block[2] = bd.z;
    rec.dynamic_shared = cfg.dynamic_shared;
    rec.blocks = double(g.x) * g.y * g.z;
    const int* k = session->options().samples;
    for (auto [z, wz] : count_samples(g.z, k[2]))
      for (auto [y, wy] : count_samples(g.y, k[1]))
        for (auto [x, wx] : count_samples(g.x, k[0])) {
          if (!ex.error.empty()) break;
          ex.counted = true;
          run_block(ex, uint3{x, y, z});
          ex.counted = false;
          count_block_end(wx * wy * wz, rec);
          ++n_blocks;
          n_threads += nthreads;
        }
    if (ex.error.empty()) session->add(std::move(rec));
  } else {
    for (unsigned z = 0; z < g.z && ex.error.empty(); ++z)
      for (unsigned y = 0; y < g.y && ex.error.empty(); ++y)
        for (unsigned x = 0; x < g.x && ex.error.empty(); ++x) {
          run_block(ex, uint3{x, y, z});
          ++n_blocks;
          n_threads += nthreads;
        }
  }
  error = ex.error;
  ex.cfg = nullptr;
#endif
  current_thread = nullptr;
  current_block = nullptr;
  if (!error.empty()) set_last_error(cudaErrorLaunchFailure, error);
}

}  // namespace loom::emu
