#include "runtime/launch_env.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>

#include "runtime/error.h"

namespace loom {

namespace {
int env_int(const EnvGet& get, const char* name, int fallback) {
  const char* v = get(name);
  return v && *v ? std::atoi(v) : fallback;
}
}  // namespace

int slurm_tasks_on_node(const std::string& spec, int node) {
  int at = 0;
  size_t i = 0;
  while (i < spec.size()) {
    size_t end = spec.find(',', i);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(i, end - i);
    const int tasks = std::atoi(item.c_str());
    int repeat = 1;
    if (auto x = item.find("(x"); x != std::string::npos) repeat = std::atoi(item.c_str() + x + 2);
    if (node < at + repeat) return tasks;
    at += repeat;
    i = end + 1;
  }
  return 0;
}

LaunchEnv launch_env_read(const EnvGet& get) {
  LaunchEnv e;
  auto has = [&](const char* name) { return get(name) != nullptr; };
  if (has("OMPI_COMM_WORLD_SIZE")) {
    e.launcher = "mpirun";
    e.rank = env_int(get, "OMPI_COMM_WORLD_RANK", 0);
    e.world = env_int(get, "OMPI_COMM_WORLD_SIZE", 1);
    e.local_rank = env_int(get, "OMPI_COMM_WORLD_LOCAL_RANK", 0);
    e.node = env_int(get, "OMPI_COMM_WORLD_NODE_RANK", 0);
    e.local_size = env_int(get, "OMPI_COMM_WORLD_LOCAL_SIZE", 0);
    if (e.local_size) e.local_from = "OMPI_COMM_WORLD_LOCAL_SIZE";
  } else if (has("SLURM_PROCID") && has("SLURM_NTASKS") && has("SLURM_STEP_ID")) {
    e.launcher = "slurm";  // srun; batch scripts without srun set no SLURM_STEP_ID
    e.rank = env_int(get, "SLURM_PROCID", 0);
    e.world = env_int(get, "SLURM_NTASKS", 1);
    e.local_rank = env_int(get, "SLURM_LOCALID", 0);
    e.node = env_int(get, "SLURM_NODEID", 0);
    // The step's own layout: srun -n 2 sets neither SLURM_NTASKS_PER_NODE nor a local size.
    for (const char* v : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})
      if (const char* spec = get(v); spec && !e.local_size) {
        e.local_size = slurm_tasks_on_node(spec, e.node);
        if (e.local_size) e.local_from = v;
      }
  } else if (has("PMIX_RANK")) {
    e.launcher = "pmix";
    e.rank = env_int(get, "PMIX_RANK", 0);
    e.world = env_int(get, "PMIX_SIZE", 1);  // MPI reports the real size after init
    e.local_size = env_int(get, "PMIX_LOCAL_SIZE", 0);
    if (e.local_size) e.local_from = "PMIX_LOCAL_SIZE";
  }
  e.cpus_per_task = env_int(get, "SLURM_CPUS_PER_TASK", 0);
  return e;
}

ThreadChoice threads_choose(int configured, const LaunchEnv& env, const EnvGet& get, int cores) {
  if (configured > 0) return {configured, "train.threads"};
  if (int omp = env_int(get, "OMP_NUM_THREADS", 0); omp > 0) return {omp, "OMP_NUM_THREADS"};
  if (env.cpus_per_task > 0) return {env.cpus_per_task, "SLURM_CPUS_PER_TASK"};
  const int local = std::max(1, env.local_size);
  const std::string from = env.local_size ? fmt::format(" ({})", env.local_from) : std::string();
  return {std::max(1, cores / local),
          fmt::format("{} shared by {} on this node{}", plural(cores, "core"), plural(local, "rank"), from)};
}

int cores_visible(const EnvGet& get) {
  const char* v = get("LOOM_CORES");
  if (!v || !*v) return omp_get_num_procs();
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  LOOM_CHECK(*end == '\0' && n >= 1 && n <= 65536,
             "LOOM_CORES = '{}' is not a core count: unset it, or give a whole number >= 1", v);
  return int(n);
}

}  // namespace loom
