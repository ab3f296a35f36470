// ZeRO over the data-parallel group. Every unit of the model (the embeddings, each block,
// the head) is sharded over the dp ranks: rank r owns elements [r*s, (r+1)*s) of a unit of
// len elements, s = ceil(len / dp), the last shards padded with zeros. This rank's shards of
// all units, back to back, form its shard space, where the Adam moments live.
//   stage 1: full weights and gradients; at step end each unit's gradients are
//            reduce-scattered, this rank updates its slice, and the weights are all-gathered.
//   stage 2: no full gradient buffer: a unit's gradients go to a unit-sized buffer and are
//            reduce-scattered as soon as its backward ends (every micro-batch), accumulating
//            into the gradient shard.
//   stage 3: no full weights either: a unit is all-gathered right before its forward and
//            again before its backward, the next block prefetched while this one computes,
//            and the buffer reused once the unit is done.
// Communication per micro-batch, in elements per rank: stages 1-2 reduce-scatter N and
// all-gather N (2N, like DDP's all-reduce); stage 3 adds the second all-gather (3N).
#pragma once
#include <memory>

#include "model/model.h"
#include "optim/adamw.h"
#include "runtime/comm/process_group.h"

namespace loom {

// Per-rank bytes of weights, gradients, optimizer state and communication buffers for a
// layout, dp size and stage (fp32 throughout, as on the CPU); what Zero allocates.
struct ZeroBytes {
  int64_t params = 0, grads = 0, optim = 0, comm = 0;
  int64_t shard_elems = 0;  // this rank's shard space (padding included)
};
ZeroBytes zero_bytes(const ModelLayout& layout, int dp, int stage);

class Zero final : public UnitAccess {
 public:
  // tp: the tensor-parallel group, for the global gradient norm.
  Zero(int stage, Model& model, ProcessGroup& dp, ProcessGroup& tp, Allocator& alloc);
  ~Zero() override;

  const float* params(int u, Pass pass) override;
  float* grads(int u) override;
  void forward_done(int u) override;
  void backward_done(int u) override;

  // Takes this rank's slices from full weights (after init or load).
  void shard_from(const float* full);
  // Gathers the full weights into `full`; collective over dp.
  void gather_to(float* full);
  // Finishes the reductions, clips by the global norm, updates this rank's slice with AdamW
  // and (stages 1-2) all-gathers the weights. Returns the norm before clipping.
  double step(const AdamWHyper& h, int64_t step, double grad_clip);
  // Milliseconds spent waiting on communication since the last call.
  double take_wait_ms();

 private:
  struct Unit {
    int64_t lo, len, s, shard_off;
  };
  struct Slot;  // a unit-sized buffer for gathered weights or gradients in flight
  Slot& slot_of(std::vector<std::unique_ptr<Slot>>& slots, int u) const;
  void gather_into(Slot& slot, int u, Pass pass);
  void drain(Slot& slot);  // waits for a slot's reduce-scatter and adds it into the shard
  void wait(const Work& w);

  int stage_;
  Model& model_;
  ProcessGroup& dp_;
  ProcessGroup& tp_;
  int n_, r_;
  std::vector<Unit> units_;
  std::vector<AdamSegment> segments_;
  std::unique_ptr<AdamW> adam_;
  Tensor shard_params_, shard_grads_, bounce_;
  std::vector<std::unique_ptr<Slot>> grad_slots_, param_slots_;
  int64_t max_unit_ = 0;
  double wait_ms_ = 0;
};

}  // namespace loom
