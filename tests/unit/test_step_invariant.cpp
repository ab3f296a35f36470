// parallel.invariant in the step-time model: the micro-batch tree's traffic is a term of its
// own, over 2 ranks the library's collectives stay, over more DDP hides the tree all-reduce
// behind the backward but for the units that end it, and ZeRO-2 pays a tree reduce-scatter a unit and micro-batch
// (log2(dp) latencies, the first hidden behind the next unit's backward), each exchange on the link its pair crosses.
#include <gtest/gtest.h>

#include <cmath>

#include "model/layout.h"
#include "model/registry.h"
#include "plan/layout_search.h"
#include "plan/step_invariant.h"
#include "plan/step_model.h"
#include "step_model_testing.h"

namespace loom {
namespace {

// One node of 16 (every dp below in it), overlap 1: what the plain path hides, it hides.
Cluster node16(double mem_bw_gbs, double bw_gbs, double peak_tflops = 1) {
  test::ClusterFigures f;
  f.nodes = 1, f.devices_per_node = 16, f.peak_tflops = peak_tflops, f.mem_bw_gbs = mem_bw_gbs, f.overlap = 1;
  f.intra_bw_gbs = bw_gbs;
  return test::cluster_of(f);
}

Config model(const std::string& arch, int dp, int micro_batches, int zero = 0) {
  Config c = test::small_model(arch);
  c.train.global_batch = 2 * dp * micro_batches;
  c.parallel.dp = dp, c.parallel.zero = zero, c.parallel.invariant = true;
  config_validate(c);
  return c;
}

double params(const Config& c) {
  return double(model_layout(model_dims(c)).reg.numel());
}

// Catches: the fold left out of the step, or counted per micro-batch (m, not m - 1 adds).
TEST(StepModel, InvariantAtOneRankCostsTheFoldAlone) {
  const Cluster cl = node16(10, 10);
  const Config c = model("llama", 1, 4);
  const StepPrediction p = step_predict(c, cl);
  EXPECT_NEAR(p.tree_fold, 24.0 * 3 * params(c) / 10e9, 1e-15);  // 3 adds, 3 copies up, 3 zeroings
  EXPECT_NEAR(p.step - p.plain_step, p.tree_fold, 1e-12);
  EXPECT_EQ(p.dp, 0);
  const StepPrediction one = step_predict(model("llama", 1, 1), cl);  // one micro-batch: nothing to fold
  EXPECT_EQ(one.tree_fold, 0);
  EXPECT_EQ(one.step, one.plain_step);
}

// Catches: the tree taken over 2 ranks (where loom keeps the library's overlapped all-reduce).
TEST(StepModel, InvariantOverTwoRanksKeepsTheLibrarysAllReduce) {
  const StepPrediction p = step_predict(model("llama", 2, 2), node16(10, 10));
  EXPECT_GT(p.dp, 0);
  EXPECT_EQ(p.dp, p.plain_dp);
  EXPECT_NEAR(p.step - p.plain_step, p.tree_fold, 1e-12);
}

// Catches: the tree all-reduce priced after the backward (nothing overlapped), or hidden whole
// (the units that end the backward have their exchanges left), or at the ring's 2 (dp - 1)
// steps instead of 2 log2(dp).
TEST(StepModel, InvariantDdpHidesTheTreeAllReduceButItsTail) {
  // element-wise work free (the exchanges alone), a backward long enough to hide all but the tail
  const Cluster cl = node16(1e12, 10, 1e-3);
  Config c = model("llama", 4, 1);
  c.parallel.bucket_mb = 0.01;
  const StepPrediction p = step_predict(c, cl);
  const ModelLayout layout = model_layout(model_dims(c));
  auto len = [&](int u) { return double(layout.unit_lo(u + 1) - layout.unit_lo(u)); };
  // 4 exchanges a unit: the embedding's all, blocks 1, 2, 3 (ending the backward 1, 2, 3 units
  // early) 3, 2 and 1 of them
  const double tail = len(0) + len(1) * 3 / 4 + len(2) * 2 / 4 + len(3) * 1 / 4;
  EXPECT_NEAR(tree_all_reduce_tail(layout, 4), tail, 1e-6);
  auto tree = [](double bytes) { return 4 * 10e-6 + 2 * (bytes / 2 + bytes / 4) / 10e9; };
  EXPECT_NEAR(p.dp, tree(4 * tail), 1e-9 * tree(4 * tail));
  EXPECT_NEAR(p.dp_total, tree(4 * params(c)), 1e-9 * tree(4 * params(c)));  // every byte still sent
  EXPECT_NEAR(p.step - p.plain_step, p.dp - p.plain_dp, 1e-12);
  // a backward that hides nothing: the whole tree after it
  const StepPrediction fast = step_predict(c, node16(1e12, 10, 1e9));
  EXPECT_NEAR(fast.dp, tree(4 * params(c)), 1e-3 * tree(4 * params(c)));
}

// Catches: the tree reduce-scatter's dp - 1 steps (the ring's), or more of it hidden than each
// unit's first exchange (its slot is drained at the next hook), or the last unit's hidden too.
TEST(StepModel, InvariantZero2LatencyGrowsWithLog2Dp) {
  const Cluster cl = node16(1e12, 1e12);  // latency alone
  const int units = 4 + 2, m = 2;         // blocks, embedding and head; micro-batches a rank
  for (int dp : {4, 8, 16}) {
    const StepPrediction p = step_predict(model("llama", dp, m, 2), cl);
    const double tree_rs = m * units * std::log2(dp) * 10e-6, gathers = units * (dp - 1) * 10e-6;
    const double hidden = m * (units - 1) * 10e-6;  // every unit's first exchange but the last unit's
    EXPECT_NEAR(p.dp, tree_rs - hidden + gathers, 1e-9) << "dp " << dp;
    EXPECT_NEAR(p.dp_total, tree_rs + gathers, 1e-9) << "dp " << dp;  // every exchange still made
  }
}

// Catches: ZeRO-2's tree reduce-scatter priced as the blocking one (nothing hidden) when the
// backward is long, or its first exchanges hidden when the backward is too short to hide them.
TEST(StepModel, InvariantZero2HidesTheFirstExchangesBehindTheBackward) {
  Config c = model("llama", 8, 1, 2);
  const ModelLayout layout = model_layout(model_dims(c));
  const int units = layout.num_units();
  const double n = params(c), rate = 1e21;
  for (double peak : {1e-3, 1e9}) {  // a backward that hides all it can, and one that hides nothing
    const Cluster cl = node16(1e12, 10, peak);
    const StepPrediction p = step_predict(c, cl);
    const double trs = units * tree_collective_time("reduce_scatter", 8, 1, 4 * n / units, cl, rate);
    const double first = units * tree_first_exchange_time(8, 1, 4 * n / units, cl);
    const double gathers = p.dp_total - trs;  // ZeRO-2's one all-gather a step
    const double want = peak < 1 ? trs - first + first / units : trs;
    EXPECT_NEAR(p.dp - gathers, want, 1e-3 * want) << "peak " << peak;
  }
}

// Catches: the tied head's own sum left out (its matrix's all-reduce after the step, its add).
TEST(StepModel, InvariantTiedHeadAddsItsMatrixOnce) {
  const Config c = model("gpt2", 4, 1);
  const double w = double(model_layout(model_dims(c)).reg.at(head_names(model_dims(c)).wte).numel());
  EXPECT_NEAR(step_predict(c, node16(10, 10)).tree_fold, 16 * w / 10e9, 1e-15);  // added to the embedding's and zeroed
  // a backward that hides nothing: the gradients' tree, then the head's matrix's
  const Cluster cl = node16(1e12, 10, 1e9);
  const StepPrediction p = step_predict(c, cl);
  const double rate = 1e21;
  const double expect = tree_collective_time("all_reduce", 4, 1, 4 * params(c), cl, rate) +
                        tree_collective_time("all_reduce", 4, 1, 4 * w, cl, rate);
  EXPECT_NEAR(p.dp, expect, 1e-3 * expect);
}

// Catches: gpt2's head part kept apart under ZeRO-2 with cp priced as one reduce-scatter over
// dp x cp each micro-batch (log2(dp cp) latencies), not as the units' split: log2(dp) each
// micro-batch, log2(cp) once a step.
TEST(StepModel, InvariantTiedHeadWithCpSplitsAsTheUnits) {
  const Cluster cl = node16(1e12, 1e12);  // latency alone
  const int m = 2;
  auto with = [&](bool tied) {
    Config c = test::small_model("gpt2");
    config_set(c, tied ? "model.tie_embeddings=true" : "model.tie_embeddings=false");
    c.train.global_batch = 2 * 2 * m;
    c.parallel.dp = 2, c.parallel.cp = 2, c.parallel.zero = 2, c.parallel.invariant = true;
    config_validate(c);
    return step_predict(c, cl);
  };
  EXPECT_NEAR(with(true).dp_total - with(false).dp_total, (m * 1 + 1) * 10e-6, 1e-9);
}

// Catches: the reduce-scatter halving from the highest bit (its big first half would cross
// nodes from every rank at once), its blocks' permutation left out, or the pairs priced on the
// node's whole link (every rank of a node crosses at once).
TEST(StepModel, InvariantExchangesCrossTheLinkTheirPairDoes) {
  test::ClusterFigures f;  // 2 nodes of 4
  f.mem_bw_gbs = 1, f.overlap = 1;
  const Cluster c = test::cluster_of(f);
  const double S = 8e6, adds = 3 * 0.875 * S / 1e9;
  // 8 positions, 4 of them palindromes: 2 pairs swapped, 3 block copies each (read and write)
  const double permute = 2 * 3 * 2 * (S / 8) / 1e9;
  const double in_node = 2 * 10e-6 + (S / 2 + S / 4) / 10e9, across = 100e-6 + S / 8 / 0.25e9;
  EXPECT_NEAR(tree_collective_time("reduce_scatter", 8, 1, S, c, 1e9), permute + in_node + across + adds, 1e-12);
  const double across_ar = 100e-6 + S / 8 / 0.25e9, in_node_ar = 2 * 10e-6 + (S / 2 + S / 4) / 10e9;
  EXPECT_NEAR(tree_collective_time("all_reduce", 8, 1, S, c, 1e9), 2 * (across_ar + in_node_ar) + adds, 1e-12);
}

// Catches: the cost's line missing from `loom plan layout --predict`, or printed without the mode.
TEST(StepModel, InvariantCostIsPrinted) {
  const Cluster cl = node16(10, 10);
  Config c = model("llama", 4, 2);
  const std::string on = step_prediction_text(c, cl, step_predict(c, cl));
  EXPECT_NE(on.find("parallel.invariant: +"), std::string::npos) << on;
  EXPECT_NE(on.find("a tree all-reduce a unit, overlapped with the backward"), std::string::npos) << on;
  c.parallel.invariant = false;
  EXPECT_EQ(step_prediction_text(c, cl, step_predict(c, cl)).find("parallel.invariant"), std::string::npos);
}

}  // namespace
}  // namespace loom
