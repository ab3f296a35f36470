// A profiled run's measured rates written into a cluster file (`loom bench train --profile
// --write-cluster FILE`), in the terms the step model prices: its own work for each term (the
// prediction with that term's rate at 1 and every other free) over the time the profile measured
// for the ops of that term. The model then predicts the profiled run's terms as measured, and
// other shapes on the same device from the same rates.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "plan/step_model.h"
#include "runtime/error.h"
#include "runtime/file.h"
#include "train/bench.h"

namespace loom {

namespace {

enum class Term { matmul, attention, cp_attention, elementwise, optimizer, none };

// Which term of the step model an op family's time belongs to.
Term term_of(const std::string& family) {
  if (family.rfind("linear", 0) == 0 || family.rfind("down+", 0) == 0) return Term::matmul;
  if (family.rfind("cp attention", 0) == 0) return Term::cp_attention;
  if (family.rfind("attention", 0) == 0) return Term::attention;
  if (family == "adamw" || family == "grad norm") return Term::optimizer;
  if (family == "inputs" || family == "upload" || family == "download") return Term::none;  // host transfers
  return Term::elementwise;
}

// The model's work for one term on cfg's layout: seconds at a rate of 1 with every other free.
double model_work(const Cluster& base, const Config& cfg, Term term) {
  Cluster c = base;
  c.nodes = 1, c.devices_per_node = std::max(1, cfg.world()), c.physical_devices = 0, c.memory_bytes = 0;
  const double free = 1e30;
  c.peak_flops = term == Term::matmul ? 1 : free, c.gemm_efficiency = 1;
  c.attention_flops = term == Term::attention ? 1 : free;
  c.cp_attention_flops = term == Term::cp_attention ? 1 : free;
  c.mem_bw = term == Term::elementwise ? 1 : free;
  c.optimizer_bw = term == Term::optimizer ? 1 : free;
  Config k = cfg;
  if (k.train.dtype == DTypeChoice::automatic) k.train.dtype = dtype_choice(c.dtype);
  const StepPrediction p = step_predict(k, c);
  return term == Term::optimizer ? p.optimizer : p.compute;
}

}  // namespace

Cluster profile_cluster_fit(const Cluster& base, const Config& cfg, const OpProfile& prof) {
  LOOM_CHECK(prof.steps > 0, "no step was profiled: nothing to fit");
  double t[6] = {};
  for (const ProfileRow& r : prof.rows) t[int(term_of(r.family))] += r.ms / 1e3 / double(prof.steps);
  Cluster c = base;
  auto rate = [&](Term term) {
    const double s = t[int(term)];
    return s > 0 ? model_work(base, cfg, term) / s : 0.0;
  };
  if (const double mm = rate(Term::matmul); mm > 0) c.gemm_efficiency = std::min(1.0, mm / c.peak_flops);
  if (const double a = rate(Term::attention); a > 0) c.attention_flops = a;
  if (const double a = rate(Term::cp_attention); a > 0) c.cp_attention_flops = a;
  if (const double bw = rate(Term::elementwise); bw > 0) c.mem_bw = bw;
  if (const double bw = rate(Term::optimizer); bw > 0) c.optimizer_bw = bw;
  return c;
}

Cluster cluster_with_term_seconds(const Cluster& base, const Config& cfg, double attention_s, double elementwise_s,
                                  double optimizer_s) {
  Cluster c = base;
  if (attention_s > 0) c.attention_flops = model_work(base, cfg, Term::attention) / attention_s;
  if (elementwise_s > 0) c.mem_bw = model_work(base, cfg, Term::elementwise) / elementwise_s;
  if (optimizer_s > 0) c.optimizer_bw = model_work(base, cfg, Term::optimizer) / optimizer_s;
  return c;
}

std::string profile_prediction_compare(const Cluster& cl, const Config& cfg, const OpProfile& prof) {
  LOOM_CHECK(prof.steps > 0, "no step was profiled: nothing to compare");
  double t[6] = {};
  for (const ProfileRow& r : prof.rows) t[int(term_of(r.family))] += r.ms / double(prof.steps);
  const ClusterRates rates = cluster_rates(cl);
  const double rate[5] = {rates.matmul, rates.attention, rates.cp_attention, rates.elementwise, rates.optimizer};
  const char* names[5] = {"matmuls", "attention", "cp attention", "element-wise", "optimizer"};
  std::string out = fmt::format("predicted on {} against measured, ms per step:", cl.name);
  double sum_p = 0, sum_m = 0;
  for (int i = 0; i < 5; ++i) {
    const double predicted = 1e3 * model_work(cl, cfg, Term(i)) / rate[i];
    if (t[i] == 0 && predicted < 1e-9) continue;  // a term this run has not (cp attention without cp)
    sum_p += predicted, sum_m += t[i];
    out += fmt::format(" {} {:.3f} vs {:.3f} ({:+.1f}%);", names[i], predicted, t[i],
                       t[i] > 0 ? 100.0 * (predicted / t[i] - 1) : 0.0);
  }
  out += fmt::format(" ops {:.3f} vs {:.3f} ({:+.1f}%)\n", sum_p, sum_m, sum_m > 0 ? 100.0 * (sum_p / sum_m - 1) : 0.0);
  return out + cluster_rates(cl).describe + "\n";
}

namespace {

// text with `key = value` set at the top level: the key's line replaced (its comment with it),
// or a new line before the first table; every other line as it was.
std::string key_set(const std::string& text, const std::string& key, double value, const std::string& why) {
  const std::string line = fmt::format("{} = {:.4g}  # {}", key, value, why);
  std::istringstream in(text);
  std::string out, l;
  bool done = false, tables = false;
  while (std::getline(in, l)) {
    tables = tables || (!l.empty() && l[0] == '[');
    const bool is_key = !tables && l.rfind(key, 0) == 0 &&
                        l.find_first_not_of(" \t", key.size()) != std::string::npos &&
                        l[l.find_first_not_of(" \t", key.size())] == '=';
    if (!done && tables) out += line + "\n", done = true;
    if (is_key && !done) {
      out += line + "\n", done = true;
      continue;
    }
    out += l + "\n";
  }
  if (!done) out += line + "\n";
  return out;
}

}  // namespace

void profile_cluster_write(const std::string& path, const Config& cfg, const TrainResult& r) {
  // The emulated device runs the CUDA backend's kernels (bf16, flash attention) on the host.
  const bool gpu = device_is_cuda(r.device);
  std::string text;
  if (std::filesystem::exists(path)) {
    std::ifstream in(path);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } else {
    // A one-device file: the rates are this run's; the links are not measured by it.
    const double table = r.device == DeviceKind::cuda ? cuda_peak_flops() : 0.0;  // the MFU denominator where known
    text = fmt::format(
        "# One {} as loom's own kernels ran it (`loom bench train --profile --write-cluster`).\n"
        "name = \"{}\"\nnodes = 1\ndevices_per_node = 1\ndevice = \"{}\"\ndtype = \"{}\"\npeak_tflops = {:.4g}\n"
        "gemm_efficiency = 1\nmem_bw_gbs = {:.4g}\n\n"
        "[intra]  # a placeholder, not measured (one device): edit it for the machine's links\n"
        "alpha_us = 1.5\nbw_gbs = 370\n",
        device_name(r.device), r.device == DeviceKind::cuda ? cuda_device_name() : device_name(r.device),
        gpu ? "cuda" : "cpu", gpu ? "bf16" : "f32", (table > 0 ? table : r.roofline.gemm_flops) / 1e12,
        r.roofline.copy_bw / 1e9);
  }
  const Cluster base = cluster_parse(text, path);
  LOOM_CHECK(base.device == (gpu ? DeviceKind::cuda : DeviceKind::cpu),
             "{} describes a {} cluster; this run trained on {}", path, device_name(base.device),
             device_name(r.device));
  const Cluster fit = profile_cluster_fit(base, cfg, r.profile);
  const std::string from =
      fmt::format("fitted: {} d_model {} L {} B {} T {}, {} profiled", cfg.model.arch, cfg.model.d_model,
                  cfg.model.n_layer, cfg.train.micro_batch, cfg.model.seq_len, plural(r.profile.steps, "step"));
  text = key_set(text, "gemm_efficiency", fit.gemm_efficiency, from);
  text = key_set(text, "mem_bw_gbs", fit.mem_bw / 1e9, from);
  if (fit.attention_flops > 0) text = key_set(text, "attention_tflops", fit.attention_flops / 1e12, from);
  if (fit.cp_attention_flops > 0) text = key_set(text, "cp_attention_tflops", fit.cp_attention_flops / 1e12, from);
  if (fit.optimizer_bw > 0) text = key_set(text, "optimizer_gbs", fit.optimizer_bw / 1e9, from);
  cluster_parse(text, path);  // what is written reads back
  file_write_atomic(path, [&](std::FILE* f) { file_write(f, text.data(), text.size(), path); });
}

void cluster_term_rates_write(const std::string& path, const std::string& base_path, const Cluster& fit,
                              const std::string& why) {
  const std::string from = std::filesystem::exists(path) ? path : base_path;
  std::ifstream in(from);
  LOOM_CHECK(in, "cannot read the cluster file '{}'", from);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  cluster_parse(text, from);
  text = key_set(text, "attention_tflops", fit.attention_flops / 1e12, why);
  text = key_set(text, "mem_bw_gbs", fit.mem_bw / 1e9, why);
  text = key_set(text, "optimizer_gbs", fit.optimizer_bw / 1e9, why);
  cluster_parse(text, path);  // what is written reads back
  file_write_atomic(path, [&](std::FILE* f) { file_write(f, text.data(), text.size(), path); });
}

}  // namespace loom
