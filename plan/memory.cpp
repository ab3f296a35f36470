#include "plan/memory.h"

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "kernels/flash_ds.h"
#include "kernels/moe_row.h"
#include "model/backend.h"
#include "model/flops.h"
#include "model/layout.h"
#include "parallel/ddp.h"
#include "parallel/grad_tree.h"
#include "parallel/pipeline.h"
#include "parallel/zero.h"
#include "runtime/cuda_api.h"
#include "runtime/error.h"
#include "runtime/exact_digits.h"
#include "runtime/mesh.h"

namespace loom {

std::array<double, 4> plan_zero_paper(double psi, int dp, double bp, double bg, double k) {
  return {(bp + bg + k) * psi, (bp + bg) * psi + k * psi / dp, bp * psi + (bg + k) * psi / dp,
          (bp + bg + k) * psi / dp};
}

int64_t MemoryPlan::total() const {
  int64_t s = 0;
  for (int64_t b : bytes) s += b;
  return s;
}

MemoryPlan plan_memory(const Config& cfg, DeviceKind kind, DType dtype, int rank, const PartSpec* given) {
  const MeshDims dims{cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.cp, cfg.parallel.tp, cfg.parallel.ep};
  const MeshCoord at = mesh_coord(dims, rank);
  // dp x cp hold the same weights: ZeRO shards over them, ep is carved from them.
  const int dcp = cfg.parallel.dp * cfg.parallel.cp, dcp_rank = at.dp * cfg.parallel.cp + at.cp;
  const bool cuda = device_is_cuda(kind);
  const ModelDims model = model_dims(cfg);
  const BackendTraits traits = backend_traits(kind, dtype, model);
  const PartSpec spec = given ? *given : pipeline_chunk_spec(cfg, at.pp);  // the whole model without stages
  const ModelLayout layout = model_layout(model, at.tp, chunk_runs(spec), dcp_rank % cfg.parallel.ep);
  const int64_t n = int64_t(layout.reg.numel());
  const int stage = cfg.parallel.zero;
  std::vector<PlanItem> items = cuda ? cuda_backend_plan(model) : cpu_backend_plan(model, dtype);
  // The chunk (model/decoder_part.cpp): flat buffers, activations, scratch, RoPE tables, loss sum, MoE
  // statistics.
  if (stage < 3) items.push_back({"params", n, dtype, Mem::params});
  if (stage < 2) items.push_back({"grads", n, DType::f32, Mem::grads});
  const ChunkPlan a = chunk_plan(model, spec, traits);
  for (size_t j = 0; j < a.pieces.size(); ++j)
    for (auto& b : a.pieces[j].buffers)
      items.push_back({b.name, b.numel * b.copies * spec.pieces[j].slots, b.dtype, Mem::activations});
  for (auto& b : a.scratch) items.push_back({b.name, b.numel, b.dtype, b.comm ? Mem::comm : Mem::workspace});
  if (cfg.model.arch == Arch::llama)
    for (int i = 0; i < 2; ++i)
      items.push_back({"rope", int64_t(cfg.model.seq_len) * cfg.head_dim() / 2, DType::f32, Mem::workspace});
  items.push_back({"loss_sum", kExactDigits, DType::f64, Mem::workspace});
  if (cfg.moe_layers()) items.push_back({"moe_stats", moe_row::kStats * cfg.moe_layers(), DType::f64, Mem::workspace});
  for (auto& it : pipeline_stage_plan(cfg, at.pp, dtype)) items.push_back(it);
  // The data-parallel side and its optimizer.
  const DataParallelOptions o = data_parallel_options(cfg);
  const ModelDims md = model_dims(cfg);
  const ZeroRanks z = zero_ranks(o, md, dcp, dcp_rank, dcp_rank / cfg.parallel.ep);
  const auto dp_items = stage == 0 ? Ddp::plan(o, md, layout, dtype, kind)
                                   : zero_plan(layout, z, stage, at.tp, dtype, o.reduce, kind, o.keep_gathered);
  items.insert(items.end(), dp_items.begin(), dp_items.end());
  if (stage >= 1 && o.invariant)  // (DDP's plan lists them itself)
    for (auto& it :
         zero_tree_plan(layout, z, stage, o.micro_batches,
                        tied_head_apart(layout, md, true) ? layout.reg.at(head_names(md).wte).numel() : 0, o.cp))
      items.push_back(it);
  MemoryPlan p;
  for (auto& it : items) p.bytes[size_t(it.mem)] += Allocator::alloc_bytes(it.numel, it.dtype);
  return p;
}

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// A number from a kernel file ("MemAvailable:  1234 kB" with `key`, or a bare count); -1 when
// absent or "max".
int64_t proc_number(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!key.empty() && line.rfind(key, 0) != 0) continue;
    std::istringstream words(key.empty() ? line : line.substr(key.size()));
    int64_t n = -1;
    std::string unit;
    if (!(words >> n)) return -1;
    return words >> unit && unit == "kB" ? n * 1024 : n;
  }
  return -1;
}
}  // namespace

