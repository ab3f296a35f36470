// The device policy: train.device and train.dtype = "auto" resolved, for training and for the
// planners alike (they must plan for the device a run would take).
#pragma once
#include <string>

#include "runtime/config.h"
#include "runtime/tensor.h"

namespace loom {

// train.device = auto: cuda when `gpus` (visible devices; 0 in a build without CUDA) > 0 and
// the CUDA kernels run this model (bf16 compute, head dims 32, 64 or 128); otherwise cpu, with
// *why saying what kept a visible GPU idle. A device named in the config comes back as it is.
DeviceKind device_resolve(const Config& cfg, int gpus, std::string* why);
// train.dtype = auto: f32 on the CPU, bf16 on CUDA (and the emulated device).
DType dtype_resolve(const Config& cfg, DeviceKind device);
// The train.dtype that names `dtype` (f32 or bf16).
DTypeChoice dtype_choice(DType dtype);

// What carries a run's collectives (parallel.comm resolved): NCCL groups, NCCL's rules
// emulated over MPI on host buffers, or MPI (CUDA buffers staged through pinned host memory,
// where ranks share GPUs: NCCL takes one rank per GPU). Pure: the device, whether the ranks
// were launched together (MPI), the ranks on this node and its GPUs are arguments. A choice
// the layout cannot take is an Error naming the fix; `note` is what a user should be told.
struct CommPlan {
  bool nccl = false, nccl_emulated = false;
  std::string note;
};
CommPlan comm_choose(CommChoice comm, DeviceKind device, bool launched, int local_ranks, int gpus);

}  // namespace loom
