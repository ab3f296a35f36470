// Elastic restarts for `loom supervise --ranks MIN:MAX`: the hosts a job may run on, which of
// them still answer, and the largest layout that the survivors hold and the run's own config
// accepts. The command names where the layout goes with placeholders: {ranks} (the world
// size), {dp} (ranks / --replica: the data-parallel size), {hosts} ("name:slots,..." of the
// hosts used, Open MPI's --host form) and {nodelist} (their names, srun's -w form). The global batch stays the
// config's, so fewer ranks accumulate more micro-batches each, and the run resumes from its last checkpoint resharded
// (checkpoint.resume = latest). Not here: the restart loop (launch/supervise.cpp).
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace loom {

struct Host {
  std::string name;
  int slots = 1;  // ranks it takes
};
// "a:2,b:2,c" (a host without slots takes 1); an Error names a malformed entry.
std::vector<Host> hosts_parse(const std::string& list);
std::string hosts_str(const std::vector<Host>& hosts);
// The hosts of the Slurm allocation this runs in (SLURM_JOB_NODELIST through `scontrol show
// hostnames`), with their slots (slurm_slots); an Error where there is no allocation.
std::vector<Host> hosts_from_slurm();
// Slurm's nodes in order with their tasks: SLURM_NTASKS_PER_NODE on each where it is set (not
// empty), else node i's count in SLURM_TASKS_PER_NODE ("2(x3),1").
std::vector<Host> slurm_slots(const std::vector<std::string>& names, const std::string& ntasks_per_node,
                              const std::string& tasks_per_node);

struct ElasticOptions {
  int min_ranks = 0, max_ranks = 0;  // 0: not elastic
  int replica = 1;                   // ranks per data-parallel replica (tp x pp x cp)
  std::vector<Host> hosts;
  std::string probe;    // a shell command with {host}: exits 0 when the host can run ranks
  double probe_s = 10;  // how long a probe may take
  bool enabled() const { return max_ranks > 0; }
};

// Checks the options against the command (an Error says what to change); takes the hosts from
// the Slurm allocation where none are given, with a probe that starts a task on the host.
void elastic_check(ElasticOptions& o, const std::vector<std::string>& command);
// Every {ranks}, {dp}, {hosts} ("name:slots,...") and {nodelist} ("name,...", for srun -w) in
// the command's words replaced.
std::vector<std::string> command_fill(const std::vector<std::string>& command, int ranks, int dp,
                                      const std::string& hosts, const std::string& nodelist);
std::string nodelist_str(const std::vector<Host>& hosts);
// The `loom train ...` part of a launch command (from the word naming loom, followed by
// "train"); empty where there is none.
std::vector<std::string> train_part(const std::vector<std::string>& command);
// Whether the probe, with {host} replaced, exits 0 within probe_s (run by /bin/sh).
bool host_answers(const ElasticOptions& o, const std::string& host);
// The largest world size, a multiple of replica between min_ranks and max_ranks that the
// slots of `alive` hold and `fits` accepts; 0 when none does.
int elastic_ranks(const ElasticOptions& o, const std::vector<Host>& alive, const std::function<bool(int)>& fits);
// The hosts `ranks` ranks fill, in order, each taking up to its slots (the last maybe fewer).
std::vector<Host> hosts_take(const std::vector<Host>& alive, int ranks);
// The trainer's own check of a layout: the command's `loom train` part, filled for ranks and
// dp, resolves its config (--print-config exits 0 within timeout_s); true where there is none.
bool elastic_fits(const std::vector<std::string>& command, int ranks, int dp, double timeout_s);

}  // namespace loom
