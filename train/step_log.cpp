#include <spdlog/spdlog.h>

#include <filesystem>

#include "plan/step_model.h"
#include "runtime/error.h"
#include "train/stop.h"
#include "train/trainer.h"

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

void StepLog::predict(const std::string& device, int world) {
  // Said here, after the run's set-up: a refusal before it stays one line.
  if (print_ && !metrics_.path().empty())
    spdlog::info("metrics: {} (log.dir){}", metrics_.path(),
                 tensorboard_ ? "; TensorBoard: tensorboard --logdir " + cfg_.log.dir : "");
  if (!lead_ || cfg_.log.cluster == "none") return;
  std::string path = cfg_.log.cluster;
  if (path == "auto") {
    path = cluster_this_machine_path();
    if (device != "cpu" || !std::filesystem::exists(path)) return;  // no cluster file describes this machine
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
    if (c.train.dtype == "auto") c.train.dtype = dtype_name(cluster.dtype);
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
        "predicted on cluster {} ({}): {:.4g} ms per step (compute {:.4g}, communication {:.4g}, bubble {:.4g}, "
        "optimizer {:.4g}); the end of the run compares; {}",
        cluster_, path, predicted_->step, predicted_->compute, predicted_->comm, predicted_->bubble,
        predicted_->optimizer, rates_);
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
      spdlog::info("predicted (cluster {}) vs measured, mean of {} steps:\n{}\n{}", cluster_, seen_ - 1,
                   split_table(*predicted_, mean),
                   gap.empty() ? "no term is off its prediction by both 1 ms and 10%" : "largest gap: " + gap);
    }
  }
  if (stopped_by) {
    metrics_.stopped(steps_done, stop_signal_name(stopped_by));
    if (print_)
      spdlog::warn("stopped by {} after step {} of {}", stop_signal_name(stopped_by), steps_done, cfg_.train.steps);
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

}  // namespace loom
