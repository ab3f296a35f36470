#include "launch/plan.h"

#include <fmt/format.h>

#include "model/model.h"
#include "parallel/zero.h"

namespace loom {

std::array<double, 4> plan_zero_paper(double psi, int dp, double bp, double bg, double k) {
  return {(bp + bg + k) * psi, (bp + bg) * psi + k * psi / dp, bp * psi + (bg + k) * psi / dp,
          (bp + bg + k) * psi / dp};
}

MemoryPlan plan_memory(const Config& cfg, int stage) {
  const ModelLayout layout = model_layout(cfg);
  const ZeroBytes z = zero_bytes(layout, cfg.parallel.dp, stage);
  const ActPlan a = act_plan(cfg, cfg.train.micro_batch, recompute_from(cfg.train.recompute));
  auto rounded = [](int64_t bytes) { return std::max<int64_t>(64, (bytes + 63) / 64 * 64); };
  MemoryPlan p;
  p.params = z.params;
  p.grads = z.grads;
  p.optim = z.optim;
  p.comm = z.comm;
  for (auto& b : a.buffers) p.activations += rounded(b.bytes());
  for (auto& b : a.scratch) (b.comm ? p.comm : p.workspace) += rounded(b.bytes());
  if (cfg.model.arch == "llama")  // the RoPE cos/sin tables
    p.workspace += 2 * rounded(int64_t(cfg.model.seq_len) * cfg.head_dim() / 2 * 4);
  return p;
}

std::string plan_memory_table(const Config& cfg) {
  std::string out = fmt::format("per-rank memory, dp = {} (MiB)\n{:<12}", cfg.parallel.dp, "");
  MemoryPlan p[4];
  for (int s = 0; s < 4; ++s) {
    p[s] = plan_memory(cfg, s);
    out += fmt::format(" {:>10}", fmt::format("zero {}", s));
  }
  auto row = [&](const char* name, auto get) {
    out += fmt::format("\n{:<12}", name);
    for (auto& x : p) out += fmt::format(" {:>10.2f}", double(get(x)) / 1048576.0);
  };
  row("params", [](auto& x) { return x.params; });
  row("grads", [](auto& x) { return x.grads; });
  row("optim", [](auto& x) { return x.optim; });
  row("comm", [](auto& x) { return x.comm; });
  row("activations", [](auto& x) { return x.activations; });
  row("workspace", [](auto& x) { return x.workspace; });
  row("total", [](auto& x) { return x.total(); });
  return out;
}

std::string plan_memory_json(const Config& cfg) {
  std::string out = "[";
  for (int s = 0; s < 4; ++s) {
    auto p = plan_memory(cfg, s);
    out += fmt::format(
        "{}{{\"zero\":{},\"n_params\":{},\"dp\":{},\"params_b\":{},\"grads_b\":{},\"optim_b\":{},\"comm_b\":{},\"act_"
        "b\":{},\"workspace_b\":{}}}",
        s ? "," : "", s, model_layout(cfg).reg.numel(), cfg.parallel.dp, p.params, p.grads, p.optim, p.comm,
        p.activations, p.workspace);
  }
  return out + "]";
}

}  // namespace loom
