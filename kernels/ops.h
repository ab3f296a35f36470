// The op API: each op the decoder is written in, its shapes and its overwrite or += semantics,
// stated once here, with its CPU kernel. The decoder calls the ops through Backend
// (model/backend.h); the CUDA kernels are twins of these (kernels/cuda/ops_cuda.h), the
// whole-sequence attention kernels training no longer runs references (kernels/cuda/reference/).
// One forward and one backward per op (llm.c style). Shapes use B (batch),
// T (time), C (channels), H (query heads), KV (key/value heads), D (head dim), F (MLP width),
// V (vocab), N (rows = B*T). Backward kernels say whether they overwrite or accumulate (+=):
// parameter gradients always accumulate (gradient accumulation across micro-batches);
// input gradients overwrite unless the comment says +=.
// Storage type S is float or bf16 (bf16 storage, fp32 arithmetic: every value is widened on
// load and rounded once on store, as a GPU kernel does). Parameter gradients, norm statistics
// and losses are always fp32. GEMMs (OpenBLAS) are fp32 only; the CPU backend widens bf16
// operands for them.
// Parallel loops use static OpenMP schedules and fixed-order reductions, so results are
// bitwise reproducible for a given thread count.
#pragma once
#include <cstdint>

#include "kernels/attention_block.h"
#include "runtime/tensor.h"

namespace loom::cpu {

// GEMM layouts of a weight: out_in is nn.Linear's [N_out, K_in]; in_out is GPT-2's Conv1D.
enum class WLayout { out_in, in_out };

inline float ld(float x) {
  return x;
}
inline float ld(bf16 x) {
  return bf16_to_f32(x.bits);
}
inline void st(float& d, float v) {
  d = v;
}
inline void st(bf16& d, float v) {
  d.bits = f32_to_bf16(v);
}

// defines: gemm, matmul_forward, matmul_backward (fp32)
// C[M,N] = alpha * op(A) @ op(B) + beta * C, row-major, through OpenBLAS.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc);
// out[M,N] = inp[M,K] @ W + bias (bias may be null).
void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int M, int K, int N,
                    WLayout layout);
// dinp[M,K] overwritten; dw and dbias accumulate (each skipped if null).
void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w, int M,
                     int K, int N, WLayout layout);
// dbias[N] += column sums of dout[M, N], threads owning column ranges.
void bias_backward(float* dbias, const float* dout, int M, int N);

// defines: layernorm_forward, layernorm_backward, rmsnorm_forward, rmsnorm_backward
// Forward: with add not null, inp += add first, in place (the residual add fused into the
// norm that follows it), and the norm reads the stored sum.
template <class S>
void layernorm_forward(S* out, float* mean, float* rstd, S* inp, const S* add, const S* weight, const S* bias, int N,
                       int C, float eps);
// dinp += ; dweight, dbias += (either side may be null: a split backward asks for one)
template <class S>
void layernorm_backward(S* dinp, float* dweight, float* dbias, const S* dout, const S* inp, const S* weight,
                        const float* mean, const float* rstd, int N, int C);
template <class S>
void rmsnorm_forward(S* out, float* rstd, S* inp, const S* add, const S* weight, int N, int C, float eps);
// dinp += ; dweight += (either may be null)
template <class S>
void rmsnorm_backward(S* dinp, float* dweight, const S* dout, const S* inp, const S* weight, const float* rstd, int N,
                      int C);

// defines: rope_table, rope_forward, rope_backward
// cos/sin table [T, D/2], computed as Hugging Face does in fp32.
void rope_table(float* cos, float* sin, int T, int D, float theta);
// Rotates the q and k parts of qkv [B,T,(H+2KV)*D] in place (rotate-half form), token (b,t)
// by the angle of pos[b,t] (null: t).
template <class S>
void rope_forward(S* qkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D,
                  const int32_t* pos = nullptr);
// The inverse rotation of the q and k gradients, in place.
template <class S>
void rope_backward(S* dqkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D,
                   const int32_t* pos = nullptr);

// defines: attention_forward, attention_backward
// Causal attention with grouped-query heads over packed qkv [B,T,(H+2KV)*D]:
// q heads first, then KV k heads, then KV v heads; query head h reads kv head h/(H/KV).
// out [B,T,H*D]; probs [B,H,T,T] keeps the softmax (the O(T^2) design: see attention.cpp).
// The shapes and data.doc_mask's positions are an AttentionShape (kernels/attention_block.h).
// Backward reads the masked probabilities and needs no mask of its own (it ignores shape.pos).
template <class S>
void attention_forward(S* out, S* probs, const S* qkv, const AttentionShape& shape);
// dqkv overwritten.
template <class S>
void attention_backward(S* dqkv, const S* dout, const S* qkv, const S* probs, const AttentionShape& shape);

