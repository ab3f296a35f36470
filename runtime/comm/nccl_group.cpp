#include "runtime/comm/nccl_group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

#include "runtime/comm/hang_report.h"
#include "runtime/cuda_check.h"
#include "runtime/trace.h"

#define LOOM_NCCL_CHECK(call)                                                                                   \
  do {                                                                                                          \
    ncclResult_t r_ = (call);                                                                                   \
    LOOM_CHECK(r_ == ncclSuccess, "{} failed at {}:{}: {}", #call, __FILE__, __LINE__, ncclGetErrorString(r_)); \
  } while (0)

namespace loom {

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}

int cuda_device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

int cuda_device_select(int local_rank) {
  const int n = cuda_device_count();
  if (n == 0) return -1;
  LOOM_CUDA_CHECK(cudaSetDevice(local_rank % n));
  return local_rank % n;
}

class NcclWorld {
 public:
  ncclComm_t comm = nullptr;
  int rank = 0, size = 1;
  NcclOptions options;
  std::deque<std::string> names;  // the communicators' names, which NCCL holds by pointer
  ~NcclWorld() {
    if (comm) ncclCommDestroy(comm);
  }
};

namespace {
// Every communicator is non-blocking (ncclConfig_t.blocking = 0): its creation, its splits and
// any call on it may return ncclInProgress while NCCL works in the background, and nothing
// waits without a deadline. settle() polls the communicator's state until it leaves
// ncclInProgress; past options.timeout_s (0: no deadline) it aborts the communicator and ends
// the job with a line naming the call (`why` says what a stall there usually means).
// name: NCCL keeps the pointer (it must outlive the communicator) and prints it at init.
ncclConfig_t nonblocking_config(const char* name) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;
  c.commName = name;
  return c;
}
// Past the deadline: names the call, aborts the communicator, ends the job.
void stall_exit(ncclComm_t comm, const char* call, const std::string& where, double waited, const char* why,
                const NcclOptions& o) {
  std::fprintf(stderr, "error: rank %d: %s%s has not completed after %.0f s: %s (parallel.timeout_s = %.0f)\n",
               o.world_rank, call, where.c_str(), waited, why, o.timeout_s);
  std::fflush(stderr);
  ncclCommAbort(comm);
  if (o.end_job) o.end_job();
  std::_Exit(4);
}
void settle(ncclComm_t comm, ncclResult_t r, const char* call, const std::string& where, const NcclOptions& o,
            const char* why) {
  const auto t0 = std::chrono::steady_clock::now();
  while (r == ncclInProgress) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o.timeout_s > 0 && waited >= o.timeout_s) stall_exit(comm, call, where, waited, why, o);
    std::this_thread::yield();
    if (const ncclResult_t q = ncclCommGetAsyncError(comm, &r); q != ncclSuccess) r = q;
  }
  if (r != ncclSuccess) {
    ncclCommAbort(comm);  // what NCCL asks after an error: nothing more runs on it
    fail("{}{} failed: {}", call, where, ncclGetErrorString(r));
  }
}
constexpr const char* kNotJoined =
    "a rank has not joined, or NCCL cannot reach it (NCCL_DEBUG=INFO shows its bootstrap)";
}  // namespace

std::shared_ptr<NcclWorld> nccl_world_create(ProcessGroup& mpi_world, const NcclOptions& o) {
  auto w = std::make_shared<NcclWorld>();
  w->rank = mpi_world.rank();
  w->size = mpi_world.size();
  w->options = o;
  // Every rank checks in over MPI first: one that never arrives is named there by the MPI
  // group's watchdog and hang verdict, before NCCL's bootstrap would wait for it unseen.
  std::vector<int32_t> here(size_t(w->size), 0);
  int32_t one = 1;
  mpi_world.all_gather(Buf(&one, 1), Buf(here.data(), int64_t(here.size()))).wait();
  ncclUniqueId id;
  static_assert(sizeof(id) % 4 == 0);
  if (w->rank == 0) LOOM_NCCL_CHECK(ncclGetUniqueId(&id));
  mpi_world.broadcast(Buf(reinterpret_cast<int32_t*>(&id), sizeof(id) / 4), 0).wait();
  ncclConfig_t config = nonblocking_config("world");
  const ncclResult_t r = ncclCommInitRankConfig(&w->comm, w->size, id, w->rank, &config);
  LOOM_CHECK(w->comm, "ncclCommInitRankConfig made no communicator: {}", ncclGetErrorString(r));
  settle(w->comm, r, "NCCL's world communicator (ncclCommInitRankConfig)", "", o, kNotJoined);
  return w;
}

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::f64:
      return ncclFloat64;
  }
  return ncclFloat32;
}

