#include "launch/supervise.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "launch/log_dir.h"
#include "runtime/error.h"
#include "runtime/file.h"
#include "train/fault.h"

namespace loom {

namespace {
volatile std::sig_atomic_t g_asked = 0;  // the signal the supervisor got
// The signals that stop the supervisor, each passed on to the job.
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};

extern "C" void note_signal(int sig) {
  g_asked = sig;
}

// The processes below `root` that started none of their own (from /proc): the ranks, and not
// a launcher between (a wrapper's mpirun kills its ranks when signalled).
std::vector<pid_t> descendants(pid_t root) {
  std::map<pid_t, pid_t> parent;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    const size_t close = stat.rfind(')');  // the command may hold spaces and parentheses
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    parent[pid_t(std::stol(name))] = ppid;
  }
  std::set<pid_t> parents;
  for (auto [pid, ppid] : parent) parents.insert(ppid);
  std::vector<pid_t> out;
  for (auto [pid, ppid] : parent) {
    if (parents.count(pid)) continue;
    for (pid_t up = ppid; up > 1; up = parent.count(up) ? parent[up] : 0)
      if (up == root) {
        out.push_back(pid);
        break;
      }
  }
  return out;
}

// A stop for the job: to the processes the launcher started (the ranks: they stop at a step
// boundary and checkpoint, where a launcher given the signal may kill them at once), or to the
// launcher itself when it started none here (srun's tasks run under Slurm's daemons).
void stop_job(pid_t child, int sig) {
  const std::vector<pid_t> below = descendants(child);
  if (below.empty()) ::kill(child, sig);
  for (pid_t p : below) ::kill(p, sig);
}

std::string status_meaning(int status) {
  switch (status) {
    case 0:
      return "success";
    case 2:
      return "a usage or config error";
    case 3:
      return "a rank exited with an error";
    case 4:
      return "a collective timed out (the watchdog ended the job)";
    case 5:
      return "the run diverged: not restarted (it would diverge again)";
    case 74:
      return "an I/O failure (a checkpoint could not be written)";
    case 75:
      return "stopped by a signal (preemption): requeue";
    default:
      if (status > 128) return fmt::format("a process was killed by signal {}", status - 128);
      return "a failure";
  }
}
}  // namespace

bool status_restartable(int status) {
  // 126/127: the shell could not run the command (not executable, not found): a restart runs
  // the same nothing.
  // 5: the run diverged, and the same config diverges the same way again.
  return status != 0 && status != 2 && status != 5 && status != 126 && status != 127;
}

namespace {
// The command of the next run: as given, or (elastic) filled with the layout the hosts that
// answer now can take; empty when they cannot take --ranks' minimum.
std::vector<std::string> command_now(const std::vector<std::string>& command, const SuperviseOptions& opt,
                                     int restart) {
  const ElasticOptions& e = opt.elastic;
  if (!e.enabled()) return command;
  std::vector<Host> alive;
  std::vector<std::string> lost;
  for (const Host& h : e.hosts) {
    if (host_answers(e, h.name))
      alive.push_back(h);
    else
      lost.push_back(h.name);
  }
  const int ranks = elastic_ranks(e, alive, [&](int r) { return elastic_fits(command, r, r / e.replica, 120); });
  const std::string lost_list = lost.empty() ? "none" : fmt::format("{}", fmt::join(lost, ", "));
  event_append(opt.log_dir, "layout",
               fmt::format(R"("restart":{},"ranks":{},"dp":{},"hosts":"{}","lost":{})", restart, ranks,
                           ranks / e.replica, hosts_str(hosts_take(alive, ranks)), lost.size()));
  if (!ranks) {
    int slots = 0;
    for (const Host& h : alive) slots += h.slots;
    spdlog::error(
        "supervise: the hosts that answer ({}: {} slots; lost: {}) hold no layout of {} to {} ranks (multiples of "
        "--replica {}) that the run's config accepts",
        hosts_str(alive), slots, lost_list, e.min_ranks, e.max_ranks, e.replica);
    return {};
  }
  spdlog::info("supervise: {} (dp {}) on {}; hosts lost: {}", plural(ranks, "rank"), ranks / e.replica,
               hosts_str(hosts_take(alive, ranks)), lost_list);
  const std::vector<Host> used = hosts_take(alive, ranks);
  return command_fill(command, ranks, ranks / e.replica, hosts_str(used), nodelist_str(used));
}

// Whether run `restart` of the job has written its hang verdict (in its log.dir's flight
// directory, naming the run that judged).
bool verdict_of(const std::string& given, int restart) {
  // The run writes the newest of log.dir's numbered family (launch/log_dir.h): another run's
  // logs in log.dir move a new run to log.dir-2.
  const std::vector<std::string> family = log_dir_family(given);
  const std::string log_dir = family.empty() ? given : family.back();
  std::ifstream in(log_dir + "/flight/verdict.run");
  int run = -1;
  return in >> run && run == restart && std::filesystem::exists(log_dir + "/flight/verdict.txt");
}
}  // namespace

