#include "runtime/comm/process_group.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

namespace loom {

void producer_check(const std::string& group, const Stream& after, const Buf& b) {
  LOOM_CHECK(b.count == 0 || b.device == DeviceKind::cpu || after.kind == b.device,
             "group '{}' was handed a device buffer with {} stream as its producer; pass the stream whose work wrote "
             "it (the op would run unordered with that work)",
             group, after.kind == DeviceKind::cpu ? "the host's" : "another device's");
}

const char* comm_op_name(CommOp op) {
  static const char* names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                "all_to_all", "send",           "recv",       "barrier"};
  return names[int(op)];
}

int64_t CommCounters::total_bytes() const {
  int64_t s = 0;
  for (auto b : bytes) s += b;
  return s;
}

namespace {
double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

void FlightRecorder::issued(int64_t seq, CommOp op, int64_t bytes, int peer) {
  std::lock_guard lk(mu_);
  ring_[size_t(n_ % kRecords)] = {seq, op, bytes, peer, wall_now(), 0, 0};
  ++n_;
}

OpRecord* FlightRecorder::find(int64_t seq) {
  for (auto& r : ring_)
    if (r.seq == seq) return &r;
  return nullptr;
}

void FlightRecorder::started(int64_t seq) {
  std::lock_guard lk(mu_);
  if (OpRecord* r = find(seq)) r->started = wall_now();
}

void FlightRecorder::finished(int64_t seq) {
  std::lock_guard lk(mu_);
  if (OpRecord* r = find(seq)) r->finished = wall_now();
}

std::vector<OpRecord> FlightRecorder::records() const {
  std::lock_guard lk(mu_);
  std::vector<OpRecord> out;
  for (int64_t i = std::max<int64_t>(0, n_ - kRecords); i < n_; ++i) out.push_back(ring_[size_t(i % kRecords)]);
  return out;
}

int64_t FlightRecorder::last_issued() const {
  std::lock_guard lk(mu_);
  return n_ == 0 ? 0 : ring_[size_t((n_ - 1) % kRecords)].seq;
}

void ProcessGroup::hang_forever(CommOp op) const {
  std::fprintf(stderr, "rank %d: fault drill: hanging inside %s #%lld on group '%s'\n", world_ranks_[size_t(rank_)],
               comm_op_name(op), (long long)counters_.seq, name_.c_str());
  std::fflush(stderr);
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

void Work::wait() const {
  if (!s_) return;
  if (s_->land) {
    s_->land(nullptr);
    return;
  }
  std::unique_lock lk(s_->mu);
  s_->cv.wait(lk, [&] { return s_->done; });
  if (s_->error) std::rethrow_exception(s_->error);
}

void Work::wait_on(const Stream& s) const {
  if (!s_) return;
  if (s_->land) {
    s_->land(&s);
    return;
  }
  wait();  // a host backend's result is in place once the host has waited
}

bool Work::done() const {
  if (!s_) return true;
  if (s_->poll) return s_->poll();
  std::lock_guard lk(s_->mu);
  return s_->done;
}

namespace {

class LocalGroup final : public ProcessGroup {
 public:
  LocalGroup(const std::string& name, int world_rank) : ProcessGroup(name, 0, 1, {world_rank}) {}
  Work all_reduce(Buf b, ReduceOp, const Stream&) override {
    count(CommOp::all_reduce, b.bytes());
    return {};
  }
  Work reduce_scatter(Buf in, Buf out, const Stream& after) override {
    count(CommOp::reduce_scatter, in.bytes());
    copy(in, out, after);
    return {};
  }
  Work all_gather(Buf in, Buf out, const Stream& after) override {
    count(CommOp::all_gather, out.bytes());
    copy(in, out, after);
    return {};
  }
  Work broadcast(Buf b, int, const Stream&) override {
    count(CommOp::broadcast, b.bytes());
    return {};
  }
  Work all_to_all_v(Buf in, const std::vector<int64_t>& sc, Buf out, const std::vector<int64_t>&,
                    const Stream& after) override {
    count(CommOp::all_to_all, size_t(sc.at(0)) * dtype_size(in.dtype));
    copy(in.slice(0, sc.at(0)), out, after);
    return {};
  }
  Work send(Buf, int, int, const Stream&) override {
    fail("group '{}' has one rank: there is no peer to send to", name_);
  }
  Work recv(Buf, int, int, const Stream&) override {
    fail("group '{}' has one rank: there is no peer to receive from", name_);
  }
  Work barrier() override {
    count(CommOp::barrier, 0);
    return {};
  }
  const char* backend() const override { return "local"; }
  bool carries(DeviceKind) const override { return true; }

 private:
  static void copy(Buf in, Buf out, const Stream& after) {
    stream_copy(in.device == DeviceKind::cpu && out.device == DeviceKind::cpu ? host_stream() : after, out.data,
                in.data, std::min(in.bytes(), out.bytes()));
  }
};

}  // namespace

std::unique_ptr<ProcessGroup> local_group(const std::string& name, int world_rank) {
  return std::make_unique<LocalGroup>(name, world_rank);
}

}  // namespace loom
