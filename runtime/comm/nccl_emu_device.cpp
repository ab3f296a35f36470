#include "runtime/comm/nccl_emu_device.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "runtime/comm/hang_report.h"
#include "runtime/comm/mpi_group.h"
#include "runtime/error.h"

namespace loom {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A launch given up because its group is going away (an error unwinds the trainer).
struct Abandoned {};

void mpi_ok(int rc, const char* what, const EmuLaunch& l) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail("{} #{} on group '{}' (nccl-emulated): {} failed: {}", comm_op_name(l.kind), l.seq, l.group, what,
       std::string(msg, size_t(len)));
}

const char* desc_dtype(int32_t d) {
  return dtype_name(DType(d));
}

// How a collective's descriptor reads in a mismatch message.
std::string desc_text(const EmuLaunch::Desc& d) {
  std::string s = fmt::format("{} of {} {}", comm_op_name(CommOp(d.kind)), d.count, desc_dtype(d.dtype));
  if (d.root >= 0) s += fmt::format(" from root {}", d.root);
  if (CommOp(d.kind) == CommOp::all_reduce) s += d.reduce == int(ReduceOp::sum) ? " (sum)" : " (max)";
  return s;
}

// What travels ahead of each send: the receiver checks it against its own receive.
struct P2pDesc {
  int64_t count, seq;
  int32_t dtype, pad;
};

}  // namespace

NcclEmuDevice::NcclEmuDevice(std::unique_ptr<EmuBoard> board, const NcclEmuOptions& o)
    : board_(std::move(board)), opt_(o) {
  {
    std::lock_guard lk(page_mu_);
    board_->begin_write(opt_.world_rank);
    board_->mine(opt_.world_rank).attached = 1;
    board_->end_write(opt_.world_rank);
  }
  worker_ = std::thread([this] { run(); });
  watchdog_ = std::thread([this] { watch(); });
}

NcclEmuDevice::~NcclEmuDevice() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
  watchdog_.join();
  // Abandoned launches' buffers stay allocated for good: MPI may still write into them.
  if (!abandoned_.empty()) new std::vector<std::shared_ptr<EmuLaunch>>(std::move(abandoned_));
  std::lock_guard lk(page_mu_);
  board_->begin_write(opt_.world_rank);
  board_->mine(opt_.world_rank).gone = 1;
  board_->end_write(opt_.world_rank);
}

int NcclEmuDevice::add_comm(const std::string& name, int color, int rank, const std::vector<int>& world) {
  std::lock_guard lk(page_mu_);
  EmuRankState& s = board_->mine(opt_.world_rank);
  LOOM_CHECK(s.comms < kEmuMaxGroups, "nccl-emulated: more than {} communicators on one rank", kEmuMaxGroups);
  board_->begin_write(opt_.world_rank);
  EmuCommState& c = s.comm[s.comms];
  std::snprintf(c.name, sizeof(c.name), "%s", name.c_str());
  c.color = color;
  c.rank = rank;
  c.size = int(world.size());
  for (size_t j = 0; j < world.size(); ++j) c.world[j] = world[j];
  const int index = s.comms++;
  board_->end_write(opt_.world_rank);
  return index;
}

void NcclEmuDevice::submit(std::shared_ptr<EmuLaunch> launch) {
  {
    std::lock_guard lk(mu_);
    queue_.push_back(std::move(launch));
  }
  cv_.notify_all();
}

void NcclEmuDevice::forget(const ProcessGroup* owner) {
  std::lock_guard wlk(watch_mu_);
  std::vector<std::shared_ptr<EmuLaunch>> dropped;
  {
    std::unique_lock lk(mu_);
    for (auto& l : queue_)
      if (l->owner == owner) dropped.push_back(l);
    std::erase_if(queue_, [&](const auto& l) { return l->owner == owner; });
    abandon_ = owner;
    cv_.wait(lk, [&] { return !head_ || head_->owner != owner; });
    abandon_ = nullptr;
  }
  // What never ran fails, so that a Work waited on later says so instead of waiting forever.
  for (auto& l : dropped)
    for (auto& op : l->ops) {
      {
        std::lock_guard slk(op->state->mu);
        op->state->done = true;
        op->state->error = std::make_exception_ptr(
            Error(fmt::format("{} #{} on group '{}' (nccl-emulated) never ran: its group went away first",
                              comm_op_name(op->kind), op->seq, l->group)));
      }
      op->state->cv.notify_all();
    }
}

