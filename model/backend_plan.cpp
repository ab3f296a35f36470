// The CUDA backend's working memory, computed without a device so that `loom plan memory` can
// plan a GPU run anywhere; the CUDA backend allocates exactly this list.
#include <algorithm>

#include "kernels/flash_ds.h"
#include "model/backend.h"

namespace loom {

int cuda_input_slots(const ModelDims& dims) {
  return std::clamp(dims.accum, 2, 64);
}

int64_t attention_ds_elems(const ModelDims& dims) {
  if (dims.cp != 1 || !dims.attention_ds) return 0;
  return flash_ds_planned_elems(dims.B, dims.T, dims.H / std::max(dims.tp, 1), dims.D, dims.doc_mask);
}

std::vector<PlanItem> cuda_backend_plan(const ModelDims& dims) {
  const int64_t N = int64_t(dims.B) * dims.T_local();
  const int C = dims.C, E = dims.moe.num_experts;
  constexpr int64_t kMaxColumnChunks = 64;  // kernels/cuda/ops_cuda.h's kMaxRowChunks
  return {{"cublaslt_workspace", int64_t(32) << 18, DType::i32,
           Mem::workspace},  // 32 MiB
                             // a slot per micro-batch of a step (cuda_input_slots) of tokens [N], targets [N] and
                             // the embedding gradient's token index [up to 3N + 1]
          // (data.doc_mask or cp: and the positions [N] with the rows at each position [T + 1 + N])
          {"inputs", cuda_input_slots(dims) * (5 * N + 1 + (dims.doc_mask || dims.cp > 1 ? 2 * N + dims.T + 1 : 0)),
           DType::i32, Mem::workspace},
          {"norm_partials", 1024, DType::f64, Mem::workspace},
          // the column sums' partials (weight, bias and router gradients), for the widest
          // column count: a bias of 3C or F, a norm's C (the fused norm backward's 512 blocks: 8C
          // in these units), the experts
          {"column_partials", 2 * kMaxColumnChunks * std::max({8 * int64_t(C), int64_t(dims.F), int64_t(E)}),
           DType::f32, Mem::workspace},
          // context parallel: every cp rank's token positions, the block kernels' masks
          {"cp_positions", dims.cp > 1 ? int64_t(dims.cp) * dims.T_local() : 0, DType::i32, Mem::workspace},
          // the flash backward's stored dS (B H T^2 / 2 bf16, kernels/flash_ds.h), reused by every
          // layer; none where dQ recomputes it (head dim other than 64, document masks, cp, past 1 GiB,
          // or no room for it on the device: plan/memory.h's attention_ds_fit)
          {"attention_ds", attention_ds_elems(dims), DType::bf16, Mem::workspace}};
}

}  // namespace loom
