#include "plan/step_elementwise.h"

#include "model/layout.h"
#include "model/registry.h"
#include "runtime/device_policy.h"

namespace loom {

BlockElementwise block_elementwise(const Config& cfg, const Cluster& cl, bool moe) {
  const auto& m = cfg.model;
  const auto& p = cfg.parallel;
  const double C = m.d_model, F = m.d_ff, kvd = double(cfg.kv_heads()) * cfg.head_dim();
  const bool llama = m.arch == Arch::llama;
  const double norms = 8.0 * C / (p.sp ? p.tp : 1);
  const double mlp = (moe ? m.moe.top_k : 1.0 / p.tp) * F;
  const bool fused_dgelu = !moe && backend_traits(cl.device, cl.dtype, model_dims(cfg)).fused_dgelu;
  const double rope = llama ? 2.0 * (C + kvd) / p.tp : 0;
  const double biases = llama || device_is_cuda(cl.device) ? 0 : (3 * C + (moe ? 0 : F)) / p.tp + 2 * C;
  return {norms + (llama ? 3.0 : 2.0) * mlp + rope, norms +
                                                        (llama         ? 5.0
                                                         : fused_dgelu ? 0.0
                                                                       : 3.0) *
                                                            mlp +
                                                        rope + biases};
}

BlockElementwise ends_elementwise(const Config& cfg, bool first, bool last) {
  const auto& p = cfg.parallel;
  const double C = cfg.model.d_model;
  BlockElementwise e;
  if (first) e.fwd += 3 * C, e.bwd += 5 * C;
  if (last) {
    e.fwd += 4 * C / (p.sp ? p.tp : 1) + 2.0 * double(model_dims(cfg).V_padded()) / p.tp;
    e.bwd += 4 * C / (p.sp ? p.tp : 1);
  }
  return e;
}

}  // namespace loom
