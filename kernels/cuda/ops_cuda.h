// CUDA kernels, the twins of kernels/ops.h: same shapes, same semantics (overwrite vs +=),
// device pointers, an explicit stream. Activations and weights are bf16 with fp32 arithmetic
// inside every kernel; parameter gradients (the main gradients), norm statistics, losses,
// master weights and Adam moments are fp32; sums that travel between ranks are fp64. Every
// reduction runs in a fixed order (no atomics), so results are bitwise reproducible on one GPU
// model. Built only when CUDA is on; callers check cuda_device_count().
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attention_block.h"

namespace loom::cuda {

using bf16 = __nv_bfloat16;

// The memory-bound kernels move 16-byte words; where a tensor does not start on 16 bytes they
// run element by element instead (the same results, about 8x the memory requests). Their
// wrappers name each such tensor to `paths` when the caller passes one (the last argument).
class ScalarPaths {
 public:
  virtual ~ScalarPaths() = default;
  virtual void taken(const char* kernel, const char* tensor) = 0;
};
// The CUDA backend's: says each kernel and tensor once, through `say`.
class ScalarPathsOnce final : public ScalarPaths {
 public:
  explicit ScalarPathsOnce(std::function<void(const std::string&)> say) : say_(std::move(say)) {}
  void taken(const char* kernel, const char* tensor) override {
    if (seen_.insert(std::string(kernel) + "/" + tensor).second)
      say_(std::string(kernel) + ": " + tensor +
           " does not start on 16 bytes, so the kernel runs element by element (same results, slower)");
  }

 private:
  std::function<void(const std::string&)> say_;
  std::set<std::string> seen_;
};

// Column sums (weight and bias gradients, the MoE router's) run in two deterministic stages
// over row_chunks(N) chunks of rows (kernels/cuda/common.cuh); their partials need
// column_partials_floats(N, C) floats of scratch, at most 2 * kMaxRowChunks * C.
constexpr int kMaxRowChunks = 64;
inline int row_chunks(int N) {
  const int c = (N + 127) / 128;
  return c < 1 ? 1 : c > kMaxRowChunks ? kMaxRowChunks : c;
}
inline int64_t column_partials_floats(int N, int C) {
  return 2 * int64_t(row_chunks(N)) * C;
}
// The norms' backward adds the weight (and bias) gradients' partials of up to
// kMaxNormGradBlocks blocks of rows (kernels/cuda/norm.cu): norm_partials_floats(N, C) floats,
// at most 1024 C (the backend plans those).
constexpr int kMaxNormGradBlocks = 8 * kMaxRowChunks;
inline int64_t norm_partials_floats(int N, int C) {
  return std::max(column_partials_floats(N, C), 2 * int64_t(std::min(N, kMaxNormGradBlocks)) * C);
}

// defines: to_bf16, to_f32
void to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t s, ScalarPaths* paths = nullptr);
void to_f32(float* out, const bf16* in, int64_t n, cudaStream_t s, ScalarPaths* paths = nullptr);

// defines: GemmContext, gemm, gemm_f32out, gemm_f32out_bias_grad, gemm_batched, gemm_batched_f32out,
// gemm_gelu, gemm_dgelu (cuBLASLt, bf16 in and out, fp32 accumulation)
struct GemmBatch;       // kernels/cuda/gemm_plan.h
enum class BiasGradOf;  // kernels/cuda/gemm_plan.h
// The cuBLASLt handle and workspace, owned by whoever runs the GEMMs (one per device).
class GemmContext {
 public:
  explicit GemmContext(size_t workspace_bytes = size_t(32) << 20);
  GemmContext(void* workspace, size_t workspace_bytes);  // a workspace the caller owns
  ~GemmContext();
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;
  void* handle() const { return handle_; }
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return bytes_; }

 private:
  void* handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t bytes_;
  bool owns_;
};
// Row-major C[M,N] = op(A) @ op(B) (+ bias[N]) + beta * C, as cpu::gemm.
void gemm(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
          const bf16* B, int ldb, float beta, bf16* C, int ldc, const bf16* bias, cudaStream_t s);