MemoryAvailable memory_available(DeviceKind kind, int sharing) {
  sharing = std::max(1, sharing);
  MemoryAvailable a;
  // The emulated device is a device of its own to each rank where LOOM_EMULATED_DEVICE_MB sizes it
  // (kernels/emu/runtime.h), else the host's memory.
  const char* emulated = std::getenv("LOOM_EMULATED_DEVICE_MB");
  if (kind == DeviceKind::cuda || (kind == DeviceKind::cuda_emulated && emulated && *emulated)) {
    if (kind != DeviceKind::cuda) sharing = 1;
    const double free = double(cuda_api(kind).mem_free());
    a.bytes = int64_t(free / sharing);
    a.from = fmt::format("{:.1f} GiB free on this {}{}", free / kGiB,
                         kind == DeviceKind::cuda ? "GPU" : "emulated device (LOOM_EMULATED_DEVICE_MB)",
                         sharing > 1 ? fmt::format(", shared by {} ranks", sharing) : "");
    return a;
  }
  // The emulated device's memory is the host's.
  int64_t host = proc_number("/proc/meminfo", "MemAvailable:");
  std::string what = "available on this host";
  const int64_t limit = proc_number("/sys/fs/cgroup/memory.max", ""),
                used = proc_number("/sys/fs/cgroup/memory.current", "");
  if (limit > 0 && used >= 0 && (host < 0 || limit - used < host)) {
    host = std::max<int64_t>(0, limit - used);
    what = "left under this cgroup's memory limit";
  }
  if (host < 0) return a;
  a.bytes = host / sharing;
  a.from = fmt::format("{:.1f} GiB {}{}", double(host) / kGiB, what,
                       sharing > 1 ? fmt::format(", shared by {} ranks", sharing) : "");
  return a;
}

void memory_fit_rough(const Config& cfg, DType dtype, int world, const MemoryAvailable& avail) {
  if (avail.bytes < 0) return;
  const double n = param_count_f64(model_dims(cfg)), bytes = n * double(dtype_size(dtype)) / std::max(1, world);
  LOOM_CHECK(bytes <= double(avail.bytes),
             "the model.* keys describe {:.3g} parameters: their {} weights alone take {:.1f} GiB per rank even "
             "spread over all {} ranks, and each rank has {:.1f} GiB ({}); check the model.* keys or run on more "
             "ranks",
             n, dtype_name(dtype), bytes / kGiB, world, double(avail.bytes) / kGiB, avail.from);
}

void memory_fit_check(const MemoryPlan& plan, int rank, const MemoryAvailable& avail) {
  if (avail.bytes < 0 || plan.total() <= avail.bytes) return;
  std::string split;
  for (int i = 0; i < kMemCategories; ++i)
    if (plan.bytes[size_t(i)] > 0)
      split += fmt::format("{}{} {:.2f}", split.empty() ? "" : ", ", mem_name(Mem(i)), plan.bytes[size_t(i)] / kGiB);
  fail(
      "rank {} plans {:.2f} GiB ({} GiB) and has {:.2f} GiB ({}); lower train.micro_batch or model.seq_len, set "
      "train.recompute, shard with parallel.zero, tp or pp (`loom plan memory` prints every rank's plan), or train a "
      "smaller model",
      rank, plan.total() / kGiB, split, double(avail.bytes) / kGiB, avail.from);
}

