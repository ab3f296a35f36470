// A device backend: the ops the decoder is written in, and the device memory ops that parallel
// code, the optimizer and the trainer use. The decoder is written once (model/decoder_part.cpp) over
// this interface; backends are CPU (fp32, or bf16 storage with fp32 arithmetic) and CUDA (bf16
// with fp32 accumulation). Ops have the same shapes and the same overwrite / += semantics on
// every backend (kernels/ops.h documents them); a backend may fuse (the residual add into the
// norm, GELU's backward into a GEMM epilogue) where its results stay bitwise reproducible.
// Every op is issued in order on the backend's stream; nothing here waits for the host except
// download() and upload().
// Tensors in the compute dtype (activations, weights) travel as Ptr; gradients, norm
// statistics and losses are fp32 (float*), scalars that reduce across ranks fp64 (double*).
#pragma once
#include <cstdint>
#include <memory>

#include "kernels/ops.h"
#include "model/layout.h"
#include "runtime/allocator.h"
#include "runtime/comm/process_group.h"
#include "runtime/device.h"

namespace loom {

using cpu::WLayout;

// An element pointer into a buffer of the compute dtype.
struct Ptr {
  char* p = nullptr;
  int es = 4;  // element size: 4 (fp32) or 2 (bf16)
  Ptr() = default;
  Ptr(void* q, int element_size) : p(static_cast<char*>(q)), es(element_size) {}
  Ptr operator+(int64_t i) const { return p ? Ptr(p + i * es, es) : *this; }
  explicit operator bool() const { return p != nullptr; }
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(p);
  }
};
inline Ptr ptr_of(const Tensor& t) {
  return t.defined() ? Ptr(t.data<char>(), int(dtype_size(t.dtype))) : Ptr();
}

// A micro-batch's token ids where the backend reads them (its device).
struct Inputs {
  const int32_t* tokens = nullptr;     // [N]
  const int32_t* targets = nullptr;    // [N]
  const int32_t* index = nullptr;      // CUDA: the token index the embedding gradient walks
  int unique = 0;                      // distinct token ids in the index
  const int32_t* pos = nullptr;        // [N] each token's position in its document (data.doc_mask, cp or not),
                                       // else in the whole sequence under cp
  const int32_t* pos_index = nullptr;  // CUDA, pos set: the rows at each position (cuda::position_index)
  int pos_range = 0;                   // CUDA, pos set: positions lie in [0, pos_range)
};

// One piece of the optimizer's work, at most kOptChunk elements of one tensor: its place in
// the optimizer state (master weights and moments), in the parameter buffer and in the
// gradient buffer; whether it decays and whether it counts in the gradient norm on this rank.
struct OptChunk {
  int64_t state, param, grad;
  int32_t n;
  int16_t decay, norm;
};
constexpr int kOptChunk = 8192;
// The chunk table, on the host and (CUDA) on the device; one table drives AdamW and the norm.
struct OptTable {
  std::vector<OptChunk> host;
  Tensor device;  // i32 elements holding the table (CUDA; empty on the CPU)
};
struct AdamScalars {
  float lr_step, bc2_sqrt, beta1, beta2, eps, decay_factor;
};

