// The step-time model: collective times are the ring's counts, groups pick the link their
// placement uses, compute is the FLOP count flops.cpp gives MFU (independently written), the
// terms add up to the step, the dp traffic is the gradients' bytes, the pipeline's bubble is
// the schedule's, and the layout search ranks only what fits and what loom runs.
#include <gtest/gtest.h>

#include <cmath>

#include "model/flops.h"
#include "model/layout.h"
#include "model/registry.h"
#include "parallel/pipeline_schedule.h"
#include "plan/layout_search.h"
#include "plan/step_model.h"
#include "runtime/error.h"
#include "step_model_testing.h"

namespace loom {
namespace {

// 2 nodes of 4, nothing hidden behind compute.
Cluster cluster_small() {
  return test::cluster_of({});
}

Config model_small(const std::string& arch = "llama") {
  return test::small_model(arch);
}

TEST(StepModel, CollectivesCountRingStepsAndVolumes) {
  const LinkTier l{1e-5, 1e9};
  const double S = 8e6;
  EXPECT_DOUBLE_EQ(collective_time("all_reduce", 4, S, l, false), 6 * 1e-5 + 2 * 0.75 * S / 1e9);
  EXPECT_DOUBLE_EQ(collective_time("all_reduce", 8, S, l, true), 6 * 1e-5 + 2 * 0.875 * S / 1e9);  // tree: 2 log2 8
  EXPECT_DOUBLE_EQ(collective_time("reduce_scatter", 4, S, l, false), 3 * 1e-5 + 0.75 * S / 1e9);
  EXPECT_DOUBLE_EQ(collective_time("all_gather", 4, S, l, true), 3 * 1e-5 + 0.75 * S / 1e9);
  EXPECT_DOUBLE_EQ(collective_time("send", 2, S, l, false), 1e-5 + S / 1e9);
  EXPECT_EQ(collective_time("all_reduce", 1, S, l, false), 0);
  LinkTier r = l;  // sums at their own rate, a collective with its own bandwidth and latency
  r.reduce_bw = 2e9;
  r.op_bw[2] = 4e9, r.op_alpha_s[2] = 0;
  EXPECT_DOUBLE_EQ(collective_time("reduce_scatter", 4, S, r, false), 3 * 1e-5 + 0.75 * S / 1e9 + 0.75 * S / 2e9);
  EXPECT_DOUBLE_EQ(collective_time("all_gather", 4, S, r, false), 0.75 * S / 4e9);
}

TEST(StepModel, GroupsUseTheLinkTheirPlacementCrosses) {
  const Cluster c = cluster_small();
  EXPECT_EQ(group_link(c, 4, 1).bw, 10e9);      // tp 4 inside a node
  EXPECT_EQ(group_link(c, 2, 2).bw, 10e9);      // ranks 0 and 2
  const LinkTier across = group_link(c, 8, 1);  // one ring through both nodes
  EXPECT_EQ(across.bw, 1e9);
  EXPECT_NEAR(across.alpha_s, 100e-6, 1e-18);
  EXPECT_EQ(group_link(c, 2, 4).bw, 0.25e9);  // four dp groups share each node's link
}

TEST(StepModel, ComputeIsTheFlopsMfuCounts) {
  const Cluster c = cluster_small();  // memory bandwidth so high element-wise ops cost nothing
  for (const char* rc : {"none", "selective", "full"}) {
    Config cfg = model_small();
    cfg.train.recompute = choice_parse<Recompute>(rc).value();
    config_validate(cfg);
    const StepPrediction p = step_predict(cfg, c);
    const double tokens = double(cfg.train.global_batch) * cfg.model.seq_len;
    const double flops = p.compute * c.peak_flops * c.gemm_efficiency;
    // flops.cpp counts the norms' weights among the 6N (and full recompute's 2N); they are no matmul.
    const double norms = 2.0 * cfg.model.d_model * cfg.model.n_layer + cfg.model.d_model;
    const double expect = flops_per_token(model_dims(cfg)).hardware - (std::string(rc) == "full" ? 8 : 6) * norms;
    EXPECT_NEAR(flops / (expect * tokens), 1.0, 1e-9) << rc;
    EXPECT_NEAR(p.compute + p.comm_exposed + p.bubble + p.optimizer, p.step, 1e-12 * p.step);
  }
  // tp 2 halves each rank's work: attention, the MLP and the head split.
  Config tp = model_small();
  tp.parallel.tp = 2;
  config_validate(tp);
  Config one = model_small();
  config_validate(one);
  EXPECT_NEAR(step_predict(tp, c).compute / step_predict(one, c).compute, 0.5, 1e-9);
  EXPECT_EQ(step_predict(one, c).bubble, 0);  // no pipeline, no bubble
  // A MoE model computes its top_k experts only.
  Config moe = model_small();
  moe.model.moe.num_experts = 4, moe.model.moe.top_k = 2;
  config_validate(moe);
  const StepPrediction p = step_predict(moe, c);
  const double norms = 2.0 * moe.model.d_model * moe.model.n_layer + moe.model.d_model;
  EXPECT_NEAR(
      p.compute * c.peak_flops * c.gemm_efficiency /
          ((flops_per_token(model_dims(moe)).hardware - 6 * norms) * moe.train.global_batch * moe.model.seq_len),
      1.0, 1e-9);
  // Under tp the router and experts are whole on every rank, which runs them on every row.
  Config moe_tp = moe;
  moe_tp.parallel.tp = 2;
  config_validate(moe_tp);
  const double C = moe.model.d_model, F = moe.model.d_ff, L = moe.model.n_layer;
  const double experts = 6.0 * (2 * 3 * C * F + 4 * C) * L;  // per token: top 2 of 3 C F each, and the router
  const double dense = flops_per_token(model_dims(moe)).hardware - 6 * norms - experts;
  EXPECT_NEAR(step_predict(moe_tp, c).compute * c.peak_flops * c.gemm_efficiency /
                  ((dense / 2 + experts) * moe.train.global_batch * moe.model.seq_len),
              1.0, 1e-9);
}

TEST(StepModel, DataParallelMovesTheGradientsAndHidesBehindBackward) {
  Cluster c = cluster_small();
  Config cfg = model_small();
  cfg.parallel.dp = 8;  // across both nodes
  cfg.train.global_batch = 16;
  cfg.parallel.bucket_mb = 1e6;  // one bucket: it can only start once backward is done
  config_validate(cfg);
  const double grads = 4.0 * double(model_layout(model_dims(cfg)).reg.numel());
  const double ring = collective_time("all_reduce", 8, grads, group_link(c, 8, 1), false);
  StepPrediction p = step_predict(cfg, c);
  EXPECT_DOUBLE_EQ(p.dp_total, ring);
  EXPECT_DOUBLE_EQ(p.dp, ring);
  c.overlap = 1;
  EXPECT_DOUBLE_EQ(step_predict(cfg, c).dp, ring);
  // Small buckets: each pays its latency, and with overlap they go while backward runs.
  cfg.parallel.bucket_mb = 0.01;
  c.overlap = 0;
  p = step_predict(cfg, c);
  EXPECT_GT(p.dp_total, ring);
  EXPECT_DOUBLE_EQ(p.dp, p.dp_total);
  c.overlap = 1;
  const StepPrediction hidden = step_predict(cfg, c);
  EXPECT_LT(hidden.dp, p.dp_total);
  EXPECT_GE(hidden.dp, collective_time("all_reduce", 8, 0.01 * 1048576, group_link(c, 8, 1), false) * 0.999);
  EXPECT_LT(hidden.step, p.step);
}

TEST(StepModel, ZeroStagesMoveWhatTheyShard) {
  Cluster c = cluster_small();
  Config cfg = model_small();
  cfg.parallel.dp = 4;
  cfg.train.global_batch = 16;  // 2 micro-batches of 2 per rank
  config_validate(cfg);
  const double n = double(model_layout(model_dims(cfg)).reg.numel());
  const int units = cfg.model.n_layer + 2;  // embedding, blocks, head
  const LinkTier l = group_link(c, 4, 1);
  const double rs = units * collective_time("reduce_scatter", 4, 4 * n / units, l, false);
  const double ag = units * collective_time("all_gather", 4, 4 * n / units, l, false);  // f32 weights
  for (int zero : {1, 2, 3}) {
    Config z = cfg;
    z.parallel.zero = zero;
    config_validate(z);
    const StepPrediction p = step_predict(z, c);
    const double expect = zero == 1 ? rs + ag : zero == 2 ? 2 * rs + ag : 2 * (2 * ag + rs);
    EXPECT_NEAR(p.dp_total, expect, 1e-12) << "zero " << zero;
    EXPECT_NEAR(p.dp, expect, 1e-12) << "zero " << zero;                  // overlap 0
    EXPECT_NEAR(p.optimizer * 4, step_predict(cfg, c).optimizer, 1e-12);  // the moments sharded
  }
}

TEST(StepModel, ExpertsReduceOverExpertDataParallel) {
  const Cluster c = cluster_small();
  Config cfg = model_small();
  cfg.model.moe.num_experts = 4;
  cfg.parallel.dp = 4, cfg.parallel.ep = 2, cfg.parallel.zero = 1;
  cfg.train.global_batch = 16;
  config_validate(cfg);
  const ModelLayout layout = model_layout(model_dims(cfg), 0, std::vector<std::pair<int, int>>{{0, -1}});
  double experts = 0;
  for (auto& spec : layout.reg.all())
    if (expert_param(spec.name)) experts += double(spec.numel());
  const double dense = double(layout.reg.numel()) - experts;
  ASSERT_GT(experts, 0);
  // Dense over dp 4 unit by unit; experts over the 2 ranks holding them (ranks 0 and 2), per MoE block.
  const int units = cfg.model.n_layer + 2, moe = cfg.moe_layers();
  auto moved = [&](double n, int ranks, int u, const LinkTier& l) {
    return u * (collective_time("reduce_scatter", ranks, 4 * n / u, l, false) +
                collective_time("all_gather", ranks, 4 * n / u, l, false));
  };
  const double expect = moved(dense, 4, units, group_link(c, 4, 1)) + moved(experts, 2, moe, group_link(c, 2, 2));
  const StepPrediction p = step_predict(cfg, c);
  EXPECT_NEAR(p.dp_total, expect, 1e-12);
  EXPECT_NEAR(p.optimizer, (dense / 4 + experts / 2) * 32 / c.mem_bw, 1e-15);
}

TEST(StepModel, HandOffsCrossANodeWhereTheStagesDo) {
  Cluster c = cluster_small();  // 2 nodes of 4
  Cluster flat = c;
  flat.inter = flat.intra;
  Config cfg = model_small();
  cfg.train.global_batch = 16;
  cfg.parallel.pp = 2, cfg.parallel.dp = 4;  // stage 0 on node 0, stage 1 on node 1
  config_validate(cfg);
  EXPECT_GT(step_predict(cfg, c).pp, 2 * step_predict(cfg, flat).pp);
  Config in = model_small();  // four stages of one rank: all on node 0
  in.train.global_batch = 16;
  in.parallel.pp = 4;
  config_validate(in);
  EXPECT_DOUBLE_EQ(step_predict(in, c).pp, step_predict(in, flat).pp);
}

TEST(StepModel, PipelineBubbleIsTheSchedules) {
  Cluster c = cluster_small();
  c.inter = c.intra;  // hand-offs at intra speed
  Config cfg = model_small();
  cfg.model.n_layer = 8, cfg.model.vocab_size = 64;  // a head small beside a stage's two blocks
  cfg.parallel.pp = 4;
  cfg.train.global_batch = 16;  // 8 micro-batches
  auto predict = [&](const char* schedule, int v) {
    Config x = cfg;
    x.parallel.pp_schedule = choice_parse<PpSchedule>(schedule).value(), x.parallel.pp_virtual = v;
    config_validate(x);
    return step_predict(x, c);
  };
  const StepPrediction p = predict("1f1b", 1);
  // 1f1b idles p - 1 forwards and backwards of a stage (the head's extra work on the last
  // stage adds a little each micro-batch).
  const double per_micro = p.compute / 8;
  EXPECT_GT(p.bubble, 3 * per_micro * 0.95);
  EXPECT_LT(p.bubble, 3 * per_micro * 1.35);
  EXPECT_GT(p.pp, 0);
  EXPECT_NEAR(predict("gpipe", 1).bubble, p.bubble, 0.05 * p.bubble);
  EXPECT_LT(predict("interleaved", 2).bubble, 0.75 * p.bubble);
  EXPECT_LT(predict("zb", 1).bubble, 0.75 * p.bubble);
}

TEST(StepModel, RanksSharingADeviceTakeTurns) {
  Cluster c = cluster_small();
  Config cfg = model_small();
  cfg.parallel.tp = 4;  // inside a node
  config_validate(cfg);
  const StepPrediction own = step_predict(cfg, c);
  c.physical_devices = 2;  // four ranks on two cores
  const StepPrediction shared = step_predict(cfg, c);
  EXPECT_NEAR(shared.compute, 2 * own.compute, 1e-12);
  EXPECT_NEAR(shared.tp, 2 * own.tp, 1e-12);  // shared memory is the cores' copying
  // Between nodes the link's bandwidth is the link's: only the per-message cost doubles.
  Config across = model_small();
  across.parallel.dp = 8, across.parallel.bucket_mb = 1e6, across.train.global_batch = 16;
  config_validate(across);
  c.physical_devices = 0;
  const double alone = step_predict(across, c).dp_total;
  c.physical_devices = 4;
  const double crowded = step_predict(across, c).dp_total;
  const double latency = 14 * c.inter.alpha_s;  // 2(n-1) steps
  EXPECT_NEAR(crowded - alone, latency, 1e-12);
}

TEST(StepModel, SearchRanksWhatFitsAndRuns) {
  Cluster c = cluster_small();
  c.memory_bytes = 4e6;  // room for some layouts only
  Config base = model_small();
  base.train.global_batch = 16;
  config_validate(base);
  const LayoutSearch s = layouts_rank(base, c);
  ASSERT_FALSE(s.ranked.empty());
  EXPECT_GT(s.too_big, 0);
  for (size_t i = 0; i < s.ranked.size(); ++i) {
    const LayoutChoice& l = s.ranked[i];
    EXPECT_EQ(l.cfg.world(), c.devices());
    EXPECT_LE(double(l.pred.memory_bytes), c.memory_bytes) << layout_name(l.cfg);
    if (i) {
      EXPECT_LE(l.pred.mfu, s.ranked[i - 1].pred.mfu);
    }
    Config again = l.cfg;
    EXPECT_NO_THROW(config_validate(again));
    EXPECT_LE(l.cfg.parallel.tp, c.devices_per_node);
  }
  // ZeRO-3 runs with pipelines, with either reshard policy, and the V schedules are tried:
  // each shows up among the ranked layouts.
  // Context parallel too, with pipelines.
  bool z3_pp = false, kept = false, v = false, cp_pp = false;
  for (const LayoutChoice& l : s.ranked) {
    z3_pp = z3_pp || (l.cfg.parallel.zero == 3 && l.cfg.parallel.pp > 1);
    kept = kept || (l.cfg.parallel.zero == 3 && l.cfg.parallel.zero3_reshard == Zero3Reshard::after_step);
    v = v || l.cfg.pp_v_shape();
    cp_pp = cp_pp || (l.cfg.parallel.cp > 1 && l.cfg.parallel.pp > 1);
  }
  EXPECT_TRUE(z3_pp);
  EXPECT_TRUE(kept);
  EXPECT_TRUE(v);
  EXPECT_TRUE(cp_pp);
  int refused = 0;
  for (auto& [key, got] : s.refused) refused += got.first;
  EXPECT_EQ(s.tried, refused + s.too_big + int(s.ranked.size()));
  // The first-ranked is what --predict says of its layout.
  const StepPrediction again = step_predict(s.ranked[0].cfg, c);
  EXPECT_EQ(again.mfu, s.ranked[0].pred.mfu);
}

TEST(StepModel, ClusterFilesSayWhatIsWrong) {
  const std::string ok =
      "nodes = 1\ndevices_per_node = 1\npeak_tflops = 1\ngemm_efficiency = 0.5\nmem_bw_gbs = 1\n"
      "[intra]\nalpha_us = 1\nbw_gbs = 1\n";
  EXPECT_NO_THROW(cluster_parse(ok, "f"));
  auto fails = [&](const std::string& text, const std::string& says) {
    try {
      cluster_parse(text, "f");
      ADD_FAILURE() << "no error for: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  fails("gpus = 8\n" + ok, "unknown key `gpus`");
  fails("nodes = 1\ndevices_per_node = 1\ngemm_efficiency = 0.5\nmem_bw_gbs = 1\n[intra]\nalpha_us = 1\nbw_gbs = 1\n",
        "`peak_tflops` must be a positive number");
  std::string eff = ok;
  eff.replace(eff.find("0.5"), 3, "1.5");
  fails(eff, "gemm_efficiency = 1.5 is a share of the peak, at most 1");
  fails(ok + "bandwidth = 3\n", "unknown key `intra.bandwidth`");
  fails("nodes = 2\n" + ok.substr(ok.find("devices_per_node")), "`inter.alpha_us`");
  fails("devices_per_node = 0.5\n" + ok.substr(ok.find("peak")) + "", "`nodes` is missing");
  std::string half = ok;
  half.replace(half.find("devices_per_node = 1"), 20, "devices_per_node = 0.5");
  fails(half, "`devices_per_node` must be a whole number from 1 to 1000000");
  fails("memory_gb = -1\n" + ok, "`memory_gb` must be a positive number");
  fails("tree = 1\n" + ok, "`tree` must be true or false");
  std::string bad_tier = ok;
  bad_tier += "fast = 1\n";  // inside [intra]
  fails(bad_tier, "unknown key `intra.fast`");
}

// Context parallel: each rank computes T / cp tokens; the ring's transfers hide behind block
// attention unless cp_overlap is false; the all-gather's gather (twice) and reduce-scatter are
// exposed, per block and micro-batch, to the byte.
TEST(StepModel, ContextParallelTransfersAndTheirOverlap) {
  Cluster c = cluster_small();
  c.overlap = 1;
  c.dtype = DType::bf16;  // keys and values travel in bf16, their gradients in f32
  Config base = model_small();
  base.model.seq_len = 256;
  base.parallel.cp = 2, base.parallel.dp = 4;
  config_validate(base);
  const StepPrediction ring = step_predict(base, c);
  Config off = base;
  off.parallel.cp_overlap = false;
  config_validate(off);
  const StepPrediction exposed = step_predict(off, c);
  const double kvd = double(base.kv_heads()) * base.head_dim(), tokens = 2.0 * 128, act = 2;
  const double kv = tokens * 2 * kvd * act, hop = collective_time("send", 2, kv, c.intra, false),
               hop_grad = collective_time("send", 2, 2 * kv, c.intra, false);
  const int L = base.model.n_layer, m = base.accum_steps();
  // forward one hop; backward one hop and one gradient, and the gradient's last hop home
  EXPECT_NEAR(exposed.cp, m * L * (2 * hop + 2 * hop_grad), 1e-12);
  // overlapped: each hop behind the causal half of one block's attention (two blocks' worth
  // backward), the gradient's last hop home never hidden
  const double rate = c.peak_flops * c.gemm_efficiency, C = base.model.d_model;
  const double core_block = 0.5 * 4.0 * C * 256 * tokens / rate / 2;
  const double hidden = std::max(0.0, hop - core_block) + std::max(0.0, hop + hop_grad - 2 * core_block) + hop_grad;
  EXPECT_NEAR(ring.cp, m * L * hidden, 1e-12);
  EXPECT_LT(ring.cp, exposed.cp);
  EXPECT_GT(ring.cp, 0);
  Config ag = base;
  ag.parallel.cp_attention = CpAttentionKind::allgather;
  config_validate(ag);
  const double gather = collective_time("all_gather", 2, 2 * kv, c.intra, c.tree);
  const double rs = collective_time("reduce_scatter", 2, 2 * 2 * kv, c.intra, c.tree);  // f32 gradients
  EXPECT_NEAR(step_predict(ag, c).cp, m * L * (2 * gather + rs), 1e-12);
  // half the tokens a rank: less memory than the same layout without cp
  Config one = base;
  one.parallel.cp = 1;
  config_validate(one);
  EXPECT_LT(step_predict(base, c).memory_bytes, step_predict(one, c).memory_bytes);
}

}  // namespace
}  // namespace loom
