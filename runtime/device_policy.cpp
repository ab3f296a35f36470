// train.device and train.dtype = "auto" resolved: which device a run trains on and in what.
#include "runtime/device_policy.h"

#include <fmt/format.h>

#include "runtime/error.h"

namespace loom {

DeviceKind device_resolve(const Config& cfg, int gpus, std::string* why) {
  const TrainConfig& t = cfg.train;
  switch (t.device) {
    case DeviceChoice::cpu:
      return DeviceKind::cpu;
    case DeviceChoice::cuda:
      return DeviceKind::cuda;
    case DeviceChoice::cuda_emulated:
      return DeviceKind::cuda_emulated;
    case DeviceChoice::automatic:
      break;
  }
  const int hd = cfg.head_dim();
  std::string no;
  if (gpus == 0)
    no = LOOM_HAVE_CUDA ? "no CUDA device is visible" : "this build has no CUDA";
  else if (t.dtype == DTypeChoice::f32)
    no = "train.dtype = \"f32\" and the GPU path computes in bf16";
  else if (hd != 32 && hd != 64 && hd != 128)
    no = fmt::format("the CUDA attention kernels take head dims 32, 64 and 128, not d_model / n_head = {}", hd);
  if (no.empty()) return DeviceKind::cuda;
  if (why && gpus > 0) *why = no;
  return DeviceKind::cpu;
}

DType dtype_resolve(const Config& cfg, DeviceKind device) {
  if (cfg.train.dtype == DTypeChoice::bf16) return DType::bf16;
  if (cfg.train.dtype == DTypeChoice::f32) return DType::f32;
  return device == DeviceKind::cpu ? DType::f32 : DType::bf16;
}

DTypeChoice dtype_choice(DType dtype) {
  LOOM_CHECK(dtype == DType::f32 || dtype == DType::bf16, "train.dtype is f32 or bf16, not {}", dtype_name(dtype));
  return dtype == DType::bf16 ? DTypeChoice::bf16 : DTypeChoice::f32;
}

CommPlan comm_choose(CommChoice comm, DeviceKind device, bool launched, int local_ranks, int gpus) {
  CommPlan plan;
  plan.nccl_emulated = comm == CommChoice::nccl_emulated;
  LOOM_CHECK(!plan.nccl_emulated || device != DeviceKind::cuda,
             "parallel.comm = \"nccl-emulated\" carries host buffers: it needs train.device = \"cpu\" or "
             "\"cuda-emulated\" (it is \"cuda\"); on a GPU use parallel.comm = \"nccl\"");
  LOOM_CHECK(device != DeviceKind::cuda_emulated || comm != CommChoice::nccl,
             "parallel.comm = \"nccl\" needs GPUs, and train.device = \"cuda-emulated\" has none; use "
             "parallel.comm = \"mpi\" (its staged path carries the emulated device's buffers)");
  if (plan.nccl_emulated && !launched)
    plan.note =
        "parallel.comm = \"nccl-emulated\" on one process: there is no communication to check; launch the "
        "layout under mpirun or srun";
  if (device != DeviceKind::cuda || !launched) return plan;
  const bool shared = local_ranks > gpus;
  LOOM_CHECK(!(shared && comm == CommChoice::nccl),
             "parallel.comm = \"nccl\" but {} share {} on this node, and NCCL takes one rank per GPU; "
             "use parallel.comm = \"mpi\" (staged through the host) or launch one rank per GPU",
             plural(local_ranks, "rank"), plural(gpus, "GPU"));
  plan.nccl = comm == CommChoice::nccl || (comm == CommChoice::automatic && !shared);
  if (!plan.nccl && comm == CommChoice::automatic)
    plan.note = fmt::format(
        "{} share {} on this node: collectives go through MPI, staged in host memory (for checking "
        "layouts, not for speed); launch one rank per GPU for NCCL",
        plural(local_ranks, "rank"), plural(gpus, "GPU"));
  return plan;
}

}  // namespace loom