// defines: attention_kv_extract, attention_block_scratch, attention_block_forward, attention_block_finish,
// attention_block_delta, attention_block_backward, attention_block_grads_store
// Context parallel (model/context_parallel.h): this rank's queries, rows of qkv
// [B,Tq,(H+2KV)*D], attend to keys and values that arrive in blocks, kv [B,Tk,2*KV*D] (k heads,
// then v heads); the shapes and the mask's positions (host memory) are an AttentionBlockShape
// (kernels/attention_block.h). Blocks may come in any order.
// kv_extract: a rank's own block, kv [B,T,2*KV*D] from its qkv.
template <class S>
void attention_kv_extract(S* kv, const S* qkv, int B, int T, int H, int KV, int D);
// The scores scratch the block kernels work in, f32 elements: one pair of runs' P per (b, head)
// forward, its P and dS per (b, kv head) backward.
int64_t attention_block_scratch(int B, int Tq, int Tk, int H, int KV);
// Merges one block into the running output acc f32 [B,Tq,H*D] and the running max and sum
// ml f32 [B,H,Tq,2] (online softmax); `first` starts them.
template <class S>
void attention_block_forward(float* acc, float* ml, const S* qkv, const S* kv, const AttentionBlockShape& shape,
                             bool first, float* scratch);
// out [B,Tq,H*D] = acc / sum; lse f32 [B,H,Tq] = max + log(sum).
template <class S>
void attention_block_finish(S* out, float* lse, const float* acc, const float* ml, int B, int Tq, int H, int D);
// delta f32 [B,H,Tq] = rowsum(dout * out) per head: what every block's backward subtracts.
template <class S>
void attention_block_delta(float* delta, const S* dout, const S* out, int B, int Tq, int H, int D);
// One block's backward from P recomputed by the lse: dq f32 [B,Tq,H*D] +=, dkv f32 [B,Tk,2*KV*D] +=.
template <class S>
void attention_block_backward(float* dq, float* dkv, const S* dout, const S* qkv, const S* kv, const float* lse,
                              const float* delta, const AttentionBlockShape& shape, float* scratch);
// dqkv [B,T,(H+2KV)*D] (overwritten) from dq f32 [B,T,H*D] and this rank's dkv f32 [B,T,2*KV*D].
template <class S>
void attention_block_grads_store(S* dqkv, const float* dq, const float* dkv, int B, int T, int H, int KV, int D);

// defines: gelu_forward, gelu_backward, swiglu_forward, swiglu_backward, add_inplace
template <class S>
void gelu_forward(S* out, const S* inp, int64_t n);  // tanh approximation
template <class S>
void gelu_backward(S* dinp, const S* inp, const S* dout, int64_t n);
// out[N,F] = silu(inp[:, :F]) * inp[:, F:]; inp is [N, 2F] with gate first, then up.
template <class S>
void swiglu_forward(S* out, const S* inp, int N, int F);
template <class S>
void swiglu_backward(S* dinp, const S* inp, const S* dout, int N, int F);
void add_inplace(float* acc, const float* x, int64_t n);  // acc += x

// defines: crossentropy_forward_backward
// Fused softmax cross-entropy over logits [N,V]; only the first `valid` columns are the
// vocabulary (the rest is padding, left out of the softmax, with gradient 0). Writes each
// row's loss into losses[N]. If dloss != 0, logits are overwritten with their gradient:
// (softmax - onehot) * dloss.
template <class S>
void crossentropy_forward_backward(S* logits, float* losses, const int32_t* targets, int N, int V, int valid,
                                   float dloss);

// defines: embedding_forward, embedding_backward
// out[b,t] = wte[tok[b,t]] + wpe[pos[b,t]]. Rows of wte cover token ids [v0, v0 + Vl) (the
// whole vocabulary on one rank; a vocab-parallel shard otherwise); other tokens contribute
// zeros. wpe may be null (llama; or every tensor-parallel rank but one). pos [B,T]: each
// token's position in its document (data.doc_mask); null: t.
template <class S>
void embedding_forward(S* out, const int32_t* tokens, const S* wte, int v0, int Vl, const S* wpe, int B, int T, int C,
                       const int32_t* pos = nullptr);
// dwte, dwpe +=; dwpe may be null.
template <class S>
void embedding_backward(float* dwte, int v0, int Vl, float* dwpe, const S* dout, const int32_t* tokens, int B, int T,
                        int C, const int32_t* pos = nullptr);

// defines: crossentropy_shard_stats, crossentropy_shard_sumexp, crossentropy_shard_finish
// Vocab-parallel cross-entropy over logits [N, Vl] holding ids [v0, v0 + Vl), of which the
// first `valid` are real (the rest is padding). The caller reduces between the phases: max of
// rowmax, then sum of sumexp and of target_logit.
template <class S>
void crossentropy_shard_stats(const S* logits, const int32_t* targets, int N, int Vl, int valid, int v0, float* rowmax,
                              float* target_logit);
