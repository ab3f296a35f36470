// A step's micro-batch passes on one stage (its list of ops: the accumulation loop at pp 1,
// the pipeline's table otherwise) with the drills that fire inside them.
#include <spdlog/spdlog.h>

#include "train/trainer_parts.h"

namespace loom {

void Trainer::Parts::micro_batches(int64_t step, bool reduce, bool poison) {
  const float dloss = 1.0f / float(tokens_per_step);  // loss is the mean over the global batch
  const int accum = cfg.accum_steps();
  chunk->zero_grad();
  auto inputs = [&](int micro) {
    auto s = trace.scope("data", Trace::host);
    StepClock::Scope c(clock.get(), Phase::data);
    return stage(*data.train, step, micro);
  };
  if (pipe) {
    faults->at(step + 1, "forward");  // (a pipeline stage's phases interleave: both fire first)
    faults->at(step + 1, "backward");
    pipe->run(pipe_ops, inputs, poison ? std::nanf("") : dloss);
    return;
  }
  Inputs in;
  for (const PipeOp& op : pipe_ops) {
    LOOM_ASSERT(op.kind == PipeOp::F || op.kind == PipeOp::B);
    if (op.kind == PipeOp::F) {
      if (op.micro == 0) faults->at(step + 1, "forward");
      in = inputs(op.micro);
      // fault.nan: this rank's last micro-batch seeds its backward with NaN.
      chunk->forward(in, poison && op.micro + 1 == accum ? std::nanf("") : dloss, *dpar);
    } else {
      if (op.micro == 0) faults->at(step + 1, "backward");
      // Accumulation micro-batches do not communicate; with !reduce none does, and the
      // reductions wait for reduce_grads().
      dpar->set_last(reduce && op.micro + 1 == accum);
      chunk->backward(in, *dpar);
    }
  }
}

}  // namespace loom
