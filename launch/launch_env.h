// Where this process sits in the job, read from the launcher's environment: Open MPI
// (mpirun), PMIx, or Slurm (srun). Local rank picks the GPU on CUDA machines.
#pragma once
#include <string>

namespace loom {

struct LaunchEnv {
  int rank = 0, world = 1, local_rank = 0, node = 0;
  std::string launcher = "none";  // none | mpirun | pmix | slurm
  bool distributed() const { return launcher != "none"; }
};

LaunchEnv launch_env_read();

}  // namespace loom
