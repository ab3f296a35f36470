// One training step, top to bottom (Trainer::step): the gradients of every micro-batch (the
// stage's op list through the pipeline executor, at every pp), their reduction, the update
// guard, the update, the checkpoint and the step's metrics; then the step boundary and
// validation. The drills attach at named points (train/drills.h); what recovers from a bad
// step is train/recovery.cpp; what a step's metrics hold, train/step_log.cpp.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "runtime/cuda_api.h"
#include "runtime/exact_sum.h"
#include "train/trainer_parts.h"

namespace loom {

StepMetrics Trainer::step(int64_t step) {
  Parts& p = *p_;
  const int64_t s1 = step + 1;  // 1-based, as the drills and metrics count
  p.next = s1;
  const Parts::StepStart start = p.step_start(s1);
  StepMetrics m;

  // 1. The gradients: every micro-batch forward and backward from zeroed gradients; the last
  //    backward of each piece starts the data-parallel reductions. fault.sdc_every computes
  //    them again and compares (recovery.cpp).
  p.drills->at(StepPoint::begin, s1);
  p.drills->at(StepPoint::gradients, s1);
  const float dloss = p.drills->dloss(s1, 1.0f / float(p.tokens_per_step));  // the loss is the global batch's mean
  bool sdc_unresolved = false;
  if (p.cfg.fault.sdc_every > 0 && s1 % p.cfg.fault.sdc_every == 0) {
    m.sdc_ranks = p.sdc_check(step, dloss, &sdc_unresolved);
  } else {
    p.micro_batches(step, dloss, /*reduce=*/true);
    p.drills->at(StepPoint::gradients_done, s1);
    if (start.emulated) m.host_syncs_compute = int64_t(cuda_emulated_host_syncs() - start.host_syncs);
  }

  // 2. The reductions, the guard and the update (or a skip, and past fault.max_skips in a row
  //    a rollback). An async save still reading the state it saves holds the update back.
  StepClock& clock = *p.clock;
  if (p.ckpt) {
    StepClock::Scope c(&clock, Phase::ckpt);
    p.ckpt->wait_reads();
  }
  const AdamWHyper hyper{lr_at(p.cfg.train, step), p.cfg.train.beta1, p.cfg.train.beta2, p.cfg.train.eps,
                         p.cfg.train.weight_decay};
  m.lr = hyper.lr;
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
    p.drills->at(StepPoint::optimizer, s1);
    if (m.skipped.empty()) {
      p.dpar->apply(hyper, s1, p.cfg.train.grad_clip);
    } else {
      p.dpar->discard();
      p.skipped(s1, m.skipped);
    }
  }

  // 3. The checkpoint; not after a rollback (the state is an earlier step's now). What the
  //    step loses to it is ckpt_block_ms.
  if (p.ckpt && p.ckpt->due(s1) && p.next == s1) {
    auto s = p.trace.scope("checkpoint", Trace::host);
    clock.enter(Phase::ckpt);
    p.ckpt->save(s1, *p.dpar);
  }

  // 4. The step's metrics (step_log.cpp).
  p.metrics_fill(m, step, start, loss_sum);
  return m;
}

Trainer::Parts::StepStart Trainer::Parts::step_start(int64_t s1) {
  if (trace.enabled()) trace.record(trace_from <= s1 && s1 <= trace_to);
  if (profiler && profile_from <= s1 && s1 <= profile_to) profiler->step_begin(&trace);
  StepStart s;
  s.dp = dp().counters();
  s.tp = tp().counters();
  s.emulated = alloc->device() == DeviceKind::cuda_emulated;
  s.host_syncs = s.emulated ? cuda_emulated_host_syncs() : 0;
  s.device_ops = s.emulated ? cuda_emulated_device_ops() : 0;
  s.graph_launches = s.emulated ? cuda_emulated_graph_launches() : 0;
  s.wall = Clock::now();  // step_ms: the host's clock, apart from the marks
  clock->begin(Phase::compute);
  return s;
}

void Trainer::Parts::micro_batches(int64_t step, float dloss, bool reduce) {
  chunk->zero_grad();
  const int64_t s1 = step + 1;
  // A backward right after its forward (the accumulation loop at pp 1) reads the inputs staged
  // for that forward: staged again, they would take another of the backend's upload slots.
  int staged = -1;
  Inputs last;
  auto inputs = [&](int micro) {
    if (micro == staged) return last;
    auto s = trace.scope("data", Trace::host);
    StepClock::Scope c(clock.get(), Phase::data);
    staged = micro;
    return last = stage(*data.train, step, micro);
  };
  pipe->run(pipe_ops, inputs, dloss, reduce,
            [&](const PipeOp& op) { drills->at(op.kind == PipeOp::F ? StepPoint::forward : StepPoint::backward, s1); });
}