// The same with an fp32 C: weight gradients accumulate (beta = 1) into the fp32 main gradients
// without a bf16 rounding per micro-batch.
void gemm_f32out(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
                 const bf16* B, int ldb, float beta, float* C, int ldc, cudaStream_t s);
// The same with a bias gradient from the epilogue: bias_grad (fp32) = the sums over K of op(A)
// (BiasGradOf::a: M of them) or op(B) (N), written, not added; its order is cuBLASLt's for the
// shape (the emulation's: blocks of 256 in order). False, with nothing run, where cuBLASLt has
// no algorithm for that epilogue at this shape.
[[nodiscard]] bool gemm_f32out_bias_grad(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K,
                                         const bf16* A, int lda, const bf16* B, int ldb, float beta, float* C, int ldc,
                                         BiasGradOf of, float* bias_grad, cudaStream_t s);
// A strided batch of such GEMMs in one call (the experts of a MoE layer, one each), C bf16 or
// fp32; GemmBatch (kernels/cuda/gemm_plan.h) gives the count and each operand's stride.
void gemm_batched(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
                  const bf16* B, int ldb, float beta, bf16* C, int ldc, const GemmBatch& batch, cudaStream_t s);
void gemm_batched_f32out(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A,
                         int lda, const bf16* B, int ldb, float beta, float* C, int ldc, const GemmBatch& batch,
                         cudaStream_t s);
// defines: gemm_ragged_tiles, gemm_ragged_rows, gemm_ragged_wgrad (kernels/cuda/gemm_ragged.cu)
// The experts' GEMMs over runs of rows whose lengths stay on the device (a dropless MoE
// layer): expert e (of El) owns the next sum_s counts[s * El + e] rows of R in all.
// out[r, :N] = a[r, :K] @ B_e for each run, B_e read at w + e * w_stride as W [N, K]
// transposed (w_nk) or as W [K, N]; out is overwritten (rows past the runs are not written).
void gemm_ragged_rows(bf16* out, const bf16* a, const bf16* w, int64_t w_stride, bool w_nk, const int32_t* counts,
                      int sources, int El, int64_t R, int K, int N, cudaStream_t s);
// dw_e [N, K] (fp32, at dw + e * w_stride) += dy_e^T @ x_e over each run's rows.
void gemm_ragged_wgrad(float* dw, const bf16* dy, const bf16* x, int64_t w_stride, const int32_t* counts, int sources,
                       int El, int N, int K, cudaStream_t s);
// The blocks gemm_ragged_rows launches per 64 output columns: the most 64-row tiles R rows
// can make over El runs.
int gemm_ragged_tiles(int64_t R, int El);
// C = gelu(op(A) @ op(B) + bias) with GELU's argument kept in pre[M, N] (stride ldc, a
// multiple of 8): the fused bias + GELU epilogue. bias may be null. The model does not use it
// (its GELU on the fp32 accumulator could not be recomputed to the bit from pre); loom bench
// kernels measures what it would save.
void gemm_gelu(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
               const bf16* B, int ldb, bf16* C, int ldc, const bf16* bias, bf16* pre, cudaStream_t s);
// C = (op(A) @ op(B)) * gelu'(pre): GELU's backward fused into the GEMM that makes its input
// gradient. C is overwritten.
void gemm_dgelu(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
                const bf16* B, int ldb, bf16* C, int ldc, const bf16* pre, cudaStream_t s);
// dbias[N] += column sums of dout[M, N] (fp32, fixed order); partials: column_partials_floats(M, N).
void bias_backward(float* dbias, const bf16* dout, int M, int N, float* partials, cudaStream_t s,
                   ScalarPaths* paths = nullptr);

// defines: layernorm_forward, layernorm_backward, rmsnorm_forward, rmsnorm_backward
// Forward: with add not null, inp += add first, in place (the fused residual add), and the
// norm reads the bf16-rounded sum.
void layernorm_forward(bf16* out, float* mean, float* rstd, bf16* inp, const bf16* add, const bf16* weight,
                       const bf16* bias, int N, int C, float eps, cudaStream_t s, ScalarPaths* paths = nullptr);
