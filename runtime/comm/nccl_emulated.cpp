#include "runtime/comm/nccl_emulated.h"

#include <cstring>
#include <deque>
#include <limits>

#include "runtime/comm/mpi_group.h"
#include "runtime/comm/nccl_emu_device.h"
#include "runtime/error.h"

namespace loom {

namespace {

// A group's ops not yet landed, in issue order. Its Works hold it weakly (a Work that outlives
// its group, or one never waited on, must not keep the group's ops, or the device, alive).
struct Landing {
  NcclEmuDevice* device = nullptr;  // the group holds it
  std::string group;
  std::mutex mu;
  std::deque<std::shared_ptr<EmuOp>> pending;
};

// NaN in every float type, and the most negative int: what an output holds until it lands.
void poison(void* p, int64_t n, DType t) {
  switch (t) {
    case DType::f32:
      std::fill_n(static_cast<float*>(p), n, std::numeric_limits<float>::quiet_NaN());
      break;
    case DType::f64:
      std::fill_n(static_cast<double*>(p), n, std::numeric_limits<double>::quiet_NaN());
      break;
    case DType::bf16:
      std::fill_n(static_cast<uint16_t*>(p), n, uint16_t(0x7fc0));
      break;
    case DType::i32:
      std::fill_n(static_cast<int32_t*>(p), n, std::numeric_limits<int32_t>::min());
      break;
  }
}

void land_one(EmuOp& op, const std::string& group) {
  for (auto& b : op.bufs)
    LOOM_CHECK(!b.check || std::memcmp(b.user, b.copy.data(), b.copy.size()) == 0,
               "{} #{} on group '{}' (nccl-emulated): its input was written before the op completed; NCCL reads it "
               "while the op runs, so wait on the op's Work before writing the buffer again",
               comm_op_name(op.kind), op.seq, group);
  for (auto& b : op.bufs)
    if (b.back) std::memcpy(b.user, b.copy.data(), b.copy.size());
  op.landed = true;
  op.bufs = {};
}

void wait_done(NcclEmuDevice* device, Work::State& s) {
  std::unique_lock lk(s.mu);
  if (s.done) return;
  lk.unlock();
  if (device) device->host_wait(true);
  lk.lock();
  s.cv.wait(lk, [&] { return s.done; });
  lk.unlock();
  if (device) device->host_wait(false);
}

// Waiting on op `seq` lands it and every earlier op of the group (one stream runs them in
// order, so they are done); an op still queued in an open group_start() stops the walk.
void land_through(Landing& l, const EmuOp& op, Work::State& s) {
  LOOM_CHECK(op.submitted,
             "{} #{} on group '{}' (nccl-emulated) was waited on between group_start() and group_end(): the group's "
             "ops start only at group_end()",
             comm_op_name(op.kind), op.seq, l.group);
  const int64_t seq = op.seq;
  wait_done(l.device, s);
  std::lock_guard lk(l.mu);
  while (!l.pending.empty() && l.pending.front()->seq <= seq) {
    std::shared_ptr<EmuOp> o = l.pending.front();
    {
      std::lock_guard slk(o->state->mu);
      if (!o->state->done) break;
    }
    l.pending.pop_front();
    if (!o->state->error) land_one(*o, l.group);
  }
  if (s.error) std::rethrow_exception(s.error);
}

bool overlaps(const Buf& a, const Buf& b) {
  const char *pa = static_cast<const char*>(a.data), *pb = static_cast<const char*>(b.data);
  return a.count && b.count && pa < pb + b.bytes() && pb < pa + a.bytes();
}

class NcclEmuGroup final : public ProcessGroup {
 public:
  NcclEmuGroup(std::shared_ptr<NcclEmuDevice> device, const std::string& name, MPI_Comm comm, int color,
               std::vector<int> ranks)
      : ProcessGroup(name, 0, 1, std::move(ranks)), comm_(comm), landing_(std::make_shared<Landing>()) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);  // a count mismatch is reported, not fatal
    MPI_Op_create(&mpi_bf16_sum, 1, &bf16_sum_);
    MPI_Op_create(&mpi_bf16_max, 1, &bf16_max_);
    device_ = std::move(device);
    landing_->device = device_.get();
    landing_->group = name;
    index_ = device_->add_comm(name, color, rank_, world_ranks_);
    sends_.assign(size_t(size_), 0);
    recvs_.assign(size_t(size_), 0);
  }
  ~NcclEmuGroup() override {
    device_->forget(this);
    MPI_Op_free(&bf16_sum_);
    MPI_Op_free(&bf16_max_);
    MPI_Comm_free(&comm_);
  }
  const char* backend() const override { return "nccl-emulated"; }
  // The emulated CUDA device's memory is host memory: its buffers are staged as host ones,
  // once the stream that produced them (`after`) has run.
  bool carries(DeviceKind d) const override { return d == DeviceKind::cpu || d == DeviceKind::cuda_emulated; }

