// DeviceMesh: the degrees pp, dp, cp, tp (ep carved out of dp x cp, as Megatron does) and
// every process group they imply. Rank order is pp-dp-cp-tp with tp innermost, so tensor-
// parallel peers are neighbours (same node):
//   rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i
// Worked example, 8 ranks as pp2 x dp2 x tp2:
//   rank:  0 1 2 3 4 5 6 7
//   pp_i:  0 0 0 0 1 1 1 1     pp groups {0,4} {1,5} {2,6} {3,7}
//   dp_i:  0 0 1 1 0 0 1 1     dp groups {0,2} {1,3} {4,6} {5,7}
//   tp_i:  0 1 0 1 0 1 0 1     tp groups {0,1} {2,3} {4,5} {6,7}
// The rank arithmetic is pure (mesh_*) and tested on its own; DeviceMesh builds the groups.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/process_group.h"

namespace loom {

class Trace;

enum class Axis { pp, dp, cp, tp, ep, edp, embed };
constexpr int kAxes = 7;
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

class DeviceMesh {
 public:
  // world_size 1 without MPI: every group is local. Otherwise MPI must be initialized.
  // timeout_s: the groups' watchdog (0: none).
  DeviceMesh(const MeshDims& d, int world_rank, int world_size, bool use_mpi, Trace* trace, double timeout_s = 0);
  const MeshDims& dims() const { return dims_; }
  const MeshCoord& coord() const { return coord_; }
  int rank() const { return rank_; }
  int world() const { return dims_.world(); }
  ProcessGroup& group(Axis a) const { return *groups_[size_t(a)]; }
  ProcessGroup& world_group() const { return *world_; }

 private:
  MeshDims dims_;
  MeshCoord coord_;
  int rank_;
  std::unique_ptr<ProcessGroup> world_;
  std::vector<std::unique_ptr<ProcessGroup>> groups_;
};

}  // namespace loom
