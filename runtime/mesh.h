// DeviceMesh: the degrees pp, dp, cp, tp (ep carved out of dp x cp, as Megatron does) and
// every process group they imply. Rank order is pp-dp-cp-tp with tp innermost, so tensor-
// parallel peers are neighbours (same node):
//   rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i
// Worked example, 8 ranks as pp2 x dp2 x tp2:
//   rank:  0 1 2 3 4 5 6 7
//   pp_i:  0 0 0 0 1 1 1 1     pp groups {0,4} {1,5} {2,6} {3,7}
//   dp_i:  0 0 1 1 0 0 1 1     dp groups {0,2} {1,3} {4,6} {5,7}
//   tp_i:  0 1 0 1 0 1 0 1     tp groups {0,1} {2,3} {4,5} {6,7}
// The rank arithmetic is pure (mesh_*) and tested on its own; DeviceMesh builds the groups:
// for every axis one that carries the training buffers (MPI for host buffers or, staged,
// CUDA ones; NCCL for CUDA buffers; NCCL's rules emulated over host buffers) and one for host
// buffers (the same object unless NCCL, real or emulated).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/process_group.h"

namespace loom {

class Trace;

// dcp: dp and cp together (the ranks that hold the same weights: gradients reduce and ZeRO
// shards over it, as Megatron folds cp into dp), in the order (dp, cp).
enum class Axis { pp, dp, cp, tp, ep, edp, embed, dcp };
constexpr int kAxes = 8;
const char* axis_name(Axis a);

struct MeshDims {
  int pp = 1, dp = 1, cp = 1, tp = 1, ep = 1;
  int world() const { return pp * dp * cp * tp; }
};
struct MeshCoord {
  int pp = 0, dp = 0, cp = 0, tp = 0;
};

// Fails, with the arithmetic in the message, unless pp*dp*cp*tp == world and ep divides dp*cp.
void mesh_validate(const MeshDims& d, int world);
MeshCoord mesh_coord(const MeshDims& d, int rank);
int mesh_rank(const MeshDims& d, const MeshCoord& c);
// The group along `axis` that holds `rank`: its world ranks in group-rank order, and an id
// that is the same for every member and different between groups (an MPI split color).
struct MeshGroup {
  int id;
  std::vector<int> ranks;
};
MeshGroup mesh_group(const MeshDims& d, Axis axis, int rank);

struct MeshOptions {
  bool use_mpi = false;        // world_size 1 without MPI: every group is local; else MPI is initialized
  bool nccl = false;           // CUDA buffers over NCCL (one GPU per rank); else over MPI, staged
  bool nccl_emulated = false;  // the training buffers over NCCL's rules on the CPU (nccl_emulated.h)
  double timeout_s = 0;        // the groups' watchdog (0: none)
  Trace* trace = nullptr;
  std::string flight_dir;  // where a timed-out collective's flight records go (empty: nowhere)
};

class HangReport;

class DeviceMesh {
 public:
  DeviceMesh(const MeshDims& d, int world_rank, int world_size, const MeshOptions& options);
  ~DeviceMesh();
  const MeshDims& dims() const { return dims_; }
  const MeshCoord& coord() const { return coord_; }
  int rank() const { return rank_; }
  int world() const { return dims_.world(); }
  ProcessGroup& group(Axis a) const { return *groups_[size_t(a)]; }     // the training buffers
  ProcessGroup& host_group(Axis a) const { return *host_[size_t(a)]; }  // host buffers
  ProcessGroup& world_group() const { return *world_; }                 // host buffers
  const char* comm_name() const { return nccl_ ? "NCCL" : emulated_ ? "NCCL (emulated)" : use_mpi_ ? "MPI" : "local"; }
  // Every group this rank is in (world, host and device groups of every axis).
  std::vector<ProcessGroup*> all_groups() const;
  // Fault drill (fault.hang): the next op this rank issues, on any group, never returns.
  void hang_next_op();

 private:
  MeshDims dims_;
  MeshCoord coord_;
  int rank_;
  bool use_mpi_, nccl_, emulated_;
  std::unique_ptr<HangReport> hang_;  // before the groups: they report to it until they are gone
  std::unique_ptr<ProcessGroup> world_;
  std::vector<std::unique_ptr<ProcessGroup>> host_owned_, device_owned_;
  std::vector<ProcessGroup*> host_, groups_;
  std::shared_ptr<void> nccl_world_;  // the NCCL world communicator, or the emulated device
};

}  // namespace loom
