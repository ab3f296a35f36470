// A profiled run's measured rates written into a cluster file (`loom bench train --profile
// --write-cluster FILE`), in the terms the step model prices: its own work for each term (the
// prediction with that term's rate at 1 and every other free) over the time the profile measured
// for the ops of that term. The model then predicts the profiled run's terms as measured, and
// other shapes on the same device from the same rates.
#include <toml++/toml.h>

#include <filesystem>
#include <fstream>

#include "launch/bench.h"
#include "launch/step_model.h"
#include "runtime/error.h"
#include "runtime/file.h"

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
  if (k.train.dtype == "auto") k.train.dtype = dtype_name(c.dtype);
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

void profile_cluster_write(const std::string& path, const Config& cfg, const TrainResult& r) {
  // The emulated device runs the CUDA backend's kernels (bf16, flash attention) on the host.
  const bool gpu = r.device == "cuda" || r.device == "cuda-emulated";
  Cluster base;
  toml::table t;
  const bool exists = std::filesystem::exists(path);
  if (exists) {
    base = cluster_load(path);
    t = toml::parse_file(path);
  } else {
    // A one-device file: the rates are this run's; the links are not measured by it.
    base.name = r.device == "cuda" ? cuda_device_name() : r.device;
    base.device = gpu ? "cuda" : "cpu";
    base.dtype = gpu ? DType::bf16 : DType::f32;
    const double table = r.device == "cuda" ? cuda_peak_flops() : 0.0;  // the MFU denominator where known
    base.peak_flops = table > 0 ? table : r.roofline.gemm_flops;
    base.gemm_efficiency = 1, base.mem_bw = r.roofline.copy_bw;
    t.insert("name", base.name);
    t.insert("nodes", 1);
    t.insert("devices_per_node", 1);
    t.insert("device", base.device);
    t.insert("dtype", gpu ? "bf16" : "f32");
    t.insert("peak_tflops", base.peak_flops / 1e12);
    toml::table intra;
    intra.insert("alpha_us", 1.5);  // not measured here: a placeholder for one device
    intra.insert("bw_gbs", 370.0);
    t.insert("intra", std::move(intra));
  }
  LOOM_CHECK(base.device == (gpu ? "cuda" : "cpu"), "{} describes a {} cluster; this run trained on {}", path,
             base.device, r.device);
  const Cluster fit = profile_cluster_fit(base, cfg, r.profile);
  t.insert_or_assign("gemm_efficiency", fit.gemm_efficiency);
  t.insert_or_assign("mem_bw_gbs", fit.mem_bw / 1e9);
  if (fit.attention_flops > 0) t.insert_or_assign("attention_tflops", fit.attention_flops / 1e12);
  if (fit.cp_attention_flops > 0) t.insert_or_assign("cp_attention_tflops", fit.cp_attention_flops / 1e12);
  if (fit.optimizer_bw > 0) t.insert_or_assign("optimizer_gbs", fit.optimizer_bw / 1e9);
  std::stringstream text;
  text << "# Per-op rates fitted by `loom bench train --profile --write-cluster` from a run of " << cfg.model.arch
       << " d_model " << cfg.model.d_model << " L " << cfg.model.n_layer << " B " << cfg.train.micro_batch << " T "
       << cfg.model.seq_len << " on " << r.device << "\n"
       << (exists ? "" : "# [intra] is a placeholder (one device measured): edit it for the machine's links\n") << t
       << "\n";
  const std::string out = text.str();
  file_write_atomic(path, [&](std::FILE* f) { file_write(f, out.data(), out.size(), path); });
}

}  // namespace loom
