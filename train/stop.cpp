#include "train/stop.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

namespace loom {

namespace {
volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_signal(int sig) {
  if (g_signal) {  // the second one: end now
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_signal = sig;
}
}  // namespace

void stop_signals_install(double grace_s) {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGUSR1, on_signal);
  if (grace_s <= 0) return;
  // The scheduler kills a preempted job after its grace period anyway: end on our terms, with
  // the status that asks for a requeue (a save not yet committed leaves the last one intact).
  std::thread([grace_s] {
    while (!g_signal) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::this_thread::sleep_for(std::chrono::duration<double>(grace_s));
    std::fprintf(stderr,
                 "error: %s arrived %.0f s ago (fault.grace_s) and the run has not ended; exiting with status 75 "
                 "(the last committed checkpoint is intact)\n",
                 stop_signal_name(g_signal), grace_s);
    std::fflush(stderr);
    std::_Exit(kExitStopped);
  }).detach();
}

int stop_signal() {
  return g_signal;
}

const char* stop_signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "a signal";
}

std::string stop_cause(int sig) {
  const char* file = std::getenv("LOOM_STOP_CAUSE");
  if (sig != SIGUSR1 || !file || !*file) return stop_signal_name(sig);
  // A short line from a regular file (never a FIFO that would block the end of the run); the
  // script's host may not be rank 0's, and then the file is not there.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(std::filesystem::symlink_status(file, ec)))
    return "SIGUSR1 (launch/mpirun.sh passes a Ctrl-C or SIGTERM on as SIGUSR1)";
  std::string cause;
  std::ifstream in(file);
  std::getline(in, cause);
  return cause.empty() || cause.size() > 80 ? "SIGUSR1" : cause;  // empty: not the script's doing
}

}  // namespace loom
