#include "launch/stop.h"

#include <csignal>

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

void stop_signals_install() {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
}

int stop_signal() {
  return g_signal;
}

const char* stop_signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
}

}  // namespace loom
