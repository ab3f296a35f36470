#include "parallel/pipeline.h"

#include <chrono>
#include <map>
#include <set>
#include <tuple>

#include "parallel/pipeline_split.h"
#include "runtime/error.h"
#include "runtime/trace.h"

namespace loom {

namespace {
// The model chunk g's neighbours: does it receive activations (and send their gradients back),
// and does it send activations (and receive their gradients)?
bool chunk_receives(int g) {
  return g > 0;
}
bool chunk_sends(int g, int chunks) {
  return g + 1 < chunks;
}
PipeSlots::Buffer buffer_of(PipeOp::Kind k) {
  switch (k) {
    case PipeOp::recv_act:
      return PipeSlots::recv_act;
    case PipeOp::send_act:
      return PipeSlots::send_act;
    case PipeOp::recv_grad:
      return PipeSlots::recv_grad;
    default:
      return PipeSlots::send_grad;
  }
}
}  // namespace

PipeSlots pipeline_slots(const std::vector<PipeOp>& ops) {
  PipeSlots ps;
  ps.slot.assign(ops.size(), -1);
  std::array<std::vector<bool>, PipeSlots::kBuffers> busy;
  auto take = [&](int b) {
    auto& v = busy[size_t(b)];
    size_t k = 0;
    while (k < v.size() && v[k]) ++k;
    if (k == v.size()) v.push_back(true);
    v[k] = true;
    ps.count[size_t(b)] = std::max(ps.count[size_t(b)], int(v.size()));
    return int(k);
  };
  std::array<std::map<std::pair<int, int>, int>, 2> held;  // receives by (chunk, micro): activations, gradients
  auto release = [&](int h, const PipeOp& op) {
    auto it = held[size_t(h)].find({op.chunk, op.micro});
    if (it == held[size_t(h)].end()) return;
    busy[size_t(h == 0 ? PipeSlots::recv_act : PipeSlots::recv_grad)][size_t(it->second)] = false;
    held[size_t(h)].erase(it);
  };
  // Local hand-offs (a V): which F's and B's are on this list, and the slots taken for them.
  std::set<std::tuple<int, int, int>> here;
  for (const PipeOp& op : ops) here.insert({int(op.kind), op.chunk, op.micro});
  std::array<std::map<std::pair<int, int>, int>, 2> local;  // by the reader's (chunk, micro)
  for (const std::vector<size_t>& batch : pipeline_comm_batches(ops)) {
    const PipeOp& first = ops[batch[0]];
    if (!pipe_op_is_comm(first.kind)) {  // a compute op frees the receive it reads
      if (first.kind == PipeOp::F) release(0, first);
      if (first.kind == PipeOp::B) release(1, first);
      if (first.kind != PipeOp::F && first.kind != PipeOp::B) continue;
      const int h = first.kind == PipeOp::F ? 0 : 1, b = h == 0 ? PipeSlots::local_act : PipeSlots::local_grad;
      auto it = local[size_t(h)].find({first.chunk, first.micro});  // read, then free
      if (it != local[size_t(h)].end()) {
        busy[size_t(b)][size_t(it->second)] = false;
        local[size_t(h)].erase(it);
      }
      const int to = h == 0 ? first.chunk + 1 : first.chunk - 1;  // the chunk it hands to
      if (here.count({int(first.kind), to, first.micro}))
        local[size_t(h)][{to, first.micro}] = ps.slot[batch[0]] = take(b);
      continue;
    }
    std::vector<std::pair<int, int>> sent;
    for (size_t i : batch) {
      const PipeOp& op = ops[i];
      const int b = buffer_of(op.kind);
      ps.slot[i] = take(b);
      if (op.kind == PipeOp::recv_act || op.kind == PipeOp::recv_grad)
        held[op.kind == PipeOp::recv_act ? 0 : 1][{op.chunk, op.micro}] = ps.slot[i];
      else
        sent.push_back({b, ps.slot[i]});
    }
    for (auto [b, k] : sent) busy[size_t(b)][size_t(k)] = false;
  }
  return ps;
}

std::array<int, PipeSlots::kBuffers> pipeline_stage_slots(const Config& cfg, int stage) {
  const int pp = cfg.parallel.pp, v = cfg.parallel.pp_virtual, m = cfg.accum_steps();
  const PipeSchedule sched = pipeline_schedule(cfg.parallel.pp_schedule, pp, v, m);
  auto n = pipeline_slots(pipeline_in_order(sched).ops[size_t(stage)]).count;
  const auto fwd = pipeline_slots(pipeline_forward_ops(pp, v, stage, m, sched.v_shape)).count;
  for (size_t b = 0; b < n.size(); ++b) n[b] = std::max(n[b], fwd[b]);
  return n;
}

PipelineStage::PipelineStage(DecoderPart& chunk, DataParallel& dp, ProcessGroup& pp, int micro_batches,
                             const std::array<int, PipeSlots::kBuffers>& slots, StepClock* clock, Trace& trace)
    : chunk_(chunk), dp_(dp), pp_(pp), clock_(clock), trace_(trace), micro_(micro_batches) {
  const ModelDims& dims = chunk.dims();
  const int tp = dims.tp;
  const int64_t N = int64_t(dims.B) * dims.T_local();
  rows_ = (dims.sp && tp > 1 ? N / tp : N) * dims.C;
  if (pp.size() == 1) return;
  LOOM_CHECK(micro_batches == dims.accum, "pipeline: {} micro-batches, but the config's step has {}", micro_batches,
             dims.accum);
  const auto& n = slots;
  Allocator& a = chunk.backend().alloc();
  const DType dt = chunk.backend().dtype();
  Tensor* bufs[PipeSlots::kBuffers] = {&recv_act_,  &send_act_,  &recv_grad_,
                                       &send_grad_, &local_act_, &local_grad_};  // PipeSlots::Buffer order
  for (size_t b = 0; b < n.size(); ++b)
    if (n[b]) *bufs[b] = a.empty({rows_ * n[b]}, dt, Mem::comm);
}

PipelineStage::~PipelineStage() = default;

Buf PipelineStage::slot_buf(const Tensor& t, int slot) const {
  LOOM_ASSERT(slot >= 0 && rows_ * (slot + 1) <= t.numel());
  return Buf(t).slice(rows_ * slot, rows_);
}

void PipelineStage::run(const std::vector<PipeOp>& ops, const std::function<Inputs(int)>& inputs, float dloss,
                        bool reduce, const OpHook& before_op) {
  Backend& be = chunk_.backend();
  const Stream& s = be.stream();
  const DType dt = be.dtype();
  const DeviceKind dev = be.device();
  const int P = pp_.size(), G = P * chunk_.pieces();
  auto view = [&](Ptr p) { return Buf(p.p, rows_, dt, dev); };
  // Work on model chunk g (one of this stage's pieces) for micro-batch `micro`.
  auto select = [&](int g, int micro) {
    chunk_.set_piece(g / P);
    chunk_.set_slot(micro % chunk_.slots());
  };
  // Receives are posted where the schedule puts them, each with the sends and receives next to
  // it in one group (pipeline_comm_batches): NCCL runs a communicator's ops in issue order and
  // a send waits for its receive, so a receive posted early would block the sends behind it.
  const size_t slots_n = static_cast<size_t>(micro_ * chunk_.pieces());
  std::vector<Work> act_in(slots_n), grad_in(slots_n);
  std::vector<int> act_at(slots_n, -1), grad_at(slots_n, -1);        // the slot each receive landed in
  std::vector<int> act_local(slots_n, -1), grad_local(slots_n, -1);  // the local slot of a V's hand-off
  auto index = [&](int g, int micro) { return size_t((g / P) * micro_ + micro); };
  const PipeSlots ps = pipeline_slots(ops);
  const Tensor* bufs[PipeSlots::kBuffers] = {&recv_act_,  &send_act_,  &recv_grad_,
                                             &send_grad_, &local_act_, &local_grad_};
  for (size_t b = 0; b < PipeSlots::kBuffers; ++b)
    LOOM_CHECK(rows_ * ps.count[b] <= bufs[b]->numel(),
               "pipeline: this op list needs {} slots of buffer {}, {} were made", ps.count[b], b,
               bufs[b]->defined() ? bufs[b]->numel() / rows_ : 0);
  // The send last issued from each slot: a send into the slot waits for it first.
  std::vector<Work> act_sent(size_t(ps.count[PipeSlots::send_act])), grad_sent(size_t(ps.count[PipeSlots::send_grad]));
  std::vector<Work> sends;
  auto tag = [&](int g, int micro, bool grad) { return (g * micro_ + micro) * 2 + (grad ? 1 : 0); };
  // The ops that finish a piece's gradients: its last W under a split backward, else its last
  // B. DDP's buckets take the finished gradients as a suffix of the flat buffer, so the pieces
  // must finish from the last to the first (the schedules do).
  bool split = false;
  for (const PipeOp& op : ops) split = split || op.kind == PipeOp::W;
  const PipeOp::Kind finishing = split ? PipeOp::W : PipeOp::B;
  std::vector<int> last(static_cast<size_t>(chunk_.pieces()), -1);
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].kind == finishing) last[size_t(ops[i].chunk / P)] = int(i);
  for (size_t j = 1; j < last.size(); ++j)
    LOOM_CHECK(last[j] < last[j - 1] || last[0] < 0, "pipeline: piece {} finishes its gradients after piece {}", j,
               j - 1);
  bubble_ms_ = 0;
  auto wait_in = [&](Work& w) {
    const auto t0 = std::chrono::steady_clock::now();
    {
      auto sc = trace_.scope("pipeline_wait", Trace::host);
      StepClock::Scope c(clock_, Phase::bubble);
      w.wait_on(s);
      if (device_is_cuda(dev)) s.synchronize();  // the wait is idle time only once the data is there
    }
    bubble_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  // A send slot's earlier send, before the slot is written again: idle time where the host
  // waits for it (the CPU, MPI), and never a host synchronization inside a group (NCCL).
  auto wait_sent = [&](Work& w) {
    const auto t0 = std::chrono::steady_clock::now();
    {
      StepClock::Scope c(clock_, Phase::bubble);
      w.wait_on(s);
    }
    bubble_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const PipeOp& op = ops[i];
    if (before_op && !pipe_op_is_comm(op.kind)) before_op(op);
    switch (op.kind) {
      case PipeOp::F: {
        select(op.chunk, op.micro);
        const Inputs in = inputs(op.micro);
        if (chunk_receives(op.chunk) && act_local[index(op.chunk, op.micro)] >= 0) {
          be.copy(view(chunk_.input()), slot_buf(local_act_, act_local[index(op.chunk, op.micro)]));
        } else if (chunk_receives(op.chunk)) {
          wait_in(act_in[index(op.chunk, op.micro)]);
          be.copy(view(chunk_.input()), slot_buf(recv_act_, act_at[index(op.chunk, op.micro)]));
        }
        chunk_.forward(in, dloss, dp_);
        if (ps.slot[i] >= 0) {  // the next chunk is here too (a V): its input, kept until its F
          be.copy(slot_buf(local_act_, ps.slot[i]), view(chunk_.output()));
          act_local[index(op.chunk + 1, op.micro)] = ps.slot[i];
        }
        break;
      }
      case PipeOp::B: {
        select(op.chunk, op.micro);
        // The embedding's chunk, and with data.doc_mask or context parallel every chunk (its
        // positions drive RoPE's backward and recomputed attention).
        const ModelDims& dims = chunk_.dims();
        const Inputs in = op.chunk == 0 || dims.doc_mask || dims.cp > 1 ? inputs(op.micro) : Inputs{};
        if (chunk_sends(op.chunk, G) && grad_local[index(op.chunk, op.micro)] >= 0) {
          be.copy(view(chunk_.grad_output()), slot_buf(local_grad_, grad_local[index(op.chunk, op.micro)]));
        } else if (chunk_sends(op.chunk, G)) {
          wait_in(grad_in[index(op.chunk, op.micro)]);
          be.copy(view(chunk_.grad_output()), slot_buf(recv_grad_, grad_at[index(op.chunk, op.micro)]));
        }
        dp_.set_last(reduce && int(i) == last[size_t(op.chunk / P)]);  // DDP's buckets go with a piece's last backward
        chunk_.backward(in, dp_, split ? Grads::input : Grads::all);
        if (ps.slot[i] >= 0) {  // the previous chunk is here too (a V): its output gradient
          be.copy(slot_buf(local_grad_, ps.slot[i]), view(chunk_.grad_input()));
          grad_local[index(op.chunk - 1, op.micro)] = ps.slot[i];
        }
        break;
      }
      case PipeOp::W:
        select(op.chunk, op.micro);
        dp_.set_last(reduce && int(i) == last[size_t(op.chunk / P)]);
        chunk_.backward(op.chunk == 0 ? inputs(op.micro) : Inputs{}, dp_, Grads::weight);
        break;
      case PipeOp::send_act:
      case PipeOp::send_grad:
      case PipeOp::recv_act:
      case PipeOp::recv_grad: {
        pp_.group_start();
        try {
          for (; i < ops.size() && pipe_op_is_comm(ops[i].kind); ++i) {
            const PipeOp& c = ops[i];
            const int k = ps.slot[i];
            if (c.kind == PipeOp::send_act) {  // of chunk c.chunk - 1, computed here, to c.chunk
              select(c.chunk - 1, c.micro);
              const Buf b = slot_buf(send_act_, k);
              wait_sent(act_sent[size_t(k)]);  // the slot's last send has left it
              be.copy(b, view(chunk_.output()));
              sends.push_back(act_sent[size_t(k)] = pp_.send(b, c.peer, tag(c.chunk, c.micro, false), s));
            } else if (c.kind == PipeOp::send_grad) {  // of chunk c.chunk + 1's input, to c.chunk
              select(c.chunk + 1, c.micro);
              const Buf b = slot_buf(send_grad_, k);
              wait_sent(grad_sent[size_t(k)]);
              be.copy(b, view(chunk_.grad_input()));
              sends.push_back(grad_sent[size_t(k)] = pp_.send(b, c.peer, tag(c.chunk, c.micro, true), s));
            } else if (c.kind == PipeOp::recv_act) {
              act_at[index(c.chunk, c.micro)] = k;
              act_in[index(c.chunk, c.micro)] =
                  pp_.recv(slot_buf(recv_act_, k), c.peer, tag(c.chunk, c.micro, false), s);
            } else {
              grad_at[index(c.chunk, c.micro)] = k;
              grad_in[index(c.chunk, c.micro)] =
                  pp_.recv(slot_buf(recv_grad_, k), c.peer, tag(c.chunk, c.micro, true), s);
            }
          }
        } catch (...) {  // close the group, so no later op is batched into it silently
          try {
            pp_.group_end();
          } catch (...) {
          }
          throw;
        }
        --i;  // the loop's ++i moves past the batch
        pp_.group_end();
        break;
      }
    }
  }
  if (!sends.empty()) {  // waiting for peers, not computing
    StepClock::Scope c(clock_, Phase::bubble);
    for (auto& w : sends) w.wait();
  }
  chunk_.set_piece(0);
  chunk_.set_slot(0);
}

