#include "launch/plan.h"

#include <fmt/format.h>

#include "model/backend.h"
#include "model/layout.h"
#include "parallel/ddp.h"
#include "parallel/pipeline.h"
#include "parallel/zero.h"
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

MemoryPlan plan_memory(const Config& cfg, const std::string& device, DType dtype, int rank, const ChunkSpec* given) {
  const MeshDims dims{cfg.parallel.pp, cfg.parallel.dp, 1, cfg.parallel.tp, cfg.parallel.ep};
  const MeshCoord at = mesh_coord(dims, rank);
  const bool cuda = device == "cuda" || device == "cuda-emulated";
  const DeviceKind kind = device == "cuda-emulated" ? DeviceKind::cuda_emulated
                          : cuda                    ? DeviceKind::cuda
                                                    : DeviceKind::cpu;
  const BackendTraits traits = backend_traits(kind, dtype, cfg);
  const ChunkSpec spec = given ? *given : pipeline_chunk_spec(cfg, at.pp);  // the whole model without stages
  const ModelLayout layout = model_layout(cfg, at.tp, chunk_runs(spec), at.dp % cfg.parallel.ep);
  const int64_t n = int64_t(layout.reg.numel());
  const int stage = cfg.parallel.zero;
  std::vector<PlanItem> items = cuda ? cuda_backend_plan(cfg) : cpu_backend_plan(cfg, dtype);
  // The chunk (model/chunk.cpp): flat buffers, activations, scratch, RoPE tables, loss sum.
  if (stage < 3) items.push_back({"params", n, dtype, Mem::params});
  if (stage < 2) items.push_back({"grads", n, DType::f32, Mem::grads});
  const ChunkPlan a = chunk_plan(cfg, spec, traits);
  for (size_t j = 0; j < a.pieces.size(); ++j)
    for (auto& b : a.pieces[j].buffers)
      items.push_back({b.name, b.numel * b.copies * spec.pieces[j].slots, b.dtype, Mem::activations});
  for (auto& b : a.scratch) items.push_back({b.name, b.numel, b.dtype, b.comm ? Mem::comm : Mem::workspace});
  if (cfg.model.arch == "llama")
    for (int i = 0; i < 2; ++i)
      items.push_back({"rope", int64_t(cfg.model.seq_len) * cfg.head_dim() / 2, DType::f32, Mem::workspace});
  items.push_back({"loss_sum", 1, DType::f64, Mem::workspace});
  for (auto& it : pipeline_stage_plan(cfg, at.pp, dtype)) items.push_back(it);
  // The data-parallel side and its optimizer.
  const auto dp_items =
      stage == 0 ? Ddp::plan(cfg, layout.reg, at.tp, dtype, kind)
                 : zero_plan(layout,
                             {cfg.parallel.dp, at.dp, cfg.parallel.ep > 1 ? cfg.parallel.dp / cfg.parallel.ep : 0,
                              at.dp / cfg.parallel.ep},
                             stage, at.tp, dtype, grad_reduce_dtype(cfg), kind);
  items.insert(items.end(), dp_items.begin(), dp_items.end());
  MemoryPlan p;
  for (auto& it : items) p.bytes[size_t(it.mem)] += Allocator::alloc_bytes(it.numel, it.dtype);
  return p;
}

std::string plan_memory_table(const Config& cfg, const std::string& device, DType dtype) {
  std::string out = fmt::format("per-rank memory on {} ({}), dp {}, tp {} (MiB)\n{:<12}", device, dtype_name(dtype),
                                cfg.parallel.dp, cfg.parallel.tp, "");
  MemoryPlan p[4];
  for (int s = 0; s < 4; ++s) {
    Config c = cfg;
    c.parallel.zero = s;
    p[s] = plan_memory(c, device, dtype);
    out += fmt::format(" {:>10}", fmt::format("zero {}", s));
  }
  for (int m = 0; m < kMemCategories; ++m) {
    out += fmt::format("\n{:<12}", mem_name(Mem(m)));
    for (auto& x : p) out += fmt::format(" {:>10.2f}", double(x.bytes[size_t(m)]) / 1048576.0);
  }
  out += fmt::format("\n{:<12}", "total");
  for (auto& x : p) out += fmt::format(" {:>10.2f}", double(x.total()) / 1048576.0);
  return out;
}

std::string plan_memory_json(const Config& cfg, const std::string& device, DType dtype) {
  const int world = cfg.parallel.pp * cfg.parallel.dp * cfg.parallel.tp;
  std::string out = fmt::format(
      "{{\"device\":\"{}\",\"dtype\":\"{}\",\"zero\":{},\"dp\":{},\"tp\":{},\"n_params\":{},"
      "\"ranks\":[",
      device, dtype_name(dtype), cfg.parallel.zero, cfg.parallel.dp, cfg.parallel.tp,
      model_layout(cfg).reg.global_numel());
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
