#include "launch/elastic.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "runtime/error.h"
#include "runtime/launch_env.h"

namespace loom {

namespace {
void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}
}  // namespace

std::vector<Host> hosts_parse(const std::string& list) {
  std::vector<Host> out;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    Host h;
    const size_t colon = item.rfind(':');
    h.name = item.substr(0, colon);
    if (colon != std::string::npos) {
      const std::string n = item.substr(colon + 1);
      char* end = nullptr;
      const long v = std::strtol(n.c_str(), &end, 10);
      LOOM_CHECK(!n.empty() && *end == '\0' && v >= 1 && v <= 4096,
                 "--hosts: '{}' is not NAME:SLOTS with SLOTS a number of ranks from 1 to 4096", item);
      h.slots = int(v);
    }
    LOOM_CHECK(!h.name.empty(), "--hosts: an entry without a host name in '{}'", list);
    for (const Host& o : out) LOOM_CHECK(o.name != h.name, "--hosts: '{}' is listed twice", h.name);
    out.push_back(h);
  }
  LOOM_CHECK(!out.empty(), "--hosts: no hosts in '{}'; give NAME:SLOTS,...", list);
  return out;
}

std::string hosts_str(const std::vector<Host>& hosts) {
  std::string out;
  for (const Host& h : hosts) out += fmt::format("{}{}:{}", out.empty() ? "" : ",", h.name, h.slots);
  return out;
}

std::vector<Host> slurm_slots(const std::vector<std::string>& names, const std::string& ntasks_per_node,
                              const std::string& tasks_per_node) {
  std::vector<Host> out;
  for (size_t i = 0; i < names.size(); ++i) {
    const int slots =
        !ntasks_per_node.empty() ? std::atoi(ntasks_per_node.c_str()) : slurm_tasks_on_node(tasks_per_node, int(i));
    LOOM_CHECK(slots >= 1,
               "loom supervise: Slurm gives node {} ({}) no tasks (SLURM_NTASKS_PER_NODE '{}', "
               "SLURM_TASKS_PER_NODE '{}')",
               i, names[i], ntasks_per_node, tasks_per_node);
    out.push_back({names[i], slots});
  }
  return out;
}

std::vector<Host> hosts_from_slurm() {
  const char* nodes = std::getenv("SLURM_JOB_NODELIST");
  LOOM_CHECK(nodes && *nodes,
             "loom supervise --ranks: no --hosts given and no Slurm allocation (SLURM_JOB_NODELIST) to take them from");
  FILE* p = ::popen(fmt::format("scontrol show hostnames '{}'", nodes).c_str(), "r");
  LOOM_CHECK(p, "loom supervise: cannot run scontrol to list the allocation's hosts");
  std::vector<std::string> names;
  char line[1024];
  while (std::fgets(line, sizeof line, p)) {
    std::string name(line);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    if (!name.empty()) names.push_back(name);
  }
  const int rc = ::pclose(p);
  LOOM_CHECK(rc == 0 && !names.empty(), "loom supervise: `scontrol show hostnames {}` failed", nodes);
  auto env = [](const char* k) {
    const char* v = std::getenv(k);
    return std::string(v ? v : "");
  };
  return slurm_slots(names, env("SLURM_NTASKS_PER_NODE"), env("SLURM_TASKS_PER_NODE"));
}

void elastic_check(ElasticOptions& o, const std::vector<std::string>& command) {
  bool placeholders = false;
  for (const std::string& w : command)
    for (const char* p : {"{ranks}", "{dp}", "{hosts}", "{nodelist}"})
      placeholders = placeholders || w.find(p) != std::string::npos;
  if (!o.enabled()) {
    LOOM_CHECK(
        !placeholders && o.hosts.empty() && o.probe.empty(),
        "loom supervise: {{ranks}}, {{dp}}, {{hosts}}, --hosts and --probe belong to an elastic job: add --ranks "
        "MIN:MAX");
    return;
  }
  LOOM_CHECK(o.replica >= 1, "--replica {} must be at least 1 (ranks per data-parallel replica: tp x pp x cp)",
             o.replica);
  LOOM_CHECK(o.min_ranks >= 1 && o.min_ranks <= o.max_ranks, "--ranks {}:{} needs 1 <= MIN <= MAX", o.min_ranks,
             o.max_ranks);
  LOOM_CHECK(o.max_ranks >= o.replica && o.max_ranks / o.replica * o.replica >= o.min_ranks,
             "--ranks {}:{} holds no multiple of --replica {}", o.min_ranks, o.max_ranks, o.replica);
  LOOM_CHECK(placeholders,
             "loom supervise --ranks: the command names no {{ranks}}, {{dp}}, {{hosts}} or {{nodelist}}, so no "
             "relaunch could change "
             "its layout; e.g. mpirun --host {{hosts}} -np {{ranks}} loom train --set parallel.dp={{dp}} ...");
  LOOM_CHECK(o.probe_s > 0, "--probe-s {} must be positive", o.probe_s);
  if (o.hosts.empty()) {
    o.hosts = hosts_from_slurm();
    // --overlap: the probe runs beside a step still ending on the host.
    if (o.probe.empty()) o.probe = "srun --overlap --nodes=1 --ntasks=1 --nodelist={host} true";
  }
}

