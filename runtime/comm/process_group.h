// ProcessGroup: the collectives and point-to-point ops one mesh axis needs. Every op is
// asynchronous and returns a Work; ops run in issue order, carry a per-group sequence number
// (what the watchdog and flight recorder name), and add to per-group byte counters.
// Stream order: an op reads its input after the work already issued to `after` (the stream
// that produced it), and a consumer calls Work::wait_on(its stream) before it reads the result;
// neither side waits on the host where the backend can do better.
// Backends: LocalGroup (one rank, no communication), MpiGroup (host buffers, a dedicated
// communication thread per group; CUDA buffers staged through pinned host memory),
// NcclGroup (CUDA buffers, its own stream or the caller's; CUDA builds), NcclEmuGroup (host
// buffers under NCCL's ordering rules, for checking a layout on the CPU).
#pragma once
#include <array>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/tensor.h"

namespace loom {

class Trace;

enum class ReduceOp { sum, max };
enum class CommOp { all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, send, recv, barrier };
constexpr int kCommOps = 8;
const char* comm_op_name(CommOp op);

// A typed span of memory on a device that a collective (or a device op) reads or writes.
struct Buf {
  void* data = nullptr;
  int64_t count = 0;
  DType dtype = DType::f32;
  DeviceKind device = DeviceKind::cpu;
  Buf() = default;
  Buf(void* p, int64_t n, DType t, DeviceKind d) : data(p), count(n), dtype(t), device(d) {}
  Buf(float* p, int64_t n) : data(p), count(n), dtype(DType::f32) {}
  Buf(double* p, int64_t n) : data(p), count(n), dtype(DType::f64) {}
  Buf(int32_t* p, int64_t n) : data(p), count(n), dtype(DType::i32) {}
  Buf(const Tensor& t) : data(t.data<char>()), count(t.numel()), dtype(t.dtype), device(t.device()) {}
  size_t bytes() const { return size_t(count) * dtype_size(dtype); }
  // Elements [at, at + n) of this span.
  Buf slice(int64_t at, int64_t n) const {
    return Buf(static_cast<char*>(data) + size_t(at) * dtype_size(dtype), n, dtype, device);
  }
};

class Work {
 public:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
    double start_us = 0, end_us = 0;  // on the group's trace clock
    // Device backends: land(stream) makes the result visible to work issued to `stream` from
    // now on (null: to the host), poll() asks without blocking. Host backends leave them empty.
    std::function<void(const Stream*)> land;
    std::function<bool()> poll;
  };
  Work() = default;  // an already-complete Work
  explicit Work(std::shared_ptr<State> s) : s_(std::move(s)) {}
  void wait() const;                    // the host waits; rethrows the op's error
  void wait_on(const Stream& s) const;  // work issued to s from now on sees the result
  bool done() const;

 private:
  std::shared_ptr<State> s_;
};

struct CommCounters {
  int64_t seq = 0;                        // ops issued
  std::array<int64_t, kCommOps> bytes{};  // payload bytes per op kind (see each op)
  std::array<int64_t, kCommOps> count{};  // ops per kind
  int64_t total_bytes() const;
};

// The flight recorder: a group's last kRecords ops, with wall-clock times (seconds since the
// epoch, comparable between ranks; 0: not yet). The watchdog's hang verdict reads them.
struct OpRecord {
  int64_t seq = 0;
  CommOp op = CommOp::barrier;
  int64_t bytes = 0;
  int peer = -1;  // send / recv
  double issued = 0, started = 0, finished = 0;
};
class FlightRecorder {
 public:
  static constexpr int kRecords = 64;
  void issued(int64_t seq, CommOp op, int64_t bytes, int peer);
  void started(int64_t seq);
  void finished(int64_t seq);
  std::vector<OpRecord> records() const;  // oldest first
  int64_t last_issued() const;            // the sequence number of the newest op (0: none)

