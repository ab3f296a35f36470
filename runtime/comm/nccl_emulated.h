// parallel.comm = "nccl-emulated": process groups over host buffers that keep NCCL's rules,
// so a layout's communication can be checked on the CPU before it meets a GPU cluster.
//   - One device per rank runs its communicators' ops one at a time, in the order they were
//     issued (a CUDA stream per communicator, and the strictest reading of NCCL's advice that
//     ops on several communicators be issued in one order on every rank).
//   - A send completes only once the peer has started the matching receive, and a receive only
//     once the send has started (rendezvous); sends and receives match in issue order, tags
//     are ignored. Between group_start() and group_end() they progress together.
//   - Collectives carry (op, count, dtype, root) to their peers: a rank that issues something
//     else at the same point is named in an error where NCCL would hang or corrupt.
//   - Results land in the caller's buffer only when a Work is waited on (for an op, and every
//     earlier op of its communicator); until then the buffer holds NaN, so a consumer that
//     forgets to wait reads poison. Inputs are read at issue; a send buffer or input written
//     before its op's Work is waited on is an error.
//   - A deadlock (ranks whose ops wait on each other while their hosts wait) is reported with
//     the ranks, communicators and ops in the cycle, within about a second, and ends the job.
// Transport is MPI (each communicator is an MPI communicator of its own); every rank must be
// on one node, where the ranks' positions are posted in shared memory (nccl_emu_board.h).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/process_group.h"

namespace loom {

class NcclEmuDevice;

struct NcclEmuOptions {
  double timeout_s = 0;  // an op on the device past this ends the job (0: never)
  int world_rank = 0;
  std::function<void()> end_job;  // how a verdict ends the job (MPI_Abort under mpirun)
};

// This rank's emulated device; collective over `world` (an MPI group of every rank).
std::shared_ptr<NcclEmuDevice> nccl_emu_device_create(ProcessGroup& world, const NcclEmuOptions& options);
// The group of world ranks `ranks` (this one among them), split with `color`; collective over
// the world.
std::unique_ptr<ProcessGroup> nccl_emu_group(const std::shared_ptr<NcclEmuDevice>& device, const std::string& name,
                                             int color, const std::vector<int>& ranks);

}  // namespace loom
