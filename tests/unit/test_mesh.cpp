// The mesh's rank arithmetic, as pure functions: the worked example of runtime/mesh.h,
// expert groups carved out of dp, and the refusal of a layout that does not fit the world.
#include "runtime/error.h"
#include "runtime/mesh.h"
#include "runtime/trace.h"
#include "testing.h"

using namespace loom;

TEST(Mesh, WorkedExampleOfEightRanks) {
  MeshDims d{.pp = 2, .dp = 2, .cp = 1, .tp = 2};
  for (int r = 0; r < 8; ++r) EXPECT_EQ(mesh_rank(d, mesh_coord(d, r)), r);
  EXPECT_EQ(mesh_group(d, Axis::tp, 5).ranks, (std::vector<int>{4, 5}));
  EXPECT_EQ(mesh_group(d, Axis::dp, 5).ranks, (std::vector<int>{5, 7}));
  EXPECT_EQ(mesh_group(d, Axis::pp, 5).ranks, (std::vector<int>{1, 5}));
  EXPECT_EQ(mesh_group(d, Axis::embed, 6).ranks, (std::vector<int>{2, 6}));
  // Members agree on the id; different groups differ.
  EXPECT_EQ(mesh_group(d, Axis::dp, 5).id, mesh_group(d, Axis::dp, 7).id);
  EXPECT_NE(mesh_group(d, Axis::dp, 5).id, mesh_group(d, Axis::dp, 4).id);
}

TEST(Mesh, ExpertGroupsAreCarvedFromDataParallel) {
  MeshDims d{.pp = 1, .dp = 4, .cp = 1, .tp = 2, .ep = 2};
  // dp groups hold ranks {0,2,4,6} and {1,3,5,7}; ep takes blocks of two of them.
  EXPECT_EQ(mesh_group(d, Axis::ep, 4).ranks, (std::vector<int>{4, 6}));
  EXPECT_EQ(mesh_group(d, Axis::edp, 4).ranks, (std::vector<int>{0, 4}));
  EXPECT_EQ(mesh_group(d, Axis::edp, 7).ranks, (std::vector<int>{3, 7}));
}

TEST(Mesh, RefusesALayoutThatDoesNotFit) {
  MeshDims d{.pp = 2, .dp = 2, .cp = 1, .tp = 2};
  try {
    mesh_validate(d, 6);
    FAIL() << "accepted 8 ranks' layout on 6";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "the layout pp x dp x cp x tp = 2 x 2 x 1 x 2 = 8 ranks does not match the 6 ranks launched; "
              "launch 8 ranks or change parallel.*");
  }
  d.ep = 3;
  EXPECT_THROW(mesh_validate(d, 8), Error);
}

TEST(Mesh, OneRankWithoutMpiIsLocal) {
  Trace trace(false);
  DeviceMesh m(MeshDims{}, 0, 1, MeshOptions{.trace = &trace});
  float x = 3;
  m.group(Axis::dp).all_reduce(Buf(&x, 1)).wait();
  EXPECT_EQ(x, 3);
  EXPECT_EQ(m.group(Axis::dp).counters().seq, 1);
  EXPECT_EQ(m.group(Axis::dp).counters().bytes[int(CommOp::all_reduce)], 4);
}