  Work all_reduce(Buf b, ReduceOp op, const Stream& after) override {
    count(CommOp::all_reduce, b.bytes());
    auto o = make_op(CommOp::all_reduce);
    void* p = stage(*o, after, b, true, true);
    const int n = mpi_count(b.count);
    const MPI_Datatype t = mpi_type(b.dtype);
    const MPI_Op m = b.dtype == DType::bf16 ? (op == ReduceOp::sum ? bf16_sum_ : bf16_max_)
                                            : (op == ReduceOp::sum ? MPI_SUM : MPI_MAX);
    const MPI_Comm c = comm_;
    return collective(o, {int(CommOp::all_reduce), int(b.dtype), -1, int(op), b.count, 0},
                      [=](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, p, n, t, m, c, r); });
  }
  Work reduce_scatter(Buf in, Buf out, const Stream& after) override {
    LOOM_CHECK(in.count == out.count * size_, "reduce_scatter on '{}': input has {} elements, not {} x {}", name_,
               in.count, size_, out.count);
    count(CommOp::reduce_scatter, in.bytes());
    auto o = make_op(CommOp::reduce_scatter);
    void* pi = stage(*o, after, in, true, false, !overlaps(in, out));
    void* po = stage(*o, after, out, false, true);
    const int n = mpi_count(out.count);
    const MPI_Datatype t = mpi_type(in.dtype);
    const MPI_Op m = in.dtype == DType::bf16 ? bf16_sum_ : MPI_SUM;
    const MPI_Comm c = comm_;
    return collective(o, {int(CommOp::reduce_scatter), int(in.dtype), -1, 0, out.count, 0},
                      [=](MPI_Request* r) { return MPI_Ireduce_scatter_block(pi, po, n, t, m, c, r); });
  }
  Work all_gather(Buf in, Buf out, const Stream& after) override {
    LOOM_CHECK(out.count == in.count * size_, "all_gather on '{}': output has {} elements, not {} x {}", name_,
               out.count, size_, in.count);
    count(CommOp::all_gather, out.bytes());
    auto o = make_op(CommOp::all_gather);
    void* pi = stage(*o, after, in, true, false, !overlaps(in, out));
    void* po = stage(*o, after, out, false, true);
    const int n = mpi_count(in.count);
    const MPI_Datatype t = mpi_type(in.dtype);
    const MPI_Comm c = comm_;
    return collective(o, {int(CommOp::all_gather), int(in.dtype), -1, 0, in.count, 0},
                      [=](MPI_Request* r) { return MPI_Iallgather(pi, n, t, po, n, t, c, r); });
  }
  Work broadcast(Buf b, int root, const Stream& after) override {
    count(CommOp::broadcast, b.bytes());
    auto o = make_op(CommOp::broadcast);
    // The root's buffer is only read (NCCL's in-place broadcast): it keeps its values.
    void* p = stage(*o, after, b, true, rank_ != root, rank_ == root);
    const int n = mpi_count(b.count);
    const MPI_Datatype t = mpi_type(b.dtype);
    const MPI_Comm c = comm_;
    return collective(o, {int(CommOp::broadcast), int(b.dtype), root, 0, b.count, 0},
                      [=](MPI_Request* r) { return MPI_Ibcast(p, n, t, root, c, r); });
  }
  // NCCL's all-to-all is a group of sends and receives (zero counts skipped, as loom's NCCL
  // group does); this rank's own block is copied.
  Work all_to_all_v(Buf in, const std::vector<int64_t>& sc, Buf out, const std::vector<int64_t>& rc,
                    const Stream& after) override {
    LOOM_CHECK(int(sc.size()) == size_ && int(rc.size()) == size_, "all_to_all_v on '{}' needs {} counts", name_,
               size_);
    LOOM_CHECK(sc[size_t(rank_)] == rc[size_t(rank_)],
               "all_to_all_v on '{}': rank {} sends itself {} elements but expects {}", name_, rank_, sc[size_t(rank_)],
               rc[size_t(rank_)]);
    int64_t sent = 0, got = 0;
    for (int r = 0; r < size_; ++r) sent += sc[size_t(r)], got += rc[size_t(r)];
    LOOM_CHECK(sent <= in.count && got <= out.count,
               "all_to_all_v on '{}': sends {} of {} elements, receives {} into {}", name_, sent, in.count, got,
               out.count);
    count(CommOp::all_to_all, size_t(sent) * dtype_size(in.dtype));
    auto o = make_op(CommOp::all_to_all);
    char* pi = static_cast<char*>(stage(*o, after, in, true, false, !overlaps(in, out)));
    char* po = static_cast<char*>(stage(*o, after, out, false, true));
    const size_t es = dtype_size(in.dtype);
    std::vector<EmuLaunch::P2p> e;
    int64_t so = 0, ro = 0;
    for (int r = 0; r < size_; ++r) {
      const int64_t s = sc[size_t(r)], v = rc[size_t(r)];
      if (r == rank_)
        std::memcpy(po + size_t(ro) * es, pi + size_t(so) * es, size_t(s) * es);
      else {
        if (s) e.push_back({r, true, ++sends_[size_t(r)], pi + size_t(so) * es, s, in.dtype, o->seq});
        if (v) e.push_back({r, false, ++recvs_[size_t(r)], po + size_t(ro) * es, v, out.dtype, o->seq});
      }
      so += s, ro += v;
    }
    return p2p(o, std::move(e));
  }
  Work send(Buf b, int peer, int, const Stream& after) override {
    check_peer(CommOp::send, peer);
    count(CommOp::send, b.bytes(), peer);
    auto o = make_op(CommOp::send);
    void* p = stage(*o, after, b, true, false);
    return p2p(o, {{peer, true, ++sends_[size_t(peer)], p, b.count, b.dtype, o->seq}});
  }
  Work recv(Buf b, int peer, int, const Stream& after) override {
    check_peer(CommOp::recv, peer);
    count(CommOp::recv, b.bytes(), peer);
    auto o = make_op(CommOp::recv);
    void* p = stage(*o, after, b, false, true);
    return p2p(o, {{peer, false, ++recvs_[size_t(peer)], p, b.count, b.dtype, o->seq}});
  }
  Work barrier() override {
    count(CommOp::barrier, 0);
    const MPI_Comm c = comm_;
    return collective(make_op(CommOp::barrier), {int(CommOp::barrier), 0, -1, 0, 0, 0},
                      [=](MPI_Request* r) { return MPI_Ibarrier(c, r); });
  }
  // NCCL's group call is the thread's, across communicators; loom groups one group's ops, so
  // an op on another group while this one's is open is refused (as loom's NCCL group does).
  void group_start() override {
    LOOM_CHECK(!open_group_ || open_group_ == this, "group_start() on '{}' while group '{}' has one open", name_,
               open_group_ ? open_group_->name() : "");
    if (depth_++ == 0) open_ = new_launch(CommOp::send);
    open_group_ = this;
  }
  void group_end() override {
    LOOM_CHECK(depth_ > 0, "group_end() on '{}' without group_start()", name_);
    if (--depth_ > 0) return;
    open_group_ = nullptr;
    std::shared_ptr<EmuLaunch> l = std::move(open_);
    if (l->ops.empty()) return;
    l->seq = l->ops.front()->seq;  // the group is named by its first op
    l->kind = l->ops.front()->kind;
    submit(std::move(l));
  }

 private:
  std::shared_ptr<EmuOp> make_op(CommOp kind) {
    LOOM_CHECK(!open_group_ || open_group_ == this, "{} on group '{}' while group '{}' has a group_start() open",
               comm_op_name(kind), name_, open_group_ ? open_group_->name() : "");
    auto o = std::make_shared<EmuOp>();
    o->kind = kind;
    o->seq = counters_.seq;
    return o;
  }
  // Copies an input as of now (`read`: for a device buffer, once `after` has produced it); an
  // output (`back`) is poisoned and lands later;
  // `check`: the caller's input must not change before the op lands.
  void* stage(EmuOp& o, const Stream& after, const Buf& b, bool read, bool back, bool check = true) {
    LOOM_CHECK(b.count == 0 || carries(b.device),
               "group '{}' (nccl-emulated) was handed a CUDA buffer; it carries host buffers and the emulated "
               "device's",
               name_);
    producer_check(name_, after, b);
    if (b.count && b.device != DeviceKind::cpu) after.synchronize();
    o.bufs.push_back({b.data, std::vector<char>(b.bytes()), back, read && !back && check});
    EmuOp::Staged& s = o.bufs.back();
    if (read && b.count) std::memcpy(s.copy.data(), b.data, b.bytes());
    if (back) poison(b.data, b.count, b.dtype);
    return s.copy.data();
  }
  std::shared_ptr<EmuLaunch> new_launch(CommOp kind) {
    auto l = std::make_shared<EmuLaunch>();
    l->comm = index_;
    l->mpi = comm_;
    l->group = name_;
    l->owner = this;
    l->recorder = &recorder_;
    l->kind = kind;
    l->seq = counters_.seq;
    return l;
  }
  void submit(std::shared_ptr<EmuLaunch> l) {
    for (auto& o : l->ops) o->submitted = true;
    device_->submit(std::move(l));
  }
  Work track(const std::shared_ptr<EmuOp>& o) {
    {
      std::lock_guard lk(landing_->mu);
      landing_->pending.push_back(o);
    }
    // Weak both: the op leaves `pending` once landed, the Landing goes with its group; either
    // way the op is done (forget() fails what never ran), and only its status is left to read.
    std::weak_ptr<Landing> landing = landing_;
    std::weak_ptr<EmuOp> op = o;
    Work::State* s = o->state.get();
    s->land = [landing, op, s](const Stream*) {
      std::shared_ptr<Landing> l = landing.lock();
      std::shared_ptr<EmuOp> o = op.lock();
      if (l && o) return land_through(*l, *o, *s);
      wait_done(nullptr, *s);
      if (s->error) std::rethrow_exception(s->error);
    };
    s->poll = [s] {
      std::lock_guard lk(s->mu);
      return s->done;
    };
    return Work(o->state);
  }
  Work collective(std::shared_ptr<EmuOp> o, EmuLaunch::Desc d, std::function<int(MPI_Request*)> start) {
    LOOM_CHECK(depth_ == 0,
               "{} on group '{}' between group_start() and group_end(): nccl-emulated groups only sends and receives",
               comm_op_name(o->kind), name_);
    auto l = new_launch(o->kind);
    l->collective = d.ordinal = ++collectives_;
    l->desc = d;
    l->start = std::move(start);
    l->ops = {o};
    Work w = track(o);
    submit(std::move(l));
    return w;
  }
  void check_peer(CommOp kind, int peer) const {
    LOOM_CHECK(peer >= 0 && peer < size_ && peer != rank_, "{} on group '{}': peer {} of {} ranks (this is {})",
               comm_op_name(kind), name_, peer, size_, rank_);
  }
  Work p2p(std::shared_ptr<EmuOp> o, std::vector<EmuLaunch::P2p> e) {
    Work w = track(o);
    if (depth_ > 0) {
      open_->p2p.insert(open_->p2p.end(), e.begin(), e.end());
      open_->ops.push_back(std::move(o));
      return w;
    }
    auto l = new_launch(o->kind);
    l->p2p = std::move(e);
    l->ops = {std::move(o)};
    submit(std::move(l));  // an all-to-all that moves nothing still runs in stream order
    return w;
  }

  MPI_Comm comm_;
  std::shared_ptr<NcclEmuDevice> device_;
  std::shared_ptr<Landing> landing_;
  int index_ = 0;
  MPI_Op bf16_sum_ = MPI_OP_NULL, bf16_max_ = MPI_OP_NULL;
  int64_t collectives_ = 0;
  std::vector<int64_t> sends_, recvs_;  // issued, per peer
  int depth_ = 0;
  std::shared_ptr<EmuLaunch> open_;
  static thread_local const NcclEmuGroup* open_group_;  // whose group_start() this thread is in
};

