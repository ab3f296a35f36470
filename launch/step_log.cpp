#include <spdlog/spdlog.h>

#include "launch/stop.h"
#include "launch/trainer.h"

namespace loom {

StepLog::StepLog(const Config& cfg, const TrainOptions& opt, bool has_val, TrainResult& result)
    : cfg_(cfg),
      opt_(opt),
      lead_(opt.world_rank == 0),
      print_(lead_ && !opt.quiet),
      has_val_(has_val && cfg.data.val_batches > 0),
      result_(result),
      metrics_(lead_ ? cfg.log.dir : "", opt.world_size) {}

void StepLog::validation(int64_t step, const std::function<double()>& validate) {
  if (!has_val_) return;
  const double v = validate();
  result_.val.push_back({step, v});
  metrics_.validation(step, v);
  if (print_) spdlog::info("step {} | val_loss {:.4f}", step, v);
}

void StepLog::after_step(const StepMetrics& m, const std::function<double()>& validate) {
  metrics_.step(m);
  result_.losses.push_back(m.loss);
  result_.grad_norms.push_back(m.grad_norm);
  if (!m.moe.empty()) result_.aux_losses.push_back(m.aux_loss);
  result_.comm_exposed_ms += m.comm_exposed_ms;
  if (++seen_ > 1) timed_ms_ += m.step_ms;  // this process's first step is a warm-up
  const double elapsed = ms_since(start_) / 1e3;
  if (print_ && (m.step % cfg_.log.every == 0 || m.step == 1 || m.step == m.steps))
    spdlog::info("{}", progress_line(m, elapsed / double(m.step) * double(m.steps - m.step)));
  if (cfg_.data.val_every > 0 && m.step % cfg_.data.val_every == 0 && m.step != m.steps) validation(m.step, validate);
}

void StepLog::finish(const std::function<double()>& validate, int64_t tokens_per_step, double flops_model, double peak,
                     int stopped_by, int64_t steps_done) {
  if (stopped_by) {
    metrics_.stopped(steps_done, stop_signal_name(stopped_by));
    if (print_)
      spdlog::warn("stopped by {} after step {} of {}", stop_signal_name(stopped_by), steps_done, cfg_.train.steps);
  } else {
    validation(cfg_.train.steps, validate);
  }
  metrics_.close();  // flushed and fsynced; a failed write is an error, not a lost file
  if (seen_ > 1) {
    result_.tokens_per_s = double(tokens_per_step) * double(seen_ - 1) / (timed_ms_ / 1e3);
    result_.mfu = peak > 0 ? result_.tokens_per_s * flops_model / peak : 0.0;
  }
}

}  // namespace loom
