#include "launch/supervise.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <thread>

#include "launch/fault.h"
#include "runtime/error.h"
#include "runtime/file.h"

namespace loom {

namespace {
volatile std::sig_atomic_t g_child = 0;  // the running command's process group
volatile std::sig_atomic_t g_asked = 0;  // the signal the supervisor got

extern "C" void forward_signal(int sig) {
  g_asked = sig;
  if (g_child > 0) ::kill(-pid_t(g_child), sig);
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
  return status != 0 && status != 2;
}

int supervise_run(const std::vector<std::string>& command, const SuperviseOptions& opt) {
  LOOM_CHECK(!command.empty(), "loom supervise: no command; usage: loom supervise [options] -- COMMAND...");
  LOOM_CHECK(opt.max_restarts >= 0, "--max-restarts {} must be >= 0", opt.max_restarts);
  std::signal(SIGINT, forward_signal);
  std::signal(SIGTERM, forward_signal);
  int status = 0;
  for (int restart = 0;; ++restart) {
    const auto t0 = std::chrono::steady_clock::now();
    event_append(opt.log_dir, "start", fmt::format("\"restart\":{}", restart));
    spdlog::info("supervise: run {} (LOOM_RESTART={}): {}", restart + 1, restart, fmt::join(command, " "));
    const pid_t pid = ::fork();
    LOOM_CHECK(pid >= 0, "loom supervise: fork failed");
    if (pid == 0) {
      ::setpgid(0, 0);  // its own process group: signals and the final cleanup reach all of it
      ::setenv("LOOM_RESTART", std::to_string(restart).c_str(), 1);
      std::vector<char*> argv;
      for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      std::fprintf(stderr, "error: loom supervise: cannot run '%s'\n", argv[0]);
      std::_Exit(127);
    }
    ::setpgid(pid, pid);
    g_child = pid;
    int ws = 0;
    while (::waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    g_child = 0;
    ::kill(-pid, SIGKILL);  // whatever the command left behind
    status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    event_append(opt.log_dir, "exit", fmt::format("\"restart\":{},\"status\":{}", restart, status));
    spdlog::info("supervise: run {} ended with status {} ({}) after {:.1f} s", restart + 1, status,
                 status_meaning(status), took);
    if (g_asked) {
      spdlog::info("supervise: stopped by signal {}; not restarting", int(g_asked));
      return status;
    }
    if (!status_restartable(status)) return status;
    if (restart >= opt.max_restarts) {
      spdlog::error("supervise: {} restarts used (--max-restarts {}); giving up with status {}", restart,
                    opt.max_restarts, status);
      return status;
    }
    const double wait = std::min(60.0, opt.backoff_s * std::pow(2.0, restart));
    spdlog::info("supervise: restarting in {:.1f} s ({} of {})", wait, restart + 1, opt.max_restarts);
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    if (g_asked) return status;
  }
}

}  // namespace loom
