// `loom bench kernels --counts`: what the CUDA kernels ask of an sm_90 as the counting emulation
// counts them, at the shapes of the counts table (kernels/emu/count_sets.h), the occupancy the
// build's ptxas figures allow, and the kernel time model's H200 and H100 times
// (plan/kernel_model.h), with the GPT-2 124M step the step model then predicts on an H200. Runs on
// the CPU and needs no device: every figure is a count or a prediction, none is measured.
#pragma once
#include <string>

namespace loom {

// Generated at build time (tests/cuda/ptxas_check.py --cpp): "kernel,registers,spill_bytes,
// static_shared" rows, or "" in a build without nvcc.
const char* ptxas_sm90_table();

// Prints the counts, the occupancy and the predictions; returns the exit status. With
// write_cluster, also writes the step model's attention, element-wise and optimizer rates those
// predictions imply (at GPT-2 124M's shape) into that cluster file: a new one is a copy of
// examples/clusters/h200.toml, an existing one keeps its other lines.
int bench_kernel_counts(const std::string& write_cluster = "");

}  // namespace loom
