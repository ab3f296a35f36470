// The roofline profile (log.profile_steps): every op family a step issues, with the bytes and
// FLOPs its shapes give (hand-counted here for a small model), on the CPU and the emulated
// device; the same bits with it on as off, no host wait added; the ops on the trace's gpu
// track; and the cluster file it fits, which the step model reads back as measured.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "plan/step_model.h"
#include "runtime/cuda_api.h"
#include "train/bench.h"
#include "train/trainer.h"

namespace loom {
namespace {

constexpr int L = 2, C = 64, V = 128, T = 16, B = 2, F = 4 * C;

Config small(DeviceChoice device, const std::string& profile) {
  Config c = config_defaults();
  c.model.n_layer = L, c.model.d_model = C, c.model.n_head = 2, c.model.vocab_size = V, c.model.seq_len = T;
  c.train.micro_batch = B, c.train.global_batch = 2 * B;  // two micro-batches a step
  c.train.steps = 3, c.train.threads = 1, c.train.device = device;
  c.data.val_batches = 0;
  c.log.dir.clear(), c.log.cluster = "none";
  c.log.profile_steps = profile;
  config_validate(c);
  return c;
}

TrainResult run(const Config& c) {
  TrainOptions o;
  o.quiet = true;
  return train_run(c, o);
}

const ProfileRow& row(const TrainResult& r, const std::string& family) {
  const ProfileRow* p = r.profile.find(family);
  if (!p) throw std::runtime_error("no row " + family + " in the profile");
  return *p;
}

// Per step and micro-batch count m = 2: N tokens of the micro-batch, es bytes an element.
void expect_hand_counts(const TrainResult& r, int es) {
  const double N = B * T, m = 2, steps = double(r.profile.steps);
  ASSERT_EQ(r.profile.steps, 2);
  // LayerNorm forward: ln_1 and ln_2 of each block and ln_f, all but the first with the
  // residual add fused (rows read twice and written twice); weight and bias read; mean and rstd.
  const double with_add = (4 * N * C + 2 * C) * es + 8 * N, first = (2 * N * C + 2 * C) * es + 8 * N;
  const ProfileRow& ln = row(r, "layernorm fwd");
  EXPECT_EQ(ln.calls, int64_t(steps * m * (2 * L + 1)));
  EXPECT_DOUBLE_EQ(ln.bytes / steps, m * (2 * L * with_add + first));
  // LayerNorm backward: dout, input, dinp read, dinp written; w; mean, rstd; dw, db fp32 += .
  const ProfileRow& lnb = row(r, "layernorm bwd");
  EXPECT_DOUBLE_EQ(lnb.bytes / steps, m * (2 * L + 1) * ((4 * N * C + C) * es + 8 * N + 16 * C));
  // GEMMs forward: qkv, proj, fc, down of each block and the tied head, 2 N K N' FLOPs each.
  const double mm = L * (C * 3 * C + C * C + C * F + F * C) + C * V;
  EXPECT_DOUBLE_EQ(row(r, "linear fwd").flops / steps, m * 2 * N * mm);
  // GELU forward: fc read, act written.
  EXPECT_DOUBLE_EQ(row(r, "gelu fwd").bytes / steps, m * L * 2 * N * F * es);
  // Causal attention forward: QK^T and PV over the lower triangle, B H T^2 D x 2 each.
  EXPECT_DOUBLE_EQ(row(r, "attention fwd").flops / steps, m * L * 2.0 * B * T * T * C);
  EXPECT_DOUBLE_EQ(row(r, "attention bwd").flops / steps, m * L * 4.0 * B * T * T * C);
  // The loss over the logits: read, and their gradient written over them.
  EXPECT_DOUBLE_EQ(row(r, "loss").bytes / steps, m * (2 * N * V * es + 8 * N));
  EXPECT_EQ(row(r, "adamw").calls, int64_t(steps));
  for (const char* f : {"linear bwd", "layernorm bwd", "embedding fwd", "embedding bwd", "grad norm"})
    EXPECT_NE(r.profile.find(f), nullptr) << f;
  double ops = 0;
  for (const ProfileRow& p : r.profile.rows) ops += p.ms;
  EXPECT_GT(ops, 0);
  EXPECT_LE(ops, r.profile.step_ms * 1.0001);  // the ops lie inside the step windows
  const std::string table = profile_table(r.profile, {1e10, 1e11, "test"});
  for (const char* s : {"op family", "layernorm fwd", "roofline", "idle"})
    EXPECT_NE(table.find(s), std::string::npos) << s << " in\n" << table;
}

TEST(Profile, CpuTableHasTheFamiliesAndHandCountedBytesAndFlops) {
  const TrainResult on = run(small(DeviceChoice::cpu, "2:3")), off = run(small(DeviceChoice::cpu, ""));
  expect_hand_counts(on, 4);
  EXPECT_EQ(off.profile.steps, 0);   // no wrapper at all
  EXPECT_EQ(on.losses, off.losses);  // the same bits
  EXPECT_EQ(on.grad_norms, off.grad_norms);
}

TEST(Profile, EmulatedDeviceSameBitsNoHostWaitAdded) {
  Config c = small(DeviceChoice::cuda_emulated, "2:3");
  c.train.steps = 3;
  const TrainResult on = run(c);
  expect_hand_counts(on, 2);
  Config plain = c;
  plain.log.profile_steps.clear();
  const TrainResult off = run(plain);
  EXPECT_EQ(on.losses, off.losses);
  EXPECT_EQ(on.grad_norms, off.grad_norms);
  // Inside the step (its micro-batches through its end), a profiled step waits for the device
  // exactly as often as an unprofiled one; its events are read after that.
  auto syncs_of_step = [](const Config& cfg) {
    TrainOptions o;
    o.quiet = true;
    Trainer t(cfg, o);
    t.init();
    t.step(0);
    const StepMetrics m = t.step(1);
    return std::pair{m.host_syncs_compute, m.host_syncs};
  };
  EXPECT_EQ(syncs_of_step(c), syncs_of_step(plain));
}

// The emulated device counts a profiled step's launches as an unprofiled step issues them (the
// profile's events are none of them), and the profile prices them; the CPU has none to count.
TEST(Profile, EmulatedDeviceCountsTheLaunchesItPrices) {
  Config c = small(DeviceChoice::cuda_emulated, "2:3");
  const TrainResult on = run(c);
  Config plain = c;
  plain.log.profile_steps.clear();
  TrainOptions o;
  o.quiet = true;
  Trainer t(plain, o);
  t.init();
  t.step(0);
  const StepMetrics m = t.step(1);
  ASSERT_GT(m.device_ops, 0);
  EXPECT_EQ(m.graph_launches, 0);
  EXPECT_EQ(on.profile.launches, on.profile.steps * m.device_ops);
  const std::string line = launch_gap_line(on.profile);
  EXPECT_NE(line.find(fmt::format("{} launches a step (counted", m.device_ops)), std::string::npos) << line;
  const TrainResult cpu = run(small(DeviceChoice::cpu, "2:3"));
  EXPECT_EQ(cpu.profile.launches, -1);
  EXPECT_NE(launch_gap_line(cpu.profile).find("at least"), std::string::npos);
}

TEST(Profile, TraceGetsTheOpsOnAGpuTrack) {
  Config c = small(DeviceChoice::cpu, "2:2");
  c.log.dir = ::testing::TempDir() + "loom_profile_trace";
  c.log.trace = true;
  std::filesystem::remove_all(c.log.dir);
  run(c);
  std::ifstream in(c.log.dir + "/trace.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"args\":{\"name\":\"gpu\"}"), std::string::npos);
  EXPECT_NE(text.find("{\"name\":\"layernorm fwd\",\"ph\":\"X\",\"pid\":0,\"tid\":3"), std::string::npos);
}

// The fitted file predicts the profiled run's compute and optimizer terms as measured.
TEST(Profile, FittedClusterPredictsTheMeasuredTerms) {
  const Config c = small(DeviceChoice::cpu, "2:3");
  const TrainResult r = run(c);
  const Cluster base = cluster_parse(
      "name = \"t\"\nnodes = 1\ndevices_per_node = 1\ndevice = \"cpu\"\ndtype = \"f32\"\npeak_tflops = 1\n"
      "gemm_efficiency = 0.5\nmem_bw_gbs = 10\n[intra]\nalpha_us = 1\nbw_gbs = 1\n",
      "t");
  const Cluster fit = profile_cluster_fit(base, c, r.profile);
  double compute = 0, optimizer = 0;
  for (const ProfileRow& p : r.profile.rows) {
    if (p.family == "adamw" || p.family == "grad norm")
      optimizer += p.ms;
    else if (p.family != "inputs" && p.family != "download" && p.family != "upload")
      compute += p.ms;
  }
  const double n = double(r.profile.steps);
  Config k = c;
  k.train.dtype = DTypeChoice::f32;
  const StepPrediction p = step_predict(k, fit);
  EXPECT_NEAR(p.compute, compute / n / 1e3, 1e-6 * p.compute);
  EXPECT_NEAR(p.optimizer, optimizer / n / 1e3, 1e-6 * p.optimizer);
  EXPECT_GT(fit.attention_flops, 0);
  EXPECT_NE(cluster_rates(fit).describe.find("attention_tflops"), std::string::npos);
}

// Context parallel's attention is priced at the attention rate (the same flash tiles) unless
// the file measured one of its own.
TEST(Profile, CpAttentionTakesTheAttentionRateWithoutAMeasuredRate) {
  const std::string head =
      "name = \"g\"\nnodes = 1\ndevices_per_node = 8\ndevice = \"cuda\"\npeak_tflops = 989\n"
      "gemm_efficiency = 0.7\nmem_bw_gbs = 3000\n[intra]\nalpha_us = 1\nbw_gbs = 300\n";
  const ClusterRates assumed = cluster_rates(cluster_parse(head, "g"));
  EXPECT_DOUBLE_EQ(assumed.cp_attention, 989e12 * 0.7);  // no attention_tflops either: the matmuls'
  EXPECT_NE(assumed.describe.find("cp attention 692.3 TFLOP/s (assumed: the attention rate)"), std::string::npos);
  const ClusterRates att = cluster_rates(cluster_parse("attention_tflops = 60\n" + head, "g"));
  EXPECT_DOUBLE_EQ(att.cp_attention, 60e12);
  const ClusterRates measured = cluster_rates(cluster_parse("cp_attention_tflops = 5\n" + head, "g"));
  EXPECT_DOUBLE_EQ(measured.cp_attention, 5e12);
  EXPECT_DOUBLE_EQ(measured.attention, 989e12 * 0.7);  // no attention_tflops: the matmuls' rate
}

// examples/clusters/h200.toml predicts the two benchmark models' steps as loom measured them on
// an H200 (every kernel timed: 74.7 and 283 ms), within 15%: the file and the model agree.
TEST(Profile, H200ClusterPredictsTheMeasuredBenchmarkSteps) {
  const std::string src = LOOM_SOURCE_DIR;
  const Cluster h200 = cluster_load(src + "/examples/clusters/h200.toml");
  for (auto [name, ms] : {std::pair{"gpt2_124m_gpu", 74.7}, {"llama_1b_gpu", 283.0}}) {
    Config c = config_defaults();
    config_load_file(c, src + "/examples/configs/" + name + ".toml");
    config_validate(c);
    const StepPrediction p = step_predict(c, h200);
    EXPECT_NEAR(1e3 * p.step, ms, 0.15 * ms) << name;
  }
}

// The kernel model's predicted times become the step model's per-op rates (bench kernels --counts
// --write-cluster): with them, its attention, element-wise and optimizer terms on the config are
// those times, and its matmuls are the file's.
TEST(Profile, TermSecondsBecomeTheStepModelsRates) {
  const std::string src = LOOM_SOURCE_DIR;
  const Cluster h200 = cluster_load(src + "/examples/clusters/h200.toml");
  Config c = config_defaults();
  config_load_file(c, src + "/examples/configs/gpt2_124m_gpu.toml");
  config_validate(c);
  const Cluster set = cluster_with_term_seconds(h200, c, 0.010, 0.005, 0.001);
  Cluster free = set;
  free.attention_flops = free.mem_bw = 1e30;
  const double matmuls = step_predict(c, free).compute;
  const StepPrediction p = step_predict(c, set);
  EXPECT_NEAR(p.compute, matmuls + 0.010 + 0.005, 1e-9);
  EXPECT_NEAR(p.optimizer, 0.001, 1e-9);
  EXPECT_DOUBLE_EQ(cluster_with_term_seconds(h200, c, 0, 0, 0).attention_flops, h200.attention_flops);  // kept
}

}  // namespace
}  // namespace loom