using EventPtr = std::shared_ptr<CUevent_st>;

EventPtr event_new() {
  cudaEvent_t ev;
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  return EventPtr(ev, [](cudaEvent_t e) { cudaEventDestroy(e); });
}

class NcclGroup final : public ProcessGroup {
 public:
  NcclGroup(std::shared_ptr<NcclWorld> world, const std::string& name, ncclComm_t comm, bool owns,
            std::vector<int> ranks, const NcclOptions& opt)
      : ProcessGroup(name, 0, 1, std::move(ranks)), world_(std::move(world)), comm_(comm), owns_(owns), opt_(opt) {
    where_ = " on group '" + name + "'";
    LOOM_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    LOOM_NCCL_CHECK(ncclCommCount(comm_, &size_));
    LOOM_CUDA_CHECK(cudaGetDevice(&device_));
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    if (opt_.timeout_s > 0) watchdog_ = std::thread([this] { watch(); });
  }
  ~NcclGroup() override {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    if (watchdog_.joinable()) watchdog_.join();
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    if (scratch_) cudaFree(scratch_);
    if (owns_) ncclCommDestroy(comm_);
  }
  const char* backend() const override { return "nccl"; }
  bool carries(DeviceKind d) const override { return d == DeviceKind::cuda; }

  Work all_reduce(Buf b, ReduceOp op, const Stream& after) override {
    no_group(CommOp::all_reduce);
    count(CommOp::all_reduce, b.bytes());
    cudaStream_t s = begin(after, {b});
    nccl_op("ncclAllReduce", [&] {
      return ncclAllReduce(b.data, b.data, size_t(b.count), nccl_type(b.dtype), op == ReduceOp::sum ? ncclSum : ncclMax,
                           comm_, s);
    });
    return end(CommOp::all_reduce, s);
  }
  Work reduce_scatter(Buf in, Buf out, const Stream& after) override {
    no_group(CommOp::reduce_scatter);
    LOOM_CHECK(in.count == out.count * size_ && in.dtype == out.dtype,
               "reduce_scatter on '{}': input has {} {} elements, not {} x {} {}", name_, in.count,
               dtype_name(in.dtype), size_, out.count, dtype_name(out.dtype));
    count(CommOp::reduce_scatter, in.bytes());
    cudaStream_t s = begin(after, {in, out});
    nccl_op("ncclReduceScatter", [&] {
      return ncclReduceScatter(in.data, out.data, size_t(out.count), nccl_type(in.dtype), ncclSum, comm_, s);
    });
    return end(CommOp::reduce_scatter, s);
  }
  Work all_gather(Buf in, Buf out, const Stream& after) override {
    no_group(CommOp::all_gather);
    LOOM_CHECK(out.count == in.count * size_ && in.dtype == out.dtype,
               "all_gather on '{}': output has {} {} elements, not {} x {} {}", name_, out.count, dtype_name(out.dtype),
               size_, in.count, dtype_name(in.dtype));
    count(CommOp::all_gather, out.bytes());
    cudaStream_t s = begin(after, {in, out});
    nccl_op("ncclAllGather",
            [&] { return ncclAllGather(in.data, out.data, size_t(in.count), nccl_type(in.dtype), comm_, s); });
    return end(CommOp::all_gather, s);
  }
  Work broadcast(Buf b, int root, const Stream& after) override {
    no_group(CommOp::broadcast);
    count(CommOp::broadcast, b.bytes());
    cudaStream_t s = begin(after, {b});
    nccl_op("ncclBroadcast",
            [&] { return ncclBroadcast(b.data, b.data, size_t(b.count), nccl_type(b.dtype), root, comm_, s); });
    return end(CommOp::broadcast, s);
  }
  Work all_to_all_v(Buf in, const std::vector<int64_t>& sc, Buf out, const std::vector<int64_t>& rc,
                    const Stream& after) override {
    LOOM_CHECK(int(sc.size()) == size_ && int(rc.size()) == size_ && in.dtype == out.dtype,
               "all_to_all_v on '{}' needs {} counts each way and one dtype", name_, size_);
    const size_t es = dtype_size(in.dtype);
    int64_t sent = 0, got = 0;
    for (int r = 0; r < size_; ++r) sent += sc[size_t(r)], got += rc[size_t(r)];
    LOOM_CHECK(sent <= in.count && got <= out.count,
               "all_to_all_v on '{}': sends {} of {} elements, receives {} into {}", name_, sent, in.count, got,
               out.count);
    count(CommOp::all_to_all, size_t(sent) * es);  // before it is enqueued, as every op
    cudaStream_t s = begin(after, {in, out});
    LOOM_NCCL_CHECK(ncclGroupStart());
    int64_t so = 0, ro = 0;
    for (int r = 0; r < size_; ++r) {
      if (sc[size_t(r)])
        nccl_op("ncclSend (all_to_all_v)", [&] {
          return ncclSend(static_cast<char*>(in.data) + so * es, size_t(sc[size_t(r)]), nccl_type(in.dtype), r, comm_,
                          s);
        });
      if (rc[size_t(r)])
        nccl_op("ncclRecv (all_to_all_v)", [&] {
          return ncclRecv(static_cast<char*>(out.data) + ro * es, size_t(rc[size_t(r)]), nccl_type(out.dtype), r, comm_,
                          s);
        });
      so += sc[size_t(r)], ro += rc[size_t(r)];
    }
    nccl_op("ncclGroupEnd (all_to_all_v)", [&] { return ncclGroupEnd(); });
    return end(CommOp::all_to_all, s);
  }
  Work send(Buf b, int peer, int, const Stream& after) override {
    count(CommOp::send, b.bytes(), peer);
    cudaStream_t s = begin(after, {b});
    nccl_op("ncclSend", [&] { return ncclSend(b.data, size_t(b.count), nccl_type(b.dtype), peer, comm_, s); });
    return end(CommOp::send, s);
  }
  Work recv(Buf b, int peer, int, const Stream& after) override {
    count(CommOp::recv, b.bytes(), peer);
    cudaStream_t s = begin(after, {b});
    nccl_op("ncclRecv", [&] { return ncclRecv(b.data, size_t(b.count), nccl_type(b.dtype), peer, comm_, s); });
    return end(CommOp::recv, s);
  }
  // Collectives stay out of groups (as under nccl-emulated): loom groups sends and receives.
  void no_group(CommOp kind) const {
    LOOM_CHECK(depth_ == 0,
               "{} on group '{}' between group_start() and group_end(): only sends and receives are grouped",
               comm_op_name(kind), name_);
  }
  // NCCL's group is the thread's, across communicators; loom's groups are one group's ops:
  // an op on another group while this one's is open is refused (its event would be recorded
  // before NCCL enqueued it).
  void group_start() override {
    LOOM_CHECK(!open_group_ || open_group_ == this, "group_start() on '{}' while group '{}' has one open", name_,
               open_group_ ? open_group_->name() : "");
    LOOM_NCCL_CHECK(ncclGroupStart());
    ++depth_;
    open_group_ = this;
  }
  void group_end() override {
    LOOM_CHECK(depth_ > 0, "group_end() on '{}' without group_start()", name_);
    std::vector<Deferred> ops;
    if (--depth_ == 0) {
      open_group_ = nullptr;
      ops = std::move(deferred_);
      deferred_.clear();
    }
    nccl_op("ncclGroupEnd", [] { return ncclGroupEnd(); });
    for (Deferred& d : ops) *d.done = record(d.kind, d.seq, d.stream);
  }
  Work barrier() override {
    no_group(CommOp::barrier);
    count(CommOp::barrier, 0);
    if (!scratch_) LOOM_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
    nccl_op("ncclAllReduce (barrier)",
            [&] { return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_); });
    Work w = end(CommOp::barrier, stream_);
    w.wait();
    return w;
  }

 private:
  struct Deferred {  // an op issued inside a group, waiting for group_end() to record its event
    CommOp kind;
    int64_t seq;
    cudaStream_t stream;
    std::shared_ptr<EventPtr> done;
  };
  struct Pending {
    CommOp kind;
    int64_t seq;
    EventPtr done;
    std::chrono::steady_clock::time_point issued;
  };

  // A call on this non-blocking communicator, settled (enqueued) before its op is recorded;
  // under the communicator's lock, as NCCL lets one thread at a time operate a communicator
  // and the watchdog queries it too.
  template <class Call>
  void nccl_op(const char* call, Call&& f) {
    std::lock_guard lk(nccl_mu_);
    settle(comm_, f(), call, where_, opt_,
           "a peer rank has likely died or hangs, or NCCL cannot set up its connections");
  }
  // The stream the op runs on, ordered after `after`'s work so far.
  cudaStream_t begin(const Stream& after, std::initializer_list<Buf> bufs) {
    LOOM_CHECK(!open_group_ || open_group_ == this, "an op on group '{}' while group '{}' has a group_start() open",
               name_, open_group_ ? open_group_->name() : "");
    for (const Buf& b : bufs) {
      LOOM_CHECK(b.count == 0 || b.device == DeviceKind::cuda,
                 "group '{}' (NCCL) was handed a host buffer; NCCL groups carry CUDA buffers", name_);
      producer_check(name_, after, b);
    }
    const bool device_after = after.kind == DeviceKind::cuda;
    if (opt_.on_caller_stream && device_after) return static_cast<cudaStream_t>(after.handle);
    if (device_after) {
      EventPtr ev = event_new();
      LOOM_CUDA_CHECK(cudaEventRecord(ev.get(), static_cast<cudaStream_t>(after.handle)));
      LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream_, ev.get(), 0));
    }
    return stream_;
  }

  // The op's completion event. Inside group_start()/group_end() NCCL enqueues nothing until
  // the group ends, so the event is recorded then (group_end); the Work holds it by reference.
  Work end(CommOp kind, cudaStream_t s) {
    auto done = std::make_shared<EventPtr>();
    if (depth_ > 0)
      deferred_.push_back({kind, counters_.seq, s, done});
    else
      *done = record(kind, counters_.seq, s);
    auto st = std::make_shared<Work::State>();
    st->land = [done](const Stream* consumer) {
      LOOM_CHECK(*done, "a Work of an NCCL group was waited on before its group_end()");
      if (consumer && consumer->kind == DeviceKind::cuda)
        LOOM_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(consumer->handle), done->get(), 0));
      else
        LOOM_CUDA_CHECK(cudaEventSynchronize(done->get()));
    };
    st->poll = [done] { return *done && cudaEventQuery(done->get()) == cudaSuccess; };
    return Work(st);
  }
  EventPtr record(CommOp kind, int64_t seq, cudaStream_t s) {
    EventPtr done = event_new();
    LOOM_CUDA_CHECK(cudaEventRecord(done.get(), s));
    if (watchdog_.joinable()) {
      std::lock_guard lk(mu_);
      pending_.push_back({kind, seq, done, std::chrono::steady_clock::now()});
    }
    return done;
  }

  // Polls the oldest pending op: done ones are dropped; an asynchronous NCCL error or an op
  // past the timeout ends the job with one line that names the op and the group.
  void watch() {
    cudaSetDevice(device_);
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::unique_lock lk(mu_);
      if (stop_) return;
      // Finish times to the poll's resolution (50 ms); a GPU op's start is not seen from here.
      while (!pending_.empty() && cudaEventQuery(pending_.front().done.get()) == cudaSuccess) {
        recorder_.finished(pending_.front().seq);
        pending_.pop_front();
      }
      if (pending_.empty()) continue;
      const Pending p = pending_.front();
      lk.unlock();
      ncclResult_t async = ncclSuccess;
      {
        std::lock_guard g(nccl_mu_);
        ncclCommGetAsyncError(comm_, &async);
      }
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - p.issued).count();
      if (async != ncclSuccess && async != ncclInProgress) {
        std::fprintf(stderr, "error: rank %d: %s #%lld on group '%s' failed: %s\n", opt_.world_rank,
                     comm_op_name(p.kind), (long long)p.seq, name_.c_str(), ncclGetErrorString(async));
      } else if (waited >= opt_.timeout_s) {
        std::fprintf(stderr,
                     "error: rank %d: %s #%lld on group '%s' has not completed after %.0f s; a peer rank has likely "
                     "died or hangs (parallel.timeout_s = %.0f)\n",
                     opt_.world_rank, comm_op_name(p.kind), (long long)p.seq, name_.c_str(), waited, opt_.timeout_s);
        std::fflush(stderr);
        if (hang_report_) hang_report_->timed_out(*this, p.seq, waited);
      } else {
        continue;
      }
      std::fflush(stderr);
      ncclCommAbort(comm_);
      if (opt_.end_job) opt_.end_job();
      std::_Exit(4);
    }
  }

  std::shared_ptr<NcclWorld> world_;
  ncclComm_t comm_;
  bool owns_;
  NcclOptions opt_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;
  std::string where_;   // " on group 'NAME'", for messages
  std::mutex nccl_mu_;  // held while a thread operates the communicator
  std::mutex mu_;       // pending_, stop_
  std::deque<Pending> pending_;
  int depth_ = 0;
  std::vector<Deferred> deferred_;
  static thread_local const NcclGroup* open_group_;  // whose group_start() this thread is in
  bool stop_ = false;
  std::thread watchdog_;
};