std::vector<std::string> command_fill(const std::vector<std::string>& command, int ranks, int dp,
                                      const std::string& hosts, const std::string& nodelist) {
  std::vector<std::string> out = command;
  for (std::string& w : out) {
    replace_all(w, "{ranks}", std::to_string(ranks));
    replace_all(w, "{dp}", std::to_string(dp));
    replace_all(w, "{hosts}", hosts);
    replace_all(w, "{nodelist}", nodelist);
  }
  return out;
}

std::string nodelist_str(const std::vector<Host>& hosts) {
  std::string out;
  for (const Host& h : hosts) out += (out.empty() ? "" : ",") + h.name;
  return out;
}

std::vector<std::string> train_part(const std::vector<std::string>& command) {
  for (size_t i = 0; i + 1 < command.size(); ++i) {
    const std::string& w = command[i];
    const bool loom = w == "loom" || (w.size() > 5 && w.compare(w.size() - 5, 5, "/loom") == 0);
    if (loom && command[i + 1] == "train") return {command.begin() + long(i), command.end()};
  }
  return {};
}

namespace {
// Runs argv with no input (its output to `out`, or nowhere; launcher variables dropped where
// `bare`, so that a loom it runs is one process whatever launched the supervisor); its exit
// status, or -1 past timeout_s (then killed).
int run_quiet(const std::vector<std::string>& argv, double timeout_s, const std::string& out = "", bool bare = false) {
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    ::setpgid(0, 0);
    const int null = ::open("/dev/null", O_RDWR);
    const int o = out.empty() ? null : ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(null, 0), ::dup2(o < 0 ? null : o, 1), ::dup2(null, 2);
    if (bare) {
      std::vector<std::string> drop;
      for (char** e = environ; *e; ++e) {
        const std::string kv = *e;
        for (const char* p : {"OMPI_", "PMI_", "PMIX_", "SLURM_"})
          if (kv.rfind(p, 0) == 0) drop.push_back(kv.substr(0, kv.find('=')));
      }
      for (const auto& k : drop) ::unsetenv(k.c_str());
    }
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execvp(a[0], a.data());
    std::_Exit(127);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    int ws = 0;
    const pid_t r = ::waitpid(pid, &ws, WNOHANG);
    if (r == pid) return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    if (r < 0 && errno != EINTR) return -1;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &ws, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}
}  // namespace

bool host_answers(const ElasticOptions& o, const std::string& host) {
  if (o.probe.empty()) return true;
  std::string cmd = o.probe;
  replace_all(cmd, "{host}", host);
  return run_quiet({"/bin/sh", "-c", cmd}, o.probe_s) == 0;
}

int elastic_ranks(const ElasticOptions& o, const std::vector<Host>& alive, const std::function<bool(int)>& fits) {
  int slots = 0;
  for (const Host& h : alive) slots += h.slots;
  for (int r = std::min(o.max_ranks, slots) / o.replica * o.replica; r >= o.min_ranks && r > 0; r -= o.replica)
    if (fits(r)) return r;
  return 0;
}

std::vector<Host> hosts_take(const std::vector<Host>& alive, int ranks) {
  std::vector<Host> out;
  for (const Host& h : alive) {
    if (ranks <= 0) break;
    out.push_back({h.name, std::min(h.slots, ranks)});
    ranks -= h.slots;
  }
  return out;
}

// The trainer's own check of a layout: the config resolves, and the mesh it describes is the
// world and the replica asked for (dp x tp x pp = ranks, tp x pp = replica).
bool elastic_fits(const std::vector<std::string>& command, int ranks, int dp, double timeout_s) {
  std::vector<std::string> train = train_part(command_fill(command, ranks, dp, "", ""));
  if (train.empty()) return true;  // nothing to ask: the launch will say
  train.push_back("--print-config");
  char tmpl[] = "/tmp/loom-fit-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  if (fd >= 0) ::close(fd);
  const int rc = run_quiet(train, timeout_s, tmpl, /*bare=*/true);
  std::ifstream in(tmpl);
  std::map<std::string, int> mesh = {{"dp", 1}, {"tp", 1}, {"pp", 1}, {"cp", 1}};
  std::string line;
  bool parallel = false;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '[') parallel = line == "[parallel]";
    for (auto& [k, v] : mesh)
      if (parallel && line.rfind(k + " = ", 0) == 0) v = std::atoi(line.c_str() + k.size() + 3);
  }
  ::unlink(tmpl);
  if (rc == 2) return false;  // the config refuses it (say, a global batch dp does not divide)
  if (rc != 0) {
    spdlog::warn("supervise: could not ask the run's config about {} ({} exited {}); trusting the layout",
                 plural(ranks, "rank"), train.front(), rc);
    return true;
  }
  const int replica = mesh["tp"] * mesh["pp"] * mesh["cp"];
  if (mesh["dp"] * replica != ranks) {
    spdlog::warn("supervise: at {} the run's config has dp {} x tp {} x pp {} x cp {}: give it parallel.dp={{dp}}",
                 plural(ranks, "rank"), mesh["dp"], mesh["tp"], mesh["pp"], mesh["cp"]);
    return false;
  }
  return true;
}

}  // namespace loom
