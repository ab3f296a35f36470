#include "train/stop.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
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

}  // namespace loom