// Run g's rows in a ragged layout (Backend::linear_forward_ragged), from counts in host memory.
inline int64_t ragged_rows(const int32_t* counts, int sources, int G, int g) {
  int64_t n = 0;
  for (int s = 0; s < sources; ++s) n += counts[s * G + g];
  return n;
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const BackendTraits& traits() const = 0;
  DeviceKind device() const { return traits().device; }
  DType dtype() const { return traits().dtype; }
  int es() const { return int(dtype_size(dtype())); }
  virtual const Stream& stream() const = 0;
  virtual Allocator& alloc() = 0;

  // Memory. copy converts between f32 and bf16 where the dtypes differ (same count).
  virtual void copy(Buf dst, Buf src) = 0;
  virtual void zero(Buf b) = 0;
  virtual void add(Buf acc, Buf x) = 0;                // acc += x, both fp32
  virtual void upload(Buf dst, const void* host) = 0;  // host values of dst's dtype
  virtual void download(void* host, Buf src) = 0;      // waits for the stream
  // A micro-batch's inputs staged where the ops read them, valid until two more have been
  // staged (a micro-batch's forward and backward run before the one after next is staged);
  // v0, Vl: the vocabulary rows this rank holds (the embedding gradient's index covers those);
  // pos: each token's position in its document (data.doc_mask, with or without cp), else in the
  // whole sequence (cp), or null; T: the sequence length (positions lie below it).
  virtual Inputs stage_inputs(const int32_t* tokens, const int32_t* targets, const int32_t* pos, int N, int T, int v0,
                              int Vl) = 0;

  // Optimizer. out[kExactDigits]: the exact sum (runtime/exact_sum.h) of the squares of the
  // chunks with norm set, as digits: each chunk's sum in a fixed order, the chunks' sums
  // exactly, so the result does not depend on the table's order or on how the chunks are spread
  // over ranks (their digits are summed across ranks). NaN digits where a square is not finite.
  virtual void grad_sum_squares(double* out, const float* grads, const OptTable& t) = 0;
  // *scale = clip_coef(sqrt(the sum), max_norm), from the digits of an exact sum.
  virtual void clip_scale(float* scale, const double* sum_squares, double max_norm) = 0;
  // One AdamW step over the table, gradients times *grad_scale. master null: the fp32 params
  // are the master weights; else master is updated and params get its bf16 rounding.
  virtual void adamw(float* master, Ptr params, const float* grads, float* m, float* v, const OptTable& t,
                     const AdamScalars& a, const float* grad_scale) = 0;
  // acc[kExactDigits] (exact digits, runtime/exact_digits.h) += the sum of losses[N], the sum
  // taken in double in a fixed order: the micro-batch's loss, whatever rank computed it.
  virtual void loss_accumulate(double* acc, const float* losses, int N) = 0;

  // The decoder's ops (kernels/ops.h gives each one's semantics).
  virtual void embedding_forward(Ptr out, const Inputs& in, Ptr wte, int v0, int Vl, Ptr wpe, int B, int T, int C) = 0;
  virtual void embedding_backward(float* dwte, float* dwpe, Ptr dout, const Inputs& in, int v0, int Vl, int B, int T,
                                  int C) = 0;
  // rms: RMSNorm (no mean, no bias); else LayerNorm. inout += add first when add is set.
  virtual void norm_forward(bool rms, Ptr out, float* mean, float* rstd, Ptr inout, Ptr add, Ptr w, Ptr b, int N, int C,
                            float eps) = 0;
  virtual void norm_backward(bool rms, Ptr dinp, float* dw, float* db, Ptr dout, Ptr inp, Ptr w, const float* mean,
                             const float* rstd, int N, int C) = 0;
  virtual void add_act(Ptr inout, Ptr x, int64_t n) = 0;  // inout += x in the compute dtype
  // out[M,N] = inp[M,K] @ W (+ bias).
  virtual void linear_forward(Ptr out, Ptr inp, Ptr w, Ptr bias, int M, int K, int N, WLayout layout) = 0;
  // dinp overwritten (if set); dw, dbias (if set) +=.
  virtual void linear_backward(Ptr dinp, float* dw, float* dbias, Ptr dout, Ptr inp, Ptr w, int M, int K, int N,
                               WLayout layout) = 0;
  // G linears of one shape over consecutive row blocks (a MoE layer's experts): block g is
  // inp + g*M*K -> out + g*M*N through the weights at w + g*w_stride (their gradients at dw +
  // g*w_stride). One call per GEMM where the device batches them; here, one linear per block.
  virtual void linear_forward_grouped(Ptr out, Ptr inp, Ptr w, int G, int64_t w_stride, int M, int K, int N,
                                      WLayout layout) {
    for (int g = 0; g < G; ++g)
      linear_forward(out + int64_t(g) * M * N, inp + int64_t(g) * M * K, w + g * w_stride, Ptr(), M, K, N, layout);
  }
  virtual void linear_backward_grouped(Ptr dinp, float* dw, Ptr dout, Ptr inp, Ptr w, int G, int64_t w_stride, int M,
                                       int K, int N, WLayout layout) {
    for (int g = 0; g < G; ++g)
      linear_backward(dinp + int64_t(g) * M * K, dw ? dw + g * w_stride : nullptr, nullptr, dout + int64_t(g) * M * N,
                      inp + int64_t(g) * M * K, w + g * w_stride, M, K, N, layout);
  }
  // G linears over runs of rows whose lengths stay on the device (a dropless MoE layer's
  // experts): run g is the next sum_s counts[s * G + g] rows of R in all (`sources` tables of G
  // counts, on the backend's device), through the out_in weights at w + g*w_stride (their
  // gradients at dw + g*w_stride). Nothing waits for the host.
  virtual void linear_forward_ragged(Ptr out, Ptr inp, Ptr w, int G, int64_t w_stride, const int32_t* counts,
                                     int sources, int64_t R, int K, int N) = 0;
  virtual void linear_backward_ragged(Ptr dinp, float* dw, Ptr dout, Ptr inp, Ptr w, int G, int64_t w_stride,
                                      const int32_t* counts, int sources, int64_t R, int K, int N) = 0;
  // swiglu: act[N,F] = silu(fc[:, :F]) * fc[:, F:]; else act = gelu(fc), fc [N, F].
  virtual void act_forward(bool swiglu, Ptr act, Ptr fc, int N, int F) = 0;
  virtual void act_backward(bool swiglu, Ptr dfc, Ptr fc, Ptr dact, int N, int F) = 0;
  // The down projection's backward and the activation's: dfc (overwritten), dw/db +=, through
  // dact (scratch [N, F], unused where the backend fuses the two).
  virtual void down_act_backward(bool swiglu, Ptr dfc, float* dw, float* db, Ptr dout, Ptr act, Ptr fc, Ptr w, Ptr dact,
                                 int N, int F, int C, WLayout layout) {
    linear_backward(dact, dw, db, dout, act, w, N, F, C, layout);
    act_backward(swiglu, dfc, fc, dact, N, F);
  }
  // pos: as Inputs::pos (null: each token's index in its sequence).
  virtual void rope(bool inverse, Ptr qkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D,
                    const int32_t* pos) = 0;
  // The whole sequence's attention (kernels/attention_block.h's AttentionShape; shape.pos as
  // Inputs::pos). stats: traits().attention_stats elements of attention_stats_dtype().
  virtual void attention_forward(Ptr out, Ptr stats, Ptr qkv, const AttentionShape& shape) = 0;
  // dqkv overwritten; scratch: B*H*T floats where the plan has them; shape as forward's.
  virtual void attention_backward(Ptr dqkv, Ptr dout, Ptr out, Ptr qkv, Ptr stats, float* scratch,
                                  const AttentionShape& shape) = 0;
  // Context parallel's attention over blocks of keys (kernels/ops.h, attention_block_*), qpos
  // and kpos where the kernels read them: rows of cp_position_table(), or host memory where
  // that is null (the CPU).
  virtual const int32_t* cp_position_table() const { return nullptr; }  // [cp, T / cp]
  virtual void attention_kv_extract(Ptr kv, Ptr qkv, int B, int T, int H, int KV, int D) = 0;
  // scratch: attention_block_scratch(B, Tq, Tk, H, KV) floats where the plan has them (the CPU).
  // shape.qdoc: data.doc_mask's positions of the queries in their documents [B, Tq], or null.
  virtual void attention_block_forward(float* acc, float* ml, Ptr qkv, Ptr kv, const AttentionBlockShape& shape,
                                       bool first, float* scratch) = 0;
  virtual void attention_block_finish(Ptr out, float* lse, const float* acc, const float* ml, int B, int Tq, int H,
                                      int D) = 0;
  virtual void attention_block_delta(float* delta, Ptr dout, Ptr out, int B, int Tq, int H, int D) = 0;
  virtual void attention_block_backward(float* dq, float* dkv, Ptr dout, Ptr qkv, Ptr kv, const float* lse,
                                        const float* delta, const AttentionBlockShape& shape, float* scratch) = 0;
  virtual void attention_block_grads_store(Ptr dqkv, const float* dq, const float* dkv, int B, int T, int H, int KV,
                                           int D) = 0;
  virtual void crossentropy(Ptr logits, float* losses, const Inputs& in, int N, int V, int valid, float dloss) = 0;
  // Mixture of experts (kernels/ops.h, moe_*): index arrays are i32 on the backend's device.
  virtual void moe_route(float* probs, int32_t* idx, float* w, Ptr logits, int N, int E, int k) = 0;
  // The plan's scratch: moe_row::plan_scratch_ints(N * k, E) int32 (the CPU needs none).
  virtual void moe_plan(int32_t* row_of, int32_t* token_of, int32_t* counts, const int32_t* idx, int N, int E, int k,
                        int cap, int slot, int rows, int32_t* scratch) = 0;
  virtual void moe_ep_maps(int32_t* map_in, int32_t* map_out, const int32_t* from, int P, int El, int slot) = 0;
  virtual void moe_stats_add(double* st, const int32_t* counts, const float* prob_sums, int N, int E, int k) = 0;
  virtual void moe_aux_grad(float* g, const int32_t* counts, double scale, int N, int E, int k) = 0;
  virtual void moe_gather(Ptr rows, Ptr x, const int32_t* token_of_row, int R, int C) = 0;
  virtual void moe_combine(Ptr out, Ptr rows, const int32_t* row_of, const float* w, int N, int k, int C) = 0;
  virtual void moe_combine_backward(Ptr drows, float* dw, Ptr dout, Ptr rows, const int32_t* row_of, const float* w,
                                    int N, int k, int C) = 0;
  virtual void moe_scatter_add(Ptr dx, Ptr drows, const int32_t* row_of, int N, int k, int C) = 0;
  virtual void moe_router_backward(Ptr dlogits, const float* probs, const int32_t* idx, const float* w, const float* dw,
                                   const float* aux_g, int N, int E, int k) = 0;
  virtual void column_sums(float* out, const float* probs, int N, int E) = 0;
  virtual void ce_stats(Ptr logits, const Inputs& in, int N, int Vl, int valid, int v0, float* rowmax,
                        float* target) = 0;
  virtual void ce_sumexp(Ptr logits, const float* rowmax, int N, int Vl, int valid, float* sumexp) = 0;
  virtual void ce_finish(Ptr logits, float* losses, const Inputs& in, int N, int Vl, int valid, int v0,
                         const float* rowmax, const float* sumexp, const float* target, float dloss) = 0;
};

