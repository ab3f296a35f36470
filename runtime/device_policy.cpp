// train.device and train.dtype = "auto" resolved: which device a run trains on and in what.
#include "runtime/device_policy.h"

#include <fmt/format.h>

namespace loom {

std::string device_resolve(const Config& cfg, int gpus, std::string* why) {
  const TrainConfig& t = cfg.train;
  if (t.device != "auto") return t.device;
  const int hd = cfg.head_dim();
  std::string no;
  if (gpus == 0)
    no = LOOM_HAVE_CUDA ? "no CUDA device is visible" : "this build has no CUDA";
  else if (t.dtype == "f32")
    no = "train.dtype = \"f32\" and the GPU path computes in bf16";
  else if (hd != 32 && hd != 64 && hd != 128)
    no = fmt::format("the CUDA attention kernels take head dims 32, 64 and 128, not d_model / n_head = {}", hd);
  if (no.empty()) return "cuda";
  if (why && gpus > 0) *why = no;
  return "cpu";
}

DType dtype_resolve(const Config& cfg, const std::string& device) {
  if (cfg.train.dtype == "bf16") return DType::bf16;
  if (cfg.train.dtype == "f32") return DType::f32;
  return device == "cpu" ? DType::f32 : DType::bf16;
}

}  // namespace loom
