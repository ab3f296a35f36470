// The emulated device's streams and events. A stream is a queue and a worker thread that runs
// its work in issue order; the host only enqueues, so kernels, copies and GEMMs run
// asynchronously to it as on a GPU, and a result read without a synchronization that covers its
// producer is read while (or before) it is being written. An event record is a marker in its
// stream's queue; cudaStreamWaitEvent queues a wait for the marker recorded last before it;
// synchronizations wait for markers or for an empty queue. The first failure of queued work
// (a kernel fault, a GEMM the emulated cuBLASLt rejects) becomes the device's sticky error.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <atomic>
#include <cstring>
#include <vector>

#include "kernels/emu/runtime.h"

namespace loom::emu::rt {
struct CUstream_st {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  bool busy = false, stop = false;
  std::thread worker;
};
}  // namespace loom::emu::rt

namespace loom::emu {

namespace {

struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0, completed = 0;  // markers issued and passed
  std::chrono::steady_clock::time_point at{};
  bool timing = true;
};

std::mutex fault_mu;
cudaError_t fault_code = cudaSuccess;
std::string fault_text;
std::atomic<uint64_t> n_host_syncs{0};

std::mutex streams_mu;
std::set<CUstream_st*>& streams() {
  static std::set<CUstream_st*> s;
  return s;
}

void fault_set(cudaError_t e, const std::string& message) {
  std::lock_guard lk(fault_mu);
  if (fault_code != cudaSuccess) return;
  fault_code = e;
  fault_text = "queued work failed: " + message;
}

// Runs one item of work and turns its failure into the device's sticky error.
void run_work(const std::function<void()>& work) {
  try {
    work();
  } catch (const std::exception& e) {
    fault_set(cudaErrorLaunchFailure, e.what());
  }
  cudaGetLastError();  // clears this thread's own error, sticky or not
}

void worker_loop(CUstream_st* s) {
  for (;;) {
    std::function<void()> work;
    {
      std::unique_lock lk(s->mu);
      s->cv.wait(lk, [&] { return s->stop || !s->queue.empty(); });
      if (s->queue.empty()) return;  // stopping, and nothing left
      work = std::move(s->queue.front());
      s->queue.pop_front();
      s->busy = true;
    }
    // A kernel's last error on this thread is a fault of the queued work.
    run_work([&] {
      work();
      const cudaError_t e = cudaPeekAtLastError();
      if (e != cudaSuccess && e != device_fault()) fault_set(e, cudaGetErrorString(e));
    });
    {
      std::lock_guard lk(s->mu);
      s->busy = false;
    }
    s->cv.notify_all();
  }
}

void stream_drain(CUstream_st* s) {
  std::unique_lock lk(s->mu);
  s->cv.wait(lk, [&] { return s->queue.empty() && !s->busy; });
}

// cudaEvent_t is a handle to shared state: queued markers keep it alive past cudaEventDestroy,
// as a device's events outlive their destruction until passed.
struct EventHandle {
  std::shared_ptr<EventState> state;
};
EventState* state_of(cudaEvent_t e) {
  return reinterpret_cast<EventHandle*>(e)->state.get();
}

}  // namespace

cudaError_t device_fault() {
  std::lock_guard lk(fault_mu);
  return fault_code;
}
const char* device_fault_message(cudaError_t e) {
  std::lock_guard lk(fault_mu);
  return e != cudaSuccess && e == fault_code ? fault_text.c_str() : nullptr;
}
void count_host_sync() {
  ++n_host_syncs;
}
uint64_t host_syncs() {
  return n_host_syncs.load();
}

cudaError_t drain_all() {
  std::vector<CUstream_st*> all;
  {
    std::lock_guard lk(streams_mu);
    all.assign(streams().begin(), streams().end());
  }
  for (CUstream_st* s : all) stream_drain(s);
  return device_fault();
}

void stream_enqueue(cudaStream_t s, std::function<void()> work) {
  if (!s) {
    work();
    return;
  }
  {
    std::lock_guard lk(s->mu);
    s->queue.push_back(std::move(work));
  }
  s->cv.notify_all();
}

}  // namespace loom::emu

namespace loom::emu::rt {

using emu::EventHandle;
using emu::EventState;

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  auto* st = new CUstream_st;
  st->worker = std::thread(emu::worker_loop, st);
  {
    std::lock_guard lk(emu::streams_mu);
    emu::streams().insert(st);
  }
  *s = st;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return cudaErrorInvalidResourceHandle;
  {
    std::lock_guard lk(emu::streams_mu);
    if (!emu::streams().erase(s)) return cudaErrorInvalidResourceHandle;
  }
  {
    std::lock_guard lk(s->mu);
    s->stop = true;  // the worker finishes what is queued, then ends
  }
  s->cv.notify_all();
  s->worker.join();
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  emu::count_host_sync();
  if (s) emu::stream_drain(s);
  return emu::device_fault();
}
cudaError_t cudaDeviceSynchronize() {
  emu::count_host_sync();
  return emu::drain_all();
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t s) {
  if (bytes) emu::stream_enqueue(s, [=] { std::memmove(dst, src, bytes); });
  return emu::device_fault();
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  if (bytes) emu::stream_enqueue(s, [=] { std::memset(p, value, bytes); });
  return emu::device_fault();
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  auto* h = new EventHandle{std::make_shared<EventState>()};
  h->state->timing = !(flags & cudaEventDisableTiming);
  *e = reinterpret_cast<cudaEvent_t>(h);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  return cudaEventCreateWithFlags(e, cudaEventDefault);
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidResourceHandle;
  delete reinterpret_cast<EventHandle*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e) return cudaErrorInvalidResourceHandle;
  std::shared_ptr<EventState> st = reinterpret_cast<EventHandle*>(e)->state;
  uint64_t marker;
  {
    std::lock_guard lk(st->mu);
    marker = ++st->recorded;
  }
  emu::stream_enqueue(s, [st, marker] {
    {
      std::lock_guard lk(st->mu);
      st->completed = std::max(st->completed, marker);
      st->at = std::chrono::steady_clock::now();
    }
    st->cv.notify_all();
  });
  return emu::device_fault();
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidResourceHandle;
  emu::count_host_sync();
  EventState* st = emu::state_of(e);
  std::unique_lock lk(st->mu);
  const uint64_t marker = st->recorded;
  st->cv.wait(lk, [&] { return st->completed >= marker; });
  return emu::device_fault();
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidResourceHandle;
  EventState* st = emu::state_of(e);
  std::lock_guard lk(st->mu);
  return st->completed >= st->recorded ? emu::device_fault() : cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  if (!e) return cudaErrorInvalidResourceHandle;
  std::shared_ptr<EventState> st = reinterpret_cast<EventHandle*>(e)->state;
  uint64_t marker;
  {
    std::lock_guard lk(st->mu);
    marker = st->recorded;
  }
  emu::stream_enqueue(s, [st, marker] {
    std::unique_lock lk(st->mu);
    st->cv.wait(lk, [&] { return st->completed >= marker; });
  });
  return emu::device_fault();
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (!a || !b) return cudaErrorInvalidResourceHandle;
  EventState *x = emu::state_of(a), *y = emu::state_of(b);
  std::scoped_lock lk(x->mu, y->mu);
  if (!x->timing || !y->timing || x->recorded == 0 || y->recorded == 0) return cudaErrorInvalidResourceHandle;
  if (x->completed < x->recorded || y->completed < y->recorded) return cudaErrorNotReady;
  *ms = float(std::chrono::duration<double, std::milli>(y->at - x->at).count());
  return cudaSuccess;
}

}  // namespace loom::emu::rt
