// Data parallel with bucketed, overlapped gradient reduction. Buckets are ranges of the flat
// gradient buffer, bucket_mb each, taken from the end of the buffer: backward produces
// gradients in reverse registration order, so the finished gradients always form a suffix
// [offset, end) of the buffer. The model's backward reports that offset after each block;
// every bucket inside the suffix starts its all-reduce at once, on the dp group's thread,
// while backward goes on. Only the last micro-batch of a step reports: accumulation
// micro-batches do not communicate. step_end() waits only for what is still in flight.
// Gradients are sums: each rank's loss is already divided by the global token count.
#pragma once
#include <vector>

#include "model/model.h"
#include "runtime/comm/process_group.h"

namespace loom {

class Ddp final : public UnitAccess {
 public:
  Ddp(ProcessGroup& dp, Model& model, double bucket_mb);
  // UnitAccess over the model's flat buffers; on the last micro-batch (set_last), a unit's
  // backward_done starts every bucket its gradients complete.
  const float* params(int u, Pass) override { return model_.params() + model_.layout().units[size_t(u)].first; }
  float* grads(int u) override { return model_.grads() + model_.layout().units[size_t(u)].first; }
  void backward_done(int u) override {
    if (last_) grads_ready_from(model_.layout().units[size_t(u)].first);
  }
  void set_last(bool last) { last_ = last; }
  // Gradients [offset, numel) are final for this step.
  void grads_ready_from(int64_t offset);
  // Starts what has not started, waits for everything; returns the milliseconds spent waiting.
  double step_end();
  size_t num_buckets() const { return buckets_.size(); }
  double comm_us() const { return comm_us_; }  // all-reduce time of the last step, summed

 private:
  struct Bucket {
    int64_t lo, hi;
    Work work;
  };
  ProcessGroup& dp_;
  Model& model_;
  float* grads_;
  bool last_ = false;
  std::vector<Bucket> buckets_;  // in launch order: from the end of the buffer
  size_t next_ = 0;
  double comm_us_ = 0;
};

}  // namespace loom