 private:
  OpRecord* find(int64_t seq);
  mutable std::mutex mu_;
  std::array<OpRecord, kRecords> ring_{};
  int64_t n_ = 0;
};

class HangReport;

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  const CommCounters& counters() const { return counters_; }

  // `after`: the stream whose work so far produced the inputs (see the file comment).
  // In place over `buf` (payload: buf bytes).
  virtual Work all_reduce(Buf buf, ReduceOp op = ReduceOp::sum, const Stream& after = host_stream()) = 0;
  // in: size * n elements, out: n elements; rank r receives the sum of block r (payload: in).
  virtual Work reduce_scatter(Buf in, Buf out, const Stream& after = host_stream()) = 0;
  // in: n elements, out: size * n elements, block r from rank r (payload: out).
  virtual Work all_gather(Buf in, Buf out, const Stream& after = host_stream()) = 0;
  virtual Work broadcast(Buf buf, int root, const Stream& after = host_stream()) = 0;  // payload: buf
  // send_counts[r] elements go to rank r, recv_counts[r] come from it; displacements are
  // the prefix sums (payload: elements sent).
  virtual Work all_to_all_v(Buf in, const std::vector<int64_t>& send_counts, Buf out,
                            const std::vector<int64_t>& recv_counts, const Stream& after = host_stream()) = 0;
  virtual Work send(Buf buf, int peer, int tag = 0, const Stream& after = host_stream()) = 0;
  virtual Work recv(Buf buf, int peer, int tag = 0, const Stream& after = host_stream()) = 0;
  virtual Work barrier() = 0;
  // Sends and receives issued between group_start() and group_end() progress together (NCCL's
  // group call): a pair that would wait on each other issued one by one completes. Only sends
  // and receives go in a group. Host backends, whose ops never wait on each other, ignore it.
  virtual void group_start() {}
  virtual void group_end() {}
  // "local", "mpi", "nccl" or "nccl-emulated": what carries the ops (flight records name it).
  virtual const char* backend() const = 0;
  // Whether this group's ops can read and write buffers on `device`.
  virtual bool carries(DeviceKind device) const { return device == DeviceKind::cpu; }
  const FlightRecorder& recorder() const { return recorder_; }
  // Where a timed-out op is reported (the job's hang verdict); null: the watchdog's line only.
  void set_hang_report(HangReport* r) { hang_report_ = r; }
  HangReport* hang_report() const { return hang_report_; }
  // Fault drill (fault.hang): the next op issued on this group never returns to its caller.
  void hang_next_op() { hang_next_ = true; }

 protected:
  ProcessGroup(std::string name, int rank, int size, std::vector<int> world_ranks)
      : name_(std::move(name)), rank_(rank), size_(size), world_ranks_(std::move(world_ranks)) {}
  void count(CommOp op, size_t bytes, int peer = -1) {
    ++counters_.seq;
    counters_.bytes[int(op)] += int64_t(bytes);
    ++counters_.count[int(op)];
    recorder_.issued(counters_.seq, op, int64_t(bytes), peer);
    if (hang_next_) hang_forever(op);
  }
  [[noreturn]] void hang_forever(CommOp op) const;
  FlightRecorder recorder_;
  HangReport* hang_report_ = nullptr;
  bool hang_next_ = false;
  std::string name_;
  int rank_, size_;
  std::vector<int> world_ranks_;
  CommCounters counters_;
};

// A device buffer handed to a group must come with a stream of its device as `after` (the work
// that wrote it, or last read it before the op overwrites it): with the host's, the default,
// the op would run unordered with that work. Every group that carries device buffers checks.
void producer_check(const std::string& group, const Stream& after, const Buf& b);

// One rank: every collective is the identity (copies where input and output differ, on the
// `after` stream for device buffers).
std::unique_ptr<ProcessGroup> local_group(const std::string& name, int world_rank);

}  // namespace loom