thread_local const NcclGroup* NcclGroup::open_group_ = nullptr;

}  // namespace

std::unique_ptr<ProcessGroup> nccl_group(const std::shared_ptr<NcclWorld>& world, const std::string& name, int color,
                                         const std::vector<int>& ranks, const NcclOptions& options) {
  if (name == "world") return std::make_unique<NcclGroup>(world, name, world->comm, false, ranks, options);
  ncclComm_t sub = nullptr;
  ncclConfig_t config = nonblocking_config(world->names.emplace_back(name).c_str());
  ncclResult_t r = ncclCommSplit(world->comm, color, world->rank, &sub, &config);
  // The split is collective over the world. A nonblocking split returns first; NCCL stores the
  // new communicator when its init job ends (seen on a GPU: read at once, it was null), and
  // the split's result is the parent's state, not the child's.
  const std::string where = " of group '" + name + "'";
  const auto t0 = std::chrono::steady_clock::now();
  while ((r == ncclSuccess || r == ncclInProgress) && !__atomic_load_n(&sub, __ATOMIC_ACQUIRE)) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (options.timeout_s > 0 && waited >= options.timeout_s)
      stall_exit(world->comm, "ncclCommSplit", where, waited, kNotJoined, options);
    std::this_thread::yield();
    ncclResult_t state = ncclSuccess;
    if (const ncclResult_t q = ncclCommGetAsyncError(world->comm, &state); q != ncclSuccess)
      r = q;
    else if (state != ncclSuccess && state != ncclInProgress)
      r = state;
  }
  settle(world->comm, r == ncclSuccess ? ncclInProgress : r, "ncclCommSplit", where, options, kNotJoined);
  LOOM_CHECK(sub, "ncclCommSplit{} returned no communicator", where);
  settle(sub, ncclInProgress, "ncclCommSplit", where, options, kNotJoined);  // the child's own state
  return std::make_unique<NcclGroup>(world, name, sub, true, ranks, options);
}

}  // namespace loom
