// The time model (plan/kernel_model.h) against what an H200 measured of loom's earlier kernels
// (commit 8150dfa; GPT-2 124M at B16 T1024 and the 1.1B LLaMA at B4 T2048, each kernel timed,
// summed per class and step), before it predicts anything new: every class within 30%.
// The earlier kernels' counts are data: tests/cuda/counts_8150dfa.csv, written by
//   tests/cuda/counts_at_commit.sh 8150dfa --with-llama-attention
// and their sm_90 registers: tests/cuda/ptxas_8150dfa.csv, written from that commit's tree by
//   tests/cuda/ptxas_check.py NVCC TREE --table tests/cuda/ptxas_8150dfa.csv --table-only
// Today's kernels are not checked here (nothing has timed them); `loom bench kernels --counts`
// prints what the model predicts for them.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "plan/kernel_model.h"
#include "plan/step_model.h"
#include "train/bench.h"

using namespace loom;

namespace {

std::string read(const std::string& name) {
  std::ifstream in(std::string(LOOM_SOURCE_DIR) + "/tests/cuda/" + name);
  if (!in) throw std::runtime_error("cannot read tests/cuda/" + name);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Measured {
  const char* model;
  int layers;
  const char* kernel_class;
  double ms;  // per step, the H200
};
// Issue 53 section 3: the H200's per-class kernel times of the 8150dfa kernels.
constexpr Measured kMeasured[] = {{"gpt2_124m", 12, "attention", 28.7},   {"gpt2_124m", 12, "layernorm", 19.8},
                                  {"gpt2_124m", 12, "crossentropy", 2.2}, {"gpt2_124m", 12, "gelu", 1.8},
                                  {"gpt2_124m", 12, "column sums", 2.3},  {"gpt2_124m", 12, "adamw", 1.0},
                                  {"llama_1b", 22, "attention", 145.5},   {"llama_1b", 22, "rmsnorm", 46.2},
                                  {"llama_1b", 22, "adamw", 9.1},         {"llama_1b", 22, "swiglu", 8.2}};

// Predicted over measured, per class, with `k`'s constants.
std::vector<std::pair<std::string, double>> ratios(const KernelModelConstants& k) {
  const auto ops = emu::counts_csv_parse(read("counts_8150dfa.csv"));
  const auto table = ptxas_table_parse(read("ptxas_8150dfa.csv"));
  std::vector<std::pair<std::string, double>> out;
  for (const Measured& m : kMeasured) {
    const auto classes = class_seconds(op_times(ops, m.model, m.layers, table, gpu_h200(), k));
    const auto it = classes.find(m.kernel_class);
    const double predicted = it == classes.end() ? 0 : 1e3 * it->second;
    out.push_back({fmt::format("{} {}: predicted {:.2f} ms, measured {:.1f}", m.model, m.kernel_class, predicted, m.ms),
                   predicted / m.ms});
  }
  return out;
}

void expect_within_30_percent(const KernelModelConstants& k) {
  for (const auto& [what, r] : ratios(k)) {
    EXPECT_GT(r, 1 / 1.3) << what;
    EXPECT_LT(r, 1.3) << what;
  }
}

}  // namespace

TEST(KernelModel, ReproducesTheH200sEarlierKernelsWithin30PercentPerClass) {
  expect_within_30_percent(KernelModelConstants{});
  for (const auto& [what, r] : ratios(KernelModelConstants{})) std::printf("  %s (%.2fx)\n", what.c_str(), r);
}

// Each constant matters: moved by half, some class leaves the 30% band (the test above can fail).
TEST(KernelModel, EachConstantMovesSomeClassOutOfTheBand) {
  auto worst = [](const KernelModelConstants& k) {
    double w = 1;
    for (const auto& [what, r] : ratios(k)) w = std::max({w, r, 1 / r});
    return w;
  };
  EXPECT_LT(worst(KernelModelConstants{}), 1.3);
  KernelModelConstants k;
  k.round_trip_s *= 2;
  EXPECT_GT(worst(k), 1.3) << "round trips twice as long";
  k = {};
  k.walking_trips = 0;
  EXPECT_GT(worst(k), 1.3) << "a walking warp's requests batched like any others";
  k = {};
  k.warps_to_hide = 2;
  EXPECT_GT(worst(k), 1.3) << "two warps per scheduler hiding every pipe";
}

TEST(KernelModel, OccupancyFromPtxasFigures) {
  // dQ at head dim 64: 168 registers x 128 threads, 55 KB of shared memory: 3 CTAs (registers).
  EXPECT_EQ(ctas_per_sm(KernelResources{168, 0, 0}, 128, 55296), 3);
  EXPECT_EQ(ctas_per_sm(KernelResources{239, 0, 0}, 128, 56832), 2);
  EXPECT_EQ(ctas_per_sm(KernelResources{32, 0, 0}, 256, 0), 8);       // threads
  EXPECT_EQ(ctas_per_sm(KernelResources{32, 0, 0}, 128, 100000), 2);  // shared memory
  EXPECT_EQ(ctas_per_sm(KernelResources{16, 0, 0}, 32, 0), 32);       // blocks
  const auto t = ptxas_table_parse("kernel,registers,spill_bytes,static_shared\n\"a<64>\",168,4,32\n");
  ASSERT_EQ(t.count("a<64>"), 1u);
  EXPECT_EQ(t.at("a<64>").registers, 168);
  EXPECT_EQ(t.at("a<64>").spill_bytes, 4);
  EXPECT_EQ(t.at("a<64>").static_shared, 32);
}

// The step model's element-wise bytes (its element-wise term at 1 byte/s, the work the rates
// `--write-cluster` fits divide) are what today's kernels move, as counted: every launch's DRAM
// bytes in tests/cuda/kernel_counts.csv times its calls a step, but attention's and the
// optimizer's (terms of their own), within 15% at GPT-2 124M and the 1.1B LLaMA. The model's
// count of unfused kernels (36C + 12F a token and layer) was 2.2 and 1.4 times the counts, and
// made the rate fitted to the kernel model's 3.6 ms at GPT-2 7052 GB/s, past the H200's copy.
TEST(KernelModel, StepModelsElementWiseBytesAreTheCountedKernels) {
  const auto ops = emu::counts_csv_parse(read("kernel_counts.csv"));
  const std::string src = LOOM_SOURCE_DIR;
  const Cluster h200 = cluster_load(src + "/examples/clusters/h200.toml");
  for (const auto& [model, config] :
       {std::pair{"gpt2_124m", "gpt2_124m_gpu.toml"}, {"llama_1b", "llama_1b_gpu.toml"}}) {
    double counted = 0;
    for (const auto& [m, op] : ops) {
      if (m != model) continue;
      for (const emu::LaunchCounts& l : op.launches) {
        const std::string c = kernel_class(l.kernel);
        if (c != "attention" && c != "adamw" && c != "grad norm") counted += l.total.dram_bytes() * op.per_step;
      }
    }
    Config cfg = config_defaults();
    config_load_file(cfg, src + "/examples/configs/" + config);
    config_validate(cfg);
    const double modelled = cluster_with_term_seconds(h200, cfg, 0, 1.0, 0).mem_bw;  // bytes, over 1 s
    EXPECT_NEAR(modelled / counted, 1.0, 0.15)
        << model << ": the step model counts " << modelled / 1e9 << " GB of element-wise traffic a step, the kernels "
        << counted / 1e9 << " GB";
  }
}
