// The NCCL backend: CUDA buffers, one stream per group, completion tracked by CUDA events.
// The world communicator is created from an ncclUniqueId that travels over the MPI world
// group; every other group is split from it with ncclCommSplit. Built when CUDA is on.
#pragma once
#include <memory>
#include <vector>

#include "runtime/comm/process_group.h"

namespace loom {

class NcclWorld;

// Creates the NCCL world communicator; collective over `mpi_world`. The current CUDA device
// must already be set (local rank picks it).
std::shared_ptr<NcclWorld> nccl_world_create(ProcessGroup& mpi_world);
// The world as a group, or the group of `ranks` split with `color` (collective over the world).
std::unique_ptr<ProcessGroup> nccl_group(const std::shared_ptr<NcclWorld>& world, const std::string& name, int color,
                                         const std::vector<int>& ranks);
// Devices the CUDA runtime sees (0 without a driver or GPU).
int cuda_device_count();
// Makes device local_rank % count current; returns it, or -1 without a GPU.
int cuda_device_select(int local_rank);

}  // namespace loom
