// Which directory a training run writes its logs into: one run per directory. A log.dir that
// holds another run's logs (a metrics.jsonl with a line in it) stays that run's: a new run writes
// the next numbered sibling (DIR-2, DIR-3, ...), and a run that continues an earlier one (resumed
// from a checkpoint, restarted by `loom supervise` or a Slurm requeue) writes the newest of them.
// It does not lock or create anything: MetricsWriter's lock still refuses a directory in use.
#pragma once
#include <string>
#include <vector>

#include "runtime/config.h"

namespace loom {

struct LogDirChoice {
  std::string dir;   // where this run writes its logs
  std::string note;  // "" where that is log.dir as given, else why not (said beside the metrics' path)
};

// `continues`: this run carries on the run whose logs are the newest of dir's family.
LogDirChoice log_dir_choose(const std::string& dir, bool continues);
// Whether a run of `cfg` continues an earlier run: restarted (LOOM_RESTART or
// SLURM_RESTART_COUNT above 0), or checkpoint.resume names a checkpoint that is there.
bool run_continues(const Config& cfg);
// dir and its numbered siblings dir-2, dir-3, ... that exist, in order of their numbers.
std::vector<std::string> log_dir_family(const std::string& dir);
// Whether `dir` holds a run's logs: its metrics.jsonl is a regular file with something in it.
bool log_dir_holds_run(const std::string& dir);

}  // namespace loom
