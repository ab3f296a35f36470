// `loom plan layout`: every layout loom can run of a model on a cluster (tp within a node,
// pp, dp, ZeRO stage, micro-batch, schedule, recompute, ep for MoE), each predicted by the
// step-time model, those that fit in memory ranked by predicted MFU.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "plan/step_model.h"

namespace loom {

struct LayoutChoice {
  Config cfg;
  StepPrediction pred;
};
struct LayoutSearch {
  std::vector<LayoutChoice> ranked;  // fit in memory, best MFU first
  int tried = 0, too_big = 0;
  // loom's reasons (an error's first clause, its numbers aside) -> how many, and one example
  std::map<std::string, std::pair<int, std::string>> refused;
};
// base's model, global batch and grad-reduce dtype are kept (the dtype and device are the
// cluster's); the layout keys are searched over the whole cluster.
LayoutSearch layouts_rank(const Config& base, const Cluster& cluster);

std::string layout_name(const Config& cfg);  // "tp 8 pp 4 (interleaved v2) dp 2 zero 1 mb 1 rc none"
std::string plan_layout_table(const LayoutSearch& s, const Config& base, const Cluster& cluster, int top);
std::string plan_layout_json(const LayoutSearch& s, int top);
// One layout's prediction, every term (`loom plan layout --predict`).
std::string step_prediction_text(const Config& cfg, const Cluster& cluster, const StepPrediction& p);
// `loom plan pipeline`'s per-stage lines for cfg at p stages, v chunks each, schedule `name`
// and m micro-batches: each stage's model chunks and blocks (parallel.pp_layers, or "auto"'s
// choice), its compute in the step on this machine's cluster file (the step-time model) and
// its memory (the planner); or why they cannot be said (a config that does not validate).
std::string pipeline_stages_text(const Config& cfg, int p, int v, PpSchedule name, int m);
std::string step_prediction_json(const Config& cfg, const StepPrediction& p);

}  // namespace loom
