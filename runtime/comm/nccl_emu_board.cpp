#include "runtime/comm/nccl_emu_board.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include "runtime/comm/process_group.h"
#include "runtime/error.h"

namespace loom {

namespace {

int comm_index(const EmuRankState& s, const EmuCommState& c) {
  for (int i = 0; i < s.comms; ++i)
    if (s.comm[i].color == c.color && std::strncmp(s.comm[i].name, c.name, sizeof(c.name)) == 0) return i;
  return -1;
}

// The ranks q's device op waits for: members that have not started the op matching it.
std::vector<int> waits_for(const std::vector<EmuRankState>& ranks, int q) {
  const EmuRankState& s = ranks[size_t(q)];
  std::vector<int> out;
  if (s.head_comm < 0) return out;
  const EmuCommState& c = s.comm[s.head_comm];
  auto behind = [&](int member, auto&& count_of) {
    const int w = c.world[member];
    const EmuRankState& p = ranks[size_t(w)];
    const int k = comm_index(p, c);
    if (k < 0 || count_of(p.comm[k])) out.push_back(w);
  };
  if (s.head_collective > 0) {
    for (int j = 0; j < c.size; ++j)
      if (j != c.rank) behind(j, [&](const EmuCommState& pc) { return pc.collectives < s.head_collective; });
  } else {
    for (int i = 0; i < s.head_p2ps; ++i) {
      const EmuP2p& e = s.head_p2p[i];
      behind(e.peer, [&](const EmuCommState& pc) {
        return e.send ? pc.recvs[c.rank] < e.ordinal : pc.sends[c.rank] < e.ordinal;
      });
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// "send to rank 1 and recv from rank 1 (#7-#8) on 'pp'", "all_reduce #5 on 'dp'", or "no op".
std::string head_of(const EmuRankState& s) {
  if (s.head_comm < 0) return "no op on its device";
  const EmuCommState& c = s.comm[s.head_comm];
  const std::string group = fmt::format(" on group '{}'", c.name);
  if (s.head_collective > 0) return fmt::format("{} #{}{}", comm_op_name(CommOp(s.head_kind)), s.head_seq, group);
  std::string ops;
  for (int i = 0; i < s.head_p2ps; ++i) {
    const EmuP2p& e = s.head_p2p[i];
    if (i == 3) {
      ops += fmt::format(" and {} more", s.head_p2ps - 3);
      break;
    }
    ops += fmt::format("{}{} {} rank {}", i ? (i + 1 == s.head_p2ps ? " and " : ", ") : "", e.send ? "send" : "recv",
                       e.send ? "to" : "from", c.world[e.peer]);
  }
  return fmt::format("{} (#{}){}", ops, s.head_seq, group);
}

}  // namespace

std::vector<int> emu_deadlock(const std::vector<EmuRankState>& ranks, int me, std::string* report) {
  const int n = int(ranks.size());
  std::vector<std::vector<int>> edges(static_cast<size_t>(n));
  auto stuck = [&](int q) {
    const EmuRankState& s = ranks[size_t(q)];
    if (s.gone) return true;
    edges[size_t(q)] = waits_for(ranks, q);
    return s.host_waiting && s.head_comm >= 0 && !edges[size_t(q)].empty();
  };
  std::set<int> seen = {me};
  std::vector<int> todo = {me};
  while (!todo.empty()) {
    const int q = todo.back();
    todo.pop_back();
    if (!stuck(q)) return {};
    for (int w : edges[size_t(q)])
      if (seen.insert(w).second) todo.push_back(w);
  }
  std::vector<int> closure(seen.begin(), seen.end());
  if (report) {
    std::string lines;
    for (int q : closure) {
      const EmuRankState& s = ranks[size_t(q)];
      if (s.gone) {
        lines += fmt::format("; rank {} has left (it will issue nothing more)", q);
        continue;
      }
      std::string on;
      for (int w : edges[size_t(q)])
        on += fmt::format("{}rank {} ({})", on.empty() ? "" : ", ", w,
                          ranks[size_t(w)].gone ? "gone" : "at " + head_of(ranks[size_t(w)]));
      lines += fmt::format("; rank {} waits in {} for {}", q, head_of(s), on);
    }
    *report = fmt::format(
        "deadlock under NCCL's rules (parallel.comm = \"nccl-emulated\"): ranks {} wait on each other{}. Each "
        "communicator runs its ops one at a time in issue order, a device runs one NCCL op at a time, and a send or "
        "receive completes only once its peer has started the matching one: issue them in the same order on every "
        "rank, and pair a send with the receive it waits behind in one group_start()/group_end()",
        fmt::join(closure, ", "), lines);
  }
  return closure;
}

EmuBoard::EmuBoard(std::string name, int world, void* base, size_t bytes)
    : name_(std::move(name)), world_(world), base_(base), bytes_(bytes) {}

namespace {
void* board_map(const std::string& name, int world, bool create) {
  LOOM_CHECK(world <= kEmuMaxRanks, "parallel.comm = \"nccl-emulated\" runs up to {} ranks, not {}", kEmuMaxRanks,
             world);
  const int fd = ::shm_open(name.c_str(), create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  LOOM_CHECK(fd >= 0, "nccl-emulated: cannot {} shared memory {}: {}", create ? "create" : "open", name,
             std::strerror(errno));
  const size_t bytes = sizeof(EmuRankState) * size_t(world);
  if (create && ::ftruncate(fd, off_t(bytes)) != 0) {
    const int e = errno;
    ::close(fd);
    fail("nccl-emulated: cannot size shared memory {}: {}", name, std::strerror(e));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  LOOM_CHECK(p != MAP_FAILED, "nccl-emulated: cannot map shared memory {}: {}", name, std::strerror(errno));
  return p;
}
}  // namespace

std::unique_ptr<EmuBoard> EmuBoard::create(int world_size) {
  std::random_device rd;
  const std::string name = fmt::format("/loom-nccl-emu-{}-{:08x}", ::getpid(), rd());
  void* p = board_map(name, world_size, true);
  for (int r = 0; r < world_size; ++r) new (static_cast<EmuRankState*>(p) + r) EmuRankState();
  return std::unique_ptr<EmuBoard>(new EmuBoard(name, world_size, p, sizeof(EmuRankState) * size_t(world_size)));
}

std::unique_ptr<EmuBoard> EmuBoard::attach(const std::string& name, int world_size) {
  void* p = board_map(name, world_size, false);
  return std::unique_ptr<EmuBoard>(new EmuBoard(name, world_size, p, sizeof(EmuRankState) * size_t(world_size)));
}

EmuBoard::~EmuBoard() {
  unlink();
  ::munmap(base_, bytes_);
}

void EmuBoard::unlink() {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

void EmuBoard::begin_write(int rank) {
  std::atomic_ref<uint64_t> v(page(rank).version);
  v.fetch_add(1, std::memory_order_acq_rel);
  std::atomic_thread_fence(std::memory_order_release);
}

void EmuBoard::end_write(int rank) {
  std::atomic_thread_fence(std::memory_order_release);
  std::atomic_ref<uint64_t>(page(rank).version).fetch_add(1, std::memory_order_release);
}

std::vector<EmuRankState> EmuBoard::snapshot() const {
  std::vector<EmuRankState> out(static_cast<size_t>(world_));
  for (int r = 0; r < world_; ++r) {
    std::atomic_ref<uint64_t> v(page(r).version);
    // A rank that died inside a write leaves its page odd: after a while take it as it is.
    for (int tries = 0;; ++tries) {
      const uint64_t before = v.load(std::memory_order_acquire);
      if ((before & 1) && tries < (1 << 16)) {
        if (tries > 64) std::this_thread::yield();
        continue;
      }
      std::memcpy(static_cast<void*>(&out[size_t(r)]), &page(r), sizeof(EmuRankState));
      std::atomic_thread_fence(std::memory_order_acquire);
      if (v.load(std::memory_order_acquire) == before || tries >= (1 << 16)) break;
    }
  }
  return out;
}

}  // namespace loom
