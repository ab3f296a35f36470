#include "launch/launch_env.h"

#include <cstdlib>

namespace loom {

namespace {
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}
bool has(const char* name) {
  return std::getenv(name) != nullptr;
}
}  // namespace

LaunchEnv launch_env_read() {
  LaunchEnv e;
  if (has("OMPI_COMM_WORLD_SIZE")) {
    e.launcher = "mpirun";
    e.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    e.world = env_int("OMPI_COMM_WORLD_SIZE", 1);
    e.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    e.node = env_int("OMPI_COMM_WORLD_NODE_RANK", 0);
  } else if (has("SLURM_PROCID") && has("SLURM_NTASKS") && has("SLURM_STEP_ID")) {
    e.launcher = "slurm";  // srun; batch scripts without srun set no SLURM_STEP_ID
    e.rank = env_int("SLURM_PROCID", 0);
    e.world = env_int("SLURM_NTASKS", 1);
    e.local_rank = env_int("SLURM_LOCALID", 0);
    e.node = env_int("SLURM_NODEID", 0);
  } else if (has("PMIX_RANK")) {
    e.launcher = "pmix";
    e.rank = env_int("PMIX_RANK", 0);
    e.world = env_int("PMIX_SIZE", 1);  // MPI reports the real size after init
  }
  return e;
}

}  // namespace loom
