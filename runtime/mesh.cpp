#include "runtime/mesh.h"

#if LOOM_HAVE_MPI
#include "runtime/comm/hang_report.h"
#include "runtime/comm/mpi_group.h"
#include "runtime/comm/nccl_emulated.h"
#endif
#if LOOM_HAVE_CUDA
#include "runtime/comm/nccl_group.h"
#endif

namespace loom {

const char* axis_name(Axis a) {
  static const char* names[] = {"pp", "dp", "cp", "tp", "ep", "edp", "embed", "dcp"};
  return names[int(a)];
}

void mesh_validate(const MeshDims& d, int world) {
  for (auto [name, v] : {std::pair{"pp", d.pp}, {"dp", d.dp}, {"cp", d.cp}, {"tp", d.tp}, {"ep", d.ep}})
    LOOM_CHECK(v >= 1, "parallel.{} = {} must be at least 1", name, v);
  LOOM_CHECK(d.world() == world,
             "the layout pp x dp x cp x tp = {} x {} x {} x {} = {} does not match the {} launched; "
             "launch {} or change parallel.*",
             d.pp, d.dp, d.cp, d.tp, plural(d.world(), "rank"), plural(world, "rank"), plural(d.world(), "rank"));
  LOOM_CHECK((d.dp * d.cp) % d.ep == 0, "parallel.ep = {} does not divide dp x cp = {} x {} = {}", d.ep, d.dp, d.cp,
             d.dp * d.cp);
}

MeshCoord mesh_coord(const MeshDims& d, int rank) {
  MeshCoord c;
  c.tp = rank % d.tp;
  rank /= d.tp;
  c.cp = rank % d.cp;
  rank /= d.cp;
  c.dp = rank % d.dp;
  c.pp = rank / d.dp;
  return c;
}

int mesh_rank(const MeshDims& d, const MeshCoord& c) {
  return ((c.pp * d.dp + c.dp) * d.cp + c.cp) * d.tp + c.tp;
}

MeshGroup mesh_group(const MeshDims& d, Axis axis, int rank) {
  const MeshCoord me = mesh_coord(d, rank);
  MeshGroup g{0, {}};
  auto with = [&](auto&& edit) {
    MeshCoord c = me;
    edit(c);
    return mesh_rank(d, c);
  };
  // Every rank that differs from this one only in `field`, which runs over [0, n).
  auto along = [&](int MeshCoord::*field, int n) {
    for (int i = 0; i < n; ++i) g.ranks.push_back(with([&](MeshCoord& c) { c.*field = i; }));
  };
  switch (axis) {
    case Axis::pp:
      along(&MeshCoord::pp, d.pp);
      break;
    case Axis::dp:
      along(&MeshCoord::dp, d.dp);
      break;
    case Axis::cp:
      along(&MeshCoord::cp, d.cp);
      break;
    case Axis::tp:
      along(&MeshCoord::tp, d.tp);
      break;
    case Axis::ep:
    case Axis::edp: {
      // Flatten (dp, cp) into one index; ep groups are blocks of ep consecutive indices, and
      // expert-data-parallel groups take the same position from every block.
      const int flat = me.dp * d.cp + me.cp, block = flat / d.ep, pos = flat % d.ep;
      const int n = axis == Axis::ep ? d.ep : d.dp * d.cp / d.ep;
      for (int i = 0; i < n; ++i) {
        int f = axis == Axis::ep ? block * d.ep + i : i * d.ep + pos;
        g.ranks.push_back(with([&](MeshCoord& c) { c.dp = f / d.cp, c.cp = f % d.cp; }));
      }
      break;
    }
    case Axis::dcp:
      for (int f = 0; f < d.dp * d.cp; ++f)
        g.ranks.push_back(with([&](MeshCoord& c) { c.dp = f / d.cp, c.cp = f % d.cp; }));
      break;
    case Axis::embed:  // first and last pipeline stage, for tied embeddings
      g.ranks.push_back(with([&](MeshCoord& c) { c.pp = 0; }));
      if (d.pp > 1) g.ranks.push_back(with([&](MeshCoord& c) { c.pp = d.pp - 1; }));
      if (me.pp != 0 && me.pp != d.pp - 1) g.ranks = {rank};  // middle stages: a group of one
      break;
  }
  // The smallest member identifies the group; offset by axis so colors never collide.
  g.id = g.ranks.front();
  for (int r : g.ranks) g.id = std::min(g.id, r);
  return g;
}

DeviceMesh::DeviceMesh(const MeshDims& d, int world_rank, int world_size, const MeshOptions& o)
    : dims_(d),
      coord_(mesh_coord(d, world_rank)),
      rank_(world_rank),
      use_mpi_(o.use_mpi),
      nccl_(o.nccl && o.use_mpi),
      emulated_(o.nccl_emulated && o.use_mpi) {
  mesh_validate(d, world_size);
#if !LOOM_HAVE_MPI
  LOOM_CHECK(!o.use_mpi,
             "this build has no MPI (LOOM_MPI=OFF): it trains on one process; rebuild with MPI to launch {} "
             "ranks",
             world_size);
  auto mpi_group = [](const std::string&, int, const std::vector<int>&, Trace*,
                      double) -> std::unique_ptr<ProcessGroup> { return nullptr; };
#endif
  std::vector<int> all(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) all[size_t(r)] = r;
  world_ = o.use_mpi ? mpi_group("world", 0, all, o.trace, o.timeout_s) : local_group("world", world_rank);
  // Without context parallel dp x cp is dp: the same group, not a second communicator.
  const auto alias = [&](int a) { return Axis(a) == Axis::dcp && d.cp == 1; };
  for (int a = 0; a < kAxes; ++a) {
    if (alias(a)) {
      host_.push_back(host_[size_t(Axis::dp)]);
      continue;
    }
    MeshGroup g = mesh_group(d, Axis(a), world_rank);
    // Every rank takes part in every split, even where its group has one member.
    host_owned_.push_back(o.use_mpi ? mpi_group(axis_name(Axis(a)), g.id, g.ranks, o.trace, o.timeout_s)
                                    : local_group(axis_name(Axis(a)), world_rank));
    host_.push_back(host_owned_.back().get());
  }
  groups_ = host_;
  // The training buffers' group of every axis, from `make(axis, group)`, in place of the host's.
  auto device_groups = [&](const auto& make) {
    groups_.clear();
    for (int a = 0; a < kAxes; ++a) {
      if (alias(a)) {
        groups_.push_back(groups_[size_t(Axis::dp)]);
        continue;
      }
      device_owned_.push_back(make(Axis(a), mesh_group(d, Axis(a), world_rank)));
      groups_.push_back(device_owned_.back().get());
    }
  };
#if LOOM_HAVE_CUDA
  if (nccl_) {
    const NcclOptions base{.timeout_s = o.timeout_s, .world_rank = world_rank, .end_job = [] { mpi_abort(4); }};
    auto w = nccl_world_create(*world_, base);
    nccl_world_ = std::shared_ptr<void>(w, w.get());
    device_groups([&](Axis a, const MeshGroup& g) {
      NcclOptions no = base;
      // Tensor parallel's consumers wait on every op at once: run them on the compute stream.
      no.on_caller_stream = a == Axis::tp;
      return nccl_group(w, axis_name(a), g.id, g.ranks, no);
    });
  }
#else
  LOOM_CHECK(!nccl_, "NCCL groups need a CUDA build");
#endif
#if LOOM_HAVE_MPI
  if (emulated_) {
    LOOM_CHECK(!nccl_, "parallel.comm: NCCL and its emulation at once");
    auto dev = nccl_emu_device_create(*world_, {o.timeout_s, world_rank, [] { mpi_abort(4); }});
    nccl_world_ = dev;
    device_groups([&](Axis a, const MeshGroup& g) { return nccl_emu_group(dev, axis_name(a), g.id, g.ranks); });
  }
#endif
  hang_ = std::make_unique<HangReport>(o.flight_dir, world_rank);
  for (ProcessGroup* g : all_groups()) {
    hang_->add(g);
    g->set_hang_report(hang_.get());
  }
}

std::vector<ProcessGroup*> DeviceMesh::all_groups() const {
  std::vector<ProcessGroup*> out = {world_.get()};
  for (auto& g : host_owned_) out.push_back(g.get());
  for (auto& g : device_owned_) out.push_back(g.get());
  return out;
}

void DeviceMesh::hang_next_op() {
  for (ProcessGroup* g : all_groups()) g->hang_next_op();
}

DeviceMesh::~DeviceMesh() {
  device_owned_.clear();  // NCCL groups before the communicator they were split from
  nccl_world_.reset();
}

}  // namespace loom
