// Pipeline schedules as data: every generated table passes the checker, its simulated bubble
// matches the closed forms, its peaks are what the schedule promises, and broken tables (a
// missing receive, a send to the wrong stage, an op twice, an order that deadlocks) are
// caught before anything runs.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "parallel/pipeline.h"
#include "parallel/pipeline_schedule.h"
#include "runtime/error.h"
#include "tests/unit/testing.h"

namespace loom {
namespace {

// `f` must throw an Error whose message holds `says` (accepted: the message is empty).
template <class F>
void expect_refused(F&& f, const char* says) {
  const std::string e = test::error_of(f);
  EXPECT_NE(e.find(says), std::string::npos) << (e.empty() ? "accepted; expected: " + std::string(says) : e);
}

TEST(PipelineSchedule, EveryScheduleChecksAndMatchesItsBubble) {
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 4, 8, 16})
      for (PpSchedule name : {PpSchedule::gpipe, PpSchedule::f1b1, PpSchedule::zb}) {
        const PipeSchedule s = pipeline_schedule(name, p, 1, m);
        const PipeTiming t = pipeline_check(s, 1, 1, 1);
        if (name != PpSchedule::zb) {  // unit F, B of 2: the closed form, on every stage
          EXPECT_NEAR(t.bubble(), double(p - 1) / double(m + p - 1), 1e-12) << name << " p " << p << " m " << m;
        }
      }
  for (int p : {2, 4})
    for (int v : {2, 3})
      for (int m : {p, 2 * p, 4 * p}) {
        const PipeSchedule s = pipeline_schedule(PpSchedule::interleaved, p, v, m);
        const PipeTiming t = pipeline_check(s, 1, 1, 1);
        EXPECT_NEAR(t.bubble(), double(p - 1) / double(v * m + p - 1), 1e-12) << "p " << p << " v " << v << " m " << m;
      }
}

// At pp 1 the trainer runs 1F1B's one-stage list as its accumulation loop: each micro-batch's
// backward right after its forward (one micro-batch's activations live), no transfers.
TEST(PipelineSchedule, OneStageIsTheAccumulationLoop) {
  const PipeSchedule s = pipeline_schedule(PpSchedule::f1b1, 1, 1, 3);
  ASSERT_EQ(s.ops.size(), 1u);
  std::string seq;
  for (const PipeOp& op : s.ops[0]) seq += fmt::format("{}{} ", pipe_op_name(op.kind), op.micro);
  EXPECT_EQ(seq, "F0 B0 F1 B1 F2 B2 ");
}

TEST(PipelineSchedule, ZeroBubbleBeatsOneFOneBAtTheSamePeak) {
  for (int p : {2, 4, 8})
    for (int m : {2 * p, 4 * p}) {
      const PipeTiming zb = pipeline_check(pipeline_schedule(PpSchedule::zb, p, 1, m), 1, 1, 1);
      const PipeTiming f1b1 = pipeline_check(pipeline_schedule(PpSchedule::f1b1, p, 1, m), 1, 1, 1);
      // ZB-H1's bubble: (p - 1)(F + B - W) against 1F1B's (p - 1)(F + B + W).
      EXPECT_NEAR(zb.makespan, 3.0 * m + (p - 1), 1e-9) << "p " << p << " m " << m;
      EXPECT_NEAR(f1b1.makespan, 3.0 * m + 3.0 * (p - 1), 1e-9);
      for (int s = 0; s < p; ++s) EXPECT_LE(zb.peak_in_flight[size_t(s)], f1b1.peak_in_flight[0]);
    }
}

TEST(PipelineSchedule, PeaksInFlight) {
  const int p = 4, m = 8;
  const PipeTiming g = pipeline_check(pipeline_schedule(PpSchedule::gpipe, p, 1, m));
  const PipeTiming f = pipeline_check(pipeline_schedule(PpSchedule::f1b1, p, 1, m));
  for (int s = 0; s < p; ++s) {
    EXPECT_EQ(g.peak_in_flight[size_t(s)], m);
    EXPECT_EQ(f.peak_in_flight[size_t(s)], p - s);
  }
}

