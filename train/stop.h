// Clean stops: SIGINT, SIGTERM or SIGUSR1 asks training to end at the next step boundary (every
// rank at the same one), with the weights exported and metrics and trace flushed; a second
// signal ends the process at once. SIGUSR1 is the one launchers pass on to every rank: Open
// MPI's mpirun answers SIGINT/SIGTERM by killing its ranks (SIGTERM, SIGKILL a second later) but
// forwards SIGUSR1, which launch/mpirun.sh sends it on Ctrl-C. The flag a handler may touch is necessarily
// process-wide: this is the one piece of global state, and only the handler writes it.
#pragma once
#include <string>

namespace loom {

// Exit status of a run that stopped on a signal after saving what it had (EX_TEMPFAIL: try
// again later, e.g. after preemption).
constexpr int kExitStopped = 75;

// Installs the handlers for SIGINT, SIGTERM and SIGUSR1. grace_s > 0 (fault.grace_s): a run still going
// that long after the signal exits with kExitStopped at once.
void stop_signals_install(double grace_s = 0);
// The signal that asked for a stop (SIGINT, SIGTERM, SIGUSR1), or 0.
int stop_signal();
const char* stop_signal_name(int sig);
// What asked for the stop: the signal's name, or for SIGUSR1 what launch/mpirun.sh recorded in
// the file LOOM_STOP_CAUSE names ("Ctrl-C to launch/mpirun.sh": the script turns a Ctrl-C or
// SIGTERM into the SIGUSR1 that Open MPI passes on to every rank).
std::string stop_cause(int sig);

}  // namespace loom