// dinp +=; dweight, dbias (fp32) +=; partials: norm_partials_floats(N, C). max_blocks: the most
// blocks of rows whose partials are kept (past it a block takes more rows; tests lower it to
// reach the many-row path at small N).
void layernorm_backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp, const bf16* weight,
                        const float* mean, const float* rstd, int N, int C, float* partials, cudaStream_t s,
                        ScalarPaths* paths = nullptr, int max_blocks = kMaxNormGradBlocks);
void rmsnorm_forward(bf16* out, float* rstd, bf16* inp, const bf16* add, const bf16* weight, int N, int C, float eps,
                     cudaStream_t s, ScalarPaths* paths = nullptr);
void rmsnorm_backward(bf16* dinp, float* dweight, const bf16* dout, const bf16* inp, const bf16* weight,
                      const float* rstd, int N, int C, float* partials, cudaStream_t s, ScalarPaths* paths = nullptr,
                      int max_blocks = kMaxNormGradBlocks);

// defines: embedding_forward, embedding_backward, position_index, token_index
// pos [B*T] (data.doc_mask): each token's position in its document, which picks its wpe row
// (null: its index in its sequence).
void embedding_forward(bf16* out, const int32_t* tokens, const bf16* wte, int v0, int Vl, const bf16* wpe, int B, int T,
                       int C, const int32_t* pos, cudaStream_t s);
// The batch's positions grouped by token id, built on the host where the tokens come from:
// packed as ids[U] (local; ascending, but the first kMaxFrequentTokens ids of more than
// kEmbeddingPiece positions come first), starts[U + 1], then the positions of each id in
// order. Tokens outside [v0, v0 + Vl) are left out (vocab shards). *unique = U.
constexpr int kEmbeddingPiece = 64;
constexpr int kMaxFrequentTokens = 192;
constexpr int kMaxEmbeddingPieces = 2 * kMaxFrequentTokens;  // rows of C floats: a 3C bias's column partials
inline int64_t embedding_partials_floats(int C) {
  return int64_t(kMaxEmbeddingPieces) * C;
}
std::vector<int32_t> token_index(const int32_t* tokens, int N, int v0, int Vl, int* unique);
// The batch's rows grouped by position (data.doc_mask), built on the host: starts[T + 1],
// then the rows at each position in order. A position outside [0, T) is refused.
std::vector<int32_t> position_index(const int32_t* pos, int N, int T);
// dwte += (fp32, over the index's ids, each token's rows summed in order; a frequent token's in
// pieces, the pieces in order), dwpe += (if not null). index: token_index's array on the device
// over N rows of dout; pos_index: position_index's (null: the rows at index t of their
// sequences are position t's); partials: embedding_partials_floats(C).
void embedding_backward(float* dwte, float* dwpe, const bf16* dout, const int32_t* index, int U, int N, int B, int T,
                        int C, const int32_t* pos_index, float* partials, cudaStream_t s);

// defines: rope_forward, rope_backward (cos/sin tables [T, D/2] in fp32, as cpu::rope_table)
// Token (b, t) turns by the angle of pos[b * T + t] (data.doc_mask; null: t).
void rope_forward(bf16* qkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D, const int32_t* pos,
                  cudaStream_t s);
void rope_backward(bf16* dqkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D,
                   const int32_t* pos, cudaStream_t s);

// defines: gelu_forward, gelu_backward, swiglu_forward, swiglu_backward, add_bf16, add_f32
void add_bf16(bf16* acc, const bf16* x, int64_t n, cudaStream_t s,
              ScalarPaths* paths = nullptr);  // acc += x, rounded once
void add_f32(float* acc, const float* x, int64_t n, cudaStream_t s, ScalarPaths* paths = nullptr);
void gelu_forward(bf16* out, const bf16* inp, int64_t n, cudaStream_t s, ScalarPaths* paths = nullptr);
void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n, cudaStream_t s,
                   ScalarPaths* paths = nullptr);
void swiglu_forward(bf16* out, const bf16* inp, int N, int F, cudaStream_t s, ScalarPaths* paths = nullptr);
void swiglu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int N, int F, cudaStream_t s,
                     ScalarPaths* paths = nullptr);