// What is left of a run once its launcher is gone (a launcher killed outright leaves its ranks
// running, holding log.dir's lock and saving checkpoints): the supervisor is their subreaper,
// so they are its descendants; each is killed and reaped before the next run starts.
void end_leftovers() {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    const std::vector<pid_t> left = descendants(::getpid());
    if (left.empty()) return;
    if (std::chrono::steady_clock::now() > until) {
      spdlog::warn("supervise: {} of the previous run do not end (pid {}, ...)", plural(left.size(), "process"),
                   left.front());
      return;
    }
    for (pid_t p : left) ::kill(p, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// One run of the command: its status (4 where the supervisor ended a launcher that outlived its
// job's hang verdict).
int run_once(const std::vector<std::string>& run, const SuperviseOptions& opt, int restart) {
  const auto t0 = std::chrono::steady_clock::now();
  event_append(opt.log_dir, "start", fmt::format("\"restart\":{}", restart));
  spdlog::info("supervise: run {} (LOOM_RESTART={}): {}", restart + 1, restart, fmt::join(run, " "));
  // A signal before the child exists would reach no one: hold them until it does (a stop
  // asked for meanwhile is passed on by the wait below).
  sigset_t stop, old;
  sigemptyset(&stop);
  for (int sig : kStopSignals) sigaddset(&stop, sig);
  sigprocmask(SIG_BLOCK, &stop, &old);
  const pid_t pid = ::fork();
  if (pid < 0) sigprocmask(SIG_SETMASK, &old, nullptr);
  LOOM_CHECK(pid >= 0, "loom supervise: fork failed");
  if (pid == 0) {
    sigprocmask(SIG_SETMASK, &old, nullptr);
    // Its own process group: a signal reaches the launcher and what stays in its group (Open
    // MPI puts its ranks in groups of their own; it ends them itself).
    ::setpgid(0, 0);
    ::setenv("LOOM_RESTART", std::to_string(restart).c_str(), 1);
    std::vector<char*> argv;
    for (const auto& a : run) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "error: loom supervise: cannot run '%s'\n", argv[0]);
    std::_Exit(127);
  }
  ::setpgid(pid, pid);
  sigprocmask(SIG_SETMASK, &old, nullptr);
  int ws = 0;
  bool passed = false, ended = false;
  double verdict_at = -1;  // seconds into the run when its hang verdict was seen
  for (;;) {
    if (g_asked && !passed) {
      // The ranks stop cleanly on INT, TERM and USR1; a hangup goes on as TERM.
      stop_job(pid, g_asked == SIGHUP ? SIGTERM : int(g_asked));
      passed = true;
    }
    const pid_t r = ::waitpid(pid, &ws, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) break;
    const double now = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (verdict_at < 0 && !opt.log_dir.empty() && verdict_of(opt.log_dir, restart)) verdict_at = now;
    if (verdict_at >= 0 && !ended && now - verdict_at > opt.verdict_grace_s && verdict_of(opt.log_dir, restart)) {
      spdlog::warn(
          "supervise: the launcher is still running {:.0f} s after its job's hang verdict (ranks it cannot "
          "reach, or a dead link); ending it",
          now - verdict_at);
      stop_job(pid, SIGKILL);
      ::kill(-pid, SIGKILL);
      ended = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(-pid, SIGKILL);  // whatever the command left behind in its group
  end_leftovers();        // and outside it (Open MPI's ranks have groups of their own)
  const int status = ended ? 4 : WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  event_append(opt.log_dir, "exit", fmt::format("\"restart\":{},\"status\":{}", restart, status));
  spdlog::info("supervise: run {} ended with status {} ({}) after {:.1f} s", restart + 1, status,
               status_meaning(status), took);
  return status;
}

int supervise_run(const std::vector<std::string>& command, const SuperviseOptions& opt) {
  LOOM_CHECK(!command.empty(), "loom supervise: no command; usage: loom supervise [options] -- COMMAND...");
  LOOM_CHECK(opt.max_restarts >= 0, "--max-restarts {} must be >= 0", opt.max_restarts);
  if (!opt.log_dir.empty()) {
    // Its events go to <dir>/faults.jsonl: a file there would drop every one of them unseen.
    std::error_code ec;
    const auto st = std::filesystem::status(opt.log_dir, ec);
    LOOM_CHECK(!std::filesystem::exists(st) || std::filesystem::is_directory(st),
               "loom supervise: --log-dir '{}' is {}, not a directory; give the run's log.dir (a directory, or a "
               "name not yet taken)",
               opt.log_dir, std::filesystem::is_regular_file(st) ? "a regular file" : "not a directory");
    // And writable, now: the events are appended best effort later, and an immutable directory or
    // a name too long dropped every one of them with status 0.
    try {
      ::close(output_open(opt.log_dir + "/faults.jsonl", false, "loom supervise --log-dir"));
    } catch (const Error& e) {
      fail("loom supervise: --log-dir '{}' cannot hold its faults.jsonl: {}", opt.log_dir, e.what());
    }
  }
  // Processes a run leaves behind when its launcher is killed become the supervisor's children,
  // for it to end before the next run (otherwise init's, out of reach).
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  struct sigaction sa {};
  sa.sa_handler = note_signal;  // no SA_RESTART: waitpid returns, and the loop passes the stop on
  sigemptyset(&sa.sa_mask);
  // A hangup (the terminal or ssh session gone) and SIGUSR1 (a scheduler's warning) stop the job
  // as SIGTERM does: by default either would end the supervisor at once and leave the job, in a
  // process group of its own, running without it.
  for (int sig : kStopSignals) sigaction(sig, &sa, nullptr);
  int status = 0;
  for (int restart = 0;; ++restart) {
    const std::vector<std::string> run = command_now(command, opt, restart);
    if (run.empty()) return restart == 0 ? 2 : status;
    if (g_asked) return 75;  // stopped while the hosts were probed: a requeue will resume it
    if (run.empty()) {
      if (restart == 0) return 2;  // nothing ran, and nothing could
    } else {
      status = run_once(run, opt, restart);
    }
    if (g_asked) {
      // Stopped from outside (a preemption): ask for a requeue, whatever status the launcher
      // turned the ranks' 75 into (mpirun's is 1).
      spdlog::info("supervise: stopped by signal {}; not restarting", int(g_asked));
      return status == 0 ? 0 : 75;
    }
    if (!status_restartable(status)) return status;
    if (restart >= opt.max_restarts) {
      spdlog::error("supervise: {} used (--max-restarts {}); giving up with status {}", plural(restart, "restart"),
                    opt.max_restarts, status);
      return status;
    }
    const double wait = std::min(60.0, opt.backoff_s * std::pow(2.0, restart));
    spdlog::info("supervise: restarting in {:.1f} s ({} of {})", wait, restart + 1, opt.max_restarts);
    // In short naps, so that a stop ends the wait (sleep_for resumes after a signal).
    using Clock = std::chrono::steady_clock;
    const Clock::time_point until =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait));
    while (!g_asked && Clock::now() < until)
      std::this_thread::sleep_for(std::min<Clock::duration>(until - Clock::now(), std::chrono::milliseconds(50)));
    if (g_asked) return 75;  // stopped while waiting to restart: a requeue will resume it
  }
}

}  // namespace loom
