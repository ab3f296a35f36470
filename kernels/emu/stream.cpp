// The emulated device's streams and events. A stream is a queue and a worker thread that runs
// its work in issue order; the host only enqueues, so kernels, copies and GEMMs run
// asynchronously to it as on a GPU, and a result read without a synchronization that covers its
// producer is read while (or before) it is being written. An event record is a marker in its
// stream's queue; cudaStreamWaitEvent queues a wait for the marker recorded last before it;
// synchronizations wait for markers or for an empty queue. The first failure of queued work (a
// kernel fault) becomes the device's sticky error, and queued work after it is skipped (markers
// and waits still pass, so synchronizations return the error instead of hanging).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "kernels/emu/counts.h"
#include "kernels/emu/runtime.h"

namespace loom::emu::rt {
struct CUstream_st {
  struct Item {
    std::function<void()> work;
    bool control;  // an event's marker or wait: runs after a fault too
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Item> queue;
  bool busy = false, stop = false;
  std::thread worker;
};
}  // namespace loom::emu::rt

namespace loom::emu {

namespace {

// One record of an event: a point in one stream's queue, passed or not.
struct Marker {
  bool passed = false;
  bool captured = false;  // recorded into a stream capture: it passes when a graph replays it
  std::chrono::steady_clock::time_point at{};
};
// An event is its latest record (a re-record starts a new marker; waits issued before it keep
// the old one, as a device's do). One mutex and condition for every marker: they are few.
std::mutex markers_mu;
std::condition_variable markers_cv;
struct EventState {
  std::shared_ptr<Marker> latest;  // nullptr until recorded
  bool timing = true;
};
void marker_wait(const std::shared_ptr<Marker>& m) {
  if (!m) return;
  std::unique_lock lk(markers_mu);
  markers_cv.wait(lk, [&] { return m->passed; });
}

std::mutex fault_mu;
cudaError_t fault_code = cudaSuccess;
std::string fault_text;
std::atomic<uint64_t> n_host_syncs{0};

std::mutex streams_mu;
// Never destroyed: workers may still run while the process exits.
std::set<CUstream_st*>& streams() {
  static auto* s = new std::set<CUstream_st*>;
  return *s;
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
    CUstream_st::Item item;
    {
      std::unique_lock lk(s->mu);
      s->cv.wait(lk, [&] { return s->stop || !s->queue.empty(); });
      if (s->queue.empty()) return;  // stopping, and nothing left
      item = std::move(s->queue.front());
      s->queue.pop_front();
      s->busy = true;
    }
    // A kernel's last error on this thread is a fault of the queued work; after a fault, only
    // markers and waits run (a device stops at the fault).
    if (item.control || device_fault() == cudaSuccess)
      run_work([&] {
        item.work();
        const cudaError_t e = cudaPeekAtLastError();
        if (e != cudaSuccess && e != device_fault()) fault_set(e, cudaGetErrorString(e));
      });
    item.work = nullptr;  // what it holds (pending writes, launch arguments) goes now
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

struct Allocation {
  size_t bytes;
  int pending = 0;     // queued items that will write it
  std::string writer;  // the latest of them
};
std::mutex allocs_mu;
std::map<uintptr_t, Allocation>& allocations() {
  static auto* a = new std::map<uintptr_t, Allocation>;  // never destroyed, as streams()
  return *a;
}
// The allocation holding p (allocs_mu held), or end().
std::map<uintptr_t, Allocation>::iterator allocation_of(const void* p) {
  auto& all = allocations();
  const auto u = reinterpret_cast<uintptr_t>(p);
  auto it = all.upper_bound(u);
  if (it == all.begin()) return all.end();
  --it;
  return u < it->first + std::max<size_t>(it->second.bytes, 1) ? it : all.end();
}

}  // namespace

namespace {
size_t allocated = 0;  // bytes of the allocations (allocs_mu)
}  // namespace

void allocation_add(void* p, size_t bytes) {
  std::lock_guard lk(allocs_mu);
  const auto [it, added] = allocations().insert({reinterpret_cast<uintptr_t>(p), Allocation{bytes}});
  if (!added) allocated -= it->second.bytes, it->second = Allocation{bytes};
  allocated += bytes;
}
size_t allocated_bytes() {
  std::lock_guard lk(allocs_mu);
  return allocated;
}
void allocation_remove(void* p) {
  std::lock_guard lk(allocs_mu);
  const auto it = allocations().find(reinterpret_cast<uintptr_t>(p));
  if (it == allocations().end()) return;
  allocated -= it->second.bytes;
  allocations().erase(it);
}
void PendingWrites::add(const void* p, const char* writer) {
  if (!p) return;
  std::lock_guard lk(allocs_mu);
  auto it = allocation_of(p);
  if (it == allocations().end()) return;
  ++it->second.pending;
  it->second.writer = writer;
  allocs_.push_back(it->first);
}
void PendingWrites::done() {
  if (allocs_.empty()) return;
  std::lock_guard lk(allocs_mu);
  for (uintptr_t a : allocs_)
    if (auto it = allocations().find(a); it != allocations().end()) --it->second.pending;
  allocs_.clear();
}
std::vector<std::pair<uintptr_t, uintptr_t>> device_ranges() {
  std::lock_guard lk(allocs_mu);
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  out.reserve(allocations().size());
  for (auto& [begin, a] : allocations()) out.push_back({begin, begin + std::max<size_t>(a.bytes, 1)});
  return out;
}
bool is_device_memory(const void* p) {
  std::lock_guard lk(allocs_mu);
  return allocation_of(p) != allocations().end();
}
std::string pending_writer(const void* p) {
  std::lock_guard lk(allocs_mu);
  auto it = allocation_of(p);
  return it != allocations().end() && it->second.pending > 0 ? it->second.writer : std::string();
}

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

// Under streams_mu: no stream is destroyed while it is drained.
cudaError_t drain_all() {
  std::lock_guard lk(streams_mu);
  for (CUstream_st* s : streams()) stream_drain(s);
  return device_fault();
}

namespace {
// `op`: device work the host issues (counted), not an event's marker or a graph's replay.
void enqueue(cudaStream_t s, std::function<void()> work, bool control, bool op = false) {
  if (capture_take(s, work, control)) return;
  if (!s && capture_refuse(cudaErrorStreamCaptureImplicit, "work on the legacy stream") != cudaSuccess) return;
  if (op) count_device_op();
  if (!s) {
    work();
    return;
  }
  {
    std::lock_guard lk(s->mu);
    s->queue.push_back({std::move(work), control});
  }
  s->cv.notify_all();
}
}  // namespace

void stream_enqueue(cudaStream_t s, std::function<void()> work) {
  enqueue(s, std::move(work), false, true);
}
void stream_enqueue_graph(cudaStream_t s, std::function<void()> work) {
  enqueue(s, std::move(work), false);
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
  if ((!s || emu::stream_capturing(s)) &&
      emu::capture_refuse(cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize") != cudaSuccess)
    return cudaErrorStreamCaptureUnsupported;
  emu::count_host_sync();
  if (s) emu::stream_drain(s);
  return emu::device_fault();
}
cudaError_t cudaDeviceSynchronize() {
  if (emu::capture_refuse(cudaErrorStreamCaptureUnsupported, "cudaDeviceSynchronize") != cudaSuccess)
    return cudaErrorStreamCaptureUnsupported;
  emu::count_host_sync();
  return emu::drain_all();
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t s) {
  if (!bytes) return emu::device_fault();
  if (!s) {  // the legacy stream: at once, but as blind to other streams' queued work as cudaMemcpy
    if (emu::capture_refuse(cudaErrorStreamCaptureImplicit, "cudaMemcpyAsync on the legacy stream") != cudaSuccess)
      return cudaErrorStreamCaptureImplicit;
    emu::count_device_op();
    if (const std::string w = emu::pending_writer(src); !w.empty()) {
      emu::set_last_error(cudaErrorInvalidValue,
                          "cudaMemcpyAsync on the legacy stream reads device memory that "
                          "queued work (" +
                              w + ") is still to write");
      return cudaErrorInvalidValue;
    }
    std::memmove(dst, src, bytes);
    return emu::device_fault();
  }
  auto writes = std::make_shared<emu::PendingWrites>();
  if (!emu::stream_capturing(s)) writes->add(dst, "cudaMemcpyAsync");
  emu::stream_enqueue(s, [=] {
    std::memmove(dst, src, bytes);
    writes->done();
  });
  return emu::device_fault();
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  if (!bytes || emu::launch_recorder()) return emu::device_fault();  // walking shapes: nothing runs
  auto writes = std::make_shared<emu::PendingWrites>();
  if (s && !emu::stream_capturing(s)) writes->add(p, "cudaMemsetAsync");
  emu::stream_enqueue(s, [=] {
    std::memset(p, value, bytes);
    writes->done();
  });
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
  delete reinterpret_cast<EventHandle*>(e);  // queued markers hold their own
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e) return cudaErrorInvalidResourceHandle;
  auto m = std::make_shared<emu::Marker>();
  m->captured = emu::stream_capturing(s);
  {
    std::lock_guard lk(emu::markers_mu);
    emu::state_of(e)->latest = m;
  }
  emu::enqueue(
      s,
      [m] {
        {
          std::lock_guard lk(emu::markers_mu);
          m->passed = true;
          m->at = std::chrono::steady_clock::now();
        }
        emu::markers_cv.notify_all();
      },
      true);
  return emu::device_fault();
}
namespace {
std::shared_ptr<emu::Marker> latest_of(cudaEvent_t e) {
  std::lock_guard lk(emu::markers_mu);
  return emu::state_of(e)->latest;
}
}  // namespace
namespace {
// A record taken into a capture cannot be waited on or queried by the host (CUDA's
// cudaErrorCapturedEvent), and the emulation captures one stream: another stream's wait on it
// (a fork of the capture) is refused, as is a capturing stream's wait on a record outside it.
cudaError_t captured_refuse(const std::shared_ptr<emu::Marker>& m, const char* call) {
  if (m && m->captured) {
    emu::set_last_error(cudaErrorCapturedEvent, std::string(call) + " on an event recorded in a stream capture");
    return cudaErrorCapturedEvent;
  }
  return cudaSuccess;
}
}  // namespace
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidResourceHandle;
  const std::shared_ptr<emu::Marker> m = latest_of(e);
  if (const cudaError_t c = captured_refuse(m, "cudaEventSynchronize"); c != cudaSuccess) return c;
  emu::count_host_sync();
  emu::marker_wait(m);
  return emu::device_fault();
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidResourceHandle;
  const std::shared_ptr<emu::Marker> m = latest_of(e);
  if (const cudaError_t c = captured_refuse(m, "cudaEventQuery"); c != cudaSuccess) return c;
  std::lock_guard lk(emu::markers_mu);
  return !m || m->passed ? emu::device_fault() : cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  if (!e) return cudaErrorInvalidResourceHandle;
  std::shared_ptr<emu::Marker> m = latest_of(e);
  const bool inside = m && m->captured, capturing = emu::stream_capturing(s);
  if (inside != capturing) {
    const char* why = inside
                          ? "cudaStreamWaitEvent forking a capture into another stream (not emulated)"
                          : "cudaStreamWaitEvent of a capturing stream on a record outside the capture (not emulated)";
    emu::set_last_error(cudaErrorStreamCaptureUnsupported, why);
    return cudaErrorStreamCaptureUnsupported;
  }
  if (!s) emu::count_host_sync();  // the legacy stream runs here: the host waits
  emu::enqueue(
      s, [m] { emu::marker_wait(m); }, true);
  return emu::device_fault();
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (!a || !b) return cudaErrorInvalidResourceHandle;
  const std::shared_ptr<emu::Marker> x = latest_of(a), y = latest_of(b);
  std::lock_guard lk(emu::markers_mu);
  if (!emu::state_of(a)->timing || !emu::state_of(b)->timing || !x || !y) return cudaErrorInvalidResourceHandle;
  if (!x->passed || !y->passed) return cudaErrorNotReady;
  *ms = float(std::chrono::duration<double, std::milli>(y->at - x->at).count());
  return cudaSuccess;
}

}  // namespace loom::emu::rt