// defines: attention_forward (attention_flash.cu), attention_backward (attention_flash_bwd.cu)
// Flash-style causal attention over packed qkv [B,T,(H+2KV)*D] with grouped-query heads: an
// online softmax over key tiles, never a T x T matrix. lse [B,H,T] (fp32) is kept for
// backward, which recomputes the probabilities. Head dims 32, 64 and 128 run on the
// FlashAttention-2-class kernels (mma.sync, attention_flash.cu); others are refused.
// pos [B*T] (data.doc_mask): query t attends to keys t - pos[b*T + t] .. t, its own document,
// and key tiles wholly before it are skipped (null: 0 .. t); backward takes the same pos.
void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int H, int KV, int D, const int32_t* pos,
                       cudaStream_t s);
// dqkv overwritten, deterministically (no atomics); scratch: B*H*T floats. ds: where it holds
// flash_ds_elems(B, T, H, D, pos) bf16 (kernels/flash_ds.h; 16-byte aligned), dK/dV stores dS
// there and dQ = dS K reads it back (no S, dP recomputed); otherwise dQ recomputes them.
// Either way dqkv repeats its bits run to run; the two dQ add the same bf16 dS products in the
// same order (equal bits where dK/dV's S^T and dP^T mma give dQ's S and dP, as the emulation's do).
void attention_backward(bf16* dqkv, const bf16* dout, const bf16* out, const bf16* qkv, const float* lse,
                        float* scratch, int B, int T, int H, int KV, int D, const int32_t* pos, cudaStream_t s,
                        bf16* ds = nullptr, int64_t ds_elems = 0);
// The whole-sequence kernels these replaced are references: kernels/cuda/reference/.

// defines: attention_kv_extract, attention_block_forward, attention_block_finish,
//          attention_block_delta, attention_block_backward, attention_block_grads_store
//          (attention_block.cu)
// Context parallel's attention over blocks of keys, the CPU's attention_block_* of
// kernels/ops.h with the same shapes and semantics (AttentionBlockShape, its positions in
// device memory). The flash kernels' tiles on tensor cores (mma.sync), D = 32, 64 or 128; qkv,
// kv and dout 16-byte aligned; no scratch.
void attention_kv_extract(bf16* kv, const bf16* qkv, int B, int T, int H, int KV, int D, cudaStream_t s);
void attention_block_forward(float* acc, float* ml, const bf16* qkv, const bf16* kv, const AttentionBlockShape& shape,
                             bool first, cudaStream_t s);
void attention_block_finish(bf16* out, float* lse, const float* acc, const float* ml, int B, int Tq, int H, int D,
                            cudaStream_t s);
void attention_block_delta(float* delta, const bf16* dout, const bf16* out, int B, int Tq, int H, int D,
                           cudaStream_t s);
void attention_block_backward(float* dq, float* dkv, const bf16* dout, const bf16* qkv, const bf16* kv,
                              const float* lse, const float* delta, const AttentionBlockShape& shape, cudaStream_t s);
void attention_block_grads_store(bf16* dqkv, const float* dq, const float* dkv, int B, int T, int H, int KV, int D,
                                 cudaStream_t s);

// defines: crossentropy_forward_backward, crossentropy_shard_stats, crossentropy_shard_sumexp,
//          crossentropy_shard_finish, loss_accumulate
// logits: N rows of V columns, of which the first `valid` are the vocabulary (the rest is
// padding: out of the softmax, gradient 0). losses[N] in fp32; with dloss != 0, logits become
// their gradient (bf16).
void crossentropy_forward_backward(bf16* logits, float* losses, const int32_t* targets, int N, int V, int valid,
                                   float dloss, cudaStream_t s);
// Vocab-parallel phases over a shard [N, Vl] of ids [v0, v0 + Vl), as cpu::crossentropy_shard_*.
void crossentropy_shard_stats(const bf16* logits, const int32_t* targets, int N, int Vl, int valid, int v0,
                              float* rowmax, float* target_logit, cudaStream_t s);
