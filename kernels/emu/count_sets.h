// The launch shapes whose counts tests/cuda/kernel_counts.csv holds: attention at three shapes
// (GPT-2 124M, the 1.1B LLaMA's grouped-query heads, head dim 128) and the other kernels of the
// GPT-2 124M and 1.1B LLaMA steps. Shared by the counting tests, the tool that writes the table
// and `loom bench kernels --counts`. The time model's check adds the 1.1B step's own attention.
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

// The 1.1B step's attention at its own shape (B4 T2048 H32 KV4): what the H200 timed, for the time
// model's check against the earlier kernels (plan/kernel_model.h); not in the table (the table's
// grouped-query shape is a smaller one, to count fast).
inline CountSet llama_1b_attention_set() {
  return {"llama_1b attention", "llama_1b", true, [](const CountDriver& d) { return d.attention(4, 2048, 32, 4, 64); }};
}

}  // namespace loom::emu
