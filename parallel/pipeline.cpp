#include "parallel/pipeline.h"

#include <chrono>

#include "runtime/error.h"
#include "runtime/trace.h"

namespace loom {

PipelineStage::PipelineStage(Chunk& chunk, DataParallel& dp, ProcessGroup& pp, int micro_batches, StepClock* clock,
                             Trace& trace)
    : chunk_(chunk), dp_(dp), pp_(pp), clock_(clock), trace_(trace), micro_(micro_batches) {
  const Config& cfg = chunk.config();
  const int tp = cfg.parallel.tp;
  const int64_t N = int64_t(cfg.train.micro_batch) * cfg.model.seq_len;
  rows_ = (cfg.parallel.sp && tp > 1 ? N / tp : N) * cfg.model.d_model;
  if (pp.size() == 1) return;
  Allocator& a = chunk.backend().alloc();
  const DType dt = chunk.backend().dtype();
  const int64_t n = rows_ * micro_batches;
  if (!chunk.has_embedding()) recv_act_ = a.empty({n}, dt, Mem::comm), send_grad_ = a.empty({n}, dt, Mem::comm);
  if (!chunk.has_head()) send_act_ = a.empty({n}, dt, Mem::comm), recv_grad_ = a.empty({n}, dt, Mem::comm);
}

PipelineStage::~PipelineStage() = default;

Buf PipelineStage::act_buf(Tensor& t, int micro) const {
  return Buf(t).slice(rows_ * micro, rows_);
}

void PipelineStage::run(const std::vector<PipeOp>& ops, const std::function<Inputs(int)>& inputs, float dloss) {
  Backend& be = chunk_.backend();
  const Stream& s = be.stream();
  const int slots = chunk_.slots();
  const DType dt = be.dtype();
  const DeviceKind dev = be.device();
  auto view = [&](Ptr p) { return Buf(p.p, rows_, dt, dev); };
  // Every receive of the step, posted now; their tags say what and which micro-batch.
  std::vector<Work> act_in(static_cast<size_t>(micro_)), grad_in(static_cast<size_t>(micro_));
  std::vector<Work> sends;
  auto tag = [](int micro, bool grad) { return micro * 2 + (grad ? 1 : 0); };
  for (const PipeOp& op : ops) {
    if (op.kind == PipeOp::recv_act)
      act_in[size_t(op.micro)] = pp_.recv(act_buf(recv_act_, op.micro), op.peer, tag(op.micro, false), s);
    if (op.kind == PipeOp::recv_grad)
      grad_in[size_t(op.micro)] = pp_.recv(act_buf(recv_grad_, op.micro), op.peer, tag(op.micro, true), s);
  }
  // The op that finishes the stage's gradients: the last W of a split backward, else the last B.
  bool split = false;
  for (const PipeOp& op : ops) split = split || op.kind == PipeOp::W;
  const PipeOp::Kind finishing = split ? PipeOp::W : PipeOp::B;
  int last = -1;
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].kind == finishing) last = int(i);
  bubble_ms_ = 0;
  auto wait_in = [&](Work& w) {
    const auto t0 = std::chrono::steady_clock::now();
    {
      auto sc = trace_.scope("pipeline_wait", Trace::host);
      StepClock::Scope c(clock_, Phase::bubble);
      w.wait_on(s);
      if (dev == DeviceKind::cuda) s.synchronize();  // the wait is idle time only once the data is there
    }
    bubble_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const PipeOp& op = ops[i];
    chunk_.set_slot(op.micro % slots);
    switch (op.kind) {
      case PipeOp::F: {
        const Inputs in = inputs(op.micro);
        if (!chunk_.has_embedding()) {
          wait_in(act_in[size_t(op.micro)]);
          be.copy(view(chunk_.input()), act_buf(recv_act_, op.micro));
        }
        chunk_.forward(in, dloss, dp_);
        break;
      }
      case PipeOp::B: {
        const Inputs in = chunk_.has_embedding() ? inputs(op.micro) : Inputs{};
        if (!chunk_.has_head()) {
          wait_in(grad_in[size_t(op.micro)]);
          be.copy(view(chunk_.grad_output()), act_buf(recv_grad_, op.micro));
        }
        dp_.set_last(int(i) == last);  // DDP's buckets go with the stage's last backward
        chunk_.backward(in, dp_, split ? Grads::input : Grads::all);
        break;
      }
      case PipeOp::W:
        dp_.set_last(int(i) == last);
        chunk_.backward(chunk_.has_embedding() ? inputs(op.micro) : Inputs{}, dp_, Grads::weight);
        break;
      case PipeOp::send_act:
        be.copy(act_buf(send_act_, op.micro), view(chunk_.output()));
        sends.push_back(pp_.send(act_buf(send_act_, op.micro), op.peer, tag(op.micro, false), s));
        break;
      case PipeOp::send_grad:
        be.copy(act_buf(send_grad_, op.micro), view(chunk_.grad_input()));
        sends.push_back(pp_.send(act_buf(send_grad_, op.micro), op.peer, tag(op.micro, true), s));
        break;
      case PipeOp::recv_act:
      case PipeOp::recv_grad:
        break;  // posted at the start
    }
  }
  for (auto& w : sends) w.wait();
  chunk_.set_slot(0);
}

ChunkSpec pipeline_chunk_spec(const Config& cfg, int stage, PipeSchedule* schedule) {
  ChunkSpec spec;
  const int pp = cfg.parallel.pp;
  if (pp == 1) return spec;
  const std::vector<int> blocks = pipeline_layers(cfg);
  int b0 = 0;
  for (int i = 0; i < stage; ++i) b0 += blocks[size_t(i)];
  spec.unit_lo = stage == 0 ? 0 : b0 + 1;
  spec.unit_hi = stage == pp - 1 ? -1 : b0 + blocks[size_t(stage)] + 1;
  const PipeSchedule sched =
      pipeline_schedule(cfg.parallel.pp_schedule, pp, cfg.parallel.pp_virtual, cfg.accum_steps());
  spec.slots = pipeline_check(sched).peak_in_flight[size_t(stage)];
  if (schedule) *schedule = sched;
  return spec;
}

std::vector<PlanItem> pipeline_stage_plan(const Config& cfg, const ChunkSpec& spec, DType dtype) {
  std::vector<PlanItem> items;
  if (cfg.parallel.pp == 1) return items;
  const int tp = cfg.parallel.tp;
  const int64_t N = int64_t(cfg.train.micro_batch) * cfg.model.seq_len;
  const int64_t n = (cfg.parallel.sp && tp > 1 ? N / tp : N) * cfg.model.d_model * cfg.accum_steps();
  if (spec.unit_lo > 0)
    items.insert(items.end(), {{"pp_recv_act", n, dtype, Mem::comm}, {"pp_send_grad", n, dtype, Mem::comm}});
  if (spec.unit_hi >= 0)
    items.insert(items.end(), {{"pp_send_act", n, dtype, Mem::comm}, {"pp_recv_grad", n, dtype, Mem::comm}});
  return items;
}

std::vector<PipeOp> pipeline_forward_ops(int stages, int stage, int micro_batches) {
  std::vector<PipeOp> ops;
  for (int m = 0; m < micro_batches; ++m) {
    if (stage > 0) ops.push_back({PipeOp::recv_act, m, stage, stage - 1});
    ops.push_back({PipeOp::F, m, stage});
    if (stage + 1 < stages) ops.push_back({PipeOp::send_act, m, stage + 1, stage + 1});
  }
  return ops;
}

}  // namespace loom
