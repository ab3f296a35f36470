// Where this process sits in the job, read from the launcher's environment: Open MPI
// (mpirun), PMIx, or Slurm (srun). Local rank picks the GPU on CUDA machines; the ranks on
// this node and Slurm's CPUs per task decide the threads per rank.
#pragma once
#include <functional>
#include <string>

namespace loom {

// An environment lookup (std::getenv, or a test's map): null when unset.
using EnvGet = std::function<const char*(const char*)>;

struct LaunchEnv {
  int rank = 0, world = 1, local_rank = 0, node = 0;
  int local_size = 0;             // ranks on this node (0: the launcher does not say)
  std::string local_from;         // the variable local_size came from
  int cpus_per_task = 0;          // SLURM_CPUS_PER_TASK (0: unset)
  std::string launcher = "none";  // none | mpirun | pmix | slurm
  bool distributed() const { return launcher != "none"; }
};

LaunchEnv launch_env_read(const EnvGet& get = [](const char* k) { return std::getenv(k); });

// Slurm's tasks-per-node list ("2(x3),1": 2 tasks on each of nodes 0-2, 1 on node 3): the
// count on `node`, or 0 when the list does not cover it.
int slurm_tasks_on_node(const std::string& spec, int node);

// Threads per rank and why: train.threads when set; else OMP_NUM_THREADS; else Slurm's CPUs per
// task; else this node's cores shared by the ranks on it.
struct ThreadChoice {
  int threads;
  std::string why;
};
ThreadChoice threads_choose(int configured, const LaunchEnv& env, const EnvGet& get, int cores);

// The cores this process may run on (its affinity mask, as OpenMP counts them), or LOOM_CORES
// where set: the test suite runs "as another machine" with it (docs/testing.md), and it counts
// wherever loom counts cores (threads per rank, the machine's name, run.json).
int cores_visible(const EnvGet& get = [](const char* k) { return std::getenv(k); });

}  // namespace loom
