// `loom plan pipeline | memory | layout`: predictions made before anything runs.
#include <memory>

#include "launch/command.h"
#include "parallel/pipeline_schedule.h"
#include "plan/layout_search.h"
#include "plan/memory.h"
#include "runtime/error.h"
#if LOOM_HAVE_CUDA
#include "runtime/comm/nccl_group.h"
#endif

namespace loom {

namespace {
// The largest pipeline plan pipeline simulates, a few seconds' work: stages (and chunks per
// stage), micro-batches, the chunk micro-batches it times and draws, and those times the stages
// (each stage's plan looks at the others).
constexpr int kPipeStagesMax = 256, kPipeMicroMax = 65536;
constexpr int64_t kPipeOpsMax = int64_t(1) << 17, kPipeWorkMax = int64_t(1) << 21;

struct PlanArgs {
  ConfigArgs pipe_config, mem_config, layout_config;
  std::string mem_cluster;
  int pipe_pp = 0, pipe_virtual = 0, pipe_micro = 0;
  std::string pipe_schedule;
  double params = 0;
  int dp = 0;
  std::string precision = "mixed";
  bool mem_json = false, layout_json = false;
  std::string cluster;
  int top = 10;
  bool predict = false;
};

int plan_pipeline(const PlanArgs& a) {
  // The config's keys, read without the checks that refuse pipeline keys in training.
  Config cfg = config_defaults();
  if (!a.pipe_config.path.empty()) config_load_file(cfg, a.pipe_config.path);
  for (auto& s : a.pipe_config.sets) config_set(cfg, s);
  const int p = a.pipe_pp > 0 ? a.pipe_pp : cfg.parallel.pp;
  // --schedule is parallel.pp_schedule's value, and read as that key is.
  if (!a.pipe_schedule.empty()) config_set(cfg, "parallel.pp_schedule=" + a.pipe_schedule);
  const PpSchedule name = cfg.parallel.pp_schedule;
  const int v = a.pipe_virtual > 0 ? a.pipe_virtual : pipeline_v_shape(name) ? 2 : cfg.parallel.pp_virtual;
  const int dp = std::max(1, cfg.parallel.dp);
  LOOM_CHECK(a.pipe_micro > 0 || cfg.train.micro_batch >= 1, "train.micro_batch = {} must be at least 1",
             cfg.train.micro_batch);
  const int m = a.pipe_micro > 0 ? a.pipe_micro : cfg.train.global_batch / (cfg.train.micro_batch * dp);
  LOOM_CHECK(m >= 1, "no micro-batches: train.global_batch {} < train.micro_batch {} x parallel.dp {}",
             cfg.train.global_batch, cfg.train.micro_batch, dp);
  // Checked before anything is simulated: each model chunk holds at least one block.
  const char* pp_from = a.pipe_pp > 0 ? "--pp" : "parallel.pp";
  const char* v_from = a.pipe_virtual > 0 ? "--virtual" : "parallel.pp_virtual";
  LOOM_CHECK(p >= 1 && p <= kPipeStagesMax, "{} = {} must be from 1 to {}", pp_from, p, kPipeStagesMax);
  LOOM_CHECK(v >= 1 && v <= kPipeStagesMax, "{} = {} must be from 1 to {}", v_from, v, kPipeStagesMax);
  LOOM_CHECK(int64_t(p) * v <= cfg.model.n_layer,
             "{} {} stages x {} {} chunks each = {} model chunks, more than the model's {} blocks (model.n_layer): "
             "each chunk holds at least one; lower {} or {}, or plan a deeper model (--set model.n_layer=N)",
             pp_from, p, v_from, v, int64_t(p) * v, cfg.model.n_layer, pp_from, v_from);
  const int64_t ops = int64_t(p) * v * m;
  LOOM_CHECK(m <= kPipeMicroMax && ops <= kPipeOpsMax && ops * p <= kPipeWorkMax,
             "{} micro-batches{} over {} stages x {} chunks is more than loom plan pipeline simulates in a few "
             "seconds (at most {} micro-batches, {} chunk micro-batches, and {} times the stages); lower {} or the "
             "stages (--pp)",
             m, a.pipe_micro > 0 ? "" : " (train.global_batch / (train.micro_batch x parallel.dp))", p, v,
             kPipeMicroMax, kPipeOpsMax, kPipeWorkMax,
             a.pipe_micro > 0 ? "--micro" : "train.global_batch (or give --micro)");
  const PipeSchedule sched = pipeline_schedule(name, p, v, m);
  // Unit costs: F 1 and B 2 (a split B 1 and W 1), as a backward costs about two forwards.
  const PipeTiming t = pipeline_check(sched, 1, 1, 1);
  fmt::print(
      "pipeline {}: {} x {}, {}; checked (every send has its receive, no "
      "deadlock)\npredicted bubble {:.3f} ({}); simulated: worst stage {:.3f}, mean {:.3f}\n{}",
      name, plural(p, "stage"), plural(v, "chunk"), plural(m, "micro-batch"), pipeline_bubble_predicted(sched),
      pipeline_bubble_formula(sched), t.bubble(), t.bubble_mean(), pipeline_timeline(sched, t));
  fmt::print("{}", pipeline_stages_text(cfg, p, v, name, m));
  return 0;
}

// What a memory plan assumed, in its first line: device, dtype, every axis of the layout, the
// micro-batch and the global batch, so that a user knows which run was planned.
std::string plan_memory_assumed(const Config& cfg, DeviceKind device, DType dtype) {
  const ParallelConfig& p = cfg.parallel;
  return fmt::format(
      "planned for {} ({}), dp {} x tp {} x pp {} x cp {} x ep {} ({}): micro-batch {} of {} tokens, global batch {} "
      "({} a step on each dp rank), recompute {}",
      device_name(device), dtype_name(dtype), p.dp, p.tp, p.pp, p.cp, p.ep, plural(cfg.world(), "rank"),
      plural(cfg.train.micro_batch, "sequence"), cfg.model.seq_len, plural(cfg.train.global_batch, "sequence"),
      plural(cfg.accum_steps(), "micro-batch"), cfg.train.recompute);
}

int plan_memory(const PlanArgs& a) {
  if (a.params > 0) {
    LOOM_CHECK(a.dp > 0, "loom plan memory --params needs --dp");
    const bool mixed = a.precision == "mixed";
    auto gb = plan_zero_paper(a.params, a.dp, mixed ? 2 : 4, mixed ? 2 : 4, mixed ? 12 : 8);
    fmt::print("{:.3g} parameters, dp {}, {} precision (K = {}): GB per rank\n", a.params, a.dp, a.precision,
               mixed ? 12 : 8);
    for (int s = 0; s < 4; ++s) fmt::print("zero {}: {:>10.1f}\n", s, gb[size_t(s)] / 1e9);
    return 0;
  }
  std::vector<std::string> sets = a.mem_config.sets;
  std::string assumed;
  if (a.dp > 0) {
    sets.push_back(fmt::format("parallel.dp={}", a.dp));
    // --dp keeps the config's micro-batches per rank: its global batch grows with the ranks
    // (a batch sized for one GPU would not divide over 8), unless --set names one.
    Config raw = config_defaults();
    if (!a.mem_config.path.empty()) config_load_file(raw, a.mem_config.path);
    bool batch_given = false;
    for (auto& s : a.mem_config.sets) {
      config_set(raw, s);
      batch_given |= s.rfind("train.global_batch=", 0) == 0;
    }
    const int micro = std::max(1, raw.train.micro_batch),
              accum = std::max(1, raw.train.global_batch / (micro * std::max(1, raw.parallel.dp)));
    const int64_t batch = int64_t(accum) * micro * a.dp;
    if (!batch_given && batch != raw.train.global_batch && batch <= (int64_t(1) << 30)) {
      sets.push_back(fmt::format("train.global_batch={}", batch));
      assumed = fmt::format(
          "global batch scaled with --dp: the config's {} of {} a step on each rank of --dp {} (--set "
          "train.global_batch=N plans another)\n",
          plural(accum, "micro-batch"), micro, a.dp);
    }
  }
  Config cfg = config_build(a.mem_config.path, sets);
#if LOOM_HAVE_CUDA
  const int gpus = cuda_device_count();
#else
  const int gpus = 0;
#endif
  // The device planned for, and why: a plan for a CPU where GPUs were meant must say so.
  DeviceKind device = DeviceKind::cpu;
  std::string why;
  Cluster cluster;
  if (!a.mem_cluster.empty()) {
    cluster = cluster_load(a.mem_cluster);
    device = cluster.device;
    if (!cfg.set_keys.count("train.dtype")) cfg.train.dtype = dtype_choice(cluster.dtype);
    why = fmt::format("the device of cluster {} (--cluster)", cluster.name);
  } else if (cfg.train.device != DeviceChoice::automatic) {
    device = device_resolve(cfg, gpus, nullptr);
    why = "train.device";
  } else {
    std::string no_gpu;
    device = device_resolve(cfg, gpus, &no_gpu);
    why = device == DeviceKind::cpu ? fmt::format(
                                          "train.device = auto on this machine: {}; --cluster FILE or --set "
                                          "train.device=cuda plans for GPUs",
                                          no_gpu.empty() ? "no GPU here" : no_gpu)
                                    : "train.device = auto on this machine";
  }
  const DType dtype = dtype_resolve(cfg, device);
  // The flash backward's stored dS against the cluster's memory_gb, as a run weighs it against
  // the device's free memory (rank 0's plan, the one the table shows).
  std::string ds_note;
  if (cluster.memory_bytes > 0) {
    const MemoryAvailable avail{int64_t(cluster.memory_bytes), fmt::format("memory_gb of {}", a.mem_cluster)};
    const AttentionDsFit f = attention_ds_fit(cfg, device, dtype, 0, nullptr, avail);
    if (!f.fits) cfg.train.attention_ds = false, ds_note = f.note + "\n";
  }
  if (a.mem_json)
    fmt::print("{}\n", plan_memory_json(cfg, device, dtype));
  else
    fmt::print("{}\ndevice: {}\n{}{}\n{}{}", plan_memory_assumed(cfg, device, dtype), why, assumed,
               plan_memory_table(cfg, device, dtype), attention_ds_line(cfg, device), ds_note);
  return 0;
}

int plan_layout(const PlanArgs& a) {
  const Cluster cluster = cluster_load(a.cluster);
  const Config cfg = config_build(a.layout_config.path, a.layout_config.sets);
  if (a.predict) {
    const StepPrediction p = step_predict(cfg, cluster);
    fmt::print("{}\n", a.layout_json ? step_prediction_json(cfg, p) : step_prediction_text(cfg, cluster, p));
  } else {
    const LayoutSearch s = layouts_rank(cfg, cluster);
    fmt::print("{}\n", a.layout_json ? plan_layout_json(s, a.top) : plan_layout_table(s, cfg, cluster, a.top));
  }
  return 0;
}
}  // namespace

void cmd_plan_add(CLI::App& app, Commands& out) {
  auto a = std::make_shared<PlanArgs>();
  auto* plan = app.add_subcommand("plan", "predict before launch");
  plan->require_subcommand(1);
  auto* pipe = plan->add_subcommand(
      "pipeline", "a pipeline schedule as a per-stage timeline, with its bubble and micro-batches in flight");
  a->pipe_config.add_to(pipe, "TOML config (parallel.pp, pp_schedule, pp_virtual; the micro-batches)");
  pipe->add_option("--pp", a->pipe_pp, "stages (default: parallel.pp)")->check(whole_in(1, kPipeStagesMax));
  pipe->add_option("--schedule", a->pipe_schedule,
                   "gpipe | 1f1b | interleaved | zb | zbv | dualpipev (default: parallel.pp_schedule)");
  pipe->add_option("--virtual", a->pipe_virtual,
                   "chunks per stage, interleaved (default: parallel.pp_virtual; 2 for zbv, dualpipev)")
      ->check(whole_in(1, kPipeStagesMax));
  pipe->add_option("--micro", a->pipe_micro, "micro-batches per step (default: the config's accumulation steps)")
      ->check(whole_in(1, kPipeMicroMax));

  auto* mem =
      plan->add_subcommand("memory", "per-rank bytes of a run (any layout, dtype, device), or of the ZeRO paper");
  mem->add_option("--params", a->params, "parameter count (the ZeRO paper's setting; no config needed)")
      ->check(positive_up_to(1e15));
  mem->add_option("--dp", a->dp, "data-parallel ranks (overrides parallel.dp)")->check(whole_in(1, 1 << 24));
  mem->add_option("--precision", a->precision, "mixed (2+2+12 bytes/param) | fp32 (4+4+8)")
      ->check(CLI::IsMember({"mixed", "fp32"}));
  a->mem_config.add_to(mem, "TOML config of a loom run");
  mem->add_flag("--json", a->mem_json, "every rank's bytes at the config's stage, as JSON (loom runs)");
  mem->add_option("--cluster", a->mem_cluster,
                  "plan for this cluster file's device and dtype (examples/clusters/; default: train.device)");

  auto* layout = plan->add_subcommand(
      "layout", "rank the layouts of a model on a cluster by predicted MFU (the step-time model), or predict one");
  layout->add_option("--cluster", a->cluster, "cluster description (TOML; examples/clusters/)")->required();
  a->layout_config.add_to(layout, "TOML config: the model, global batch and dtypes");
  layout->add_option("--top", a->top, "layouts to print")->check(whole_in(1, 1000000));
  layout->add_flag("--predict", a->predict, "predict the config's own layout (parallel.*, train.*) instead");
  layout->add_flag("--json", a->layout_json, "as JSON");

  out.push_back({pipe, false, [a](const CommandContext&) { return plan_pipeline(*a); }});
  out.push_back({mem, false, [a](const CommandContext&) { return plan_memory(*a); }});
  out.push_back({layout, false, [a](const CommandContext&) { return plan_layout(*a); }});
}

}  // namespace loom
