#include "runtime/metrics.h"

#include <cmath>
#include <ctime>
#include <fstream>

namespace loom {

MetricsWriter::MetricsWriter(const std::string& dir, int ranks) {
  if (dir.empty()) return;
  const std::string path = dir + "/metrics.jsonl";
  int run = 1;
  {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) run += line.rfind("{\"run\":", 0) == 0;
  }
  out_ = DurableAppend(path, "a");
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  out_.line(fmt::format("{{\"run\":{},\"started\":\"{}\",\"ranks\":{}}}", run, when, ranks));
}

MetricsWriter::~MetricsWriter() = default;

namespace {
// %.9g, or null for a value that is not finite.
std::string num(double v) {
  return std::isfinite(v) ? fmt::format("{:.9g}", v) : "null";
}

std::string ranks_json(const std::vector<int>& r) {
  std::string out;
  for (int x : r) out += (out.empty() ? "" : ",") + std::to_string(x);
  return "[" + out + "]";
}

// The fields of fault handling: the time always, the rest where something happened.
std::string fault_fields(const StepMetrics& m) {
  std::string out = fmt::format(",\"t\":{:.3f}", m.t_unix);
  if (!m.skipped.empty()) out += fmt::format(",\"skipped\":\"{}\"", m.skipped);
  if (!m.stragglers.empty()) out += ",\"stragglers\":" + ranks_json(m.stragglers);
  if (!m.sdc_ranks.empty()) out += ",\"sdc_ranks\":" + ranks_json(m.sdc_ranks);
  if (m.host_syncs >= 0)
    out += fmt::format(",\"host_syncs\":{{\"compute\":{},\"step\":{}}}", m.host_syncs_compute, m.host_syncs);
  if (!m.moe.empty()) {
    out += fmt::format(",\"aux_loss\":{},\"moe\":[", num(m.aux_loss));
    for (size_t i = 0; i < m.moe.size(); ++i)
      out += fmt::format("{}{{\"layer\":{},\"load\":{},\"dropped\":{}}}", i ? "," : "", m.moe[i].layer,
                         num(m.moe[i].load), num(m.moe[i].dropped));
    out += "]";
  }
  return out;
}
}  // namespace

void MetricsWriter::step(const StepMetrics& m) {
  if (!out_.open()) return;
  auto& L = m.mem;
  out_.line(fmt::format(
      "{{\"step\":{},\"loss\":{},\"grad_norm\":{},\"lr\":{},\"tokens\":{},\"step_ms\":{},\"tokens_per_s\":{},"
      "\"mfu\":{},\"hfu\":{},\"time\":{{\"compute_ms\":{},\"comm_exposed_ms\":{},\"bubble_ms\":{},"
      "\"optimizer_ms\":{},\"data_ms\":{},\"ckpt_block_ms\":{}}},\"mem\":{{\"params_b\":{},\"grads_b\":{},"
      "\"master_b\":{},\"optim_b\":{},\"act_b\":{},\"workspace_b\":{},\"comm_b\":{},\"peak_b\":{}}},"
      "\"dp_comm\":{{\"all_reduce_b\":{},\"reduce_scatter_b\":{},\"all_gather_b\":{}}},"
      "\"tp_comm\":{{\"all_reduce_b\":{},\"reduce_scatter_b\":{},\"all_gather_b\":{}}}{}}}",
      m.step, num(m.loss), num(m.grad_norm), num(m.lr), m.tokens, num(m.step_ms), num(m.tokens_per_s), num(m.mfu),
      num(m.hfu), num(m.compute_ms), num(m.comm_exposed_ms), num(m.bubble_ms), num(m.optimizer_ms), num(m.data_ms),
      num(m.ckpt_block_ms), L.of(Mem::params), L.of(Mem::grads), L.of(Mem::master), L.of(Mem::optim),
      L.of(Mem::activations), L.of(Mem::workspace), L.of(Mem::comm), L.peak_total, m.dp_all_reduce_b,
      m.dp_reduce_scatter_b, m.dp_all_gather_b, m.tp_all_reduce_b, m.tp_reduce_scatter_b, m.tp_all_gather_b,
      fault_fields(m)));
}

void MetricsWriter::stopped(int64_t step, const char* signal) {
  if (out_.open()) out_.line(fmt::format("{{\"step\":{},\"stopped\":\"{}\"}}", step, signal));
}

void MetricsWriter::validation(int64_t step, double val_loss) {
  if (out_.open()) out_.line(fmt::format("{{\"step\":{},\"val_loss\":{}}}", step, num(val_loss)));
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
