// `loom bench`: the fp32 GEMM peak of this machine (the MFU denominator on the CPU) and a
// timed training run of any config.
#pragma once
#include "launch/trainer.h"
#include "runtime/config.h"

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
// Trains `cfg` for its steps and prints tokens/s, MFU and the step time, excluding step 1.
void bench_train(const Config& cfg, const TrainOptions& opt = {});
// Every collective over the world group, message sizes from 4 KiB up to max_mb: time, algorithm
// bandwidth and bus bandwidth with the nccl-tests conventions. Rank 0 prints the table.
void bench_comm(const TrainOptions& where, double max_mb);
// The GPU's bf16 GEMM rate, the MLP GEMM with GELU separate and fused, and causal attention
// at three reference shapes and cfg's (micro_batch, seq_len, heads): the flash kernels beside
// the WMMA ones and (cfg's shape only) the row-wise ones. Needs a CUDA build and device.
void bench_kernels(const Config& cfg);

}  // namespace loom
