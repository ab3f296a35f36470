#include "parallel/tensor_parallel.h"

namespace loom {

void copy_to_tp_backward(ProcessGroup& tp, float* grad, int64_t n) {
  if (tp.size() > 1) tp.all_reduce(Buf(grad, n)).wait();
}

void reduce_from_tp_forward(ProcessGroup& tp, float* x, int64_t n) {
  if (tp.size() > 1) tp.all_reduce(Buf(x, n)).wait();
}

void gather_from_sp_forward(ProcessGroup& tp, const float* shard, float* full, int64_t shard_n) {
  tp.all_gather(Buf(const_cast<float*>(shard), shard_n), Buf(full, shard_n * tp.size())).wait();
}

void gather_from_sp_backward(ProcessGroup& tp, const float* dfull, float* dshard, int64_t shard_n) {
  tp.reduce_scatter(Buf(const_cast<float*>(dfull), shard_n * tp.size()), Buf(dshard, shard_n)).wait();
}

void scatter_to_sp_forward(ProcessGroup& tp, const float* full, float* shard, int64_t shard_n) {
  tp.reduce_scatter(Buf(const_cast<float*>(full), shard_n * tp.size()), Buf(shard, shard_n)).wait();
}

void scatter_to_sp_backward(ProcessGroup& tp, const float* dshard, float* dfull, int64_t shard_n) {
  tp.all_gather(Buf(const_cast<float*>(dshard), shard_n), Buf(dfull, shard_n * tp.size())).wait();
}

}  // namespace loom
