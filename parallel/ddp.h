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

#include "runtime/comm/process_group.h"

namespace loom {

class Ddp {
 public:
  Ddp(ProcessGroup& dp, float* grads, int64_t numel, double bucket_mb);
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
  float* grads_;
  std::vector<Bucket> buckets_;  // in launch order: from the end of the buffer
  size_t next_ = 0;
  double comm_us_ = 0;
};

}  // namespace loom
