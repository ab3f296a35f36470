// The pipeline executor: one stage's op list of a schedule (parallel/pipeline_schedule.h, as
// pipeline_in_order() reorders it), walked in order over the pp group. Each run of consecutive
// sends and receives goes out as one group (group_start/group_end: NCCL's group call), each
// receive at the boundary where the schedule's timing has its send; sends go from a copy, so
// compute never waits for them; the time a stage spends waiting for a receive is its bubble
// (the step clock's bubble phase). Transfers take slots of four buffers (activations and
// gradients, in and out) only while they are in flight (pipeline_slots): a receive's from its
// group until the op that reads it, a send's for its group (a later send into the slot first
// waits for it), so the buffers hold what the schedule has in flight, not every micro-batch. Activations of the
// micro-batches in flight live in the chunk's slots (micro-batch k in slot k mod slots: the schedules finish
// micro-batches in order, and the checker's peak bounds how many are in flight). Under the
// interleaved schedule a stage holds several model chunks, the chunk's pieces, each with its
// own activations and slots. A schedule with W ops splits each backward: B computes the input
// gradient the previous stage waits for, W the weight gradients later, from the output
// gradients B kept in the slot. With one stage, the op list is the accumulation loop and
// nothing is sent.
#pragma once
#include <array>
#include <functional>
#include <vector>

#include "model/decoder_part.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline_schedule.h"

namespace loom {

// The slots of the executor's four buffers for one stage's op list (in issue order): each send's
// and receive's slot (per op; -1 for compute ops) and how many slots each buffer needs. A
// receive holds its slot from its group to the F (activations) or B (gradients) that reads
// it; a send holds its slot for its group.
// Under a V-shaped schedule the stage holding chunks p-1 and p hands activations and
// gradients from one to the other itself: an F whose next chunk is here puts its output in a
// local_act slot until that chunk's F reads it, a B whose previous chunk is here its input
// gradient in a local_grad slot until that chunk's B (slot: per F or B, the one it fills).
struct PipeSlots {
  enum Buffer { recv_act, send_act, recv_grad, send_grad, local_act, local_grad };
  static constexpr size_t kBuffers = 6;
  std::array<int, kBuffers> count{};
  std::vector<int> slot;
};
class PipelineStage {
 public:
  // pp: the pipeline group (this rank is stage pp.rank()).
  // slots: the buffers this stage's schedule holds (pipeline_stage_slots).
  PipelineStage(DecoderPart& chunk, DataParallel& dp, ProcessGroup& pp, int micro_batches,
                const std::array<int, PipeSlots::kBuffers>& slots, StepClock* clock, Trace& trace);
  ~PipelineStage();
  // Called before each compute op (F, B, W) of a run, with the op: where the trainer's drills
  // attach to the passes.
  using OpHook = std::function<void(const PipeOp&)>;
  // One step's (or one validation batch's) ops. inputs(micro) stages that micro-batch's tokens
  // and targets where the stage needs them (the embedding, the head); dloss seeds the head's
  // backward (0: forward only). With `reduce`, the last B (or W) of each piece starts DDP's
  // reductions; without, none does (they wait for DataParallel::reduce_grads).
  void run(const std::vector<PipeOp>& ops, const std::function<Inputs(int)>& inputs, float dloss, bool reduce = true,
           const OpHook& before_op = {});
  double bubble_ms() const { return bubble_ms_; }  // waiting in receives during the last run

 private:
  Buf slot_buf(const Tensor& t, int slot) const;
  DecoderPart& chunk_;
  DataParallel& dp_;
  ProcessGroup& pp_;
  StepClock* clock_;
  Trace& trace_;
  int micro_;
  int64_t rows_;  // elements of one activation or gradient between stages
  // [slots x rows] each: pipeline_slots' counts for this stage's training and forward lists.
  Tensor recv_act_, recv_grad_, send_act_, send_grad_, local_act_, local_grad_;
  double bubble_ms_ = 0;
};

PipeSlots pipeline_slots(const std::vector<PipeOp>& ops);
// The most slots each buffer needs on `stage` over its training and forward-only lists.
std::array<int, PipeSlots::kBuffers> pipeline_stage_slots(const Config& cfg, int stage);

// Stage `stage`'s chunk under cfg.parallel.pp: its units (the embedding on the first stage, the
// head on the last, parallel.pp_layers' blocks; under the interleaved schedule one piece per
// model chunk stage + k * pp) and each piece's activation slots, the schedule's peak in flight
// on that model chunk (the schedule is checked on the way; *schedule, if given, gets it).
PartSpec pipeline_chunk_spec(const Config& cfg, int stage, PipeSchedule* schedule = nullptr);
// The model chunks on `stage` (pipe_stage_of), in model order.
std::vector<int> pipeline_stage_chunks(const Config& cfg, int stage);
// Just its units, one run per piece, without timing the schedule.
std::vector<std::pair<int, int>> pipeline_stage_runs(const Config& cfg, int stage);
// What PipelineStage allocates for that stage (the memory planner's items).
std::vector<PlanItem> pipeline_stage_plan(const Config& cfg, int stage, DType dtype);

// The forward-only list of a stage (validation): per micro-batch, through each of its model
// chunks: receive, forward, send (a V's hand-off between its chunks p-1 and p stays local).
std::vector<PipeOp> pipeline_forward_ops(int stages, int virtual_chunks, int stage, int micro_batches,
                                         bool v_shape = false);

}  // namespace loom
