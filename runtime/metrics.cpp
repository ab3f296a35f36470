#include "runtime/metrics.h"

#include <filesystem>

namespace loom {

MetricsWriter::MetricsWriter(const std::string& dir) {
  if (dir.empty()) return;
  std::filesystem::create_directories(dir);
  std::string path = dir + "/metrics.jsonl";
  f_ = std::fopen(path.c_str(), "w");
  LOOM_CHECK(f_, "cannot write '{}'; check log.dir", path);
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::step(const StepMetrics& m) {
  if (!f_) return;
  auto& L = m.mem;
  std::fprintf(f_,
               "{\"step\":%lld,\"loss\":%.9g,\"grad_norm\":%.9g,\"lr\":%.9g,\"tokens\":%lld,\"step_ms\":%.9g,"
               "\"tokens_per_s\":%.9g,\"mfu\":%.9g,\"hfu\":%.9g,\"time\":{\"compute_ms\":%.9g,"
               "\"comm_exposed_ms\":%.9g,\"bubble_ms\":%.9g,\"optimizer_ms\":%.9g,\"data_ms\":%.9g,"
               "\"ckpt_block_ms\":%.9g},\"mem\":{\"params_b\":%lld,\"grads_b\":%lld,\"master_b\":%lld,\"optim_b\":%lld,"
               "\"act_b\":%lld,\"workspace_b\":%lld,\"comm_b\":%lld,\"peak_b\":%lld},"
               "\"dp_comm\":{\"all_reduce_b\":%lld,\"reduce_scatter_b\":%lld,\"all_gather_b\":%lld},"
               "\"tp_comm\":{\"all_reduce_b\":%lld,\"reduce_scatter_b\":%lld,\"all_gather_b\":%lld}}\n",
               (long long)m.step, m.loss, m.grad_norm, m.lr, (long long)m.tokens, m.step_ms, m.tokens_per_s, m.mfu,
               m.hfu, m.compute_ms, m.comm_exposed_ms, m.bubble_ms, m.optimizer_ms, m.data_ms, m.ckpt_block_ms,
               (long long)L.of(Mem::params), (long long)L.of(Mem::grads), (long long)L.of(Mem::master),
               (long long)L.of(Mem::optim),
               (long long)L.of(Mem::activations), (long long)L.of(Mem::workspace), (long long)L.of(Mem::comm),
               (long long)L.peak_total, (long long)m.dp_all_reduce_b, (long long)m.dp_reduce_scatter_b,
               (long long)m.dp_all_gather_b, (long long)m.tp_all_reduce_b, (long long)m.tp_reduce_scatter_b,
               (long long)m.tp_all_gather_b);
  std::fflush(f_);
}

void MetricsWriter::validation(int64_t step, double val_loss) {
  if (!f_) return;
  std::fprintf(f_, "{\"step\":%lld,\"val_loss\":%.9g}\n", (long long)step, val_loss);
  std::fflush(f_);
}

void step_rates(StepMetrics& m, int64_t step, int64_t steps, int64_t tokens_per_step, double flops_model,
                double flops_hardware, double peak) {
  m.step = step + 1;
  m.steps = steps;
  m.tokens = (step + 1) * tokens_per_step;
  m.tokens_per_s = double(tokens_per_step) / (m.step_ms / 1e3);
  m.mfu = peak > 0 ? m.tokens_per_s * flops_model / peak : 0.0;
  m.hfu = peak > 0 ? m.tokens_per_s * flops_hardware / peak : 0.0;
}

std::string format_duration(double s) {
  if (s < 60) return fmt::format("{:.0f}s", s);
  if (s < 3600) return fmt::format("{}m{:02d}s", int(s) / 60, int(s) % 60);
  return fmt::format("{}h{:02d}m", int(s) / 3600, int(s) % 3600 / 60);
}

std::string progress_line(const StepMetrics& m, double eta_s) {
  return fmt::format("step {:>{}}/{} | loss {:.4f} | lr {:.2e} | {:.0f} tok/s | MFU {:.1f}% | {:.0f} ms | ETA {}",
                     m.step, int(std::to_string(m.steps).size()), m.steps, m.loss, m.lr, m.tokens_per_s, 100.0 * m.mfu,
                     m.step_ms, format_duration(eta_s));
}

}  // namespace loom