TEST(PipelineSchedule, BrokenTablesAreCaught) {
  auto refused = [](const PipeSchedule& s, const char* says) { expect_refused([&] { pipeline_check(s); }, says); };
  const PipeSchedule ok = pipeline_schedule(PpSchedule::f1b1, 2, 1, 4);
  {  // a receive dropped: the consumer waits forever
    PipeSchedule s = ok;
    auto& o = s.ops[1];
    o.erase(std::find_if(o.begin(), o.end(), [](const PipeOp& x) { return x.kind == PipeOp::recv_act; }));
    refused(s, "deadlocks");
  }
  {  // a send to the wrong stage
    PipeSchedule s = pipeline_schedule(PpSchedule::f1b1, 3, 1, 4);
    for (auto& x : s.ops[0])
      if (x.kind == PipeOp::send_act) {
        x.peer = 2;
        break;
      }
    refused(s, "not 1");
  }
  {  // a forward twice
    PipeSchedule s = ok;
    s.ops[0].push_back({PipeOp::F, 0, 0});
    refused(s, "appears 2 times");
  }
  {  // stage 1 backward before the forward it needs: both stages wait
    PipeSchedule s = ok;
    auto& o = s.ops[1];
    std::iter_swap(o.begin(), std::find_if(o.begin(), o.end(), [](const PipeOp& x) { return x.kind == PipeOp::B; }));
    refused(s, "deadlocks");
  }
  {  // a W where the backward is not split
    PipeSchedule s = ok;
    s.ops[0].push_back({PipeOp::W, 0, 0});
    refused(s, "W without a split backward");
  }
}

// Every table runs under NCCL's rules as the executor issues it (each run of sends and
// receives one group, groups in order, sends matched to receives by issue order).
TEST(PipelineSchedule, EveryScheduleRunsUnderNcclsInOrderRules) {
  for (int p : {2, 3, 4, 8})
    for (int m : {1, 2, 4, 8, 16})
      for (PpSchedule name : {PpSchedule::gpipe, PpSchedule::f1b1, PpSchedule::zb}) {
        SCOPED_TRACE(fmt::format("{} p {} m {}", name, p, m));
        EXPECT_NO_THROW(pipeline_check_in_order(pipeline_in_order(pipeline_schedule(name, p, 1, m))));
      }
  for (int p : {2, 4})
    for (int v : {2, 3})
      for (int m : {p, 2 * p, 4 * p}) {
        SCOPED_TRACE(fmt::format("interleaved p {} v {} m {}", p, v, m));
        const PipeSchedule s = pipeline_schedule(PpSchedule::interleaved, p, v, m);
        EXPECT_NO_THROW(pipeline_check_in_order(pipeline_in_order(s)));
        if (m > p) {
          EXPECT_THROW(pipeline_check_in_order(s), Error);  // receives just ahead of their consumers
        }
      }
}

// What the in-order rules refuse: the executor that posted every receive first (a receive
// ahead of the send its peer waits behind), the interleaved table with each receive just ahead
// of its consumer (sound for the host-side checker, whose sends never wait), and two sends to
// one stage swapped (NCCL, which has no tags, would put each into the other's buffer).
TEST(PipelineSchedule, InOrderRulesCatchWhatMpiForgives) {
  auto refused = [](const PipeSchedule& s, const char* says) {
    expect_refused([&] { pipeline_check_in_order(s); }, says);
  };
  const PipeSchedule ok = pipeline_schedule(PpSchedule::f1b1, 2, 1, 4);
  {
    PipeSchedule s = ok;
    for (auto& o : s.ops)
      std::stable_partition(o.begin(), o.end(),
                            [](const PipeOp& x) { return x.kind == PipeOp::recv_act || x.kind == PipeOp::recv_grad; });
    refused(s, "deadlocks under NCCL's in-order point-to-point; stage 0 waits in the group {recv_grad");
  }
  {
    const PipeSchedule s = pipeline_schedule(PpSchedule::interleaved, 2, 2, 4);
    EXPECT_NO_THROW(pipeline_check(s));
    refused(s, "deadlocks under NCCL's in-order point-to-point; stage 0 waits in the group {send_grad");
  }
  {
    PipeSchedule s = ok;
    auto& o = s.ops[0];
    auto a = std::find_if(o.begin(), o.end(), [](const PipeOp& x) { return x.kind == PipeOp::send_act; });
    auto b = std::find_if(a + 1, o.end(), [](const PipeOp& x) { return x.kind == PipeOp::send_act; });
    std::swap(a->micro, b->micro);
    std::swap(a[-1].micro, b[-1].micro);  // and the forwards that feed them
    EXPECT_NO_THROW(pipeline_check(s));
    refused(s, "would arrive as its receive number 1 (recv_act of micro-batch 0");
  }
}