template <class S>
void crossentropy_shard_sumexp(const S* logits, const float* rowmax, int N, int Vl, int valid, float* sumexp);
// losses = log(sumexp) + rowmax - target_logit; with dloss != 0, logits become their gradient.
template <class S>
void crossentropy_shard_finish(S* logits, float* losses, const int32_t* targets, int N, int Vl, int valid, int v0,
                               const float* rowmax, const float* sumexp, const float* target_logit, float dloss);

// defines: sum_squares, widen, narrow
// Sum of squares in double, fixed-order.
double sum_squares(const float* x, int64_t n);
// bf16 <-> fp32 (narrow rounds to nearest even).
void widen(float* out, const bf16* in, int64_t n);
void narrow(bf16* out, const float* in, int64_t n);

// defines: moe_route, moe_plan, moe_ep_maps, moe_gather, moe_combine, moe_combine_backward,
// moe_scatter_add, moe_router_backward, column_sums, moe_stats_add, moe_aux_grad
// (kernels/cpu/moe.cpp)
// Mixture of experts over N tokens, E experts, top k. A token's k choices are its
// assignments; row_of[t*k + j] is the row of assignment j in the expert-sorted buffer (-1:
// dropped by capacity), token_of_row[r] the token of row r.
// probs [N,E] = softmax(logits); idx [N,k]: the k largest, descending (ties: the lower id);
// w [N,k]: their probabilities over their sum (Mixtral's renormalization).
template <class S>
void moe_route(float* probs, int32_t* idx, float* w, const S* logits, int N, int E, int k);
// The routing plan of the A = N*k assignments in idx [N,k]: each expert takes its assignments
// in token order, at most `cap` of them; the rest are dropped. counts [2E] (overwritten):
// assignments routed to each expert, then those kept. Expert e's rows are [start_e, start_e +
// kept_e) of the expert-sorted buffer of `rows` rows: start_e = e * slot (slot > 0: the padded
// layout, every shape fixed, cap <= slot), or the kept rows of the experts before e (slot = 0:
// compact). row_of [A]: each assignment's row, -1 if dropped; token_of [rows]: each row's
// token, -1 for rows no assignment took.
void moe_plan(int32_t* row_of, int32_t* token_of, int32_t* counts, const int32_t* idx, int N, int E, int k, int cap,
              int slot, int rows);
// Expert parallelism over P ranks of El experts: received rows come source-major (rank r's rows
// for its experts j = 0..El-1 in turn), the experts compute on them expert-major (expert j's
// rows from rank 0, 1, ... in turn). from [P*El]: rows from rank r for expert j, or null for the
// padded layout (`slot` rows each). map_in[q]: the received row of expert-major row q;
// map_out[p]: the expert-major row of received row p (overwritten, one per received row).
void moe_ep_maps(int32_t* map_in, int32_t* map_out, const int32_t* from, int P, int El, int slot);
// rows[r] = x[token_of_row[r]] (zeros where token_of_row[r] < 0), rows [R, C] overwritten.
template <class S>
void moe_gather(S* rows, const S* x, const int32_t* token_of_row, int R, int C);
// out[t] = sum_j w[t,j] * rows[row_of[t,j]] over kept assignments (zero if none), overwrite.
template <class S>
void moe_combine(S* out, const S* rows, const int32_t* row_of, const float* w, int N, int k, int C);
// drows[row_of[t,j]] = w[t,j] * dout[t] (overwrite); dw[t,j] = dout[t] . rows[row_of[t,j]]
// (0 if dropped), overwrite.
template <class S>
void moe_combine_backward(S* drows, float* dw, const S* dout, const S* rows, const int32_t* row_of, const float* w,
                          int N, int k, int C);
// dx[t] += sum_j drows[row_of[t,j]] over kept assignments.
template <class S>
void moe_scatter_add(S* dx, const S* drows, const int32_t* row_of, int N, int k, int C);
// dlogits [N,E] (overwrite) from dw [N,k] through the renormalization and the softmax, plus
// aux_g[e] (d objective / d probs[t,e], the same for every token: the load-balancing loss).
template <class S>
void moe_router_backward(S* dlogits, const float* probs, const int32_t* idx, const float* w, const float* dw,
                         const float* aux_g, int N, int E, int k);
// out[e] = sum_t probs[t,e] (fixed order), overwrite.
void column_sums(float* out, const float* probs, int N, int E);
// A layer's statistics from moe_plan's counts and the probabilities' column sums, added into
// st[0, moe_row::kStats) (kernels/moe_row.h says what each holds).
void moe_stats_add(double* st, const int32_t* counts, const float* prob_sums, int N, int E, int k);
// g[e] = scale * f_e (overwrite): the load-balancing loss's gradient per expert probability.
void moe_aux_grad(float* g, const int32_t* counts, double scale, int N, int E, int k);

}  // namespace loom::cpu
