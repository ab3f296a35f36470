// What the step model's tests share (test_step_model.cpp, test_step_invariant.cpp): a cluster
// file written from its figures, and the small model they price. Not here: any expectation.
#pragma once
#include <string>

#include "plan/step_model.h"
#include "runtime/config.h"

namespace loom::test {

// A CPU cluster training in f32: `nodes` of `devices_per_node`, [inter] only where nodes > 1.
struct ClusterFigures {
  int nodes = 2, devices_per_node = 4;
  double peak_tflops = 1, mem_bw_gbs = 1e12, overlap = 0;
  double intra_alpha_us = 10, intra_bw_gbs = 10;
  double inter_alpha_us = 100, inter_bw_gbs = 1;
};

inline Cluster cluster_of(const ClusterFigures& c) {
  std::string text = fmt::format(
      "nodes = {}\ndevices_per_node = {}\ndevice = \"cpu\"\ndtype = \"f32\"\npeak_tflops = {}\ngemm_efficiency = 0.5\n"
      "mem_bw_gbs = {}\noverlap = {}\n[intra]\nalpha_us = {}\nbw_gbs = {}\n",
      c.nodes, c.devices_per_node, c.peak_tflops, c.mem_bw_gbs, c.overlap, c.intra_alpha_us, c.intra_bw_gbs);
  if (c.nodes > 1) text += fmt::format("[inter]\nalpha_us = {}\nbw_gbs = {}\n", c.inter_alpha_us, c.inter_bw_gbs);
  return cluster_parse(text, "test");
}

// 4 layers of d_model 64 and 4 heads, a 256-token vocabulary, 32-token sequences; micro-batches
// of 2 in a global batch of 8.
inline Config small_model(const std::string& arch = "llama") {
  Config c = config_defaults();
  c.model.arch = choice_parse<Arch>(arch).value();
  c.model.n_layer = 4, c.model.d_model = 64, c.model.n_head = 4, c.model.vocab_size = 256, c.model.seq_len = 32;
  c.train.micro_batch = 2, c.train.global_batch = 8;
  return c;
}

}  // namespace loom::test
