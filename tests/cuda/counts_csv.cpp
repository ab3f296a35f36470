// Prints the counts of every launch of kernels/emu/count_sets.h as CSV (kernels/emu/count_csv.cpp):
// how tests/cuda/kernel_counts.csv is written, after a kernel change whose counts are meant,
//   build/tests/loom_counts_csv > tests/cuda/kernel_counts.csv
// and, built by tests/cuda/counts_at_commit.sh against an earlier commit's kernels, the counts
// of the kernels a GPU once timed. --with-llama-attention adds the 1.1B step's own attention shape
// (count_sets.h), which the time model's check needs.
#include <cstdio>
#include <cstring>
#include <exception>

#include "kernels/emu/count_ops.h"
#include "kernels/emu/count_sets.h"

int main(int argc, char** argv) {
  using namespace loom::emu;
  std::vector<CountSet> sets = count_sets();
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--with-llama-attention") != 0) {
      std::fprintf(stderr, "usage: loom_counts_csv [--with-llama-attention]\n");
      return 2;
    }
    sets.push_back(llama_1b_attention_set());
  }
  const CountDriver* d = count_driver();
  if (!d) {
    std::fprintf(stderr, "no count driver linked\n");
    return 1;
  }
  try {
    std::string out;
    for (const CountSet& set : sets) {
      const std::string csv = counts_csv(set.model, set.run(*d));
      out += out.empty() ? csv : csv.substr(csv.find('\n') + 1);
    }
    std::fputs(out.c_str(), stdout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "counting failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