std::vector<int> pipeline_stage_chunks(const Config& cfg, int stage) {
  std::vector<int> out;
  const int pp = cfg.parallel.pp, G = pp * cfg.parallel.pp_virtual;
  for (int g = 0; g < G; ++g)
    if (pipe_stage_of(g, pp, cfg.pp_v_shape()) == stage) out.push_back(g);
  return out;
}

std::vector<std::pair<int, int>> pipeline_stage_runs(const Config& cfg, int stage) {
  const int pp = cfg.parallel.pp;
  if (pp == 1) return chunk_runs(PartSpec{});  // the whole model
  const int G = pp * cfg.parallel.pp_virtual;
  const std::vector<int> blocks = pipeline_layers(cfg);  // per model chunk
  std::vector<std::pair<int, int>> runs;
  for (int g : pipeline_stage_chunks(cfg, stage)) {
    int b0 = 0;
    for (int i = 0; i < g; ++i) b0 += blocks[size_t(i)];
    runs.push_back({g == 0 ? 0 : b0 + 1, g == G - 1 ? -1 : b0 + blocks[size_t(g)] + 1});
  }
  return runs;
}

PartSpec pipeline_chunk_spec(const Config& cfg, int stage, PipeSchedule* schedule) {
  PartSpec spec;
  const int pp = cfg.parallel.pp;
  if (pp == 1) return spec;
  const PipeSchedule sched =
      pipeline_schedule(cfg.parallel.pp_schedule, pp, cfg.parallel.pp_virtual, cfg.accum_steps());
  const PipeTiming t = pipeline_check(sched);
  pipeline_check_in_order(pipeline_in_order(sched));  // the executor's groups, as NCCL runs them
  spec.pieces.clear();
  const std::vector<int> chunks = pipeline_stage_chunks(cfg, stage);  // each run's, with its peak in flight
  const std::vector<std::pair<int, int>> runs = pipeline_stage_runs(cfg, stage);
  for (size_t k = 0; k < runs.size(); ++k)
    spec.pieces.push_back({runs[k].first, runs[k].second, t.peak_in_flight_chunk[size_t(chunks[k])]});
  if (schedule) *schedule = sched;
  return spec;
}

