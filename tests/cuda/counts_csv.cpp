// Prints the counts of every launch of tests/cuda/count_sets.h as CSV (kernels/emu/count_csv.cpp):
// how tests/cuda/kernel_counts.csv is written, after a kernel change whose counts are meant,
//   build/tests/loom_counts_csv > tests/cuda/kernel_counts.csv
// and, built by tests/cuda/counts_at_commit.sh against an earlier commit's kernels, the counts
// of the kernels a GPU once timed.
#include <cstdio>
#include <exception>

#include "kernels/emu/count_ops.h"
#include "tests/cuda/count_sets.h"

int main() {
  using namespace loom::emu;
  const CountDriver* d = count_driver();
  if (!d) {
    std::fprintf(stderr, "no count driver linked\n");
    return 1;
  }
  try {
    std::string out;
    for (const CountSet& set : count_sets()) {
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
