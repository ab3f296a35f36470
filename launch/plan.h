// `loom plan memory`: per-rank bytes before launch. For the ZeRO paper's setting (any
// parameter count, mixed precision, K = 12 bytes of optimizer state per parameter) and for
// loom's own runs, computed with the same geometry the allocator will see, so a prediction
// can be checked against the ledger of a real run.
#pragma once
#include <array>
#include <string>

#include "runtime/config.h"

namespace loom {

// ZeRO paper, Figure 1: bytes per rank for stages 0..3 with psi parameters, dp ranks and
// `bytes_param`, `bytes_grad`, `k` bytes per parameter (mixed precision: 2, 2, 12).
std::array<double, 4> plan_zero_paper(double psi, int dp, double bytes_param, double bytes_grad, double k);

struct MemoryPlan {
  int64_t params = 0, grads = 0, optim = 0, comm = 0, activations = 0, workspace = 0;
  int64_t total() const { return params + grads + optim + comm + activations + workspace; }
};
// What one rank of `cfg` will hold while training, at `cfg.parallel.dp` and `zero`.
MemoryPlan plan_memory(const Config& cfg, int stage);
std::string plan_memory_table(const Config& cfg);  // stages 0..3 side by side, MiB
std::string plan_memory_json(const Config& cfg);

}  // namespace loom
