// `loom supervise [--max-restarts N] [--backoff-s S] [--log-dir DIR] [--ranks MIN:MAX --hosts
// LIST|(Slurm) --probe CMD --replica K] -- COMMAND...`: runs
// COMMAND (mpirun/srun ... loom train ...) and runs it again when it fails for a reason a
// restart can cure: a rank died or exited with an error, a collective timed out, a
// preemption ended it (status 75). Not: success (0), a usage or config error (2), or a stop
// the supervisor itself was asked for (SIGINT/SIGTERM/SIGUSR1 reach COMMAND, SIGHUP as SIGTERM, and the supervisor
// exits with its status). Each run gets LOOM_RESTART=<restarts so far>, which turns the fault
// drills off (they fire once per job); with checkpoint.resume = "latest" the job resumes from
// its newest good checkpoint. Back-off doubles from S seconds, up to 60. Elastic (--ranks,
// launch/elastic.h): before every run the hosts are probed and the job launched on those that
// answer, with the largest layout they hold and the config accepts.
#pragma once
#include <string>
#include <vector>

#include "launch/elastic.h"

namespace loom {

struct SuperviseOptions {
  int max_restarts = 3;
  double backoff_s = 1.0;
  // Where {"event": "start"|"exit"|"layout"} lines go (faults.jsonl), for drill reports; the
  // job's log.dir, whose flight/verdict.txt a hang verdict writes.
  std::string log_dir;
  // A launcher still running this long after its job's hang verdict (one that cannot reach
  // ranks beyond a dead link, say) is ended, as the watchdog would have ended the job: status 4.
  double verdict_grace_s = 30;
  ElasticOptions elastic;  // --ranks MIN:MAX: relaunch on the hosts that answer
};

// Returns the exit status to end with.
int supervise_run(const std::vector<std::string>& command, const SuperviseOptions& opt);

// Whether a restart can cure a run that ended with `status` (a shell-style status: 128 + N for
// signal N).
bool status_restartable(int status);

}  // namespace loom
