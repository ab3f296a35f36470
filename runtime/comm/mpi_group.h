// The MPI backend: host buffers, one communication thread per group. The thread starts each
// op with MPI's nonblocking call in issue order (so every rank starts a group's collectives
// in the same order) and polls for completion, so compute on the calling thread overlaps
// the transfer. CUDA buffers are staged through pinned host memory: the path that checks
// multi-rank layouts on one GPU (NCCL refuses two ranks on one device), not a fast one. bf16
// reduces through loom's own MPI ops (fp32 sums, rounded per pair). MpiWorld initializes MPI
// with MPI_THREAD_MULTIPLE for the process.
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

// loom's types as MPI's (bf16 as MPI_UINT16_T, reduced by the ops below), and an element count
// as MPI's int (fails past INT32_MAX).
MPI_Datatype mpi_type(DType t);
int mpi_count(int64_t n);
// MPI_User_function's for bf16 sums and maxima: fp32 arithmetic rounded once per pair, as a
// GPU's reduction does.
void mpi_bf16_sum(void* in, void* inout, int* len, MPI_Datatype*);
void mpi_bf16_max(void* in, void* inout, int* len, MPI_Datatype*);

// A group over `ranks` (world ranks, this rank among them), split from MPI_COMM_WORLD by
// `color`. Every world rank must call this collectively with its own color.
// Watchdog: an op still pending after timeout_s seconds (0: never) means a peer has died or
// hangs; the group prints which op and aborts the job, so no rank waits forever.
std::unique_ptr<ProcessGroup> mpi_group(const std::string& name, int color, const std::vector<int>& ranks, Trace* trace,
                                        double timeout_s = 0);
// The MPI library's own version line (callable before MPI is initialized).
std::string mpi_library_version();
// Ranks of this job on this node (MPI's shared-memory split); collective over the world.
int mpi_local_size();
// Every world rank's `mine`, by rank; collective over the world.
std::vector<std::string> mpi_all_gather_text(const std::string& mine);
// Ends the whole job from any rank (MPI_Abort with `code`).
[[noreturn]] void mpi_abort(int code);

}  // namespace loom
