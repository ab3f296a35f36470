// ZeRO over the data-parallel group. Every unit of the chunk (the embeddings, each block,
// the head) is sharded over the dp ranks (under expert parallelism a MoE block's experts, the
// tail of its unit, over the expert-dp ranks that hold the same experts): rank r owns elements [r*s, (r+1)*s) of a unit
// of len elements, s = ceil(len / dp), the last shards padded with zeros. This rank's shards of all units, back to
// back, form its shard space, where the Adam moments (and, with bf16 compute, the fp32 master weights) live.
//   stage 1: full weights and gradients; at step end each unit's gradients are
//            reduce-scattered, this rank updates its slice, and the weights are all-gathered.
//   stage 2: no full gradient buffer: a unit's gradients go to a unit-sized buffer and are
//            reduce-scattered as soon as its backward ends (every micro-batch), accumulating
//            into the fp32 gradient shard.
//   stage 3: no full weights either: a unit is all-gathered right before its forward and
//            again before its backward, the next block prefetched while this one computes,
//            and the buffer reused once the unit is done (zero3_reshard = "after_forward");
//            or, "after_step", gathered once into a whole-chunk buffer where it stays for the
//            step's other passes and micro-batches (one gather per step, the chunk's weights
//            whole meanwhile: FSDP's reshard_after_forward = False).
// Communication per step of A micro-batches, in elements per rank: stage 1 reduce-scatters N
// and all-gathers N once (2N, like DDP's all-reduce); stage 2 reduce-scatters N per
// micro-batch and all-gathers N once ((A+1)N); stage 3 all-gathers N before each micro-batch's
// forward and again before its backward, and reduce-scatters N per micro-batch (3AN). Weights
// travel in the compute dtype, gradients in parallel.grad_reduce_dtype.
#pragma once
#include <memory>

#include "parallel/data_parallel.h"
#include "parallel/tied_head.h"

namespace loom {

// Who shards what: the dp group's size and this rank's place in it; under expert parallelism
// (edp > 0) also the expert-dp group's, over which the experts' tail of each MoE block's unit
// is sharded instead.
struct ZeroRanks {
  int dp, rank;
  int edp = 0, edp_rank = 0;
  // A pipeline's tied embedding (its name; empty: none): the first stage's and the last
  // stage's copy are each sharded over dp as a part of their own, so that rank r's shard
  // covers the same elements on both stages and the two can be summed shard to shard.
  std::string tied;
  // Shards start at multiples of this many elements from their part's start (model/layout.h's
  // norm_block): the gradient norm's blocks are whole on one rank.
  int64_t block = 1;
};
// The ZeroRanks of a run of a model of `dims` for rank `rank` of dp ranks (edp_rank: its place in
// the expert-dp group, where ep > 1).
ZeroRanks zero_ranks(const DataParallelOptions& o, const ModelDims& dims, int dp, int rank, int edp_rank = 0);
// The rank's slice of every unit, cut at tensor boundaries, as state runs: `state` indexes
// the rank's shard space.
std::vector<StateRun> zero_state_runs(const ModelLayout& layout, const ZeroRanks& z);
// The rank's optimizer table: its slice of every unit, cut at tensor boundaries. Moments (and
// master weights) index the shard space; weights the full buffer below stage 3, gradients
// below stage 2. Replicated tensors count in the norm on tp rank 0 only, and `uncounted` (the
// last stage's copy of a tied embedding) nowhere.
std::vector<OptChunk> zero_opt_chunks(const ModelLayout& layout, const ZeroRanks& z, int stage, int tp_rank,
                                      const char* uncounted = nullptr);
// What Zero allocates (its optimizer's state included) on that rank for a chunk of `layout`,
// at `stage`, weights in `dtype`, gradients reduced in `reduce`; `keep_gathered`: stage 3
// keeps gathered weights until the step (parallel.zero3_reshard = Zero3Reshard::after_step).
std::vector<PlanItem> zero_plan(const ModelLayout& layout, const ZeroRanks& z, int stage, int tp_rank, DType dtype,
                                DType reduce, DeviceKind device, bool keep_gathered = false);
// What parallel.invariant adds at `stage` (parallel/grad_tree.h): the tree's levels, over the
// full gradients at stage 1 and over the rank's shards at 2 and 3, and the tree reduction's half;
// The head's part of a tied embedding kept apart (parallel/tied_head.h) at `stage`: 0, whole
// (stage 1); else the rank's shard size of unit 0's dense part, which the matrix opens.
int64_t zero_tied_shard(const ModelLayout& layout, const ZeroRanks& z, int stage);
// `tied_numel` > 0: the head's part of a tied embedding of that many elements kept apart
// (parallel/tied_head.h).
// `cp` > 1 at stages 2 and 3: the tree runs over cp-fold shards (the cp parts summed after it).
std::vector<PlanItem> zero_tree_plan(const ModelLayout& layout, const ZeroRanks& z, int stage, int micro_batches,
                                     int64_t tied_numel = 0, int cp = 1);

class Zero final : public DataParallel {
 public:
  Zero(const DataParallelOptions& o, DecoderPart& chunk, const DataParallelGroups& groups, StepClock* clock);
  ~Zero() override;

