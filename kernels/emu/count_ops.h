// The ops whose counts `loom bench kernels --counts` prints and the counting tests hold: causal
// attention at a shape, and the kernels of a training step (everything but the GEMMs) at a
// model's shape, each op with the launches it makes, how often a step calls it and the least
// DRAM traffic it could have. The ops run in the counting build of the kernels (namespace
// loom::cuda_count, kernels/emu/count_ops.cpp); a binary that links it has a driver.
#pragma once
#include <string>
#include <vector>

#include "kernels/emu/counts.h"

namespace loom::emu {

struct CountedOp {
  std::string name;        // "attention fwd", "layernorm fwd + residual add", ...
  std::string shape;       // "B16 T1024 H12 KV12 D64", "16384x768", ...
  double per_step = 1;     // calls in one step of the model (one micro-batch)
  double min_bytes = 0;    // each input read once and each output written once
  double model_flops = 0;  // attention: the causal half's 2 products (forward) or 5 (backward)
  bool memory_bound = true;
  std::vector<LaunchCounts> launches;
};

struct StepShape {
  bool llama = false;  // RMSNorm, SwiGLU, RoPE, grouped-query heads; else GPT-2's LayerNorm, GELU, biases
  int layers = 0, B = 0, T = 0, C = 0, H = 0, KV = 0, F = 0, V = 0;  // V: padded (the logits' width)
  int valid = 0;                                                     // the real vocabulary
  int64_t params = 0;
  std::string name;
};

struct CountDriver {
  // Forward and backward (delta, dQ, dK/dV) of causal attention, no document mask.
  std::vector<CountedOp> (*attention)(int B, int T, int H, int KV, int D);
  // A step's kernels other than the GEMMs and attention.
  std::vector<CountedOp> (*step)(const StepShape& s);
};
// One row per launch (count_csv.cpp), `model` naming the step or shape they belong to; and back,
// each op with its model.
std::string counts_csv(const std::string& model, const std::vector<CountedOp>& ops);
std::vector<std::pair<std::string, CountedOp>> counts_csv_parse(const std::string& text);

// The driver this binary links (nullptr: none; kernels/emu/count_ops.cpp sets it).
const CountDriver* count_driver();
void set_count_driver(const CountDriver* d);

}  // namespace loom::emu