thread_local const NcclEmuGroup* NcclEmuGroup::open_group_ = nullptr;

}  // namespace

std::shared_ptr<NcclEmuDevice> nccl_emu_device_create(ProcessGroup& world, const NcclEmuOptions& options) {
  const int local = mpi_local_size();
  LOOM_CHECK(local == world.size(),
             "parallel.comm = \"nccl-emulated\" needs every rank on one node (it checks NCCL's rules through shared "
             "memory); this job has {} of its {} ranks here: use parallel.comm = \"mpi\" across nodes",
             local, world.size());
  std::unique_ptr<EmuBoard> board;
  std::vector<int32_t> name(64, 0);
  if (world.rank() == 0) {
    board = EmuBoard::create(world.size());
    std::memcpy(name.data(), board->name().data(), std::min(board->name().size(), name.size() * 4 - 1));
  }
  world.broadcast(Buf(name.data(), int64_t(name.size())), 0).wait();
  if (world.rank() != 0) board = EmuBoard::attach(reinterpret_cast<const char*>(name.data()), world.size());
  world.barrier().wait();
  board->unlink();  // every rank has it mapped: the name is not needed any more
  return std::make_shared<NcclEmuDevice>(std::move(board), options);
}

std::unique_ptr<ProcessGroup> nccl_emu_group(const std::shared_ptr<NcclEmuDevice>& device, const std::string& name,
                                             int color, const std::vector<int>& ranks) {
  MPI_Comm comm;
  const int rc = MPI_Comm_split(MPI_COMM_WORLD, color, device->world_rank(), &comm);
  LOOM_CHECK(rc == MPI_SUCCESS, "nccl-emulated: MPI_Comm_split for group '{}' failed", name);
  return std::make_unique<NcclEmuGroup>(device, name, comm, color, ranks);
}

}  // namespace loom
