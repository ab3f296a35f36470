// Data parallel with bucketed, overlapped gradient reduction. Buckets are ranges of the flat
// fp32 gradient buffer, bucket_mb each (never mixing experts' and dense tensors: under expert
// parallelism the first reduce over expert-dp, the others over dp), taken from the end of the
// buffer: backward produces gradients in reverse registration order, so the finished
// gradients always form a suffix [offset, end) of the buffer. The chunk reports that offset
// after each unit; every bucket inside the suffix starts its all-reduce at once (on the
// group's stream or thread, after the compute stream's work so far) while backward goes on. Only the last micro-batch
// of a step reports: accumulation micro-batches do not communicate. step() waits only for what is still in flight, then
// clips and updates. With parallel.grad_reduce_dtype = bf16 a bucket is rounded into a bf16 copy that is reduced and
// widened back; fp32 accumulation is unchanged. Gradients are sums: each rank's loss is already divided by the global
// token count.
#pragma once
#include <vector>

#include "parallel/data_parallel.h"
#include "parallel/tied_head.h"

namespace loom {

// A gradient bucket: a range [lo, hi) of the flat buffer, of experts' tensors (reduced over
// expert-dp) or dense ones (over dp).
struct BucketRange {
  int64_t lo, hi;
  bool experts;
};
// The buckets of a registry's flat buffer of `numel`, in launch order (from the end, as backward
// finishes gradients): runs of tensors of one kind (experts apart only where `experts_apart`),
// each cut from its end into buckets of at most `per` elements.
std::vector<BucketRange> ddp_buckets(const ParamRegistry& reg, int64_t numel, int64_t per, bool experts_apart);

class Ddp final : public DataParallel {
 public:
  Ddp(const DataParallelOptions& o, DecoderPart& chunk, const DataParallelGroups& groups, StepClock* clock);
  // What it allocates (its optimizer's state included) for a chunk of `layout` of a model of `dims`.
  static std::vector<PlanItem> plan(const DataParallelOptions& o, const ModelDims& dims, const ModelLayout& layout,
                                    DType dtype, DeviceKind device);

  Ptr params(int u, Pass) override { return chunk_.params() + lo(u); }
  float* grads(int u) override { return chunk_.grads() + lo(u); }
  void backward_done(int u) override;
  float* tied_head_grads() override { return tied_ ? tied_->grads() : nullptr; }
  void set_last(bool last) override { last_ = last; }
  void weights_from(const float* host) override;
  void weights_to(float* host) override;
  void reduce_grads(const std::function<void(Buf)>& tied = {}) override;
  Tensor& grad_sum_squares() override { return adam_->sum_squares(); }
  void apply(const AdamWHyper& h, int64_t step, double max_norm) override;
  void discard() override;
  double grad_norm() override { return adam_->norm(); }
  std::string describe() const override;
  std::vector<StateRun> state_runs(StateUse use) const override;
  int64_t state_size() const override { return int64_t(chunk_.num_params()); }
  StateHost state_host(HostBuffer& keep) override;
  void moments_from(const float* m, const float* v) override;
  size_t num_buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    int64_t lo, hi;
    ProcessGroup* group;  // dp, or expert-dp for the experts' gradients
    Work work;
  };
  int64_t lo(int u) const { return chunk_.layout().unit_lo(chunk_.layout().local(u)); }
  // Gradients [offset, numel) are final for this step.
  void grads_ready_from(int64_t offset);

  DecoderPart& chunk_;
  Backend& be_;
  ProcessGroup& dp_;
  ProcessGroup& tp_;
  ProcessGroup* ep_;   // expert parallel: the norm sums over it
  ProcessGroup* edp_;  // and the experts' gradients reduce over it
  StepClock* clock_;
  double bucket_mb_;
  bool last_ = false;
  std::vector<Bucket> buckets_;  // in launch order: from the end of the buffer
  size_t next_ = 0;
  Tensor low_;  // bf16 copy of the gradients for grad_reduce_dtype = bf16
  // parallel.invariant: the micro-batches' canonical tree, and over more than 2 ranks the tree
  // all-reduce's half buffer (2 ranks add a + b in any all-reduce).
  std::unique_ptr<GradTree> tree_;
  Tensor half_;
  int first_bit_ = 0;  // the tree's first pairing over dp x cp
  Buf half() const { return half_.defined() ? Buf(half_) : Buf(); }
  bool tree_reduce() const { return tree_ && dp_.size() > 2; }
  // Over more than 2 ranks: each unit's sum over the ranks starts as its last backward ends and
  // progresses from the later units' hooks; reduce_grads finishes them.
  std::unique_ptr<TreeAllReduce> tree_sum_;
  std::vector<bool> tree_started_;  // per local unit, this step
  bool tied_started_ = false;       // the tied head's H, this step
  void tree_start(int i);
  std::unique_ptr<TiedHeadGrad> tied_;  // the head's part of a tied embedding, kept apart
  std::unique_ptr<AdamW> adam_;
};

}  // namespace loom
