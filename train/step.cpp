// One training step as the user sees it (Trainer::step): the gradients (grads_compute, with
// the drills around them, in recovery.cpp), the gradient guard, the update, the checkpoint,
// metrics; and validation.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "checkpoint/hf_export.h"
#include "parallel/pipeline_split.h"
#include "runtime/cuda_api.h"
#include "train/trainer_parts.h"

namespace loom {

StepMetrics Trainer::step(int64_t step) {
  Parts& p = *p_;
  FaultInjector& fi = *p.faults;
  const int64_t s1 = step + 1;  // 1-based, as the drills and metrics count
  p.next = s1;
  if (p.trace.enabled()) p.trace.record(p.trace_from <= s1 && s1 <= p.trace_to);
  if (p.profiler && p.profile_from <= s1 && s1 <= p.profile_to) p.profiler->step_begin(&p.trace);
  p.drills_step_begin(s1);
  const CommCounters dp0 = p.dp().counters(), tp0 = p.tp().counters();
  StepMetrics m;
  const bool emulated = p.alloc->device() == DeviceKind::cuda_emulated;
  const uint64_t syncs0 = emulated ? cuda_emulated_host_syncs() : 0;
  StepClock& clock = *p.clock;
  const Clock::time_point wall = Clock::now();  // step_ms: the host's clock, apart from the marks
  clock.begin(Phase::compute);
  bool sdc_unresolved = false;
  p.grads_compute(step, m, syncs0, &sdc_unresolved);
  const AdamWHyper hyper{lr_at(p.cfg.train, step), p.cfg.train.beta1, p.cfg.train.beta2, p.cfg.train.eps,
                         p.cfg.train.weight_decay};
  m.lr = hyper.lr;
  if (p.ckpt) {  // an async save still reading the state it saves: the update waits for it
    StepClock::Scope c(&clock, Phase::ckpt);
    p.ckpt->wait_reads();
  }
  double loss_sum = 0;
  {
    auto s = p.trace.scope("optimizer", Trace::host);
    clock.enter(Phase::optimizer);
    p.reduce_grads();
    if (s1 == 1 && p.cfg.log.grad_norms) p.grad_norms_write();
    loss_sum = p.loss_take();
    // The loss and the norm are reduced over the job: every rank decides the same.
    m.skipped = p.guard.check(loss_sum / double(p.tokens_per_step), p.dpar->grad_norm());
    if (m.skipped.empty() && sdc_unresolved) m.skipped = "silent data corruption (SDC check unresolved)";
    fi.at(s1, "optimizer");
    if (m.skipped.empty()) {
      p.dpar->apply(hyper, s1, p.cfg.train.grad_clip);
    } else {
      p.dpar->discard();
      p.skipped(s1, m.skipped);
    }
  }
  // Not after a rollback: the state is an earlier step's now, not step s1's.
  if (p.ckpt && p.ckpt->due(s1) && p.next == s1) {  // what the step loses to it is ckpt_block_ms
    auto s = p.trace.scope("checkpoint", Trace::host);
    clock.enter(Phase::ckpt);
    p.ckpt->save(s1, *p.dpar);
  }
  const StepTimes t = clock.end();
  if (emulated) m.host_syncs = int64_t(cuda_emulated_host_syncs() - syncs0);
  // A commit between the last step and this one (the manifest, pruning) is this step's loss too.
  const double commit_ms = p.ckpt ? p.ckpt->take_commit_ms() : 0.0;
  m.step_ms = ms_since(wall) + commit_ms;
  m.t_unix = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  m.stragglers = p.stragglers;
  p.last_compute_ms = t.of(Phase::compute);
  m.loss = loss_sum / double(p.tokens_per_step);
  m.grad_norm = p.dpar->grad_norm();
  p.moe_metrics(m);
  if (p.data.train->sources().size() > 1) {
    const std::vector<int64_t> n = step_source_tokens(*p.data.train, p.cfg, step);
    for (size_t j = 0; j < n.size(); ++j) m.source_tokens.push_back({p.data.train->sources()[j].name, n[j]});
  }
  m.compute_ms = t.of(Phase::compute);
  m.comm_exposed_ms = t.of(Phase::comm);
  m.bubble_ms = t.of(Phase::bubble);
  if (p.pipe) {  // the stage that waited most (each stage's own is on its trace track), and each one's compute
    double worst = m.bubble_ms, mine = m.compute_ms;
    ProcessGroup& pp = p.mesh->host_group(Axis::pp);
    pp.all_reduce(Buf(&worst, 1), ReduceOp::max).wait();
    m.bubble_ms = worst;
    m.stage_compute_ms.resize(size_t(pp.size()));
    pp.all_gather(Buf(&mine, 1), Buf(m.stage_compute_ms.data(), pp.size())).wait();
  }
  m.optimizer_ms = t.of(Phase::optimizer);
  m.data_ms = t.of(Phase::data);
  m.ckpt_block_ms = t.of(Phase::ckpt) + commit_ms;
  step_rates(m, step, p.cfg.train.steps, p.tokens_per_step, p.fpt.model, p.fpt.hardware, p.peak);
  m.mem = p.alloc->ledger();
  m.rss_peak_b = rss_peak_bytes();
  auto moved = [](const CommCounters& a, const CommCounters& b, CommOp op) {
    return b.bytes[int(op)] - a.bytes[int(op)];
  };
  const CommCounters &dp1 = p.dp().counters(), &tp1 = p.tp().counters();
  m.dp_all_reduce_b = moved(dp0, dp1, CommOp::all_reduce);
  m.dp_reduce_scatter_b = moved(dp0, dp1, CommOp::reduce_scatter);
  m.dp_all_gather_b = moved(dp0, dp1, CommOp::all_gather);
  m.tp_all_reduce_b = moved(tp0, tp1, CommOp::all_reduce);
  m.tp_reduce_scatter_b = moved(tp0, tp1, CommOp::reduce_scatter);
  m.tp_all_gather_b = moved(tp0, tp1, CommOp::all_gather);
  if (p.profiler) p.profiler->step_end();  // after the step's end synchronized: no wait added
  return m;
}

double Trainer::validate(int64_t batches) {
  Parts& p = *p_;
  // data.val_batches, as many as the data holds: more would read sequences twice.
  if (batches < 0) batches = std::min<int64_t>(p.cfg.data.val_batches, val_batches_available());
  LOOM_CHECK(p.data.val && batches > 0, "no validation data to evaluate on: {}", p.data.describe);
  auto s = p.trace.scope("validation", Trace::host);
  for (int64_t vb = 0; vb < batches; ++vb) {
    if (const int sig = p.stop_agreed()) {  // a stop ends validation too, on every rank at once
      p.result.stopped_by = sig;
      p.loss_take();
      return std::numeric_limits<double>::quiet_NaN();
    }
    if (p.pipe) {  // forward only, through the stages
      const int pp = p.cfg.parallel.pp, s = p.mesh->coord().pp;
      p.pipe->run(
          pipeline_forward_ops(pp, p.cfg.parallel.pp_virtual, s, p.cfg.accum_steps(), p.cfg.pp_v_shape()),
          [&](int micro) { return p.stage(*p.data.val, vb, micro); }, 0.0f);
      continue;
    }
    for (int micro = 0; micro < p.cfg.accum_steps(); ++micro)
      p.chunk->forward(p.stage(*p.data.val, vb, micro), 0.0f, *p.dpar);
  }
  return p.loss_take() / (double(batches) * double(p.tokens_per_step));
}

int64_t Trainer::val_batches_available() const {
  return p_->val_available();
}

const std::string& Trainer::data_describe() const {
  return p_->data.describe;
}

void Trainer::report(const StepMetrics& m) {
  p_->result.steps_done = m.step;
  p_->log->after_step(m, [this] { return validate(); });
}

}  // namespace loom
