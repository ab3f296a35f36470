// The NCCL backend: CUDA buffers, completion tracked by CUDA events. An op waits (on the device)
// for the stream that produced its input, runs on the group's own stream (or on that stream
// itself, for groups whose consumers block on every op anyway, like tensor parallel's), and
// its Work lands on a consumer stream as an event wait: no host wait inside a step.
// The world communicator is created from an ncclUniqueId that travels over the MPI world
// group; every other group is split from it with ncclCommSplit. Like the MPI groups, each
// group has a watchdog: an op pending past timeout_s, or an asynchronous NCCL error, prints
// which op of which group, aborts the communicator and ends the job. Built when CUDA is on.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "runtime/comm/process_group.h"

namespace loom {

class NcclWorld;
class Trace;

struct NcclOptions {
  bool on_caller_stream = false;  // run ops on the `after` stream instead of the group's own
  double timeout_s = 0;           // watchdog (0: none)
  int world_rank = 0;             // for the watchdog's message
  std::function<void()> end_job;  // how the watchdog ends the job (MPI_Abort under mpirun)
  // No trace: NCCL ops run on GPU streams, and their events are not yet put on the trace's
  // host clock (the exposed part is in time.comm_exposed_ms all the same).
};
// Creates the NCCL world communicator; collective over `mpi_world`, which every rank first
// joins (an MPI all-gather whose watchdog names a rank that never comes). Communicators are
// non-blocking: their creation, every split and every call is polled until it settles, and past
// options.timeout_s the communicator is aborted and the job ends with a line saying which. The
// current CUDA device must already be set (local rank picks it).
std::shared_ptr<NcclWorld> nccl_world_create(ProcessGroup& mpi_world, const NcclOptions& options);
// The world as a group (name "world"), or the group of `ranks` split with `color` (collective
// over the world).
std::unique_ptr<ProcessGroup> nccl_group(const std::shared_ptr<NcclWorld>& world, const std::string& name, int color,
                                         const std::vector<int>& ranks, const NcclOptions& options = {});
// "major.minor.patch" of the NCCL library loom runs with.
std::string nccl_version();
// Devices the CUDA runtime sees (0 without a driver or GPU).
int cuda_device_count();
// Makes device local_rank % count current; returns it, or -1 without a GPU.
int cuda_device_select(int local_rank);

}  // namespace loom
