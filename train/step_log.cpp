#include <spdlog/spdlog.h>

#include <filesystem>

#include "kernels/moe_row.h"
#include "plan/step_model.h"
#include "runtime/cuda_api.h"
#include "runtime/error.h"
#include "train/stop.h"
#include "train/trainer_parts.h"

namespace loom {

StepLog::StepLog(const Config& cfg, const TrainOptions& opt, bool has_val, TrainResult& result)
    : cfg_(cfg),
      opt_(opt),
      lead_(opt.world_rank == 0),
      print_(lead_ && !opt.quiet),
      has_val_(has_val && cfg.data.val_batches > 0),
      result_(result),
      metrics_(lead_ ? cfg.log.dir : "", opt.world_size) {
  // After the log.dir lock: a second run is refused before it makes a file.
  if (lead_ && cfg.log.tensorboard) tensorboard_ = std::make_unique<TensorBoardWriter>(cfg.log.dir);
}

std::string cluster_this_machine_path() {
  return std::string(LOOM_SOURCE_DIR) + "/examples/clusters/this_machine.toml";
}

void StepLog::predict(DeviceKind device, int world) {
  // Said here, after the run's set-up: a refusal before it stays one line.
  if (print_ && !metrics_.path().empty())
    spdlog::info("metrics: {} ({}){}", metrics_.path(), opt_.log_note.empty() ? "log.dir" : opt_.log_note,
                 tensorboard_ ? "; TensorBoard: tensorboard --logdir " + cfg_.log.dir : "");
  if (!lead_ || cfg_.log.cluster == "none") return;
  std::string path = cfg_.log.cluster;
  if (path == "auto") {
    path = cluster_this_machine_path();
    if (device != DeviceKind::cpu || !std::filesystem::exists(path)) return;  // no cluster file describes this machine
  }
  try {
    const Cluster cluster = cluster_load(path, "log.cluster");
    // The file loom ships describes the machine it was fitted on: compared elsewhere, its
    // gaps would measure the machines' difference, not the model's.
    if (cfg_.log.cluster == "auto" && cluster.fitted_on != machine_name()) {
      if (print_ && opt_.verbose)
        spdlog::info(
            "no step-time prediction: {} was fitted on '{}', this is '{}' (name a cluster file with "
            "log.cluster to compare)",
            path, cluster.fitted_on, machine_name());
      return;
    }
    Config c = cfg_;
    if (c.train.dtype == DTypeChoice::automatic) c.train.dtype = dtype_choice(cluster.dtype);
    LOOM_CHECK(world <= cluster.devices(), "the run's {} ranks are more than its {} devices", world, cluster.devices());
    const StepPrediction p = step_predict(c, cluster);
    predicted_ = StepSplit{1e3 * p.step, 1e3 * p.compute, 1e3 * p.comm_exposed, 1e3 * p.bubble, 1e3 * p.optimizer};
    cluster_ = cluster.name;
    rates_ = cluster_rates(cluster).describe;
  } catch (const Error& e) {
    // A prediction is a reading aid: a cluster file that does not describe this run is said,
    // and the run goes on (only rank 0 predicts: an error here would leave the others waiting).
    if (print_ && opt_.verbose && cfg_.log.cluster == "auto")
      spdlog::info("no step-time prediction from {}: {}", path, e.what());
    if (print_ && cfg_.log.cluster != "auto") spdlog::warn("no step-time prediction from log.cluster: {}", e.what());
    return;
  }
  if (print_ && opt_.verbose)
    spdlog::info(
        "predicted on cluster {} ({}): {} ms per step (compute {}, communication {}, bubble {}, optimizer {}); the "
        "end of the run compares; {}",
        cluster_, path, ms_text(predicted_->step), ms_text(predicted_->compute), ms_text(predicted_->comm),
        ms_text(predicted_->bubble), ms_text(predicted_->optimizer), rates_);
}

void StepLog::validation(int64_t step, const std::function<double()>& validate) {
  if (!has_val_) return;
  const double v = validate();
  if (result_.stopped_by) return;  // a stop cut it short: no partial value is recorded
  result_.val.push_back({step, v});
  metrics_.validation(step, v);
  if (tensorboard_) tensorboard_->validation(step, v);
  if (print_) spdlog::info("step {} | val_loss {:.4f}", step, v);
}

void StepLog::after_step(const StepMetrics& m, const std::function<double()>& validate) {
  metrics_.step(m);
  if (tensorboard_) tensorboard_->step(m);
  result_.losses.push_back(m.loss);
  result_.grad_norms.push_back(m.grad_norm);
  if (!m.moe.empty()) result_.aux_losses.push_back(m.aux_loss);
  result_.comm_exposed_ms += m.comm_exposed_ms;
  if (++seen_ > 1) {  // this process's first step is a warm-up
    timed_ms_ += m.step_ms;
    measured_.step += m.step_ms, measured_.compute += m.compute_ms, measured_.comm += m.comm_exposed_ms;
    measured_.bubble += m.bubble_ms, measured_.optimizer += m.optimizer_ms, measured_.data += m.data_ms;
    measured_.ckpt += m.ckpt_block_ms;
  }
  const double elapsed = ms_since(start_) / 1e3;
  if (print_ && (m.step % cfg_.log.every == 0 || m.step == 1 || m.step == m.steps))
    spdlog::info("{}", progress_line(m, eta_seconds(elapsed, seen_, m.steps - m.step)));
  if (cfg_.data.val_every > 0 && m.step % cfg_.data.val_every == 0 && m.step != m.steps) validation(m.step, validate);
}

void StepLog::finish(const std::function<double()>& validate, int64_t tokens_per_step, double flops_model, double peak,
                     int stopped_by, int64_t steps_done) {
  // The last validation, then the split; a stopped run's stop record stays its last line.
  if (!stopped_by) validation(cfg_.train.steps, validate);
  if (!stopped_by) stopped_by = result_.stopped_by;  // a stop that cut the last validation short
  if (predicted_ && seen_ > 1) {
    StepSplit mean = measured_;
    for (double* v : {&mean.step, &mean.compute, &mean.comm, &mean.bubble, &mean.optimizer, &mean.data, &mean.ckpt})
      *v /= double(seen_ - 1);
    metrics_.split(*predicted_, mean, cluster_);
    if (print_) {
      const std::string gap = split_gap(*predicted_, mean);
      spdlog::info("predicted (cluster {}) vs measured, mean of {}:\n{}\n{}", cluster_, plural(seen_ - 1, "step"),
                   split_table(*predicted_, mean),
                   gap.empty() ? "no term is off its prediction by both 1 ms and 10%" : "largest gap: " + gap);
    }
  }
  if (stopped_by) {
    metrics_.stopped(steps_done, stop_signal_name(stopped_by));
    if (print_) spdlog::warn("stopped by {} after step {} of {}", stop_cause(stopped_by), steps_done, cfg_.train.steps);
  }
  metrics_.close();  // flushed and fsynced; a failed write is an error, not a lost file
  result_.seconds = ms_since(start_) / 1e3;
  if (seen_ > 1) {
    result_.tokens_per_s = double(tokens_per_step) * double(seen_ - 1) / (timed_ms_ / 1e3);
    result_.mfu = peak > 0 ? result_.tokens_per_s * flops_model / peak : 0.0;
    if (print_ && result_.mfu > 1.0)
      spdlog::warn(
          "MFU {:.0f}%: this run did more than the peak it divides by, so that peak was measured low (on a "
          "busy machine?); `loom bench gemm` on a quiet machine measures it again",
          100 * result_.mfu);
  }
}

// A step's metrics, all assembled here once the step has ended: its time split, the loss and the
// norm, MoE statistics, each source's tokens, rates, memory and the bytes each group moved.
void Trainer::Parts::metrics_fill(StepMetrics& m, int64_t step, const StepStart& start, double loss_sum) {
  const StepTimes t = clock->end();
  if (start.emulated) {
    m.host_syncs = int64_t(cuda_emulated_host_syncs() - start.host_syncs);
    m.device_ops = int64_t(cuda_emulated_device_ops() - start.device_ops);
    m.graph_launches = int64_t(cuda_emulated_graph_launches() - start.graph_launches);
  }
  // A commit between the last step and this one (the manifest, pruning) is this step's loss too.
  const double commit_ms = ckpt ? ckpt->take_commit_ms() : 0.0;
  m.step_ms = ms_since(start.wall) + commit_ms;
  m.t_unix = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  m.stragglers = stragglers;
  last_compute_ms = t.of(Phase::compute);
  m.loss = loss_sum / double(tokens_per_step);
  m.grad_norm = dpar->grad_norm();
  moe_metrics(m);
  if (data.train->sources().size() > 1) {
    const std::vector<int64_t> n = step_source_tokens(*data.train, cfg, step);
    for (size_t j = 0; j < n.size(); ++j) m.source_tokens.push_back({data.train->sources()[j].name, n[j]});
  }
  m.compute_ms = t.of(Phase::compute);
  m.comm_exposed_ms = t.of(Phase::comm);
  m.bubble_ms = t.of(Phase::bubble);
  if (cfg.parallel.pp >
      1) {  // the stage that waited most (each stage's own is on its trace track), and each one's compute
    double worst = m.bubble_ms, mine = m.compute_ms;
    ProcessGroup& stages = mesh->host_group(Axis::pp);
    stages.all_reduce(Buf(&worst, 1), ReduceOp::max).wait();
    m.bubble_ms = worst;
    m.stage_compute_ms.resize(size_t(stages.size()));
    stages.all_gather(Buf(&mine, 1), Buf(m.stage_compute_ms.data(), stages.size())).wait();
  }
  m.optimizer_ms = t.of(Phase::optimizer);
  m.data_ms = t.of(Phase::data);
  m.ckpt_block_ms = t.of(Phase::ckpt) + commit_ms;
  step_rates(m, step, cfg.train.steps, tokens_per_step, fpt.model, fpt.hardware, peak);
  m.mem = alloc->ledger();
  m.rss_peak_b = rss_peak_bytes();
  auto moved = [](const CommCounters& a, const CommCounters& b, CommOp op) {
    return b.bytes[int(op)] - a.bytes[int(op)];
  };
  const CommCounters &dp1 = dp().counters(), &tp1 = tp().counters();
  m.dp_all_reduce_b = moved(start.dp, dp1, CommOp::all_reduce);
  m.dp_reduce_scatter_b = moved(start.dp, dp1, CommOp::reduce_scatter);
  m.dp_all_gather_b = moved(start.dp, dp1, CommOp::all_gather);
  m.dp_send_b = moved(start.dp, dp1, CommOp::send);
  m.tp_all_reduce_b = moved(start.tp, tp1, CommOp::all_reduce);
  m.tp_reduce_scatter_b = moved(start.tp, tp1, CommOp::reduce_scatter);
  m.tp_all_gather_b = moved(start.tp, tp1, CommOp::all_gather);
  if (profiler && profiler->recording() && m.device_ops >= 0) profiler->add_launches(m.device_ops);
  if (profiler) profiler->step_end();  // after the step's end synchronized: no wait added
}

void Trainer::Parts::moe_metrics(StepMetrics& m) {
  // Summed over dp and the pipeline's stages (each layer lives on one): integers, so exact in
  // any order (kernels/moe_row.h). The loss averaged over the micro-batches, the load and the
  // dropped fraction over the step's assignments.
  std::vector<double> st = chunk->moe_stats_take();
  if (st.empty()) return;
  mesh->host_group(dp_axis()).all_reduce(Buf(st.data(), int64_t(st.size())), ReduceOp::sum).wait();
  if (cfg.parallel.pp > 1)
    mesh->host_group(Axis::pp).all_reduce(Buf(st.data(), int64_t(st.size())), ReduceOp::sum).wait();
  m.aux_loss = 0;
  const size_t layers = st.size() / moe_row::kStats;
  for (size_t i = 0; i < layers; ++i) {
    const double *v = st.data() + moe_row::kStats * i, n = std::max(v[4], 1.0), a = std::max(v[3], 1.0);
    m.aux_loss += v[0] / moe_row::kAuxUnit / n / double(layers);
    m.moe.push_back({int((i + 1) * cfg.model.moe.every - 1), v[1] / a, v[2] / a});
  }
}

}  // namespace loom