void NcclEmuDevice::host_wait(bool on) {
  {
    std::lock_guard lk(mu_);
    host_waiting_ += on ? 1 : -1;
  }
  std::lock_guard lk(page_mu_);
  board_->begin_write(opt_.world_rank);
  board_->mine(opt_.world_rank).host_waiting += on ? 1 : -1;
  board_->end_write(opt_.world_rank);
}

void NcclEmuDevice::end_job() const {
  std::fflush(stderr);
  if (opt_.end_job) opt_.end_job();
  std::_Exit(4);
}

void NcclEmuDevice::publish(const EmuLaunch* l) {
  std::lock_guard lk(page_mu_);
  board_->begin_write(opt_.world_rank);
  EmuRankState& s = board_->mine(opt_.world_rank);
  s.head_comm = l ? l->comm : -1;
  if (l) {
    s.head_kind = int(l->kind);
    s.head_seq = l->seq;
    s.head_collective = l->collective;
    EmuCommState& c = s.comm[l->comm];
    if (l->collective) c.collectives = l->collective;
    s.head_p2ps = 0;
    for (const EmuLaunch::P2p& e : l->p2p) {
      int64_t& started = e.send ? c.sends[e.peer] : c.recvs[e.peer];
      started = std::max(started, e.ordinal);
      if (s.head_p2ps < 2 * kEmuMaxRanks) s.head_p2p[s.head_p2ps++] = {e.peer, e.send, e.ordinal};
    }
  }
  board_->end_write(opt_.world_rank);
}

// Between polls: hot for a millisecond after the last progress, then backing off so the
// executor does not take a core from compute; gives up when the launch is abandoned.
void NcclEmuDevice::idle(Clock::time_point last_progress, const EmuLaunch& l) {
  {
    std::lock_guard lk(mu_);
    if (abandon_ == l.owner || stop_) throw Abandoned{};
  }
  if (Clock::now() - last_progress < std::chrono::milliseconds(1))
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(50));
}

