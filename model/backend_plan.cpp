// The CUDA backend's working memory, computed without a device so that `loom plan memory` can
// plan a GPU run anywhere; the CUDA backend allocates exactly this list.
#include "model/backend.h"

namespace loom {

std::vector<PlanItem> cuda_backend_plan(const Config& cfg) {
  const int64_t N = int64_t(cfg.train.micro_batch) * cfg.model.seq_len;
  return {{"cublaslt_workspace", int64_t(32) << 18, DType::i32,
           Mem::workspace},  // 32 MiB
                             // two slots (a micro-batch computing, the next one uploading) of tokens [N], targets [N]
          // and the embedding gradient's token index [up to 3N + 1]
          {"inputs", 2 * (5 * N + 1), DType::i32, Mem::workspace},
          {"norm_partials", 1024, DType::f64, Mem::workspace}};
}

}  // namespace loom
