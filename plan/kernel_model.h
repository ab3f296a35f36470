// The time of one CUDA kernel launch on an H100 or H200, from what the counting emulation
// counted of it (kernels/emu/counts.h) and the occupancy its ptxas figures allow: the issue-53
// model, checked against the H200's measured times of the earlier kernels (counts.KernelModel.*).
// A handful of global constants, stated below; none is per kernel. It predicts kernel time only:
// no launch gaps between kernels, no L2 hits (a byte requested is a byte of DRAM), no GEMMs.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "kernels/emu/count_ops.h"

namespace loom {

// A GPU's rates as the model takes them.
struct GpuRates {
  std::string name;
  int sms = 0;
  double clock_hz = 0;           // the clock the tensor peak is quoted at
  double dram_bw = 0;            // bytes/s a streaming copy achieves (read + write)
  double mma_flops_clock = 0;    // mma.sync bf16 FLOPs per clock per SM (half of wgmma's 4096)
  double shared_wavefronts = 1;  // shared-memory wavefronts (128 bytes) per clock per SM
  double issue = 4;              // warp instructions per clock per SM (4 schedulers)
  double mufu = 0.5;             // MUFU warp instructions per clock per SM (16 lanes)
};
GpuRates gpu_h200();  // 132 SMs at 1.83 GHz; 4.3 TB/s, the copy the H200 measured
GpuRates gpu_h100();  // H100 SXM: 132 SMs at 1.83 GHz; 3.0 TB/s (90% of 3.35)

// The model's global constants: fitted once, on the earlier kernels' measured H200 times (see
// docs/gpu.md), the same for every kernel and both GPUs.
struct KernelModelConstants {
  double round_trip_s = 0.4e-6;  // a warp's dependent global round trip under load
  // A warp streaming a row of its own (most of a launch's loads start where that warp's last
  // ended): each such request waits this many round trips, not one per batch of loads.
  double walking_trips = 3;
  double walking_share = 0.5;
  double warps_to_hide = 4;  // warps per scheduler that keep the pipes busy; fewer serialize them
  double launch_s = 2e-6;    // a launch's fixed cost on the device
};

// A kernel instantiation's sm_90 figures from ptxas (tests/cuda/ptxas_check.py --table).
struct KernelResources {
  int registers = 0, spill_bytes = 0, static_shared = 0;
};
// "kernel,registers,spill_bytes,static_shared" rows, by the counts' kernel names.
std::map<std::string, KernelResources> ptxas_table_parse(const std::string& csv);
// CTAs an sm_90 SM holds at once: the least of its registers, threads, shared memory (1 KB
// reserved per CTA) and 32 blocks.
int ctas_per_sm(const KernelResources& k, int threads, size_t dynamic_shared);

// One launch's predicted time and its terms, seconds.
struct LaunchTime {
  double total = 0;
  double latency = 0;  // round trips: each resident warp waits one at a time
  double dram = 0;     // bytes over the copy bandwidth, after the latency (t = latency + dram)
  double tail = 0;     // the heaviest block alone: its warp's round trips or its pipes
  double core = 0;     // the busiest pipe, or all pipes in series where too few warps hide them
  double tensor = 0, shared = 0, issue = 0, mufu = 0;  // the pipes
  int warps_per_sm = 0;
  const char* bound = "";  // "memory", "tail" or "core"
};
LaunchTime launch_time(const emu::LaunchCounts& l, int ctas_per_sm, const GpuRates& gpu,
                       const KernelModelConstants& k = {});

// A launch's CTAs per SM from the table; a kernel the table lacks is an error naming it.
int ctas_per_sm(const std::map<std::string, KernelResources>& table, const emu::LaunchCounts& l);

// The launches of one op at a step's count: each launch's time and the op's calls in a step.
struct OpTimes {
  std::string model, op;
  double calls = 0;  // per step: the op's per_step, or `layers` for attention (counted once)
  std::vector<std::pair<const emu::LaunchCounts*, LaunchTime>> launches;
  double seconds() const;  // per step: every launch, times calls
};
// Every op of `model` in `ops` (counts_csv_parse's pairs, or counted ones with their model).
std::vector<OpTimes> op_times(const std::vector<std::pair<std::string, emu::CountedOp>>& ops, const std::string& model,
                              int layers, const std::map<std::string, KernelResources>& table, const GpuRates& gpu,
                              const KernelModelConstants& k = {});
// Seconds per step of each kernel class (kernel_class) of those ops.
std::map<std::string, double> class_seconds(const std::vector<OpTimes>& ops);

// The class of a kernel by its name, as the H200's measurements were grouped: "attention",
// "layernorm", "rmsnorm", "column sums", "crossentropy", "gelu", "swiglu", "adamw", "grad norm",
// "embedding", "rope", "residual add" or "other".
std::string kernel_class(const std::string& kernel);

}  // namespace loom