void NcclEmuDevice::complete(std::vector<MPI_Request>& reqs, const EmuLaunch& l) {
  const auto t0 = Clock::now();
  for (;;) {
    int flag = 0;
    mpi_ok(MPI_Testall(int(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), "MPI_Testall", l);
    if (flag) return;
    idle(t0, l);
  }
}

// Sends and receives, each on its own: first its descriptor, synchronously (a send's
// descriptor completes only once the peer has posted the matching receive: the rendezvous),
// then its payload. A receive whose peer sends another count or dtype still drains the
// payload, so the sender completes, then fails naming both.
void NcclEmuDevice::exchange_p2p(EmuLaunch& l) {
  const size_t n = l.p2p.size();
  // What MPI reads and writes lives in the launch: an abandoned launch is kept (abandoned_).
  struct Bufs {
    std::vector<P2pDesc> out, in;
    std::vector<std::vector<char>> drains;
  };
  auto bufs = std::make_shared<Bufs>();
  bufs->out.resize(n), bufs->in.resize(n), bufs->drains.resize(n);
  l.keep = bufs;
  auto &out = bufs->out, &in = bufs->in;
  auto& drains = bufs->drains;
  std::vector<MPI_Request> desc(n, MPI_REQUEST_NULL), data(n, MPI_REQUEST_NULL);
  std::vector<int> phase(n, 0);  // 0: descriptor in flight, 1: payload in flight, 2: done
  std::string mismatch;
  for (size_t i = 0; i < n; ++i) {
    const EmuLaunch::P2p& e = l.p2p[i];
    if (e.send) {
      out[i] = {e.count, e.seq, int32_t(e.dtype), 0};
      mpi_ok(MPI_Issend(&out[i], sizeof(P2pDesc), MPI_BYTE, e.peer, 1, l.mpi, &desc[i]), "MPI_Issend", l);
    } else {
      mpi_ok(MPI_Irecv(&in[i], sizeof(P2pDesc), MPI_BYTE, e.peer, 1, l.mpi, &desc[i]), "MPI_Irecv", l);
    }
  }
  auto payload = [&](size_t i) {
    const EmuLaunch::P2p& e = l.p2p[i];
    // Payloads go out as their descriptors complete, in any order: each is tagged by its
    // ordinal so that two to one peer cannot swap (MPI would pair them in posting order).
    const int tag = 2 + int(e.ordinal % 30000);
    if (e.send)
      return mpi_ok(MPI_Isend(e.data, mpi_count(e.count), mpi_type(e.dtype), e.peer, tag, l.mpi, &data[i]), "MPI_Isend",
                    l);
    if (in[i].count == e.count && in[i].dtype == int32_t(e.dtype))
      return mpi_ok(MPI_Irecv(e.data, mpi_count(e.count), mpi_type(e.dtype), e.peer, tag, l.mpi, &data[i]), "MPI_Irecv",
                    l);
    const DType theirs = DType(in[i].dtype);
    drains[i].resize(size_t(in[i].count) * dtype_size(theirs));
    mpi_ok(MPI_Irecv(drains[i].data(), mpi_count(in[i].count), mpi_type(theirs), e.peer, tag, l.mpi, &data[i]),
           "MPI_Irecv", l);
    if (mismatch.empty())
      mismatch = fmt::format(
          "recv #{} on group '{}' (nccl-emulated) expects {} {} from group rank {}, whose matching send (its #{}) "
          "carries {} {}: sends and receives match in issue order, so the two ranks issue them in different orders "
          "or with different sizes",
          e.seq, l.group, e.count, dtype_name(e.dtype), e.peer, in[i].seq, in[i].count, dtype_name(theirs));
  };
  auto last = Clock::now();
  for (size_t left = n; left > 0;) {
    for (size_t i = 0; i < n; ++i) {
      if (phase[i] == 2) continue;
      int flag = 0;
      mpi_ok(MPI_Test(phase[i] == 0 ? &desc[i] : &data[i], &flag, MPI_STATUS_IGNORE), "MPI_Test", l);
      if (!flag) continue;
      if (phase[i]++ == 0)
        payload(i);
      else
        --left;
      last = Clock::now();
    }
    if (left) idle(last, l);
  }
  if (!mismatch.empty()) throw Error(mismatch);
}

void NcclEmuDevice::execute(EmuLaunch& l) {
  if (!l.collective) return exchange_p2p(l);
  // Every member's descriptor of this collective: NCCL needs them equal and cannot tell.
  int n = 0;
  MPI_Comm_size(l.mpi, &n);
  auto gathered = std::make_shared<std::vector<EmuLaunch::Desc>>(static_cast<size_t>(n));
  l.keep = gathered;  // MPI writes it: it lives in the launch (see exchange_p2p)
  auto& all = *gathered;
  std::vector<MPI_Request> reqs(1);
  mpi_ok(MPI_Iallgather(&l.desc, sizeof(l.desc), MPI_BYTE, all.data(), sizeof(l.desc), MPI_BYTE, l.mpi, &reqs[0]),
         "MPI_Iallgather", l);
  complete(reqs, l);
  bool equal = true;
  for (const auto& d : all) equal = equal && std::memcmp(&d, &l.desc, sizeof(d)) == 0;
  if (!equal) {
    std::string each;
    for (int j = 0; j < n; ++j)
      each += fmt::format("; group rank {} (world rank {}): {}", j, l.owner->world_ranks()[size_t(j)],
                          desc_text(all[size_t(j)]));
    fail(
        "{} #{} on group '{}' (nccl-emulated): the members' collective number {} differs{}. NCCL would hang or "
        "corrupt data here: every rank must issue a communicator's collectives in the same order, with the same "
        "count and dtype",
        comm_op_name(l.kind), l.seq, l.group, l.collective, each);
  }
  mpi_ok(l.start(&reqs[0]), comm_op_name(l.kind), l);
  complete(reqs, l);
}

void NcclEmuDevice::run() {
  for (;;) {
    std::shared_ptr<EmuLaunch> l;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      l = queue_.front();
      queue_.pop_front();
      head_ = l;
      head_since_ = Clock::now();
    }
    publish(l.get());
    for (auto& op : l->ops) l->recorder->started(op->seq);
    std::exception_ptr err;
    try {
      execute(*l);
    } catch (const Abandoned&) {
      err = std::make_exception_ptr(Error("an op abandoned: its nccl-emulated group went away"));
      abandoned_.push_back(l);  // MPI may still write into its buffers
    } catch (...) {
      err = std::current_exception();
    }
    publish(nullptr);
    for (auto& op : l->ops) {
      l->recorder->finished(op->seq);
      {
        std::lock_guard lk(op->state->mu);
        op->state->done = true;
        op->state->error = err;
      }
      op->state->cv.notify_all();
    }
    {
      std::lock_guard lk(mu_);
      head_.reset();
    }
    cv_.notify_all();
  }
}

