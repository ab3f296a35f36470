// CPU kernels, one forward and one backward per op (llm.c style). Shapes use B (batch),
// T (time), C (channels), H (query heads), KV (key/value heads), D (head dim), F (MLP width),
// V (vocab), N (rows = B*T). Backward kernels say whether they overwrite or accumulate (+=):
// parameter gradients always accumulate (gradient accumulation across micro-batches);
// input gradients overwrite unless the comment says +=.
// Parallel loops use static OpenMP schedules and fixed-order reductions, so results are
// bitwise reproducible for a given thread count.
#pragma once
#include <cstdint>

namespace loom::cpu {

// GEMM layouts of a weight: out_in is nn.Linear's [N_out, K_in]; in_out is GPT-2's Conv1D.
enum class WLayout { out_in, in_out };

// defines: gemm, matmul_forward, matmul_backward
// C[M,N] = alpha * op(A) @ op(B) + beta * C, row-major, through OpenBLAS.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc);
// out[M,N] = inp[M,K] @ W + bias (bias may be null).
void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int M, int K, int N,
                    WLayout layout);
// dinp[M,K] overwritten (skipped if null); dw and dbias accumulate.
void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w, int M,
                     int K, int N, WLayout layout);

// defines: layernorm_forward, layernorm_backward, rmsnorm_forward, rmsnorm_backward
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C, float eps);
// dinp += ; dweight, dbias +=
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps);
// dinp += ; dweight +=
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C);

// defines: rope_table, rope_forward, rope_backward
// cos/sin table [T, D/2], computed as Hugging Face does in fp32.
void rope_table(float* cos, float* sin, int T, int D, float theta);
// Rotates the q and k parts of qkv [B,T,(H+2KV)*D] in place (rotate-half form).
void rope_forward(float* qkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D);
// The inverse rotation of the q and k gradients, in place.
void rope_backward(float* dqkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D);

// defines: attention_forward, attention_backward
// Causal attention with grouped-query heads over packed qkv [B,T,(H+2KV)*D]:
// q heads first, then KV k heads, then KV v heads; query head h reads kv head h/(H/KV).
// out [B,T,H*D]; probs [B,H,T,T] keeps the softmax (the O(T^2) design: see attention.cpp).
void attention_forward(float* out, float* probs, const float* qkv, int B, int T, int H, int KV, int D);
// dqkv overwritten.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs, int B, int T, int H,
                        int KV, int D);

// defines: gelu_forward, gelu_backward, swiglu_forward, swiglu_backward, add_forward
void gelu_forward(float* out, const float* inp, int64_t n);  // tanh approximation
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);
// out[N,F] = silu(inp[:, :F]) * inp[:, F:]; inp is [N, 2F] with gate first, then up.
void swiglu_forward(float* out, const float* inp, int N, int F);
void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F);
void add_forward(float* out, const float* a, const float* b, int64_t n);
void add_inplace(float* acc, const float* x, int64_t n);  // acc += x

// defines: crossentropy_forward_backward
// Fused softmax cross-entropy over logits [N,V]. Writes each row's loss into losses[N]. If
// dloss != 0, logits are overwritten with their gradient: (softmax - onehot) * dloss.
void crossentropy_forward_backward(float* logits, float* losses, const int32_t* targets, int N, int V, float dloss);

// defines: embedding_forward, embedding_backward
// out[b,t] = wte[tok[b,t]] + wpe[t]. Rows of wte cover token ids [v0, v0 + Vl) (the whole
// vocabulary on one rank; a vocab-parallel shard otherwise); other tokens contribute zeros.
// wpe may be null (llama; or every tensor-parallel rank but one).
void embedding_forward(float* out, const int32_t* tokens, const float* wte, int v0, int Vl, const float* wpe, int B,
                       int T, int C);
// dwte, dwpe +=; dwpe may be null.
void embedding_backward(float* dwte, int v0, int Vl, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C);

// defines: crossentropy_shard_stats, crossentropy_shard_sumexp, crossentropy_shard_finish
// Vocab-parallel cross-entropy over logits [N, Vl] holding ids [v0, v0 + Vl). The caller
// reduces between the phases: max of rowmax, then sum of sumexp and of target_logit.
void crossentropy_shard_stats(const float* logits, const int32_t* targets, int N, int Vl, int v0, float* rowmax,
                              float* target_logit);
void crossentropy_shard_sumexp(const float* logits, const float* rowmax, int N, int Vl, float* sumexp);
// losses = log(sumexp) + rowmax - target_logit; with dloss != 0, logits become their gradient.
void crossentropy_shard_finish(float* logits, float* losses, const int32_t* targets, int N, int Vl, int v0,
                               const float* rowmax, const float* sumexp, const float* target_logit, float dloss);

// defines: sum_squares
// Sum of squares in double, fixed-order.
double sum_squares(const float* x, int64_t n);
void scale_inplace(float* x, float s, int64_t n);

}  // namespace loom::cpu
