#include "launch/bench_counts.h"

#include <fmt/format.h>

#include <chrono>
#include <map>

#include "kernels/emu/count_sets.h"
#include "plan/kernel_model.h"
#include "runtime/error.h"
#include "train/bench.h"

namespace loom {

namespace {

using emu::CountedOp;
using emu::LaunchCounts;

// A ratio of counts, or "-" where there is nothing to divide by.
std::string ratio(double a, double b, const char* f = "{:.2f}") {
  return b > 0 ? fmt::format(fmt::runtime(f), a / b) : "-";
}

double op_dram(const CountedOp& op) {
  double b = 0;
  for (const LaunchCounts& l : op.launches) b += l.total.dram_bytes();
  return b;
}

void print_set(const emu::CountSet& set, const std::vector<CountedOp>& ops,
               const std::map<std::string, KernelResources>& table) {
  fmt::print("\n{} ({})\n", set.name, ops.empty() ? "" : ops.front().shape);
  fmt::print("{:<30} {:<38} {:>13} {:>8} {:>8} {:>7} {:>20} {:>9} {:>6} {:>5} {:>5} {:>5} {:>8} {:>6} {:>8}\n", "op",
             "kernel", "blocks x thr", "mma M", "ldmat M", "mma:ldm", "conflict ldm/cp/shr", "DRAM MB", "x min",
             "trips", "regs", "CTAs", "H200 us", "bound", "H100 us");
  for (const CountedOp& op : ops) {
    const std::string x_min = ratio(op_dram(op), op.min_bytes);
    for (const LaunchCounts& l : op.launches) {
      const emu::WorkCounts& w = l.total;
      const std::string ways = fmt::format("{}/{}/{}", ratio(w.ldmatrix_wavefronts, w.ldmatrix_matrices),
                                           ratio(w.cp_async_wavefronts, w.cp_async_ideal),
                                           ratio(w.lds_wavefronts + w.sts_wavefronts, w.lds_ideal + w.sts_ideal));
      std::string regs = "?", ctas = "?", h200 = "?", bound = "?", h100 = "?";
      if (const auto it = table.find(l.kernel); it != table.end()) {
        const int c = ctas_per_sm(it->second, l.threads(), l.dynamic_shared);
        regs = fmt::format("{}{}", it->second.registers, it->second.spill_bytes ? "s" : "");
        ctas = std::to_string(c);
        if (c > 0) {
          const LaunchTime a = launch_time(l, c, gpu_h200()), b = launch_time(l, c, gpu_h100());
          h200 = fmt::format("{:.1f}", 1e6 * a.total), bound = a.bound, h100 = fmt::format("{:.1f}", 1e6 * b.total);
        }
      }
      fmt::print(
          "{:<30} {:<38} {:>13} {:>8.2f} {:>8.2f} {:>7} {:>20} {:>9.1f} {:>6} {:>5.0f} {:>5} {:>5} {:>8} {:>6} {:>8}\n",
          op.name.substr(0, 30), l.kernel.substr(0, 38), fmt::format("{:.0f} x {}", l.blocks, l.threads()), w.mma / 1e6,
          w.ldmatrix / 1e6, ratio(w.mma, w.ldmatrix), ways, w.dram_bytes() / 1e6, x_min, w.trips_max, regs, ctas, h200,
          bound, h100);
    }
  }
}

// The classes' seconds of one model's step on `gpu`, printed in ms.
std::map<std::string, double> print_classes(const std::vector<std::pair<std::string, CountedOp>>& all,
                                            const std::string& model, int layers,
                                            const std::map<std::string, KernelResources>& table, const GpuRates& gpu) {
  const auto classes = class_seconds(op_times(all, model, layers, table, gpu));
  double sum = 0;
  std::string line;
  for (const auto& [name, s] : classes) sum += s, line += fmt::format(" {} {:.2f};", name, 1e3 * s);
  fmt::print("{} on {}, ms per step:{} all {:.2f}\n", model, gpu.name, line, 1e3 * sum);
  return classes;
}

// The step model on examples/clusters/h200.toml (its matmul rate measured on an H200) with its
// attention, element-wise and optimizer rates those that make its terms the kernel model's times.
void print_step(const std::map<std::string, double>& classes, const std::string& write_cluster) {
  double attention = 0, optimizer = 0, elementwise = 0;
  for (const auto& [name, s] : classes)
    (name == "attention" ? attention : name == "adamw" || name == "grad norm" ? optimizer : elementwise) += s;
  const std::string src = LOOM_SOURCE_DIR;
  Config cfg = config_defaults();
  config_load_file(cfg, src + "/examples/configs/gpt2_124m_gpu.toml");
  config_validate(cfg);
  const Cluster h200 = cluster_load(src + "/examples/clusters/h200.toml");
  Cluster one = cluster_with_term_seconds(h200, cfg, attention, elementwise, optimizer);
  const StepPrediction p = step_predict(cfg, one);
  fmt::print(
      "GPT-2 124M step (B16 T1024) on one H200, the step model on examples/clusters/h200.toml with this model's "
      "times: {:.1f} ms, {:.0f} tokens/s, MFU {:.1f}% (compute {:.1f} ms: matmuls at the file's measured {:.0f} "
      "TFLOP/s, attention {:.2f} ms = {:.0f} TFLOP/s, element-wise {:.2f} ms = {:.0f} GB/s of the step model's "
      "bytes; optimizer {:.2f} ms = {:.0f} GB/s)\n",
      1e3 * p.step, p.tokens_per_s, 100 * p.mfu, 1e3 * p.compute, cluster_rates(one).matmul / 1e12, 1e3 * attention,
      one.attention_flops / 1e12, 1e3 * elementwise, one.mem_bw / 1e9, 1e3 * p.optimizer, one.optimizer_bw / 1e9);
  if (write_cluster.empty()) return;
  cluster_term_rates_write(write_cluster, src + "/examples/clusters/h200.toml", one,
                           "predicted by the kernel time model at GPT-2 124M's shape (loom bench kernels --counts), "
                           "not measured");
  fmt::print("wrote attention_tflops, mem_bw_gbs and optimizer_gbs into {}\n", write_cluster);
}

}  // namespace

int bench_kernel_counts(const std::string& write_cluster) {
  const emu::CountDriver* driver = emu::count_driver();
  LOOM_CHECK(driver,
             "this loom has no counting build of the kernels (a sanitized build leaves it out); "
             "`loom bench kernels --counts` needs a build without LOOM_SANITIZE");
  const auto start = std::chrono::steady_clock::now();
  const auto table = ptxas_table_parse(ptxas_sm90_table());
  LOOM_CHECK(write_cluster.empty() || !table.empty(),
             "--write-cluster needs the time model, which needs this build's ptxas figures (built without nvcc)");
  fmt::print(
      "What each launch asks of an sm_90, counted by the emulation (kernels/emu/counts.h) at the shapes of "
      "tests/cuda/kernel_counts.csv; M = millions of warp instructions; conflict: wavefronts per ideal one of "
      "ldmatrix, cp.async and plain shared accesses (1.00: none); x min: the op's DRAM bytes over its least; "
      "trips: the most dependent global round trips one warp waits on; regs and CTAs per SM from this build's "
      "ptxas (s: spills); H200/H100: the time model (plan/kernel_model.h), predicted, not measured.\n");
  if (table.empty())
    fmt::print(
        "This build has no ptxas figures (no nvcc when it was built): occupancy and the time model need them; "
        "rebuild with CUDA to see them.\n");
  std::vector<std::pair<std::string, CountedOp>> all;
  for (const emu::CountSet& set : emu::count_sets()) {
    const std::vector<CountedOp> ops = set.run(*driver);
    print_set(set, ops, table);
    for (const CountedOp& op : ops) all.push_back({set.model, op});
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!table.empty()) {
    const KernelModelConstants k;
    fmt::print(
        "\nThe time model: round trips by Little's law over the resident warps ({:.1f} us each; {:g} for each "
        "request of a warp streaming its own row) plus bytes at the copy bandwidth; the heaviest block alone; the "
        "busiest pipe, or the pipes in series below {:g} warps per scheduler; {:g} us a launch. No GEMMs, no L2 "
        "hits, no gaps between launches. Checked against the H200's times of the 8150dfa kernels "
        "(counts.KernelModel.*: every class within 30%).\n",
        1e6 * k.round_trip_s, k.walking_trips, k.warps_to_hide, 1e6 * k.launch_s);
    const auto gpt2 = print_classes(all, "gpt2_124m", emu::gpt2_124m_step().layers, table, gpu_h200());
    print_classes(all, "gpt2_124m", emu::gpt2_124m_step().layers, table, gpu_h100());
    fmt::print(
        "(the 1.1B step below without attention: the table counts grouped-query attention at a smaller shape)\n");
    print_classes(all, "llama_1b", emu::llama_1b_step().layers, table, gpu_h200());
    print_classes(all, "llama_1b", emu::llama_1b_step().layers, table, gpu_h100());
    print_step(gpt2, write_cluster);
  }
  fmt::print("Counted in {:.1f} s on this CPU.\n", seconds);
  return 0;
}

}  // namespace loom