// The validation pass (forward only) under the same rules.
TEST(PipelineSchedule, ForwardOnlyListsRunUnderNcclsInOrderRules) {
  for (int p : {2, 3, 4})
    for (int v : {1, 2})
      for (int m : {1, 4, 8}) {
        PipeSchedule s;  // forward-only lists (its name is no schedule's)
        s.stages = p, s.virtual_chunks = v, s.micro = m;
        for (int st = 0; st < p; ++st) s.ops.push_back(pipeline_forward_ops(p, v, st, m));
        EXPECT_NO_THROW(pipeline_check_in_order(s)) << "p " << p << " v " << v << " m " << m;
        if (v != 2) continue;
        s.v_shape = true;  // a V: the last stage hands chunk p-1 to chunk p itself
        s.ops.clear();
        for (int st = 0; st < p; ++st) s.ops.push_back(pipeline_forward_ops(p, v, st, m, true));
        EXPECT_NO_THROW(pipeline_check_in_order(s)) << "V, p " << p << " m " << m;
        for (const PipeOp& op : s.ops.back()) EXPECT_FALSE(pipe_op_is_comm(op.kind) && op.peer == p - 1);
      }
}

// The V-shaped schedules: chunk g on stage g and 2p-1-g, so stage 0 holds the embedding's
// chunk and the head's; sound (every op once, in order, no deadlock, and under NCCL's in-order
// rules as the executor issues it) for every p and m tried; ZB-V's bubble at F = B = W is below
// zb's and 1F1B's and near zero once m covers the V, at no more than 1F1B's activation peak (p
// micro-batches of a stage, 2p of the V's half-size chunks; DualPipeV one chunk more); DualPipeV
// follows its eight runs.
TEST(PipelineSchedule, VShapesAreSoundAndZbvNearlyFillsTheBubble) {
  EXPECT_EQ(pipe_stage_of(0, 4, true), 0);
  EXPECT_EQ(pipe_stage_of(3, 4, true), 3);
  EXPECT_EQ(pipe_stage_of(4, 4, true), 3);
  EXPECT_EQ(pipe_stage_of(7, 4, true), 0);
  for (PpSchedule name : {PpSchedule::zbv, PpSchedule::dualpipev})
    for (int p : {2, 3, 4, 8})
      for (int m : {2 * p, 2 * p + 1, 3 * p, 4 * p}) {
        const PipeSchedule s = pipeline_schedule(name, p, 2, m);
        EXPECT_TRUE(s.v_shape && s.split_backward);
        PipeTiming t;
        ASSERT_NO_THROW(t = pipeline_check(s)) << name << " p " << p << " m " << m;
        EXPECT_NO_THROW(pipeline_check_in_order(pipeline_in_order(s))) << name << " p " << p << " m " << m;
        const bool dual = name == PpSchedule::dualpipev;  // one chunk more: DualPipe's p + 1
        for (int st = 0; st < p; ++st) EXPECT_LE(t.peak_in_flight[size_t(st)], 2 * p + dual) << name << " p " << p;
        if (dual) continue;
        const double zbv = t.bubble_mean(),
                     zb = pipeline_check(pipeline_schedule(PpSchedule::zb, p, 1, m), 1, 1, 1).bubble_mean();
        const double f1b = pipeline_check(pipeline_schedule(PpSchedule::f1b1, p, 1, m), 1, 1, 1).bubble_mean();
        EXPECT_LT(zbv, zb) << "p " << p << " m " << m;
        EXPECT_LT(zbv, f1b) << "p " << p << " m " << m;
      }
  const double zbv = pipeline_check(pipeline_schedule(PpSchedule::zbv, 8, 2, 32), 1, 1, 1).bubble_mean();
  EXPECT_LT(zbv, 0.05);
  // DualPipeV at p 4: stage 0 opens with 6 forwards of its first chunk, stage 3 with chunk 3
  // then chunk 4 (its own hand-off), and both end on weight gradients.
  const PipeSchedule d = pipeline_schedule(PpSchedule::dualpipev, 4, 2, 8);
  std::vector<PipeOp> c0, c3;
  for (const PipeOp& op : d.ops[0])
    if (!pipe_op_is_comm(op.kind)) c0.push_back(op);
  for (const PipeOp& op : d.ops[3])
    if (!pipe_op_is_comm(op.kind)) c3.push_back(op);
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(c0[size_t(i)].kind == PipeOp::F && c0[size_t(i)].chunk == 0);
  EXPECT_EQ(c0[6].chunk, 0);
  EXPECT_EQ(c0[7].chunk, 7);  // the head, on stage 0
  EXPECT_TRUE(c3[0].kind == PipeOp::F && c3[0].chunk == 3 && c3[1].kind == PipeOp::F && c3[1].chunk == 4);
  EXPECT_EQ(c0.back().kind, PipeOp::W);
  EXPECT_EQ(c3.back().kind, PipeOp::W);
  expect_refused([] { pipeline_schedule(PpSchedule::dualpipev, 4, 2, 7); }, "needs at least 2 x pp = 8 micro-batches");
  expect_refused([] { pipeline_schedule(PpSchedule::zbv, 4, 3, 8); }, "places two model chunks on each stage");
}