std::vector<PlanItem> pipeline_stage_plan(const Config& cfg, int stage, DType dtype) {
  std::vector<PlanItem> items;
  const int pp = cfg.parallel.pp;
  if (pp == 1) return items;
  const int tp = cfg.parallel.tp;
  const int64_t N = int64_t(cfg.train.micro_batch) * cfg.local_seq();
  const int64_t rows = (cfg.parallel.sp && tp > 1 ? N / tp : N) * cfg.model.d_model;
  const auto n = pipeline_stage_slots(cfg, stage);
  const char* names[PipeSlots::kBuffers] = {"pp_recv_act",  "pp_send_act",  "pp_recv_grad", "pp_send_grad",
                                            "pp_local_act", "pp_local_grad"};  // PipeSlots::Buffer order
  for (size_t b = 0; b < n.size(); ++b)
    if (n[b]) items.push_back({names[b], rows * n[b], dtype, Mem::comm});
  return items;
}

std::vector<PipeOp> pipeline_forward_ops(int stages, int virtual_chunks, int stage, int micro_batches, bool v_shape) {
  std::vector<PipeOp> ops;
  const int G = stages * virtual_chunks;
  auto stage_of = [&](int g) { return pipe_stage_of(g, stages, v_shape); };
  for (int m = 0; m < micro_batches; ++m)
    for (int g = 0; g < G; ++g) {
      if (stage_of(g) != stage) continue;
      if (chunk_receives(g) && stage_of(g - 1) != stage) ops.push_back({PipeOp::recv_act, m, g, stage_of(g - 1)});
      ops.push_back({PipeOp::F, m, g});
      if (chunk_sends(g, G) && stage_of(g + 1) != stage) ops.push_back({PipeOp::send_act, m, g + 1, stage_of(g + 1)});
    }
  return ops;
}

}  // namespace loom
