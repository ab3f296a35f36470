// A step's work on one stage, as data: an ordered list of actions over (micro-batch, chunk).
// The pipeline schedules generalize this table; with one stage and one chunk it is the
// accumulation loop F0 B0 F1 B1 ..., which keeps one micro-batch's activations at a time.
#pragma once
#include <vector>

namespace loom {

struct Action {
  enum Kind { forward, backward } kind;
  int micro;
  int chunk = 0;
};

inline std::vector<Action> schedule_one_stage(int micro_batches) {
  std::vector<Action> s;
  for (int m = 0; m < micro_batches; ++m) {
    s.push_back({Action::forward, m});
    s.push_back({Action::backward, m});
  }
  return s;
}

}  // namespace loom
