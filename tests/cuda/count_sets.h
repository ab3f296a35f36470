// The launch shapes whose counts tests/cuda/kernel_counts.csv holds: attention at three shapes
// (GPT-2 124M, the 1.1B LLaMA's grouped-query heads, head dim 128) and the other kernels of the
// GPT-2 124M and 1.1B LLaMA steps. Shared by the counting tests and the tool that writes the table.
#pragma once
#include <string>
#include <vector>

#include "kernels/emu/count_ops.h"

namespace loom::emu {

struct CountSet {
  std::string name;   // "gpt2_124m attention"
  std::string model;  // the CSV's model column
  bool attention = false;
  std::vector<CountedOp> (*run)(const CountDriver& d);
};

inline StepShape gpt2_124m_step() {
  return StepShape{false, 12, 16, 1024, 768, 12, 12, 3072, 50304, 50257, 124475904, "gpt2_124m"};
}
inline StepShape llama_1b_step() {
  return StepShape{true, 22, 4, 2048, 2048, 32, 4, 5632, 32000, 32000, 1100048384, "llama_1b"};
}

inline std::vector<CountSet> count_sets() {
  return {
      {"gpt2_124m attention", "gpt2_124m", true,
       [](const CountDriver& d) { return d.attention(16, 1024, 12, 12, 64); }},
      {"gqa attention", "gqa", true, [](const CountDriver& d) { return d.attention(1, 512, 8, 2, 64); }},
      {"d128 attention", "d128", true, [](const CountDriver& d) { return d.attention(1, 512, 4, 4, 128); }},
      {"gpt2_124m step", "gpt2_124m", false, [](const CountDriver& d) { return d.step(gpt2_124m_step()); }},
      {"llama_1b step", "llama_1b", false, [](const CountDriver& d) { return d.step(llama_1b_step()); }},
  };
}

}  // namespace loom::emu