TEST(PipelineSchedule, BadSettingsSayWhatToChange) {
  auto refused = [](PpSchedule name, int p, int v, int m, const char* says) {
    expect_refused([&] { pipeline_schedule(name, p, v, m); }, says);
  };
  refused(PpSchedule::interleaved, 4, 2, 6, "multiple of parallel.pp");
  refused(PpSchedule::f1b1, 4, 2, 8, "needs parallel.pp_schedule = \"interleaved\"");
  refused(PpSchedule::interleaved, 1, 2, 4, "needs parallel.pp > 1");
  // A name that is no schedule is refused where the config is read.
  Config c = config_defaults();
  expect_refused([&] { config_set(c, "parallel.pp_schedule=chimera"); },
                 "parallel.pp_schedule = 'chimera' is not one of gpipe|1f1b|interleaved|zb|zbv|dualpipev");
}

}  // namespace
}  // namespace loom

namespace loom {

// The executor's buffers hold the transfers in flight: at p = 4 their slots do not grow with m
// under any schedule (every receive is posted where its send is and read soon after), and
// the planner's items, which the executor allocates, say the same.
TEST(PipelineSchedule, ExecutorBuffersHoldWhatIsInFlightNotEveryMicroBatch) {
  for (PpSchedule name : {PpSchedule::gpipe, PpSchedule::f1b1, PpSchedule::interleaved, PpSchedule::zb, PpSchedule::zbv,
                          PpSchedule::dualpipev}) {
    const int v = name == PpSchedule::interleaved || pipeline_v_shape(name) ? 2 : 1;
    std::array<int, PipeSlots::kBuffers> at8{}, at16{};
    for (int m : {8, 16}) {
      const PipeSchedule s = pipeline_in_order(pipeline_schedule(name, 4, v, m));
      for (int st = 0; st < 4; ++st) {
        const auto n = pipeline_slots(s.ops[size_t(st)]).count;
        for (size_t b = 0; b < n.size(); ++b) (m == 8 ? at8 : at16)[b] = std::max((m == 8 ? at8 : at16)[b], n[b]);
      }
    }
    EXPECT_EQ(at8, at16) << name;
    for (int n : at16) EXPECT_LE(n, 2 * v) << name;
  }
  // A stage in the middle receives and sends both ways; the first receives no activation.
  Config c = config_defaults();
  c.model.n_layer = 4;
  c.parallel.pp = 4;
  c.train.global_batch = 16;
  c.train.micro_batch = 1;
  for (int steps_m : {8, 16}) {
    c.train.global_batch = steps_m;
    const auto items = pipeline_stage_plan(c, 1, DType::f32), first = pipeline_stage_plan(c, 0, DType::f32);
    int64_t bytes = 0;
    for (const auto& it : items) bytes += it.numel * 4;
    EXPECT_EQ(items.size(), 4u);
    EXPECT_EQ(first.size(), 2u);  // pp_send_act, pp_recv_grad
    EXPECT_LE(bytes, 4 * 2 * int64_t(c.model.seq_len) * c.model.d_model * 4) << "m " << steps_m;
  }
}

// Slots are reused once free: a receive read by its F frees the slot for the next receive;
// a send's slot is free after its group.
TEST(PipelineSchedule, SlotsAreReusedOnceFree) {
  const std::vector<PipeOp> ops = {{PipeOp::recv_act, 0, 1, 0}, {PipeOp::F, 0, 1},
                                   {PipeOp::send_act, 0, 2, 2}, {PipeOp::recv_act, 1, 1, 0},
                                   {PipeOp::F, 1, 1},           {PipeOp::send_act, 1, 2, 2},
                                   {PipeOp::recv_act, 2, 1, 0}, {PipeOp::recv_act, 3, 1, 0},
                                   {PipeOp::F, 2, 1},           {PipeOp::F, 3, 1}};
  const PipeSlots ps = pipeline_slots(ops);
  EXPECT_EQ(ps.slot, (std::vector<int>{0, -1, 0, 0, -1, 0, 0, 1, -1, -1}));
  EXPECT_EQ(ps.count, (std::array<int, PipeSlots::kBuffers>{2, 1, 0, 0, 0, 0}));
}

}  // namespace loom
