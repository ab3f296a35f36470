// See launch_shapes.h. The arguments are the ones backend_cuda.cpp passes for a step of `s`.
#include "tests/cuda/launch_shapes.h"

#include <cstdint>

#include "kernels/cuda/reference/attention_reference.h"
#include "kernels/flash_ds.h"

namespace loom::testing_cuda {

int call_every_kernel(const ModelShape& s) {
  using cuda::bf16;
  // Never dereferenced (nothing runs), but not null: wrappers skip optional outputs that are.
  const uintptr_t fake = 1 << 12;
  auto* x = reinterpret_cast<bf16*>(fake);
  auto* f = reinterpret_cast<float*>(fake);
  auto* i32 = reinterpret_cast<int32_t*>(fake);
  auto* f64 = reinterpret_cast<double*>(fake);
  auto* table = reinterpret_cast<const cuda::OptChunkDev*>(fake);
  const int N = s.B * s.T;
  const int64_t NC = int64_t(N) * s.C;
  int n = 0;
  cuda::to_bf16(x, f, NC, nullptr), ++n;
  cuda::to_f32(f, x, NC, nullptr), ++n;
  cuda::add_bf16(x, x, NC, nullptr), ++n;
  cuda::add_f32(f, f, s.params, nullptr), ++n;  // the main gradients, whole
  cuda::bias_backward(f, x, N, 3 * s.C, f, nullptr), n += 2;
  cuda::layernorm_forward(x, f, f, x, x, x, x, N, s.C, 1e-5f, nullptr), ++n;
  // The norms' backward: one kernel for dinp and the weight gradient's partials up to 16
  // slices of 256 columns (C <= 4096), then one finish for both gradients; wider rows read the
  // rows again for them (the column partials, then the finish).
  const bool fused_norm = s.C <= 4096;
  cuda::layernorm_backward(x, f, f, x, x, x, f, f, N, s.C, f, nullptr), n += fused_norm ? 2 : 3;
  cuda::rmsnorm_forward(x, f, x, x, x, N, s.C, 1e-5f, nullptr), ++n;
  cuda::rmsnorm_backward(x, f, x, x, x, f, N, s.C, f, nullptr), n += fused_norm ? 2 : 3;
  cuda::embedding_forward(x, i32, x, 0, s.V, x, s.B, s.T, s.C, i32, nullptr), ++n;
  // wte (the tokens that are not frequent, the frequent ones' pieces, their sums) and wpe.
  cuda::embedding_backward(f, f, x, i32, std::min(N, s.V), N, s.B, s.T, s.C, i32, f, nullptr), n += 4;
  cuda::rope_forward(x, f, f, s.B, s.T, s.H, s.KV, s.D, i32, nullptr), ++n;
  cuda::rope_backward(x, f, f, s.B, s.T, s.H, s.KV, s.D, i32, nullptr), ++n;
  const int64_t NF = int64_t(N) * s.F;
  cuda::gelu_forward(x, x, NF, nullptr), ++n;
  cuda::gelu_backward(x, x, x, NF, nullptr), ++n;
  cuda::swiglu_forward(x, x, N, s.F, nullptr), ++n;
  cuda::swiglu_backward(x, x, x, N, s.F, nullptr), ++n;
  cuda::attention_forward(x, f, x, s.B, s.T, s.H, s.KV, s.D, i32, nullptr), ++n;
  cuda::attention_backward(x, x, x, x, f, f, s.B, s.T, s.H, s.KV, s.D, i32, nullptr), n += 2;  // dQ (with delta), dK/dV
  // Without document starts, with the stored dS where it is planned: delta, dK/dV storing dS, dQ = dS K.
  if (const int64_t ds = flash_ds_planned_elems(s.B, s.T, s.H, s.D, false); ds > 0)
    cuda::attention_backward(x, x, x, x, f, f, s.B, s.T, s.H, s.KV, s.D, nullptr, nullptr, x, ds), n += 3;
  // The kernels attention_forward replaced, kept as references and in the benchmark.
  cuda::reference::attention_forward_rowwise(x, f, x, s.B, s.T, s.H, s.KV, s.D, i32, nullptr), ++n;
  cuda::reference::attention_backward_rowwise(x, x, x, x, f, f, s.B, s.T, s.H, s.KV, s.D, i32, nullptr), n += 3;
  if (s.D == 64 || s.D == 128) {
    cuda::reference::attention_forward_wmma(x, f, x, s.B, s.T, s.H, s.KV, s.D, i32, nullptr), ++n;
    cuda::reference::attention_backward_wmma(x, x, x, x, f, f, s.B, s.T, s.H, s.KV, s.D, i32, nullptr), n += 2;
  }
  // Context parallel at cp 2: blocks of T/2 keys for T/2 queries.
  const int Tl = s.T / 2;
  cuda::attention_kv_extract(x, x, s.B, Tl, s.H, s.KV, s.D, nullptr), ++n;
  const AttentionBlockShape blk{s.B, Tl, Tl, s.H, s.KV, s.D, i32, i32, i32};
  cuda::attention_block_forward(f, f, x, x, blk, false, nullptr), ++n;
  cuda::attention_block_finish(x, f, f, f, s.B, Tl, s.H, s.D, nullptr), ++n;
  cuda::attention_block_delta(f, x, x, s.B, Tl, s.H, s.D, nullptr), ++n;
  cuda::attention_block_backward(f, f, x, x, x, f, f, blk, nullptr), n += 2;
  cuda::attention_block_grads_store(x, f, f, s.B, Tl, s.H, s.KV, s.D, nullptr), ++n;
  cuda::crossentropy_forward_backward(x, f, i32, N, s.V, s.V, 1.0f, nullptr), ++n;
  cuda::crossentropy_shard_stats(x, i32, N, s.V / 8, s.V / 8, 0, f, f, nullptr), ++n;
  cuda::crossentropy_shard_sumexp(x, f, N, s.V / 8, s.V / 8, f, nullptr), ++n;
  cuda::crossentropy_shard_finish(x, f, i32, N, s.V / 8, s.V / 8, 0, f, f, f, 1.0f, nullptr), ++n;
  cuda::loss_accumulate(f64, f, N, nullptr), ++n;
  const int chunks = int((s.params + 8191) / 8192);
  cuda::adamw_multi(f, x, f, f, f, table, chunks, 1e-3f, 1.0f, 0.9f, 0.95f, 1e-8f, 1.0f, f, nullptr), ++n;
  cuda::sum_squares_table(f64, f, table, chunks, f64, nullptr), n += 2;
  cuda::grad_clip_scale(f, f64, 1.0, nullptr), ++n;
  if (s.E) {
    const int R = N * s.k;
    cuda::moe_route(f, i32, f, x, N, s.E, s.k, nullptr), ++n;
    cuda::moe_gather(x, x, i32, R, s.C, nullptr), ++n;
    cuda::moe_combine(x, x, i32, f, N, s.k, s.C, nullptr), ++n;
    cuda::moe_combine_backward(x, f, x, x, i32, f, N, s.k, s.C, nullptr), ++n;
    cuda::moe_scatter_add(x, x, i32, N, s.k, s.C, nullptr), ++n;
    cuda::moe_router_backward(x, f, i32, f, f, f, N, s.E, s.k, nullptr), ++n;
    cuda::column_sums(f, f, N, s.E, f, nullptr), n += 2;
    cuda::moe_plan(i32, i32, i32, i32, N, s.E, s.k, R, 0, R, i32, nullptr), n += 3;
    cuda::moe_ep_maps(i32, i32, i32, 8, s.E / 8, 0, nullptr), ++n;
    cuda::moe_stats_add(f64, i32, f, N, s.E, s.k, nullptr), ++n;
    cuda::moe_aux_grad(f, i32, 1.0, N, s.E, s.k, nullptr), ++n;
    // Dropless experts, d_ff per expert: the up projection (2F wide) and its weight gradient.
    cuda::gemm_ragged_rows(x, x, x, 3 * int64_t(s.F) * s.C, true, i32, 1, s.E, R, s.C, 2 * s.F, nullptr), ++n;
    cuda::gemm_ragged_wgrad(f, x, x, 3 * int64_t(s.F) * s.C, i32, 1, s.E, 2 * s.F, s.C, nullptr), ++n;
  }
  return n;
}

}  // namespace loom::testing_cuda