AttentionDsFit attention_ds_fit(const Config& cfg, DeviceKind device, DType dtype, int rank, const PartSpec* spec,
                                const MemoryAvailable& avail, int64_t with) {
  AttentionDsFit f;
  if (!device_is_cuda(device) || !cfg.train.attention_ds) return f;
  f.bytes = Allocator::alloc_bytes(attention_ds_elems(model_dims(cfg)), DType::bf16);
  if (f.bytes == 0 || avail.bytes < 0) return f;
  const int64_t margin = std::max<int64_t>(int64_t(64) << 20, avail.bytes / 20);
  if (with < 0) with = plan_memory(cfg, device, dtype, rank, spec).total();
  if (with + margin <= avail.bytes) return f;
  f.fits = false;
  f.note = fmt::format(
      "the flash backward's stored dS ({:.1f} MiB) is left out: this rank's plan with it is {:.2f} GiB, {:.2f} GiB "
      "with a margin of {:.0f} MiB, and it has {:.2f} GiB ({}); dQ recomputes S and dP instead (the same bits, a "
      "slower attention backward)",
      double(f.bytes) / (1 << 20), with / kGiB, (with + margin) / kGiB, double(margin) / (1 << 20),
      double(avail.bytes) / kGiB, avail.from);
  return f;
}

std::string attention_ds_line(const Config& cfg, DeviceKind device) {
  if (!device_is_cuda(device)) return "";
  const ModelDims d = model_dims(cfg);
  const int64_t elems = attention_ds_elems(d);
  if (elems > 0)
    return fmt::format("attention_ds: the flash backward's stored dS, {:.3f} GB of workspace\n",
                       Allocator::alloc_bytes(elems, DType::bf16) / 1e9);
  const int64_t shape = flash_ds_elems(d.B, d.T, d.H / std::max(d.tp, 1), d.D, d.doc_mask);
  const char* why = !cfg.train.attention_ds ? "no room for it on the device"
                    : d.cp > 1              ? "context parallel's blocks recompute it"
                    : shape == 0            ? "head dim other than 64 or document masks"
                                            : "past its 1 GiB cap";
  return fmt::format("attention_ds: none, dQ recomputes S and dP ({})\n", why);
}

std::string plan_memory_table(const Config& cfg, DeviceKind device, DType dtype) {
  std::string out =
      fmt::format("per-rank memory on {} ({}), dp {}, tp {}{}{} (GB)\n{:<12}", device_name(device), dtype_name(dtype),
                  cfg.parallel.dp, cfg.parallel.tp, cfg.parallel.cp > 1 ? fmt::format(", cp {}", cfg.parallel.cp) : "",
                  cfg.parallel.pp > 1 ? fmt::format(", pp {} (rank 0, the first stage)", cfg.parallel.pp) : "", "");
  MemoryPlan p[4];
  for (int s = 0; s < 4; ++s) {
    Config c = cfg;
    c.parallel.zero = s;
    p[s] = plan_memory(c, device, dtype);
    out += fmt::format(" {:>10}", fmt::format("zero {}", s));
  }
  for (int m = 0; m < kMemCategories; ++m) {
    out += fmt::format("\n{:<12}", mem_name(Mem(m)));
    for (auto& x : p) out += fmt::format(" {:>10.3f}", double(x.bytes[size_t(m)]) / 1e9);
  }
  out += fmt::format("\n{:<12}", "total");
  for (auto& x : p) out += fmt::format(" {:>10.3f}", double(x.total()) / 1e9);
  return out;
}

std::string plan_memory_json(const Config& cfg, DeviceKind device, DType dtype) {
  const int world = cfg.world();
  const ModelLayout layout = model_layout(model_dims(cfg));
  std::string out = fmt::format(
      "{{\"device\":\"{}\",\"dtype\":\"{}\",\"zero\":{},\"dp\":{},\"cp\":{},\"tp\":{},\"n_params\":{},"
      "\"units\":{},\"norm_block\":{},\"ranks\":[",
      device_name(device), dtype_name(dtype), cfg.parallel.zero, cfg.parallel.dp, cfg.parallel.cp, cfg.parallel.tp,
      layout.reg.global_numel(), layout.num_units(), norm_block(model_dims(cfg)));
  for (int r = 0; r < world; ++r) {
    const MemoryPlan p = plan_memory(cfg, device, dtype, r);
    out += fmt::format("{}{{\"rank\":{}", r ? "," : "", r);
    static const char* keys[] = {"params_b", "grads_b", "master_b", "optim_b", "act_b", "comm_b", "workspace_b"};
    for (int m = 0; m < kMemCategories; ++m) out += fmt::format(",\"{}\":{}", keys[m], p.bytes[size_t(m)]);
    out += "}";
  }
  return out + "]}";
}

}  // namespace loom
