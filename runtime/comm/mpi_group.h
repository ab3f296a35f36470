// The MPI backend: CPU buffers, one communication thread per group. The thread starts each
// op with MPI's nonblocking call in issue order (so every rank starts a group's collectives
// in the same order) and polls for completion, so compute on the calling thread overlaps
// the transfer. MpiWorld initializes MPI with MPI_THREAD_MULTIPLE for the process.
#pragma once
#include <mpi.h>

#include "runtime/comm/process_group.h"

namespace loom {

class MpiWorld {
 public:
  MpiWorld(int* argc, char*** argv);
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  int rank_ = 0, size_ = 1;
};

// A group over `ranks` (world ranks, this rank among them), split from MPI_COMM_WORLD by
// `color`. Every world rank must call this collectively with its own color.
// Watchdog: an op still pending after timeout_s seconds (0: never) means a peer has died or
// hangs; the group prints which op and aborts the job, so no rank waits forever.
std::unique_ptr<ProcessGroup> mpi_group(const std::string& name, int color, const std::vector<int>& ranks, Trace* trace,
                                        double timeout_s = 0);

}  // namespace loom
