#include "runtime/metrics.h"

#include <sys/resource.h>

#include <cmath>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>

namespace loom {

MetricsWriter::MetricsWriter(const std::string& dir, int ranks) : ranks_(ranks) {
  if (dir.empty()) return;
  // Two runs appending to one file would interleave their steps: the second is refused.
  lock_ = std::make_unique<DirLock>(dir, "log.dir", ".metrics.lock");
  path_ = dir + "/metrics.jsonl";
}

void MetricsWriter::line(const std::string& text) {
  if (path_.empty()) return;
  if (!out_.open()) {                  // the header with the first line: a run refused at start leaves none
    out_ = DurableAppend(path_, "a");  // first: it refuses what is not a regular file, unread
    int run = 1;
    {
      std::ifstream in(path_);
      std::string l;
      while (std::getline(in, l)) run += l.rfind("{\"run\":", 0) == 0;
    }
    out_.line(fmt::format("{{\"run\":{},\"started\":\"{}\",\"ranks\":{}}}", run, utc_now_text(), ranks_));
  }
  out_.line(text);
}

MetricsWriter::~MetricsWriter() = default;

std::string json_number(double v) {
  return std::isfinite(v) ? fmt::format("{}", v) : "null";  // fmt's "{}": the shortest form that reads back exactly
}

namespace {
constexpr auto num = json_number;

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
  if (!m.stage_compute_ms.empty()) {
    out += ",\"stage_compute_ms\":[";
    for (size_t i = 0; i < m.stage_compute_ms.size(); ++i) out += (i ? "," : "") + num(m.stage_compute_ms[i]);
    out += "]";
  }
  if (!m.sdc_ranks.empty()) out += ",\"sdc_ranks\":" + ranks_json(m.sdc_ranks);
  if (m.host_syncs >= 0)
    out += fmt::format(",\"host_syncs\":{{\"compute\":{},\"step\":{}}}", m.host_syncs_compute, m.host_syncs);
  if (m.device_ops >= 0)
    out += fmt::format(",\"launches\":{{\"device_ops\":{},\"graphs\":{}}}", m.device_ops, m.graph_launches);
  if (!m.source_tokens.empty()) {
    out += ",\"source_tokens\":{";
    for (size_t i = 0; i < m.source_tokens.size(); ++i)
      out += fmt::format("{}{}:{}", i ? "," : "", nlohmann::json(m.source_tokens[i].first).dump(),
                         m.source_tokens[i].second);
    out += "}";
  }
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
  if (path_.empty()) return;
  auto& L = m.mem;
  line(fmt::format(
      "{{\"step\":{},\"loss\":{},\"grad_norm\":{},\"lr\":{},\"tokens\":{},\"step_ms\":{},\"tokens_per_s\":{},"
      "\"mfu\":{},\"hfu\":{},\"time\":{{\"compute_ms\":{},\"comm_exposed_ms\":{},\"bubble_ms\":{},"
      "\"optimizer_ms\":{},\"data_ms\":{},\"ckpt_block_ms\":{}}},\"mem\":{{\"params_b\":{},\"grads_b\":{},"
      "\"master_b\":{},\"optim_b\":{},\"act_b\":{},\"workspace_b\":{},\"comm_b\":{},\"peak_b\":{},\"rss_peak_b\":{}}},"
      "\"dp_comm\":{{\"all_reduce_b\":{},\"reduce_scatter_b\":{},\"all_gather_b\":{},\"send_b\":{}}},"
      "\"tp_comm\":{{\"all_reduce_b\":{},\"reduce_scatter_b\":{},\"all_gather_b\":{}}}{}}}",
      m.step, num(m.loss), num(m.grad_norm), num(m.lr), m.tokens, num(m.step_ms), num(m.tokens_per_s), num(m.mfu),
      num(m.hfu), num(m.compute_ms), num(m.comm_exposed_ms), num(m.bubble_ms), num(m.optimizer_ms), num(m.data_ms),
      num(m.ckpt_block_ms), L.of(Mem::params), L.of(Mem::grads), L.of(Mem::master), L.of(Mem::optim),
      L.of(Mem::activations), L.of(Mem::workspace), L.of(Mem::comm), L.peak_total, m.rss_peak_b, m.dp_all_reduce_b,
      m.dp_reduce_scatter_b, m.dp_all_gather_b, m.dp_send_b, m.tp_all_reduce_b, m.tp_reduce_scatter_b,
      m.tp_all_gather_b, fault_fields(m)));
}

void MetricsWriter::stopped(int64_t step, const char* signal) {
  line(fmt::format("{{\"step\":{},\"stopped\":\"{}\"}}", step, signal));
}

namespace {
struct Term {
  const char* key;   // in metrics.jsonl
  const char* name;  // in the log
  double StepSplit::*ms;
  bool modelled;
};
// Keys of their own (not a step line's "step_ms" or "bubble_ms"), so that readers picking step
// lines by those keys pass this line by.
constexpr Term kTerms[] = {{"total", "step", &StepSplit::step, true},
                           {"compute", "compute", &StepSplit::compute, true},
                           {"comm_exposed", "communication", &StepSplit::comm, true},
                           {"bubble", "bubble", &StepSplit::bubble, true},
                           {"optimizer", "optimizer", &StepSplit::optimizer, true},
                           {"data", "data", &StepSplit::data, false},
                           {"ckpt_block", "checkpoint", &StepSplit::ckpt, false}};

std::string split_json(const StepSplit& s) {
  std::string out;
  for (const Term& t : kTerms) out += fmt::format("{}\"{}\":{}", out.empty() ? "" : ",", t.key, num(s.*t.ms));
  return "{" + out + "}";
}
}  // namespace

std::string split_gap(const StepSplit& predicted, const StepSplit& measured) {
  const Term* worst = nullptr;
  double worst_ms = 0;
  for (const Term& t : kTerms) {
    if (!t.modelled || &t == &kTerms[0]) continue;  // the step is the sum of the others
    const double p = predicted.*t.ms, m = measured.*t.ms, d = std::abs(m - p);
    if (d >= 1.0 && d >= 0.1 * std::max(p, m) && d > worst_ms) worst = &t, worst_ms = d;
  }
  if (!worst) return "";
  const double p = predicted.*worst->ms, m = measured.*worst->ms;
  return p > 0 ? fmt::format("{} {:.1f}x predicted", worst->name, m / p)
               : fmt::format("{} {:.0f} ms where none was predicted", worst->name, m);
}

void MetricsWriter::split(const StepSplit& predicted, const StepSplit& measured, const std::string& cluster) {
  const std::string gap = split_gap(predicted, measured);
  line(fmt::format("{{\"split_ms\":{{\"predicted\":{},\"measured\":{}}},\"cluster\":{},\"gap\":{}}}",
                   split_json(predicted), split_json(measured), nlohmann::json(cluster).dump(),
                   nlohmann::json(gap).dump()));
}

std::string split_table(const StepSplit& predicted, const StepSplit& measured) {
  std::string out;
  for (const Term& t : kTerms) {
    const double p = predicted.*t.ms, m = measured.*t.ms;
    out += fmt::format("\n  {:<14} {:>10} {:>10} {:>8}", t.name, t.modelled ? ms_text(p) : "-", ms_text(m),
                       !t.modelled ? "(not modelled)"
                       : p > 0     ? fmt::format("{:.2f}x", m / p)
                                   : std::string("-"));
  }
  return fmt::format("  {:<14} {:>10} {:>10} {:>8}", "ms per step", "predicted", "measured", "ratio") + out;
}

void MetricsWriter::validation(int64_t step, double val_loss) {
  line(fmt::format("{{\"step\":{},\"val_loss\":{}}}", step, num(val_loss)));
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

std::string ms_text(double ms) {
  if (!std::isfinite(ms)) return "-";
  if (ms == 0) return "0";
  const double a = std::abs(ms);
  return fmt::format("{:.{}f}", ms, a >= 1000 ? 0 : a >= 100 ? 1 : a >= 10 ? 2 : 3);
}

std::string format_duration(double s) {
  if (s < 60) return fmt::format("{:.0f}s", s);
  if (s < 3600) return fmt::format("{}m{:02d}s", int(s) / 60, int(s) % 60);
  return fmt::format("{}h{:02d}m", int(s) / 3600, int(s) % 3600 / 60);
}

int64_t rss_peak_bytes() {
  struct rusage u {};
  return ::getrusage(RUSAGE_SELF, &u) == 0 ? int64_t(u.ru_maxrss) * 1024 : 0;  // Linux: KiB
}

double eta_seconds(double elapsed_s, int64_t steps_run, int64_t steps_left) {
  return steps_run > 0 ? elapsed_s / double(steps_run) * double(steps_left) : 0.0;
}

std::string progress_line(const StepMetrics& m, double eta_s) {
  return fmt::format("step {:>{}}/{} | loss {:.4f} | lr {:.2e} | {:.0f} tok/s | MFU {:.1f}% | {:.0f} ms | ETA {}",
                     m.step, int(std::to_string(m.steps).size()), m.steps, m.loss, m.lr, m.tokens_per_s, 100.0 * m.mfu,
                     m.step_ms, format_duration(eta_s));
}

}  // namespace loom
