#include "model/tensor_parallel.h"

namespace loom {

void copy_to_tp_backward(ProcessGroup& tp, Buf grad, const Stream& s) {
  if (tp.size() > 1) tp.all_reduce(grad, ReduceOp::sum, s).wait_on(s);
}

void reduce_from_tp_forward(ProcessGroup& tp, Buf x, const Stream& s) {
  if (tp.size() > 1) tp.all_reduce(x, ReduceOp::sum, s).wait_on(s);
}

void gather_from_sp_forward(ProcessGroup& tp, Buf shard, Buf full, const Stream& s) {
  tp.all_gather(shard, full, s).wait_on(s);
}

void gather_from_sp_backward(ProcessGroup& tp, Buf dfull, Buf dshard, const Stream& s) {
  tp.reduce_scatter(dfull, dshard, s).wait_on(s);
}

void scatter_to_sp_forward(ProcessGroup& tp, Buf full, Buf shard, const Stream& s) {
  tp.reduce_scatter(full, shard, s).wait_on(s);
}

void scatter_to_sp_backward(ProcessGroup& tp, Buf dshard, Buf dfull, const Stream& s) {
  tp.all_gather(dshard, dfull, s).wait_on(s);
}

}  // namespace loom
