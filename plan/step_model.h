// The step-time model behind `loom plan layout`: a layout's step time from the cluster's
// measured or stated rates, without running it. Compute is FLOPs over an achieved GEMM rate
// plus element-wise traffic over memory bandwidth; communication is an alpha-beta model per
// link tier (the ring and tree step counts nccl-tests uses), minus what the schedule
// overlaps; the pipeline bubble comes from timing the schedule's own table; memory is
// `loom plan memory`'s planner; parallel.invariant's tree is priced in plan/step_invariant.h.
// Every term is printed, so a wrong prediction shows which term is wrong.
#pragma once
#include <string>
#include <vector>

#include "runtime/config.h"
#include "runtime/tensor.h"

namespace loom {

// One tier of links: per-message latency, the bandwidth one flow gets and the rate at which a
// rank sums what it receives (bytes/s; 0: free, as where the GPU reduces at memory speed).
struct LinkTier {
  double alpha_s = 0, bw = 0, reduce_bw = 0;
  // Per collective, where its algorithm has its own latency and rate (MPI picks a different
  // algorithm per collective; NCCL's rings move every collective at one bus bandwidth):
  // all_reduce, reduce_scatter, all_gather, all_to_all; a negative alpha and a zero bw: the
  // tier's.
  double op_alpha_s[4] = {-1, -1, -1, -1}, op_bw[4] = {0, 0, 0, 0};
};

// A cluster as the model sees it (a TOML file; examples/clusters/ has this machine's fit and
// an H100 cluster).
struct Cluster {
  std::string name;
  int nodes = 1, devices_per_node = 1;
  int physical_devices = 0;              // compute devices the ranks share (0: nodes x devices_per_node)
  DeviceKind device = DeviceKind::cuda;  // cuda | cpu
  DType dtype = DType::bf16;
  double peak_flops = 0;       // per device: the MFU denominator
  double gemm_efficiency = 0;  // achieved / peak over a model's matmuls
  double mem_bw = 0;           // bytes/s per device: element-wise ops (and the optimizer, unless optimizer_bw)
  // Per-op rates where the file has them (0: absent; a profiled run writes them, `loom bench
  // train --profile --write-cluster`): whole-sequence attention and context parallel's block
  // attention in model FLOPs per second (4 C T per token and layer forward, as MFU counts),
  // and the optimizer's bytes per second.
  double attention_flops = 0, cp_attention_flops = 0, optimizer_bw = 0;
  double memory_bytes = 0;  // per device, usable by loom (0: memory not checked)
  double overlap = 1;       // share of overlappable communication that does hide
  bool tree = false;        // all-reduces may take the tree's log2(n) latency (NCCL)
  LinkTier intra;           // within a node, per flow
  LinkTier inter;           // between nodes: a node's link, shared by its concurrent flows
  std::string fitted_on;    // the machine a fitted file was measured on (machine_name()), or ""
  int devices() const { return nodes * devices_per_node; }
};
// A regular file of at most kConfigMaxBytes; `what` names where its path came from.
Cluster cluster_load(const std::string& path, const std::string& what = "--cluster");
// This source tree's examples/clusters/this_machine.toml (log.cluster = "auto").
std::string cluster_this_machine_path();
// This machine as a fitted cluster file names it (`fitted_on`): "<CPU model>, <N> cores" (the
// cores this process may run on), as examples/scaling/calibrate.py writes it; LOOM_MACHINE_NAME
// where set.
std::string machine_name();
Cluster cluster_parse(const std::string& toml_text, const std::string& origin);

// The rates a prediction on `cluster` assumes, each with where it comes from (the file's key,
// or the fallback the file leaves it to).
struct ClusterRates {
  double matmul = 0, attention = 0, cp_attention = 0, elementwise = 0, optimizer = 0;
  std::string describe;  // one line
};
ClusterRates cluster_rates(const Cluster& cluster);

// One layout's predicted step, seconds; every term is per optimizer step on the slowest stage.
struct StepPrediction {
  double step = 0;
  double compute = 0;       // the stage's own F, B and W work (recompute included)
  double comm_exposed = 0;  // tp, ep, cp, pp hand-offs and the dp/ZeRO part no compute hides
  double bubble = 0;        // the schedule's idle time on the busiest stage
  double optimizer = 0;
  double tp = 0, ep = 0, pp = 0, dp = 0, cp = 0;  // comm_exposed by axis
  double dp_total = 0;                            // the dp/ZeRO traffic before overlap
  double tokens_per_s = 0, mfu = 0;
  int64_t memory_bytes = 0;  // the fullest rank's plan (first and last stage checked)
  bool fits = true;
  std::vector<double> stage_compute;  // per pipeline stage: its own F, B and W work in the step
  // parallel.invariant (all 0 without it): the micro-batch tree's adds, copies and zeroing, a
  // term of the step of its own; the step, the exposed dp and the dp traffic of the same layout
  // without the mode.
  double tree_fold = 0;
  double plain_step = 0, plain_dp = 0, plain_dp_total = 0;
};
// cfg must have passed config_validate; its world (pp x dp x cp x tp) must fit on the cluster.
StepPrediction step_predict(const Config& cfg, const Cluster& cluster);

// Alpha-beta(-gamma) time of one collective of `bytes` (an all-reduce's buffer, a
// reduce-scatter's input, an all-gather's output, an all-to-all's send buffer) over n ranks on
// `link`: steps x alpha + volume / bw + reduced bytes / reduce_bw, with the ring's counts
// (all-reduce 2(n-1) steps and 2(n-1)/n x bytes; the others n-1 and (n-1)/n x bytes).
double collective_time(const char* op, int n, double bytes, const LinkTier& link, bool tree);
// The link a group of n ranks, `stride` apart in rank order, uses on `cluster`: intra when it
// stays in a node (every group of its axis, or the one whose first rank is `first`), else the
// node's link shared among the groups of its axis that cross it.
LinkTier group_link(const Cluster& cluster, int n, int stride, int first = -1);

}  // namespace loom
