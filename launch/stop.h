// Clean stops: SIGINT or SIGTERM asks training to end at the next step boundary (every rank at
// the same one), with the weights exported and metrics and trace flushed; a second signal ends
// the process at once. The flag a handler may touch is necessarily process-wide: this is the
// one piece of global state, and only the handler writes it.
#pragma once

namespace loom {

// Exit status of a run that stopped on a signal after saving what it had (EX_TEMPFAIL: try
// again later, e.g. after preemption).
constexpr int kExitStopped = 75;

// Installs the handlers for SIGINT and SIGTERM.
void stop_signals_install();
// The signal that asked for a stop (SIGINT, SIGTERM), or 0.
int stop_signal();
const char* stop_signal_name(int sig);

}  // namespace loom
