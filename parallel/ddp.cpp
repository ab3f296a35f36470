#include "parallel/ddp.h"

#include <chrono>

namespace loom {

Ddp::Ddp(ProcessGroup& dp, Model& model, double bucket_mb) : dp_(dp), model_(model), grads_(model.grads()) {
  const int64_t numel = int64_t(model.num_params());
  const int64_t per = std::max<int64_t>(1, int64_t(bucket_mb * 1024 * 1024 / sizeof(float)));
  for (int64_t hi = numel; hi > 0; hi -= per) buckets_.push_back({std::max<int64_t>(0, hi - per), hi, {}});
}

void Ddp::grads_ready_from(int64_t offset) {
  while (next_ < buckets_.size() && buckets_[next_].lo >= offset) {
    Bucket& b = buckets_[next_++];
    b.work = dp_.all_reduce(Buf(grads_ + b.lo, b.hi - b.lo));
  }
}

double Ddp::step_end() {
  grads_ready_from(0);
  const auto t0 = std::chrono::steady_clock::now();
  comm_us_ = 0;
  for (auto& b : buckets_) {
    b.work.wait();
    comm_us_ += b.work.duration_us();
  }
  next_ = 0;
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace loom
