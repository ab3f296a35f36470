// The board of parallel.comm = "nccl-emulated": a shared-memory page per rank where each rank
// posts where its emulated NCCL device stands (the op it runs, how far each communicator has
// got, whether its host waits). NCCL hangs where its rules are broken; the emulation reads
// every rank's post, finds the ranks that wait on each other and names them instead.
// Every rank writes only its own page (a seqlock makes a reader's copy consistent); all ranks
// must share one node.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom {

constexpr int kEmuMaxRanks = 64;   // ranks of the job
constexpr int kEmuMaxGroups = 16;  // emulated communicators of one rank

// One communicator as a member sees it. Counts are of ops started on the device, and a
// member's k-th op of a kind matches the peer's k-th of the opposite kind (NCCL matches in
// issue order, not by tag).
struct EmuCommState {
  char name[24] = {};
  int32_t color = 0, size = 0, rank = 0;
  int32_t world[kEmuMaxRanks] = {};  // world rank of each member
  int64_t collectives = 0;           // collectives started
  int64_t sends[kEmuMaxRanks] = {};  // sends to member j started
  int64_t recvs[kEmuMaxRanks] = {};  // receives from member j started
};

// One send or receive of the op on the device: the k-th (ordinal) to or from member `peer`.
struct EmuP2p {
  int32_t peer = 0, send = 0;
  int64_t ordinal = 0;
};

struct EmuRankState {
  uint64_t version = 0;  // odd while the owner writes
  int32_t attached = 0, gone = 0;
  int32_t host_waiting = 0;  // the host blocks on one of this rank's emulated ops
  int32_t comms = 0;
  // The op the device runs (head_comm -1: idle): kind (CommOp), the communicator's sequence
  // number, and for a collective its ordinal among the communicator's collectives (else 0).
  int32_t head_comm = -1, head_kind = 0;
  int64_t head_seq = 0, head_collective = 0;
  int32_t head_p2ps = 0;
  EmuP2p head_p2p[2 * kEmuMaxRanks];
  EmuCommState comm[kEmuMaxGroups];
};

// The wait-for closure from `me`: the ranks whose device ops wait on each other (or on a
// rank that has left) with every host among them blocked, so none can move. Empty when
// something in the closure can still progress. `report` gets the verdict line.
std::vector<int> emu_deadlock(const std::vector<EmuRankState>& ranks, int me, std::string* report);

// The shared pages. create() on one rank, attach() on the rest with its name, then
// unlink() once all have attached (the mapping outlives the name).
class EmuBoard {
 public:
  static std::unique_ptr<EmuBoard> create(int world_size);
  static std::unique_ptr<EmuBoard> attach(const std::string& name, int world_size);
  ~EmuBoard();
  const std::string& name() const { return name_; }
  void unlink();
  int world() const { return world_; }
  // The owner's page, written between begin_write() and end_write().
  EmuRankState& mine(int rank) { return page(rank); }
  void begin_write(int rank);
  void end_write(int rank);
  // A consistent copy of every page.
  std::vector<EmuRankState> snapshot() const;

 private:
  EmuBoard(std::string name, int world, void* base, size_t bytes);
  EmuRankState& page(int r) const { return static_cast<EmuRankState*>(base_)[r]; }
  std::string name_;
  int world_;
  void* base_;
  size_t bytes_;
  bool linked_ = true;
};

}  // namespace loom
