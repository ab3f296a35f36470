// The device policy: train.device and train.dtype = "auto" resolved, for training and for the
// planners alike (they must plan for the device a run would take).
#pragma once
#include <string>

#include "runtime/config.h"
#include "runtime/tensor.h"

namespace loom {

// train.device = auto: "cuda" when `gpus` (visible devices; 0 in a build without CUDA) > 0 and
// the CUDA kernels run this model (bf16 compute, head dims 32, 64 or 128); otherwise "cpu",
// with *why saying what kept a visible GPU idle. "cpu" and "cuda" come back as they are.
std::string device_resolve(const Config& cfg, int gpus, std::string* why);
// train.dtype = auto: f32 on the CPU, bf16 on CUDA.
DType dtype_resolve(const Config& cfg, const std::string& device);

}  // namespace loom
