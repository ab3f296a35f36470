#include "runtime/comm/mpi_group.h"

#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <thread>

#include "runtime/comm/hang_report.h"
#include "runtime/cuda_api.h"
#include "runtime/trace.h"

#define LOOM_MPI_CHECK(call)                                                                                           \
  do {                                                                                                                 \
    int rc_ = (call);                                                                                                  \
    if (rc_ != MPI_SUCCESS) {                                                                                          \
      char msg_[MPI_MAX_ERROR_STRING];                                                                                 \
      int len_ = 0;                                                                                                    \
      MPI_Error_string(rc_, msg_, &len_);                                                                              \
      int r_ = -1;                                                                                                     \
      MPI_Comm_rank(MPI_COMM_WORLD, &r_);                                                                              \
      ::loom::fail("rank {}: {} failed at {}:{}: {}", r_, #call, __FILE__, __LINE__, std::string(msg_, size_t(len_))); \
    }                                                                                                                  \
  } while (0)

namespace loom {

MpiWorld::MpiWorld(int* argc, char*** argv) {
  int provided = 0;
  LOOM_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  LOOM_CHECK(provided == MPI_THREAD_MULTIPLE,
             "this MPI library does not provide MPI_THREAD_MULTIPLE (got level {}); loom's communication "
             "threads need it",
             provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiWorld::~MpiWorld() {
  MPI_Finalize();
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::i32:
      return MPI_INT;
    case DType::bf16:
      return MPI_UINT16_T;  // reduced by the bf16 ops below
    case DType::f64:
      return MPI_DOUBLE;
  }
  return MPI_BYTE;
}

// MPI has no bf16: these sum (or take the max of) bf16 values in fp32 and round once per
// pair, as a GPU's reduction does.
void mpi_bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}
void mpi_bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16(std::max(bf16_to_f32(a[i]), bf16_to_f32(b[i])));
}

int mpi_count(int64_t n) {
  LOOM_CHECK(n <= INT32_MAX, "an MPI message of {} elements exceeds MPI's int count; use smaller buckets", n);
  return int(n);
}

namespace {

class MpiGroup final : public ProcessGroup {
 public:
  MpiGroup(const std::string& name, MPI_Comm comm, std::vector<int> ranks, Trace* trace, double timeout_s)
      : ProcessGroup(name, 0, 1, std::move(ranks)), comm_(comm), trace_(trace), timeout_s_(timeout_s) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Op_create(&mpi_bf16_sum, 1, &bf16_sum_);
    MPI_Op_create(&mpi_bf16_max, 1, &bf16_max_);
    worker_ = std::thread([this] { run(); });
  }
  ~MpiGroup() override {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
    MPI_Op_free(&bf16_sum_);
    MPI_Op_free(&bf16_max_);
    MPI_Comm_free(&comm_);
    for (auto& [key, p] : pinned_) cuda_api(key.first).free_host(p);
  }
  const char* backend() const override { return "mpi"; }
  bool carries(DeviceKind d) const override { return d != DeviceKind::cuda || LOOM_HAVE_CUDA; }

  Work all_reduce(Buf b, ReduceOp op, const Stream& after) override {
    count(CommOp::all_reduce, b.bytes());
    Staging st(*this, after);
    Buf h = st.inout(b);
    MPI_Op mop = h.dtype == DType::bf16 ? (op == ReduceOp::sum ? bf16_sum_ : bf16_max_)
                                        : (op == ReduceOp::sum ? MPI_SUM : MPI_MAX);
    return issue(CommOp::all_reduce, std::move(st), [=, this](MPI_Request* r) {
      LOOM_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, h.data, mpi_count(h.count), mpi_type(h.dtype), mop, comm_, r));
    });
  }
  Work reduce_scatter(Buf in, Buf out, const Stream& after) override {
    LOOM_CHECK(in.count == out.count * size_, "reduce_scatter on '{}': input has {} elements, not {} x {}", name_,
               in.count, size_, out.count);
    count(CommOp::reduce_scatter, in.bytes());
    Staging st(*this, after);
    Buf hi = st.input(in), ho = st.output(out);
    MPI_Op mop = hi.dtype == DType::bf16 ? bf16_sum_ : MPI_SUM;
    return issue(CommOp::reduce_scatter, std::move(st), [=, this](MPI_Request* r) {
      LOOM_MPI_CHECK(
          MPI_Ireduce_scatter_block(hi.data, ho.data, mpi_count(ho.count), mpi_type(hi.dtype), mop, comm_, r));
    });
  }
  Work all_gather(Buf in, Buf out, const Stream& after) override {
    LOOM_CHECK(out.count == in.count * size_, "all_gather on '{}': output has {} elements, not {} x {}", name_,
               out.count, size_, in.count);
    count(CommOp::all_gather, out.bytes());
    const bool in_place = in.data == static_cast<char*>(out.data) + size_t(rank_) * in.bytes();
    Staging st(*this, after);
    Buf hi = in_place ? Buf() : st.input(in), ho = in_place ? st.inout(out) : st.output(out);
    return issue(CommOp::all_gather, std::move(st), [=, this](MPI_Request* r) {
      LOOM_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : hi.data, mpi_count(in.count), mpi_type(in.dtype), ho.data,
                                    mpi_count(in.count), mpi_type(in.dtype), comm_, r));
    });
  }
  Work broadcast(Buf b, int root, const Stream& after) override {
    count(CommOp::broadcast, b.bytes());
    Staging st(*this, after);
    Buf h = st.inout(b);
    return issue(CommOp::broadcast, std::move(st), [=, this](MPI_Request* r) {
      LOOM_MPI_CHECK(MPI_Ibcast(h.data, mpi_count(h.count), mpi_type(h.dtype), root, comm_, r));
    });
  }
  Work all_to_all_v(Buf in, const std::vector<int64_t>& sc, Buf out, const std::vector<int64_t>& rc,
                    const Stream& after) override {
    LOOM_CHECK(int(sc.size()) == size_ && int(rc.size()) == size_, "all_to_all_v on '{}' needs {} counts", name_,
               size_);
    auto v = std::make_shared<std::array<std::vector<int>, 4>>();  // counts and displacements, kept alive
    int64_t sent = 0;
    for (int r = 0, so = 0, ro = 0; r < size_; ++r) {
      (*v)[0].push_back(mpi_count(sc[size_t(r)]));
      (*v)[1].push_back(so);
      (*v)[2].push_back(mpi_count(rc[size_t(r)]));
      (*v)[3].push_back(ro);
      so += mpi_count(sc[size_t(r)]);
      ro += mpi_count(rc[size_t(r)]);
      sent += sc[size_t(r)];
    }
    count(CommOp::all_to_all, size_t(sent) * dtype_size(in.dtype));
    Staging st(*this, after);
    Buf hi = st.input(in), ho = st.output(out);
    return issue(CommOp::all_to_all, std::move(st), [=, this](MPI_Request* r) {
      LOOM_MPI_CHECK(MPI_Ialltoallv(hi.data, (*v)[0].data(), (*v)[1].data(), mpi_type(hi.dtype), ho.data,
                                    (*v)[2].data(), (*v)[3].data(), mpi_type(ho.dtype), comm_, r));
    });
  }
  Work send(Buf b, int peer, int tag, const Stream& after) override {
    count(CommOp::send, b.bytes(), peer);
    Staging st(*this, after);
    Buf h = st.input(b);
    return issue(CommOp::send, std::move(st), [=, this](MPI_Request* r) {
      LOOM_MPI_CHECK(MPI_Isend(h.data, mpi_count(h.count), mpi_type(h.dtype), peer, tag, comm_, r));
    });
  }
  Work recv(Buf b, int peer, int tag, const Stream& after) override {
    count(CommOp::recv, b.bytes(), peer);
    Staging st(*this, after);
    Buf h = st.output(b);
    return issue(CommOp::recv, std::move(st), [=, this](MPI_Request* r) {
      LOOM_MPI_CHECK(MPI_Irecv(h.data, mpi_count(h.count), mpi_type(h.dtype), peer, tag, comm_, r));
    });
  }
  Work barrier() override {
    count(CommOp::barrier, 0);
    return issue(CommOp::barrier, Staging(*this, host_stream()),
                 [=, this](MPI_Request* r) { LOOM_MPI_CHECK(MPI_Ibarrier(comm_, r)); });
  }

 private:
  struct Op {
    CommOp kind;
    std::function<void(MPI_Request*)> start;
    std::shared_ptr<Work::State> state;
    int64_t seq;
    std::chrono::steady_clock::time_point started{};
  };

  // Host views of one op's buffers. Host buffers pass through. CUDA buffers (the staged path,
  // for checking multi-rank layouts on one GPU, where NCCL refuses two ranks per device) are
  // copied into pinned host memory once `after` has produced them (the host waits for that),
  // and results are copied back when the Work lands (the host waits again): correct, and slow
  // by design; NCCL is the path for real runs. The host waits for `after` before an op that
  // only writes too: the copy back runs outside the device's streams, and work queued before
  // the op may still read the old contents (a pipeline's receive slot, reused under 1f1b).
  struct Staging {
    MpiGroup& g;
    const Stream& after;
    struct Back {
      DeviceKind kind;
      void* device;
      void* host;
      size_t bytes;
    };
    std::vector<Back> back;  // results to copy to the device on landing
    struct Held {
      DeviceKind kind;
      size_t bytes;
      void* p;
    };
    std::vector<Held> held;  // pinned blocks, returned on landing
    bool synced = false;
    Staging(MpiGroup& group, const Stream& s) : g(group), after(s) {}
    Staging(Staging&&) = default;  // leaves `held` empty behind
    // Blocks still held go back to the pool: an op that never landed, or a copy that threw
    // before the op was issued. (A staged op's Staging lives until the op is done.)
    ~Staging() {
      for (auto& h : held) g.pinned_give(h.kind, h.bytes, h.p);
    }
    Buf host_of(Buf b, bool read, bool write) {
      if (b.device == DeviceKind::cpu || b.count == 0) return b;
      producer_check(g.name(), after, b);
      void* h = g.pinned_take(b.device, b.bytes());
      held.push_back({b.device, b.bytes(), h});
      if (!synced) after.synchronize(), synced = true;
      if (read) cuda_api(b.device).memcpy(h, b.data, b.bytes());
      if (write) back.push_back({b.device, b.data, h, b.bytes()});
      return Buf(h, b.count, b.dtype, DeviceKind::cpu);
    }
    Buf input(Buf b) { return host_of(b, true, false); }
    Buf output(Buf b) { return host_of(b, false, true); }
    Buf inout(Buf b) { return host_of(b, true, true); }
  };

  void* pinned_take(DeviceKind kind, size_t bytes) {
    std::lock_guard lk(pinned_mu_);
    auto it = pinned_.find({kind, bytes});
    if (it != pinned_.end()) {
      void* p = it->second;
      pinned_.erase(it);
      return p;
    }
    return cuda_api(kind).malloc_host(bytes);
  }
  void pinned_give(DeviceKind kind, size_t bytes, void* p) {
    std::lock_guard lk(pinned_mu_);
    pinned_.emplace(std::make_pair(kind, bytes), p);
  }

  Work issue(CommOp kind, Staging staging, std::function<void(MPI_Request*)> start) {
    auto st = std::make_shared<Work::State>();
    if (!staging.held.empty()) {
      // Landing: wait for the op on the host, then copy the results up (once).
      auto staged = std::make_shared<Staging>(std::move(staging));
      auto landed = std::make_shared<bool>(false);
      Work::State* raw = st.get();
      st->land = [this, raw, staged, landed](const Stream*) {
        {
          std::unique_lock lk(raw->mu);
          raw->cv.wait(lk, [&] { return raw->done; });
          if (raw->error) std::rethrow_exception(raw->error);
        }
        if (*landed) return;
        for (auto& b : staged->back) cuda_api(b.kind).memcpy(b.device, b.host, b.bytes);
        for (auto& h : staged->held) pinned_give(h.kind, h.bytes, h.p);
        staged->held.clear();
        *landed = true;
      };
      st->poll = [raw] {
        std::lock_guard lk(raw->mu);
        return raw->done;
      };
    }
    {
      std::lock_guard lk(mu_);
      queue_.push_back({kind, std::move(start), st, counters_.seq, {}});
    }
    cv_.notify_all();
    return Work(st);
  }

  static void finish(Work::State& s, std::exception_ptr err) {
    {
      std::lock_guard lk(s.mu);
      s.done = true;
      s.error = err;
    }
    s.cv.notify_all();
  }

  double now_us() const { return trace_ ? trace_->now_us() : 0.0; }

  void watchdog(const Op& oldest) const {
    if (timeout_s_ <= 0) return;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - oldest.started).count();
    if (waited < timeout_s_) return;
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    std::fprintf(stderr,
                 "error: rank %d: %s #%lld on group '%s' has not completed after %.0f s; a peer rank has likely died "
                 "or hangs (parallel.timeout_s = %.0f)\n",
                 world_rank, comm_op_name(oldest.kind), (long long)oldest.seq, name_.c_str(), waited, timeout_s_);
    std::fflush(stderr);
    if (hang_report_) hang_report_->timed_out(*this, oldest.seq, waited);
    MPI_Abort(MPI_COMM_WORLD, 4);
  }

  void run() {
    std::vector<MPI_Request> reqs;
    std::vector<Op> pending;
    auto last_progress = std::chrono::steady_clock::now();
    for (;;) {
      std::deque<Op> fresh;
      {
        std::unique_lock lk(mu_);
        if (pending.empty()) cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (stop_ && queue_.empty() && pending.empty()) return;
        fresh.swap(queue_);
      }
      if (!fresh.empty()) last_progress = std::chrono::steady_clock::now();
      for (auto& op : fresh) {  // started in issue order
        MPI_Request r = MPI_REQUEST_NULL;
        op.state->start_us = now_us();
        op.started = std::chrono::steady_clock::now();
        recorder_.started(op.seq);
        try {
          op.start(&r);
        } catch (...) {
          finish(*op.state, std::current_exception());
          continue;
        }
        reqs.push_back(r);
        pending.push_back(std::move(op));
      }
      if (pending.empty()) continue;
      int n_done = 0;
      std::vector<int> idx(reqs.size());
      MPI_Testsome(int(reqs.size()), reqs.data(), &n_done, idx.data(), MPI_STATUSES_IGNORE);
      if (n_done == MPI_UNDEFINED || n_done == 0) {
        watchdog(pending.front());
        // Nothing finished. MPI's nonblocking collectives advance only inside MPI calls, so
        // poll hot (yielding the core) for a short while after the last progress, then back
        // off so that a long transfer does not steal a core from compute.
        if (std::chrono::steady_clock::now() - last_progress < std::chrono::microseconds(1000)) {
          std::this_thread::yield();
        } else {
          std::unique_lock lk(mu_);
          cv_.wait_for(lk, std::chrono::microseconds(50), [&] { return !queue_.empty(); });
        }
        continue;
      }
      last_progress = std::chrono::steady_clock::now();
      std::vector<bool> gone(reqs.size());
      for (int i = 0; i < n_done; ++i) {
        Op& op = pending[size_t(idx[size_t(i)])];
        op.state->end_us = now_us();
        if (trace_)
          trace_->add(comm_op_name(op.kind), Trace::comm, op.state->start_us, op.state->end_us - op.state->start_us);
        recorder_.finished(op.seq);
        finish(*op.state, nullptr);
        gone[size_t(idx[size_t(i)])] = true;
      }
      size_t k = 0;
      for (size_t i = 0; i < reqs.size(); ++i)
        if (!gone[i]) reqs[k] = reqs[i], pending[k] = std::move(pending[i]), ++k;
      reqs.resize(k);
      pending.resize(k);
    }
  }

  MPI_Comm comm_;
  Trace* trace_;
  double timeout_s_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  bool stop_ = false;
  MPI_Op bf16_sum_ = MPI_OP_NULL, bf16_max_ = MPI_OP_NULL;
  std::mutex pinned_mu_;
  std::multimap<std::pair<DeviceKind, size_t>, void*> pinned_;  // pinned staging blocks, reused by size
};

}  // namespace