void crossentropy_shard_sumexp(const bf16* logits, const float* rowmax, int N, int Vl, int valid, float* sumexp,
                               cudaStream_t s);
void crossentropy_shard_finish(bf16* logits, float* losses, const int32_t* targets, int N, int Vl, int valid, int v0,
                               const float* rowmax, const float* sumexp, const float* target_logit, float dloss,
                               cudaStream_t s);
// *acc += sum of losses[N] (fp64, fixed order): the loss stays on the device until it is read.
void loss_accumulate(double* acc, const float* losses, int N, cudaStream_t s);

// defines: OptChunkDev, adamw_multi, sum_squares_table, grad_clip_scale
// One chunk of the optimizer table (model/backend.h's OptChunk, the same bytes).
struct OptChunkDev {
  int64_t state, param, grad;
  int32_t n;
  int16_t decay, norm;
};
// One AdamW step (torch.optim.AdamW arithmetic) over every chunk in one launch: fp32 master
// weights and moments, fp32 gradients in (times *grad_scale, a device value), bf16 weights
// out. decay_factor: 1 - lr * weight_decay.
void adamw_multi(float* master, bf16* params, const float* grads, float* m, float* v, const OptChunkDev* chunks,
                 int n_chunks, float lr_step, float bc2_sqrt, float beta1, float beta2, float eps, float decay_factor,
                 const float* grad_scale, cudaStream_t s);
// out[kExactDigits]: the exact sum of the squares of the chunks with norm set, as digits
// (runtime/exact_digits.h): each chunk's sum in double by one block in a fixed order, then the
// chunks' sums added as integers (atomics on the digits: any order gives the same bits);
// scratch: kExactDigits + 1 words (the digits and a count of non-finite sums). NaN digits
// where a sum is not finite.
void sum_squares_table(double* out, const float* grads, const OptChunkDev* chunks, int n_chunks, double* scratch,
                       cudaStream_t s);
// *scale = clip_coef(sqrt(the exact sum of sum_squares' digits), max_norm), on the device.
void grad_clip_scale(float* scale, const double* sum_squares, double max_norm, cudaStream_t s);

// defines: moe_route, moe_plan, moe_ep_maps, moe_gather, moe_combine, moe_combine_backward,
// moe_scatter_add, moe_router_backward, column_sums, moe_stats_add, moe_aux_grad
// (kernels/cuda/moe.cu; kernels/ops.h gives the semantics)
void moe_route(float* probs, int32_t* idx, float* w, const bf16* logits, int N, int E, int k, cudaStream_t s);
// scratch: moe_row::plan_scratch_ints(N * k, E) (kernels/moe_row.h).
void moe_plan(int32_t* row_of, int32_t* token_of, int32_t* counts, const int32_t* idx, int N, int E, int k, int cap,
              int slot, int rows, int32_t* scratch, cudaStream_t s);
void moe_ep_maps(int32_t* map_in, int32_t* map_out, const int32_t* from, int P, int El, int slot, cudaStream_t s);
void moe_stats_add(double* st, const int32_t* counts, const float* prob_sums, int N, int E, int k, cudaStream_t s);
void moe_aux_grad(float* g, const int32_t* counts, double scale, int N, int E, int k, cudaStream_t s);
void moe_gather(bf16* rows, const bf16* x, const int32_t* token_of_row, int R, int C, cudaStream_t s);
void moe_combine(bf16* out, const bf16* rows, const int32_t* row_of, const float* w, int N, int k, int C,
                 cudaStream_t s);
void moe_combine_backward(bf16* drows, float* dw, const bf16* dout, const bf16* rows, const int32_t* row_of,
                          const float* w, int N, int k, int C, cudaStream_t s);
void moe_scatter_add(bf16* dx, const bf16* drows, const int32_t* row_of, int N, int k, int C, cudaStream_t s);
void moe_router_backward(bf16* dlogits, const float* probs, const int32_t* idx, const float* w, const float* dw,
                         const float* aux_g, int N, int E, int k, cudaStream_t s);
// partials: column_partials_floats(N, E).
void column_sums(float* out, const float* probs, int N, int E, float* partials, cudaStream_t s);

}  // namespace loom::cuda
