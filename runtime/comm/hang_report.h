// The hang verdict. When a group's watchdog finds an op pending past parallel.timeout_s,
// every rank that can writes its flight records (the last ops of each of its groups) to
// <dir>/flight/rank-R.json; the first rank to create <dir>/flight/verdict.lock then reads
// the records of the group's members and prints one line naming the group, the op and its
// sequence number, and the ranks that never reached it (no record: dead, or stuck outside
// communication) or reached a different op there (a mismatch). The files need a log.dir that
// every rank sees (one node, or a shared file system).
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/comm/process_group.h"

namespace loom {

class HangReport {
 public:
  // wait_s: how long a rank waits for its peers' records before judging.
  HangReport(std::string dir, int world_rank, double wait_s = 3.0);
  void add(const ProcessGroup* g) { groups_.push_back(g); }
  // From the watchdog of `g`, whose op `seq` has waited `waited` seconds; returns when the
  // verdict is out (the caller then ends the job).
  void timed_out(const ProcessGroup& g, int64_t seq, double waited);
  // This rank's records as JSON (what rank-R.json holds).
  nlohmann::json dump(const ProcessGroup* timed, int64_t seq, double waited) const;

 private:
  std::string dir_;
  int rank_;
  double wait_s_;
  std::vector<const ProcessGroup*> groups_;
};

// The verdict line for op `seq` of group `group` (world ranks `members`) from the records of
// the ranks that wrote one (world rank -> dump), `waited` seconds after it was started. A
// member that never reached the op and is itself waiting elsewhere says where; ranks of
// `everyone` outside the group that wrote nothing are named as the root of the wait. `backend`
// picks the group among those of one name and members (a host group beside NCCL's); empty:
// the first.
std::string hang_verdict(const std::string& group, const std::vector<int>& members, int64_t seq, double waited,
                         const std::map<int, nlohmann::json>& dumps, const std::vector<int>& everyone = {},
                         const std::string& backend = "");

}  // namespace loom