std::string mpi_library_version() {
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(v, &len);
  std::string s(v, size_t(len));
  return s.substr(0, s.find_first_of("\n,"));
}

int mpi_local_size() {
  MPI_Comm node;
  LOOM_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int n = 1;
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  return n;
}

std::vector<std::string> mpi_all_gather_text(const std::string& mine) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int n = mpi_count(int64_t(mine.size()));
  std::vector<int> sizes(static_cast<size_t>(world)), at(static_cast<size_t>(world), 0);
  LOOM_MPI_CHECK(MPI_Allgather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD));
  int64_t total = 0;
  for (int r = 0; r < world; ++r) at[size_t(r)] = mpi_count(total), total += sizes[size_t(r)];
  std::string all(size_t(total), '\0');
  LOOM_MPI_CHECK(
      MPI_Allgatherv(mine.data(), n, MPI_CHAR, all.data(), sizes.data(), at.data(), MPI_CHAR, MPI_COMM_WORLD));
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r) out.push_back(all.substr(size_t(at[size_t(r)]), size_t(sizes[size_t(r)])));
  return out;
}

void mpi_abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

std::unique_ptr<ProcessGroup> mpi_group(const std::string& name, int color, const std::vector<int>& ranks, Trace* trace,
                                        double timeout_s) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm comm;
  LOOM_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, world_rank, &comm));
  return std::make_unique<MpiGroup>(name, comm, ranks, trace, timeout_s);
}

}  // namespace loom
