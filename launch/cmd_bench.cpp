// `loom bench gemm | train | kernels | comm`: the CPU's GEMM peak (cached for MFU), a timed
// training run, the GPU's kernel rates, and each collective's bus bandwidth.
#include <memory>

#include "launch/bench_counts.h"
#include "launch/command.h"
#include "runtime/error.h"
#include "train/bench.h"

namespace loom {

namespace {
// Each rank holds two buffers of the largest message.
constexpr double kCommMaxMb = 16384;
}  // namespace

void cmd_bench_add(CLI::App& app, Commands& out) {
  struct Args {
    int threads = 0;
    ConfigArgs train, kernels;
    BenchTrainOptions train_opt;
    double comm_max_mb = 64;
    bool counts = false;
    std::string counts_cluster;
  };
  auto a = std::make_shared<Args>();
  auto* bench = app.add_subcommand("bench", "measure kernels and training speed");
  bench->require_subcommand(1);
  auto* gemm = bench->add_subcommand("gemm", "fp32 GEMM rate; caches the CPU peak used for MFU");
  gemm->add_option("--threads", a->threads, "threads (0: every core)")->check(whole_in(0, kThreadsMax));
  auto* train = bench->add_subcommand("train", "time a training run of a config");
  a->train.add_to(train);
  train->add_flag("--profile", a->train_opt.profile,
                  "time every op of steps 2 on and print the roofline table (log.profile_steps)");
  train->add_option("--write-cluster", a->train_opt.write_cluster,
                    "with --profile: write the measured per-op rates into this cluster file (a new one, or "
                    "update an existing one's rates)");
  auto* kernels = bench->add_subcommand("kernels", "GPU bf16 GEMM and attention rates (flash vs WMMA vs row-wise)");
  a->kernels.add_to(kernels, "TOML config file (its model and micro_batch set the shapes)");
  kernels->add_flag("--counts", a->counts,
                    "no GPU: the kernels' counts at the counts table's shapes, their sm_90 occupancy and the time "
                    "model's H200/H100 predictions");
  kernels->add_option("--write-cluster", a->counts_cluster,
                      "with --counts: write the step model's attention, element-wise and optimizer rates the "
                      "predictions imply into this cluster file (a new one copies examples/clusters/h200.toml)");
  auto* comm =
      bench->add_subcommand("comm", "time, algorithm and bus bandwidth of each collective (under mpirun/srun)");
  comm->add_option("--max-mb", a->comm_max_mb, "largest message in MB")->check(positive_up_to(kCommMaxMb));

  out.push_back({gemm, false, [a](const CommandContext&) {
                   const int threads = threads_set(a->threads);
                   fmt::print("{:>6} {:>12}\n", "n", "GFLOP/s");
                   for (auto& r : bench_gemm(threads)) fmt::print("{:>6} {:>12.1f}\n", r.size, r.flops / 1e9);
                   const PeakMeasure m = cpu_peak_measure(8);
                   fmt::print(
                       "per-core peak (1 thread, best of {} runs): {:.1f} GFLOP/s; median {:.1f}, lowest {:.1f}\n",
                       m.runs, m.per_core / 1e9, m.median / 1e9, m.low / 1e9);
                   fmt::print(
                       "cached per-core peak (the best measured here): {:.1f} GFLOP/s; MFU divides by it times the "
                       "cores a run uses\n",
                       cpu_peak_flops(1, true) / 1e9);
                   return 0;
                 }});
  out.push_back({train, true, [a](const CommandContext& ctx) {
                   LOOM_CHECK(a->train_opt.write_cluster.empty() || a->train_opt.profile,
                              "--write-cluster needs --profile (the rates it writes)");
                   bench_train(
                       config_build(a->train.path, a->train.sets, ctx.topt.world_size, ctx.topt.world_rank == 0, true),
                       ctx.topt, a->train_opt);
                   return 0;
                 }});
  out.push_back({kernels, false, [a](const CommandContext&) {
                   LOOM_CHECK(a->counts_cluster.empty() || a->counts,
                              "--write-cluster needs --counts (the rates "
                              "it writes are the counts' predictions)");
                   if (a->counts) {
                     LOOM_CHECK(a->kernels.path.empty() && a->kernels.sets.empty(),
                                "--counts counts the fixed shapes of tests/cuda/kernel_counts.csv; drop --config and "
                                "--set");
                     return bench_kernel_counts(a->counts_cluster);
                   }
                   bench_kernels(config_build(a->kernels.path, a->kernels.sets));
                   return 0;
                 }});
  out.push_back({comm, true, [a](const CommandContext& ctx) {
                   bench_comm(ctx.topt, a->comm_max_mb);
                   return 0;
                 }});
}

}  // namespace loom
