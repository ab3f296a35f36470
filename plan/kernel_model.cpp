#include "plan/kernel_model.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "runtime/error.h"

namespace loom {

GpuRates gpu_h200() {
  return {"H200 SXM", 132, 1.83e9, 4.3e12, 2048};
}
GpuRates gpu_h100() {
  return {"H100 SXM", 132, 1.83e9, 3.0e12, 2048};
}

std::map<std::string, KernelResources> ptxas_table_parse(const std::string& csv) {
  std::map<std::string, KernelResources> out;
  std::istringstream in(csv);
  std::string line;
  std::getline(in, line);
  LOOM_CHECK(line.empty() || line == "kernel,registers,spill_bytes,static_shared",
             "the ptxas table's header is '{}', not kernel,registers,spill_bytes,static_shared", line);
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const size_t close = line.rfind('"');
    LOOM_CHECK(line.size() > 2 && line[0] == '"' && close > 0, "a ptxas table row without a quoted kernel: {}", line);
    KernelResources k;
    std::istringstream fields(line.substr(close + 2));
    char comma = 0;
    fields >> k.registers >> comma >> k.spill_bytes >> comma >> k.static_shared;
    LOOM_CHECK(!fields.fail(), "a ptxas table row that is not three numbers after the kernel: {}", line);
    out[line.substr(1, close - 1)] = k;
  }
  return out;
}

int ctas_per_sm(const KernelResources& k, int threads, size_t dynamic_shared) {
  constexpr int kRegisters = 65536, kThreads = 2048, kBlocks = 32, kAllocation = 256;
  constexpr size_t kShared = 228 * 1024, kReserved = 1024;
  const int warps = (threads + 31) / 32;
  const int per_warp = (std::max(k.registers, 1) * 32 + kAllocation - 1) / kAllocation * kAllocation;
  const size_t shared = dynamic_shared + size_t(k.static_shared) + kReserved;
  return std::max(
      0, std::min({kRegisters / (per_warp * warps), kThreads / std::max(threads, 1), int(kShared / shared), kBlocks}));
}

namespace {

struct Pipes {
  double tensor = 0, shared = 0, issue = 0, mufu = 0;
  double max() const { return std::max({tensor, shared, issue, mufu}); }
  double sum() const { return tensor + shared + issue + mufu; }
};

// Seconds of each pipe for `w` spread over `sms` SMs.
Pipes pipes(const emu::WorkCounts& w, double sms, const GpuRates& g) {
  const double clocks = sms * g.clock_hz;
  const double wavefronts =
      w.ldmatrix_wavefronts + w.wmma_wavefronts + w.lds_wavefronts + w.sts_wavefronts + w.cp_async_wavefronts;
  // The counted warp instructions only (no arithmetic: a floor); a WMMA product is two mma.sync.
  const double instructions = w.mma + 2 * w.wmma + w.ldmatrix + w.wmma_ldst + w.lds + w.sts + w.ldg + w.stg +
                              w.cp_async + w.warp_ops + w.barriers + w.mufu;
  return {w.tensor_flops() / (g.mma_flops_clock * clocks), wavefronts / (g.shared_wavefronts * clocks),
          instructions / (g.issue * clocks), w.mufu / (g.mufu * clocks)};
}

// Pipes in series where fewer than warps_to_hide warps per scheduler wait on one another.
double core_time(const Pipes& p, double warps_per_sm, const KernelModelConstants& k) {
  const double per_scheduler = std::max(warps_per_sm / 4.0, 1e-9);
  return std::max(p.max(), p.sum() * k.warps_to_hide / per_scheduler);
}

}  // namespace