Inputs Trainer::Parts::stage(const Sequences& s, int64_t step, int micro) {
  batch_read(s, cfg, step, mesh->coord().dp, micro, inputs.data(), targets.data());
  if (cfg.data.doc_mask) {  // over whole sequences, before context parallel takes its chunks
    positions.resize(inputs.size());
    doc_positions(inputs.data(), cfg.model.seq_len, int(inputs.size()) / cfg.model.seq_len, cfg.doc_token(),
                  positions.data());
  }
  if (const ContextParallel* cp = chunk->context_parallel()) {  // this rank's 2 chunks of each sequence
    const int B = cfg.train.micro_batch;
    cp_inputs.resize(inputs.size() / size_t(cfg.parallel.cp));
    cp_targets.resize(cp_inputs.size());
    cp_select(cp_inputs.data(), inputs.data(), B, cfg.model.seq_len, cfg.parallel.cp, mesh->coord().cp);
    cp_select(cp_targets.data(), targets.data(), B, cfg.model.seq_len, cfg.parallel.cp, mesh->coord().cp);
    // Positions in the documents with data.doc_mask (the block kernels take the sequence's
    // from cp_positions), else in the sequence.
    if (cfg.data.doc_mask) {
      cp_positions_doc.resize(cp_inputs.size());
      cp_select(cp_positions_doc.data(), positions.data(), B, cfg.model.seq_len, cfg.parallel.cp, mesh->coord().cp);
    }
    return backend->stage_inputs(cp_inputs.data(), cp_targets.data(),
                                 cfg.data.doc_mask ? cp_positions_doc.data() : cp->token_positions().data(),
                                 int(cp_inputs.size()), cfg.model.seq_len, chunk->vocab_lo(), chunk->vocab_rows());
  }
  return backend->stage_inputs(inputs.data(), targets.data(), cfg.data.doc_mask ? positions.data() : nullptr,
                               int(inputs.size()), cfg.model.seq_len, chunk->vocab_lo(), chunk->vocab_rows());
}

void Trainer::Parts::reduce_grads() {
  // Over dp (DDP or ZeRO); with pipeline stages, the tied embedding's two copies summed over the
  // first and last stage (after dp: the whole tensor under DDP, each rank's shard under ZeRO),
  // and the squared norm over all stages, so that clipping and the guard see the whole model's.
  const Stream& st = backend->stream();
  const bool stages = cfg.parallel.pp > 1;
  std::function<void(Buf)> tied;
  if (stages && cfg.pp_tied_across() && (chunk->has_embedding() || chunk->holds_tied_copy())) {
    tied = [this, &st](Buf g) {
      StepClock::Scope c(clock.get(), Phase::comm);
      mesh->group(Axis::embed).all_reduce(g, ReduceOp::sum, st).wait_on(st);
    };
  }
  dpar->reduce_grads(tied);
  if (stages) {
    StepClock::Scope c(clock.get(), Phase::comm);
    pp().all_reduce(Buf(dpar->grad_sum_squares()), ReduceOp::sum, st).wait_on(st);
  }
}

double Trainer::Parts::loss_take() {
  // The chunk's loss sum over dp x cp, and from the last stage to every stage (the others
  // hold 0), read on the host and reset.
  Tensor& sum = chunk->loss_sum();
  if (dp().size() > 1) {
    StepClock::Scope c(clock.get(), Phase::comm);
    dp().all_reduce(Buf(sum), ReduceOp::sum, backend->stream()).wait_on(backend->stream());
  }
  if (cfg.parallel.pp > 1) {
    StepClock::Scope c(clock.get(), Phase::comm);
    pp().all_reduce(Buf(sum), ReduceOp::sum, backend->stream()).wait_on(backend->stream());
  }
  // Exact digits: their sum over ranks is exact in any order, and rounds once, here.
  std::array<double, kExactDigits> digits{};
  backend->download(digits.data(), Buf(sum));
  backend->zero(Buf(sum));
  return ExactSum::value_of(digits.data());
}

bool Trainer::between_steps() {
  Parts& p = *p_;
  // One gather a step: stop signals and checkpoint write states (the job acts on the worst),
  // and each rank's compute time (the straggler watch, recovery.cpp).
  ProcessGroup& world = p.mesh->world_group();
  const int n = world.size(), me = world.rank();
  std::vector<double> all(size_t(3 * n), 0.0);
  all[size_t(3 * me)] = stop_signal();
  all[size_t(3 * me + 1)] = p.ckpt ? p.ckpt->write_state() : 0;
  all[size_t(3 * me + 2)] = p.last_compute_ms;
  if (n > 1) world.all_gather(Buf(&all[size_t(3 * me)], 3), Buf(all.data(), int64_t(all.size()))).wait();
  int32_t sig = 0, write_state = 0;
  std::vector<double> compute(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    sig = std::max(sig, int32_t(all[size_t(3 * r)]));
    write_state = std::max(write_state, int32_t(all[size_t(3 * r + 1)]));
    compute[size_t(r)] = all[size_t(3 * r + 2)];
  }
  if (p.ckpt) p.ckpt->settle(write_state);
  p.stragglers_watch(compute);
  if (sig) p.result.stopped_by = sig;
  return sig != 0;
}

int Trainer::Parts::stop_agreed() {
  double sig = stop_signal();
  ProcessGroup& world = mesh->world_group();
  if (world.size() > 1) world.all_reduce(Buf(&sig, 1), ReduceOp::max).wait();
  return int(sig);
}

int64_t Trainer::next_step() const {
  return p_->next;
}

double Trainer::validate(int64_t batches) {
  Parts& p = *p_;
  // data.val_batches, as many as the data holds: more would read sequences twice.
  if (batches < 0) batches = std::min<int64_t>(p.cfg.data.val_batches, val_batches_available());
  LOOM_CHECK(p.data.val && batches > 0, "no validation data to evaluate on: {}", p.data.describe);
  auto s = p.trace.scope("validation", Trace::host);
  for (int64_t vb = 0; vb < batches; ++vb) {  // forward only, through the stages
    if (const int sig = p.stop_agreed()) {    // a stop ends validation too, on every rank at once
      p.result.stopped_by = sig;
      p.loss_take();
      return std::numeric_limits<double>::quiet_NaN();
    }
    p.pipe->run(
        p.pipe_val_ops, [&](int micro) { return p.stage(*p.data.val, vb, micro); }, 0.0f, false);
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