void NcclEmuDevice::watch() {
  std::vector<EmuRankState> prev;
  std::vector<int> prev_closure;
  Clock::time_point confirmed{};
  for (;;) {
    std::shared_ptr<EmuLaunch> head;
    double running = 0;
    bool waiting = false;
    {
      std::unique_lock lk(mu_);
      if (cv_.wait_for(lk, std::chrono::milliseconds(200), [&] { return stop_; })) return;
      head = head_;
      running = head ? seconds_since(head_since_) : 0;
      waiting = host_waiting_ > 0;
    }
    std::unique_lock wlk(watch_mu_);
    {
      std::lock_guard lk(mu_);
      if (head != head_) head.reset();  // gone (or forgotten) while this one looked
    }
    if (head && opt_.timeout_s > 0 && running >= opt_.timeout_s) {
      std::fprintf(stderr,
                   "error: rank %d: %s #%lld on group '%s' has not completed after %.0f s; a peer rank has likely "
                   "died or hangs (parallel.timeout_s = %.0f)\n",
                   opt_.world_rank, comm_op_name(head->kind), (long long)head->seq, head->group.c_str(), running,
                   opt_.timeout_s);
      std::fflush(stderr);
      if (HangReport* h = head->owner->hang_report()) h->timed_out(*head->owner, head->seq, running);
      end_job();
    }
    wlk.unlock();
    std::vector<int> closure;
    std::string report;
    std::vector<EmuRankState> snap;
    if (head && waiting && running >= 0.4) {
      snap = board_->snapshot();
      closure = emu_deadlock(snap, opt_.world_rank, &report);
    }
    // A verdict needs two reads of the board that agree: every page in the cycle unchanged
    // between them means the pages held those values at one moment (after the first read).
    bool same = !closure.empty() && closure == prev_closure;
    for (int r : closure)
      if (same && snap[size_t(r)].version != prev[size_t(r)].version) same = false;
    if (!same) {
      prev = std::move(snap);
      prev_closure = std::move(closure);
      confirmed = Clock::now();
      continue;
    }
    // The lowest rank in the cycle reports (the others see the same cycle, or a larger one
    // with the same lowest rank); any rank reports if that one has not ended the job soon.
    int reporter = -1;
    for (int r : closure)
      if (!snap[size_t(r)].gone) {
        reporter = r;
        break;
      }
    if (reporter == opt_.world_rank || seconds_since(confirmed) > 5.0) {
      std::fprintf(stderr, "error: rank %d: %s\n", opt_.world_rank, report.c_str());
      end_job();
    }
  }
}

}  // namespace loom