LaunchTime launch_time(const emu::LaunchCounts& l, int ctas, const GpuRates& g, const KernelModelConstants& k) {
  LOOM_CHECK(ctas > 0, "{}: no CTA of {} threads fits an SM", l.kernel, l.threads());
  const emu::WorkCounts& w = l.total;
  const int warps_per_cta = (l.threads() + 31) / 32;
  // A grid smaller than the GPU leaves SMs short of their CTAs.
  const double per_sm = std::min<double>(ctas, std::ceil(l.blocks / g.sms));
  LaunchTime t;
  t.warps_per_sm = int(per_sm * warps_per_cta);
  const bool walking = w.ldg > 0 && w.ldg_walking > k.walking_share * w.ldg;
  const double walk = walking ? k.walking_trips : 0;
  // Little's law in round trips: each resident warp has one in flight.
  t.latency = (w.trips_sum + walk * w.ldg_walking) * k.round_trip_s / (g.sms * std::max(t.warps_per_sm, 1));
  t.dram = w.dram_bytes() / g.dram_bw;
  const Pipes p = pipes(w, g.sms, g);
  t.tensor = p.tensor, t.shared = p.shared, t.issue = p.issue, t.mufu = p.mufu;
  t.core = core_time(p, t.warps_per_sm, k);
  // The heaviest block alone on an SM: its slowest warp's round trips, or its pipes with only its warps.
  const emu::WorkCounts& h = l.heaviest;
  const double heavy_walk = walking && h.warps > 0 ? walk * h.ldg_walking / h.warps : 0;
  t.tail = std::max((h.trips_max + heavy_walk) * k.round_trip_s, core_time(pipes(h, 1, g), warps_per_cta, k));
  const double memory = t.latency + t.dram;
  t.total = std::max({memory, t.tail, t.core});
  t.bound = t.total == memory ? "memory" : t.total == t.core ? "core" : "tail";
  t.total += k.launch_s;
  return t;
}

int ctas_per_sm(const std::map<std::string, KernelResources>& table, const emu::LaunchCounts& l) {
  const auto it = table.find(l.kernel);
  LOOM_CHECK(it != table.end(), "{}: the ptxas table has no such kernel (rebuild: it is written from the kernels)",
             l.kernel);
  return ctas_per_sm(it->second, l.threads(), l.dynamic_shared);
}

double OpTimes::seconds() const {
  double s = 0;
  for (const auto& [l, t] : launches) s += t.total;
  return s * calls;
}

std::vector<OpTimes> op_times(const std::vector<std::pair<std::string, emu::CountedOp>>& ops, const std::string& model,
                              int layers, const std::map<std::string, KernelResources>& table, const GpuRates& gpu,
                              const KernelModelConstants& k) {
  std::vector<OpTimes> out;
  for (const auto& [m, op] : ops) {
    if (m != model) continue;
    // Attention ops run once a layer; one counted with per_step 0 (a path the step does not take) stays out.
    const bool per_layer = op.name.rfind("attention", 0) == 0 && op.per_step > 0;
    OpTimes o{m, op.name, per_layer ? double(layers) : op.per_step, {}};
    for (const emu::LaunchCounts& l : op.launches)
      o.launches.push_back({&l, launch_time(l, ctas_per_sm(table, l), gpu, k)});
    out.push_back(std::move(o));
  }
  return out;
}

std::map<std::string, double> class_seconds(const std::vector<OpTimes>& ops) {
  std::map<std::string, double> out;
  for (const OpTimes& o : ops)
    for (const auto& [l, t] : o.launches) out[kernel_class(l->kernel)] += t.total * o.calls;
  return out;
}

std::string kernel_class(const std::string& kernel) {
  static const std::pair<const char*, const char*> prefixes[] = {{"attention_", "attention"},
                                                                 {"layernorm_", "layernorm"},
                                                                 {"rmsnorm_", "rmsnorm"},
                                                                 {"column_", "column sums"},
                                                                 {"crossentropy", "crossentropy"},
                                                                 {"gelu_", "gelu"},
                                                                 {"swiglu_", "swiglu"},
                                                                 {"adamw", "adamw"},
                                                                 {"sum_squares", "grad norm"},
                                                                 {"exact_finish", "grad norm"},
                                                                 {"embedding_", "embedding"},
                                                                 {"rope_", "rope"},
                                                                 {"add_", "residual add"}};
  for (const auto& [prefix, name] : prefixes)
    if (kernel.rfind(prefix, 0) == 0) return name;
  return "other";
}

}  // namespace loom