  Ptr params(int u, Pass pass) override;
  float* grads(int u) override;
  void forward_done(int u) override;
  void backward_done(int u) override;
  void weights_done(int u) override;
  void set_last(bool last) override { last_ = last; }
  void weights_from(const float* host) override;
  void weights_to(float* host) override;
  void reduce_grads(const std::function<void(Buf)>& tied = {}) override;
  float* tied_head_grads() override { return tied_ ? tied_->grads() : nullptr; }
  Tensor& grad_sum_squares() override { return adam_->sum_squares(); }
  void apply(const AdamWHyper& h, int64_t step, double max_norm) override;
  void discard() override;
  double grad_norm() override { return adam_->norm(); }
  std::string describe() const override;
  std::vector<StateRun> state_runs(StateUse use) const override;
  int64_t state_size() const override { return shard_; }
  StateHost state_host(HostBuffer& keep) override;
  void moments_from(const float* m, const float* v) override;

 private:
  struct Unit {
    int64_t lo, len, s, shard_off;
    int64_t a() const;  // this rank's slice of the unit: [a, b)
    int64_t b() const;
    int r, n;
    bool expert;  // sharded over expert-dp
    bool tail;    // split off the end of its unit (a MoE block's experts, a tied embedding's part)
  };
  ProcessGroup& group(const Unit& u) { return u.expert ? *edp_ : dp_; }
  // parallel.invariant (stage 1): the micro-batches' canonical tree over the full gradient
  // buffer; over more than 2 ranks the whole buffer is then summed in the tree all-reduce (an
  // all-reduce's bytes, not a reduce-scatter's), unit by unit, and each rank reads its slice.
  std::unique_ptr<GradTree> tree_;
  Tensor half_;
  int first_bit_ = 0;  // the tree's first pairing over dp x cp
  Buf half() const { return half_.defined() ? Buf(half_) : Buf(); }
  // Stage 1 over more than 2 ranks: each unit's tree all-reduce starts as its last backward
  // ends, progressed from the later units' hooks (as DDP's).
  std::unique_ptr<TreeAllReduce> tree_sum_;
  // Stages 2 and 3 over more than 2 ranks or with cp: each micro-batch's tree reduce-scatters in
  // flight from the hooks, each slot's runs in their own part of half_ (from half_at_).
  std::unique_ptr<TreeReduceScatter> tree_rs_;
  std::vector<int64_t> half_at_;
  std::vector<bool> tree_started_;      // per local unit, this step
  bool tied_started_ = false;           // the tied head's H, this step
  std::unique_ptr<TiedHeadGrad> tied_;  // the head's part of a tied embedding, kept apart
  // Stages 2 and 3 with cp > 1: each micro-batch reduce-scattered over the dp ranks only, into
  // a cp-fold shard (the cp ranks' parts kept apart through the micro-batches' tree, in
  // cp_grads_, with a result buffer per slot); after the step's last, a tree reduce-scatter over
  // the cp ranks leaves each rank its shard: the cp parts meet after the tree, as under DDP.
  int cp_ = 1;
  Tensor cp_grads_;
  std::vector<Tensor> cp_results_;
  bool last_ = false;
  // parallel.invariant's steps (parallel/zero_invariant.cpp): its buffers and trees; a unit's
  // tree all-reduce (stage 1); a micro-batch's tree reduce-scatter of `in` into `out`, the
  // rank's shard at element `at` of slot `slot`'s result (cp > 1: into its cp-fold result); the
  // cp parts' reduce-scatter after the step's last micro-batch; the tied head's H added to E.
  void invariant_setup(const DataParallelOptions& o);
  void tree_start(int i);
  // Which of a slot's two runs, each with its own part of the half: the unit's dense part, or
  // the tail split off its end (both can be in flight at once).
  enum class SlotPart { dense, tail };
  // Starts the run; returns its number (drain finishes it).
  int64_t start_tree_scatter(ProcessGroup& g, Buf in, Buf out, size_t slot, SlotPart part, int64_t at);
  void cp_reduce_scatter();
  void add_tied_head(float* grads);
  struct Slot;  // a unit-sized buffer for gathered weights or gradients in flight
  Slot& slot_of(std::vector<std::unique_ptr<Slot>>& slots, int u) const;
  void gather_into(Slot& slot, int u, Pass pass);
  size_t slot_index(const Slot& slot) const;  // among grad_slots_
  void drain(Slot& slot);                     // waits for a slot's reduce-scatter and adds it into the shard
  void wait(const Work& w);
  Buf dev(void* p, int64_t n, DType t) const { return Buf(p, n, t, be_.device()); }
  // Stages 2 and 3: a unit's dense part, its expert tail (a MoE unit under expert
  // parallelism; else null) and its slot's extent in buf (the unit, or the dense part padded
  // for dp, whichever is longer).
  const Unit& unit(int u) const { return units_[size_t(first_part_[size_t(chunk_.layout().local(u))])]; }
  const Unit* tail(int u) const {
    const size_t k = size_t(first_part_[size_t(chunk_.layout().local(u))]) + 1;
    return k < units_.size() && units_[k].tail ? &units_[k] : nullptr;
  }
  const Unit* tied_part() const;  // the part that is the tied embedding (see ZeroRanks)
  int64_t padded(int u) const {
    const Unit* e = tail(u);
    return std::max(unit(u).s * unit(u).n, unit(u).len + (e ? e->len : 0));
  }

  int stage_;
  DecoderPart& chunk_;
  Backend& be_;
  ProcessGroup& dp_;
  ProcessGroup& tp_;
  ProcessGroup& host_dp_;
  StepClock* clock_;
  int n_, r_;
  ProcessGroup *edp_, *host_edp_;
  ZeroRanks ranks_;
  float* reduced_ = nullptr;  // the reduced gradients apply() reads, between reduce_grads() and it
  DType dtype_, reduce_;
  std::vector<Unit> units_;      // the parts, in order (the chunk's units unless experts are split off)
  std::vector<int> first_part_;  // per local unit: its first (dense) part in units_
  std::unique_ptr<AdamW> adam_;
  Tensor shard_params_, shard_grads_, grad_bounce_, grad_bounce_low_, param_bounce_;
  std::vector<std::unique_ptr<Slot>> grad_slots_, param_slots_;
  bool keep_ = false;           // after_step: gathered units stay in param_full_ until apply()
  Tensor param_full_;           // the chunk's weights, unit by unit as they are gathered
  std::vector<char> gathered_;  // per local unit: in param_full_ since the last update
  int64_t max_unit_ = 0, shard_ = 0;
};

}  // namespace loom
