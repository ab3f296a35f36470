#include "runtime/comm/hang_report.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "runtime/error.h"
#include "runtime/file.h"
#include "runtime/json_read.h"

namespace loom {

namespace fs = std::filesystem;

namespace {
std::string rank_path(const std::string& flight, int rank) {
  return flight + "/rank-" + std::to_string(rank) + ".json";
}

std::string op_at(const nlohmann::json& group, int64_t seq) {
  for (const auto& r : group["records"])
    if (r["seq"].get<int64_t>() == seq) return r["op"].get<std::string>();
  return "";
}

// Two groups of one axis can share name and members (a host group beside NCCL's, real or
// emulated): the backend tells them apart where the dump has it.
bool same_backend(const nlohmann::json& g, const std::string& backend) {
  return backend.empty() || !g.contains("backend") || g["backend"] == backend;
}

// The dump's record of group `name` over `members` (on `backend`), or null.
const nlohmann::json* group_in(const nlohmann::json& dump, const std::string& name, const std::vector<int>& members,
                               const std::string& backend) {
  for (const auto& g : dump["groups"])
    if (g["name"] == name && g["world_ranks"].get<std::vector<int>>() == members && same_backend(g, backend)) return &g;
  return nullptr;
}

// "itself waiting in all_reduce #5 on 'tp'" for a rank whose watchdog fired, or "".
std::string waiting_in(const nlohmann::json& dump) {
  if (!dump.contains("timed_out")) return "";
  const auto& t = dump["timed_out"];
  const std::string backend = t.value("backend", "");
  std::string op;
  for (const auto& g : dump["groups"])
    if (g["name"] == t["group"] && same_backend(g, backend)) op = op_at(g, t["seq"].get<int64_t>());
  return fmt::format("itself waiting in {} #{} on '{}'", op.empty() ? "op" : op, t["seq"].get<int64_t>(),
                     t["group"].get<std::string>());
}
// Flight records are best effort (the verdict on stderr is what counts): a log.dir that
// refuses one loses that record only.
void record_write(const std::string& path, const std::string& text) {
  try {
    file_write_atomic(
        path, [&](std::FILE* f) { file_write(f, text.data(), text.size(), path); }, "log.dir");
  } catch (const Error& e) {
    std::fprintf(stderr, "warning: %s\n", e.what());
  }
}
}  // namespace

HangReport::HangReport(std::string dir, int world_rank, double wait_s)
    : dir_(std::move(dir)), rank_(world_rank), wait_s_(wait_s) {
  // An earlier run's records (a restart writes to the same log.dir) would pass for this one's,
  // and its lock would keep this run from judging: rank 0 moves them aside at start-up, long
  // before any collective can time out.
  if (dir_.empty() || rank_ != 0) return;
  std::error_code ec;
  if (!fs::exists(dir_ + "/flight", ec)) return;
  fs::remove_all(dir_ + "/flight.prev", ec);
  fs::rename(dir_ + "/flight", dir_ + "/flight.prev", ec);
}

nlohmann::json HangReport::dump(const ProcessGroup* timed, int64_t seq, double waited) const {
  nlohmann::json j;
  j["rank"] = rank_;
  if (timed)
    j["timed_out"] = {{"group", timed->name()}, {"backend", timed->backend()}, {"seq", seq}, {"waited_s", waited}};
  j["groups"] = nlohmann::json::array();
  for (const ProcessGroup* g : groups_) {
    nlohmann::json recs = nlohmann::json::array();
    for (const OpRecord& r : g->recorder().records())
      recs.push_back({{"seq", r.seq},
                      {"op", comm_op_name(r.op)},
                      {"bytes", r.bytes},
                      {"peer", r.peer},
                      {"issued", r.issued},
                      {"started", r.started},
                      {"finished", r.finished}});
    j["groups"].push_back({{"name", g->name()},
                           {"backend", g->backend()},
                           {"world_ranks", g->world_ranks()},
                           {"issued", g->recorder().last_issued()},
                           {"records", recs}});
  }
  return j;
}

void HangReport::timed_out(const ProcessGroup& g, int64_t seq, double waited) {
  if (dir_.empty()) return;
  const std::string flight = dir_ + "/flight";
  std::error_code ec;
  fs::create_directories(flight, ec);
  {
    // Two groups may time out at once: each writes its own temporary.
    const std::string tmp = rank_path(flight, rank_) + "." + g.name();
    record_write(tmp, dump(&g, seq, waited).dump(1) + "\n");
    fs::rename(tmp, rank_path(flight, rank_), ec);
  }
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration<double>(wait_s_);
  // Every rank this one shares a group with (the world group among them: all of them), so
  // that a wait can be followed to the rank at its root.
  std::set<int> everyone;
  for (const ProcessGroup* h : groups_) everyone.insert(h->world_ranks().begin(), h->world_ranks().end());
  auto all_there = [&] {
    for (int r : everyone)
      if (!fs::exists(rank_path(flight, r))) return false;
    return true;
  };
  while (!all_there() && clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const int lock = ::open((flight + "/verdict.lock").c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
  if (lock < 0) {  // another rank judges; give it time to print before this one ends the job
    const auto until = clock::now() + std::chrono::duration<double>(wait_s_ + 2.0);
    while (!fs::exists(flight + "/verdict.txt") && clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return;
  }
  ::close(lock);
  std::map<int, nlohmann::json> dumps;
  for (int r : everyone) {
    std::ifstream in(rank_path(flight, r));
    if (!in) continue;
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!json_depth_problem(text).empty()) continue;  // no record loom writes nests deep
    try {
      dumps[r] = nlohmann::json::parse(text);
    } catch (const std::exception&) {
    }
  }
  const std::string line = hang_verdict(g.name(), g.world_ranks(), seq, waited, dumps,
                                        std::vector<int>(everyone.begin(), everyone.end()), g.backend()) +
                           " (records: " + flight + ")";
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  record_write(flight + "/verdict.txt", line + "\n");
  // Which run of a supervised job judged (loom supervise reads it: a late verdict from an
  // earlier run's straggler must not end the run after it).
  const char* restart = std::getenv("LOOM_RESTART");
  record_write(flight + "/verdict.run", std::string(restart ? restart : "0") + "\n");
}

std::string hang_verdict(const std::string& group, const std::vector<int>& members, int64_t seq, double waited,
                         const std::map<int, nlohmann::json>& dumps, const std::vector<int>& everyone,
                         const std::string& backend) {
  std::string op, never, other, reached;
  auto add = [](std::string& list, const std::string& s) { list += (list.empty() ? "" : ", ") + s; };
  // Point-to-point ops: sequence numbers are each rank's own (a middle pipeline stage issues
  // twice an end stage's), so the verdict is about the one peer.
  for (int r : members) {
    auto it = dumps.find(r);
    if (it == dumps.end() || !it->second.contains("timed_out")) continue;
    const auto& t = it->second["timed_out"];
    const nlohmann::json* g = group_in(it->second, group, members, backend);
    if (t["group"] != group || t["seq"].get<int64_t>() != seq || !g) continue;
    // The op as the ranks whose watchdog fired see it.
    if (op.empty()) op = op_at(*g, seq);
    for (const auto& rec : (*g)["records"]) {
      if (rec["seq"].get<int64_t>() != seq) continue;
      const std::string kind = rec["op"].get<std::string>();
      if (kind != "send" && kind != "recv") break;
      const int peer = members.at(size_t(rec["peer"].get<int>()));
      std::string why = "no record: dead, or stuck outside communication";
      if (auto pd = dumps.find(peer); pd != dumps.end()) {
        const std::string w = waiting_in(pd->second);
        why = w.empty() ? "it wrote a record" : w;
      }
      std::string out = fmt::format(
          "hang verdict: {} #{} on group '{}' (rank {}) has waited {:.0f} s: its peer, rank {}, never {} it ({})", kind,
          seq, group, r, waited, peer, kind == "recv" ? "sent" : "received", why);
      std::string silent;
      for (int q : everyone)
        if (!dumps.count(q) && q != peer) add(silent, std::to_string(q));
      if (!silent.empty()) out += "; no record from rank " + silent + " either";
      return out;
    }
  }
  for (int r : members) {
    auto it = dumps.find(r);
    if (it == dumps.end()) {
      add(never, fmt::format("rank {} (no record: dead, or stuck outside communication)", r));
      continue;
    }
    const nlohmann::json* mine = group_in(it->second, group, members, backend);
    if (!mine) {
      add(never, fmt::format("rank {} (no record of the group)", r));
      continue;
    }
    const int64_t issued = (*mine)["issued"].get<int64_t>();
    const std::string at = op_at(*mine, seq);
    if (issued < seq) {
      const std::string last = op_at(*mine, issued);
      std::string waits = waiting_in(it->second);  // where that rank is stuck instead
      if (!waits.empty()) waits = "; " + waits;
      add(never,
          fmt::format("rank {} (its last op there is #{}{}{})", r, issued, last.empty() ? "" : " " + last, waits));
    } else if (op.empty() && !at.empty()) {
      op = at;
      add(reached, std::to_string(r));
    } else if (!at.empty() && at != op) {
      add(other, fmt::format("rank {} ({} there)", r, at));
    } else {
      add(reached, std::to_string(r));
    }
  }
  std::string out =
      fmt::format("hang verdict: {} #{} on group '{}' has waited {:.0f} s", op.empty() ? "op" : op, seq, group, waited);
  if (!never.empty()) out += ": never reached by " + never;
  if (!other.empty())
    out += (never.empty() ? ": " : "; ") + std::string("a different op at #") + std::to_string(seq) + " on " + other;
  if (never.empty() && other.empty()) out += ": every member reached it (a stall inside the collective)";
  if (!reached.empty()) out += "; waiting in it: rank " + reached;
  // The root of a chain of waits: ranks of the job that wrote no record at all.
  std::string silent;
  for (int r : everyone)
    if (!dumps.count(r) && std::find(members.begin(), members.end(), r) == members.end())
      add(silent, std::to_string(r));
  if (!silent.empty()) out += "; no record from rank " + silent + " (dead, or stuck outside communication)";
  return out;
}

}  // namespace loom
