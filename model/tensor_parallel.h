// Tensor-parallel communication as named conjugate pairs (Megatron): each op's backward is
// the conjugate of its forward.
//   copy_to_tp      forward identity                 backward all-reduce       (before a column-parallel linear)
//   reduce_from_tp  forward all-reduce               backward identity         (after a row-parallel linear)
//   gather_from_sp  forward all-gather of row shards backward reduce-scatter   (sequence parallel, before column)
//   scatter_to_sp   forward reduce-scatter to rows   backward all-gather       (sequence parallel, after row)
// Identity halves are not functions. With sequence parallelism the rows (the B*T tokens of
// a micro-batch) are split into tp contiguous blocks; rank t holds block t.
// Each op reads what `s` has produced and returns once work issued to `s` will see its result
// (under NCCL the tp group runs on the compute stream itself; under MPI, CPU buffers or CUDA
// ones staged through the host, the host waits).
// Communication per block and micro-batch, in elements of the [N, C] activations (N = B*T):
//   without sp: 2 all-reduces forward, 2 backward (4 x N*C payload)
//   with sp:    2 all-gathers + 2 reduce-scatters forward; backward 2 all-gathers of the
//               output gradient, 2 all-gathers that rebuild the normed inputs, 2 reduce-scatters.
#pragma once
#include "runtime/comm/process_group.h"

namespace loom {

void copy_to_tp_backward(ProcessGroup& tp, Buf grad, const Stream& s);
void reduce_from_tp_forward(ProcessGroup& tp, Buf x, const Stream& s);
// shard: rows/tp x C elements; full: rows x C.
void gather_from_sp_forward(ProcessGroup& tp, Buf shard, Buf full, const Stream& s);
void gather_from_sp_backward(ProcessGroup& tp, Buf dfull, Buf dshard, const Stream& s);
void scatter_to_sp_forward(ProcessGroup& tp, Buf full, Buf shard, const Stream& s);
void scatter_to_sp_backward(ProcessGroup& tp, Buf dshard, Buf dfull, const Stream& s);

}  // namespace loom