// The CPU backend for dims's shapes (dtype f32 or bf16), over `alloc`.
std::unique_ptr<Backend> cpu_backend(const ModelDims& dims, DType dtype, Allocator& alloc);
// Its working memory (the fp32 widening of bf16 GEMM operands), for the planner.
std::vector<PlanItem> cpu_backend_plan(const ModelDims& dims, DType dtype);
// The CUDA backend on the emulated device (kernels/emu; every build): the same source and
// kernels as cuda_backend, over an allocator and stream of DeviceKind::cuda_emulated.
std::unique_ptr<Backend> cuda_emulated_backend(const ModelDims& dims, Allocator& alloc);
#if LOOM_HAVE_CUDA
// The CUDA backend (bf16) on the current device, over `alloc` (whose stream it computes on).
std::unique_ptr<Backend> cuda_backend(const ModelDims& dims, Allocator& alloc);
#endif
// The CUDA backend's working memory (GEMM workspace, staged inputs, norm scratch).
std::vector<PlanItem> cuda_backend_plan(const ModelDims& dims);
// bf16 elements of the flash backward's stored dS in that plan ("attention_ds"): 0 where dQ
// recomputes (kernels/flash_ds.h's shapes, cp, or dims.attention_ds cleared).
int64_t attention_ds_elems(const ModelDims& dims);
// Slots of staged inputs: one per micro-batch of a step (2 to 64), so a step's uploads never
// wait for an earlier one's (the step's end synchronizes the stream anyway).
int cuda_input_slots(const ModelDims& dims);

}  // namespace loom
