// `loom bench`: the fp32 GEMM peak of this machine (the MFU denominator on the CPU) and a
// timed training run of any config.
#pragma once
#include "plan/step_model.h"
#include "runtime/config.h"
#include "train/trainer.h"

namespace loom {

struct GemmRate {
  int size;
  double flops;
};
std::vector<GemmRate> bench_gemm(int threads);
// The per-core fp32 GEMM peak MFU divides by (times the cores a run uses): the best of `reps`
// runs each of 1024^3 and 2048^3 on one thread, with the spread of those runs.
struct PeakMeasure {
  double per_core = 0, median = 0, low = 0;
  int runs = 0;
};
PeakMeasure cpu_peak_measure(int reps);
// profile: time every op of steps 2 on (log.profile_steps) and print the roofline table;
// write_cluster: then write the rates it measured into this cluster file (profile_cluster_write).
struct BenchTrainOptions {
  bool profile = false;
  std::string write_cluster;
};
// Trains `cfg` for its steps and prints tokens/s, MFU and the step time, excluding step 1.
void bench_train(const Config& cfg, const TrainOptions& opt = {}, const BenchTrainOptions& b = {});
// What the launch gaps of a profiled GPU step cost, predicted (the launches the emulated device
// counted, or at least the profile's op calls, at the kernel model's launch cost), and what a
// CUDA graph's replay would save of them.
std::string launch_gap_line(const OpProfile& p);
// Every collective over the world group, message sizes from 4 KiB up to max_mb: time, algorithm
// bandwidth and bus bandwidth with the nccl-tests conventions. Rank 0 prints the table.
void bench_comm(const TrainOptions& where, double max_mb);
// The GPU's bf16 GEMM rate, the MLP GEMM with GELU separate and fused, and causal attention
// at three reference shapes and cfg's (micro_batch, seq_len, heads): the flash kernels beside
// the WMMA ones and (cfg's shape only) the row-wise ones. Needs a CUDA build and device.
void bench_kernels(const Config& cfg);
// The current GPU's roofline, measured now: the copy bandwidth of a 1 GiB device-to-device copy
// (bytes read + written per second) and the bf16 cuBLASLt rate of an 8192^3 GEMM; its name.
// Need a CUDA build and device.
RooflineRates cuda_roofline_measure();
// The step model's rates from a profile of cfg's run (train/profile_cluster.cpp): base's
// gemm_efficiency, mem_bw, attention, cp attention and optimizer rates replaced by the model's
// work of each term over the time the profile measured for its ops (rank 0's).
Cluster profile_cluster_fit(const Cluster& base, const Config& cfg, const OpProfile& prof);
// base with its attention, element-wise and optimizer rates set so that the step model's terms
// on cfg take these seconds per step (a term <= 0 keeps base's rate): how the kernel model's
// predicted times (`loom bench kernels --counts`) become the step model's per-op figures, as a
// profile's measured ones do in profile_cluster_fit.
Cluster cluster_with_term_seconds(const Cluster& base, const Config& cfg, double attention_s, double elementwise_s,
                                  double optimizer_s);
// Writes fit's attention, element-wise and optimizer rates into `path` (its other lines kept), or
// into a copy of `base_path` where `path` does not exist yet; `why` is each line's comment.
void cluster_term_rates_write(const std::string& path, const std::string& base_path, const Cluster& fit,
                              const std::string& why);
// Each term of the step model on `cluster` (its work over the cluster's rate for it) beside the
// time the profile measured for its ops, ms per step, and the rates assumed.
std::string profile_prediction_compare(const Cluster& cluster, const Config& cfg, const OpProfile& prof);
// Writes the fit into `path`: a new one-device file, or an existing file's rates replaced
// (its comments are not kept).
void profile_cluster_write(const std::string& path, const Config& cfg, const TrainResult& r);
std::string cuda_device_name();

}  // namespace loom
