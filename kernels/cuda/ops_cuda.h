// CUDA kernels, the twins of kernels/ops.h: same shapes, same semantics (overwrite vs +=),
// device pointers, an explicit stream. Activations, weights and gradients are bf16 with fp32
// arithmetic inside every kernel; norm statistics, the loss, master weights and Adam moments
// are fp32. Every reduction runs in a fixed order (no atomics), so results are bitwise
// reproducible on one GPU model. Built only when CUDA is on; callers check cuda_device_count().
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace loom::cuda {

using bf16 = __nv_bfloat16;

// defines: to_bf16, to_f32
void to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t s);
void to_f32(float* out, const bf16* in, int64_t n, cudaStream_t s);

// defines: GemmContext, gemm, gemm_gelu, gemm_dgelu (cuBLASLt, bf16 in and out, fp32 accumulation)
// The cuBLASLt handle and workspace, owned by whoever runs the GEMMs (one per device).
class GemmContext {
 public:
  explicit GemmContext(size_t workspace_bytes = size_t(32) << 20);
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
};
// Row-major C[M,N] = op(A) @ op(B) (+ bias[N]) + beta * C, as cpu::gemm.
void gemm(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
          const bf16* B, int ldb, float beta, bf16* C, int ldc, const bf16* bias, cudaStream_t s);
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
// dbias[N] += column sums of dout[M, N] (fp32, fixed order).
void bias_backward(bf16* dbias, const bf16* dout, int M, int N, cudaStream_t s);

// defines: layernorm_forward, layernorm_backward, rmsnorm_forward, rmsnorm_backward
// Forward: with add not null, inp += add first, in place (the fused residual add), and the
// norm reads the bf16-rounded sum.
void layernorm_forward(bf16* out, float* mean, float* rstd, bf16* inp, const bf16* add, const bf16* weight,
                       const bf16* bias, int N, int C, float eps, cudaStream_t s);
// dinp +=; dweight, dbias +=.
void layernorm_backward(bf16* dinp, bf16* dweight, bf16* dbias, const bf16* dout, const bf16* inp, const bf16* weight,
                        const float* mean, const float* rstd, int N, int C, cudaStream_t s);
void rmsnorm_forward(bf16* out, float* rstd, bf16* inp, const bf16* add, const bf16* weight, int N, int C, float eps,
                     cudaStream_t s);
void rmsnorm_backward(bf16* dinp, bf16* dweight, const bf16* dout, const bf16* inp, const bf16* weight,
                      const float* rstd, int N, int C, cudaStream_t s);

// defines: embedding_forward, embedding_backward
void embedding_forward(bf16* out, const int32_t* tokens, const bf16* wte, int v0, int Vl, const bf16* wpe, int B, int T,
                       int C, cudaStream_t s);
// The batch's positions grouped by token id, built on the host where the tokens come from:
// packed as ids[U] (local, ascending), starts[U + 1], then the positions of each id in order.
// Tokens outside [v0, v0 + Vl) are left out (vocab shards). *unique = U.
std::vector<int32_t> token_index(const int32_t* tokens, int N, int v0, int Vl, int* unique);
// dwte += (over the index's ids, each token's rows summed in fp32 first), dwpe += (if not null).
// index: token_index's array on the device.
void embedding_backward(bf16* dwte, bf16* dwpe, const bf16* dout, const int32_t* index, int U, int B, int T, int C,
                        cudaStream_t s);

// defines: rope_forward, rope_backward (cos/sin tables [T, D/2] in fp32, as cpu::rope_table)
void rope_forward(bf16* qkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D, cudaStream_t s);
void rope_backward(bf16* dqkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D, cudaStream_t s);

// defines: gelu_forward, gelu_backward, swiglu_forward, swiglu_backward
void gelu_forward(bf16* out, const bf16* inp, int64_t n, cudaStream_t s);
void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n, cudaStream_t s);
void swiglu_forward(bf16* out, const bf16* inp, int N, int F, cudaStream_t s);
void swiglu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int N, int F, cudaStream_t s);

// defines: attention_forward, attention_backward, attention_forward_rowwise, attention_backward_rowwise
// Flash-style causal attention over packed qkv [B,T,(H+2KV)*D] with grouped-query heads: an
// online softmax over key tiles, never a T x T matrix. lse [B,H,T] (fp32) is kept for
// backward, which recomputes the probabilities. Head dims 64 and 128 run on tensor cores
// (attention_tc.cu), 32 on the row-wise kernels (attention.cu); others are refused.
void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int H, int KV, int D, cudaStream_t s);
// dqkv overwritten; scratch: B*H*T floats.
void attention_backward(bf16* dqkv, const bf16* dout, const bf16* out, const bf16* qkv, const float* lse,
                        float* scratch, int B, int T, int H, int KV, int D, cudaStream_t s);
// The row-wise kernels (a warp per query or key row, CUDA cores) for any of D = 32, 64, 128:
// the reference the tensor-core path is tested and benchmarked against.
void attention_forward_rowwise(bf16* out, float* lse, const bf16* qkv, int B, int T, int H, int KV, int D,
                               cudaStream_t s);
void attention_backward_rowwise(bf16* dqkv, const bf16* dout, const bf16* out, const bf16* qkv, const float* lse,
                                float* scratch, int B, int T, int H, int KV, int D, cudaStream_t s);

// defines: crossentropy_forward_backward, loss_accumulate
// losses[N] in fp32; with dloss != 0, logits become their gradient (bf16).
// logits: N rows of V, ld apart (a stride padded past V keeps GEMM rows aligned).
void crossentropy_forward_backward(bf16* logits, int64_t ld, float* losses, const int32_t* targets, int N, int V,
                                   float dloss, cudaStream_t s);
// *acc += sum of losses[N] (fp32, fixed order): the loss stays on the device until it is read.
void loss_accumulate(float* acc, const float* losses, int N, cudaStream_t s);

// defines: AdamSpan, AdamChunk, adamw_chunks, adamw_multi, sum_squares, grad_clip_scale
// One parameter tensor of the flat buffers: where it starts, how long, whether it decays.
struct AdamSpan {
  int64_t offset, n;
  bool decay;
};
// A piece of one tensor, at most kAdamChunk elements: one block of adamw_multi.
struct AdamChunk {
  int64_t offset;
  int32_t n, decay;
};
constexpr int kAdamChunk = 8192;
std::vector<AdamChunk> adamw_chunks(const std::vector<AdamSpan>& spans);
// One AdamW step (torch.optim.AdamW arithmetic) over every chunk in one launch: fp32 master
// weights and moments, bf16 gradients in (times *grad_scale, a device value), bf16 weights out.
// chunks: adamw_chunks' table on the device. decay_factor: 1 - lr * weight_decay.
void adamw_multi(float* master, bf16* params, const bf16* grads, float* m, float* v, const AdamChunk* chunks,
                 int n_chunks, float lr_step, float bc2_sqrt, float beta1, float beta2, float eps, float decay_factor,
                 const float* grad_scale, cudaStream_t s);
// Sum of squares of n bf16 values into *out (fp32; fixed-order two-pass reduction);
// scratch: 1024 floats.
void sum_squares(float* out, const bf16* x, int64_t n, float* scratch, cudaStream_t s);
// *scale = clip_coef(sqrt(*sum_squares), max_norm), on the device.
void grad_clip_scale(float* scale, const float* sum_squares, double max_norm, cudaStream_t s);

}  // namespace loom::cuda
