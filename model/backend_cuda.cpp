// The CUDA backend: the kernels of kernels/cuda on one compute stream, in bf16 with fp32
// accumulation. It keeps what makes the GPU path fast: cuBLASLt GEMMs with the bias (and
// GELU's backward) in their epilogues, weight gradients written by the GEMMs straight into the
// fp32 main gradients, tensor-core flash attention, the residual add fused into the norms, a
// one-pass fused loss, a multi-tensor AdamW over the chunk table, and no host wait inside a
// step: inputs go up through pinned staging (a slot per micro-batch), and the loss, the norm
// and the clipping factor stay on the device until the trainer reads them once per step.
// The emulation library compiles this same file against kernels/emu (LOOM_CUDA_EMULATION):
// the emulated device's backend, whose kernels, cuBLASLt and streams run on the CPU.
#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include <cstring>

#include "kernels/cuda/gemm_plan.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/flash_ds.h"
#include "model/backend.h"
#include "model/context_parallel.h"
#include "runtime/cuda_api.h"
#include "runtime/cuda_check.h"

namespace loom {

namespace {

using cuda::bf16;
#if defined(LOOM_CUDA_EMULATION)
constexpr DeviceKind kDevice = DeviceKind::cuda_emulated;
#else
constexpr DeviceKind kDevice = DeviceKind::cuda;
#endif

bf16* B16(Ptr p) {
  return p.as<bf16>();
}
const cuda::OptChunkDev* table_of(const OptTable& t) {
  static_assert(sizeof(cuda::OptChunkDev) == sizeof(OptChunk));
  return reinterpret_cast<const cuda::OptChunkDev*>(t.device.data<int32_t>());
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(const ModelDims& dims, Allocator& alloc)
      : traits_(backend_traits(kDevice, DType::bf16, dims)),
        alloc_(alloc),
        stream_(alloc.stream()),
        s_(static_cast<cudaStream_t>(stream_.handle)) {
    LOOM_CHECK(alloc.device() == kDevice && stream_.kind == kDevice,
               "the {} backend needs an allocator and a stream of its device", cuda_api(kDevice).name);
    for (auto& item : cuda_backend_plan(dims)) ws_.push_back(alloc.empty(item));
    ds_left_out_ = !dims.attention_ds;
    gemm_ = std::make_unique<cuda::GemmContext>(ws_[0].data<char>(), ws_[0].nbytes());
    N_ = dims.B * dims.T_local();
    staged_.resize(size_t(cuda_input_slots(dims)));
    slot_elems_ = ws_[1].numel() / int64_t(staged_.size());
    LOOM_CUDA_CHECK(cudaMallocHost(&staging_, size_t(ws_[1].numel()) * 4));
    for (Staged& st : staged_) LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&st.done, cudaEventDisableTiming));
    if (const int cp = dims.cp; cp > 1) {  // the block kernels' masks, uploaded once
      std::vector<int32_t> table;
      for (int r = 0; r < cp; ++r) {
        const std::vector<int32_t> p = cp_positions(dims.T, cp, r);
        table.insert(table.end(), p.begin(), p.end());
      }
      LOOM_CHECK(int64_t(table.size()) == ws_[4].numel(), "cp_positions planned {} words, {} needed", ws_[4].numel(),
                 table.size());
      upload(Buf(ws_[4]), table.data());  // on the stream: after the allocator's zeroing, queued there
    }
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(s_);
    if (staging_) cudaFreeHost(staging_);
    for (Staged& st : staged_)
      if (st.done) cudaEventDestroy(st.done);
  }
  const BackendTraits& traits() const override { return traits_; }
  const Stream& stream() const override { return stream_; }
  Allocator& alloc() override { return alloc_; }

  void copy(Buf dst, Buf src) override {
    LOOM_ASSERT(dst.count == src.count);
    if (dst.dtype == src.dtype) {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDefault, s_));
    } else if (dst.dtype == DType::bf16 && src.dtype == DType::f32) {
      cuda::to_bf16(static_cast<bf16*>(dst.data), static_cast<const float*>(src.data), dst.count, s_, &scalar_paths_);
    } else {
      LOOM_ASSERT(dst.dtype == DType::f32 && src.dtype == DType::bf16);
      cuda::to_f32(static_cast<float*>(dst.data), static_cast<const bf16*>(src.data), dst.count, s_, &scalar_paths_);
    }
  }
  void zero(Buf b) override { LOOM_CUDA_CHECK(cudaMemsetAsync(b.data, 0, b.bytes(), s_)); }
  void add(Buf acc, Buf x) override {
    LOOM_ASSERT(acc.dtype == DType::f32 && x.dtype == DType::f32 && acc.count == x.count);
    cuda::add_f32(static_cast<float*>(acc.data), static_cast<const float*>(x.data), acc.count, s_, &scalar_paths_);
  }
  void upload(Buf dst, const void* host) override {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(dst.data, host, dst.bytes(), cudaMemcpyHostToDevice, s_));
    synchronize();  // the host buffer may go away
  }
  void download(void* host, Buf src) override {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(host, src.data, src.bytes(), cudaMemcpyDeviceToHost, s_));
    synchronize();
  }
  // Micro-batches take the slots of pinned staging and device inputs in turn, one per
  // micro-batch of a step (cuda_input_slots). A slot is refilled once its last upload has left
  // the staging memory: known without asking when the stream was synchronized since (a step's
  // end reads the loss, so a step's uploads never wait), else waited for; a GPU has long passed
  // it. (The device slot is free by then too: the stream ran that micro-batch's backward
  // before this upload.)
  Inputs stage_inputs(const int32_t* tokens, const int32_t* targets, const int32_t* pos, int N, int T, int v0,
                      int Vl) override {
    LOOM_CHECK(N <= N_, "the CUDA backend stages micro-batches of up to {} tokens, not {}", N_, N);
    const int k = next_slot_;
    next_slot_ = (next_slot_ + 1) % int(staged_.size());
    if (staged_[size_t(k)].upload > synced_uploads_) LOOM_CUDA_CHECK(cudaEventSynchronize(staged_[size_t(k)].done));
    int unique = 0;
    const auto index = cuda::token_index(tokens, N, v0, Vl, &unique);
    int32_t* host = staging_ + k * slot_elems_;
    std::memcpy(host, tokens, size_t(N) * 4);
    std::memcpy(host + N, targets, size_t(N) * 4);
    std::memcpy(host + 2 * int64_t(N), index.data(), index.size() * 4);
    size_t used = 2 * size_t(N) + index.size();
    if (pos) {  // data.doc_mask or cp: the positions [N], then the rows at each position
      const auto by_pos = cuda::position_index(pos, N, T);
      std::memcpy(host + used, pos, size_t(N) * 4);
      std::memcpy(host + used + N, by_pos.data(), by_pos.size() * 4);
      used += size_t(N) + by_pos.size();
    }
    LOOM_CHECK(int64_t(used) <= slot_elems_, "staged inputs need {} words, a slot holds {}", used, slot_elems_);
    int32_t* dev = ws_[1].data<int32_t>() + k * slot_elems_;
    LOOM_CUDA_CHECK(cudaMemcpyAsync(dev, host, used * 4, cudaMemcpyHostToDevice, s_));
    LOOM_CUDA_CHECK(cudaEventRecord(staged_[size_t(k)].done, s_));
    staged_[size_t(k)].upload = ++uploads_;
    Inputs in{dev, dev + N, dev + 2 * int64_t(N), unique};
    if (pos) {
      in.pos = dev + 2 * int64_t(N) + int64_t(index.size());
      in.pos_index = in.pos + N;
      in.pos_range = T;
    }
    return in;
  }

  void grad_sum_squares(double* out, const float* grads, const OptTable& t) override {
    cuda::sum_squares_table(out, grads, table_of(t), int(t.host.size()), ws_[2].data<double>(), s_);
  }
  void clip_scale(float* scale, const double* sum_squares, double max_norm) override {
    cuda::grad_clip_scale(scale, sum_squares, max_norm, s_);
  }
  void adamw(float* master, Ptr params, const float* grads, float* m, float* v, const OptTable& t, const AdamScalars& a,
             const float* grad_scale) override {
    LOOM_ASSERT(master);  // bf16 weights: the fp32 master copy is always there
    cuda::adamw_multi(master, B16(params), grads, m, v, table_of(t), int(t.host.size()), a.lr_step, a.bc2_sqrt, a.beta1,
                      a.beta2, a.eps, a.decay_factor, grad_scale, s_);
  }
  void loss_accumulate(double* acc, const float* losses, int N) override { cuda::loss_accumulate(acc, losses, N, s_); }

  void embedding_forward(Ptr out, const Inputs& in, Ptr wte, int v0, int Vl, Ptr wpe, int B, int T, int C) override {
    cuda::embedding_forward(B16(out), in.tokens, B16(wte), v0, Vl, B16(wpe), B, T, C, in.pos, s_);
  }
  void embedding_backward(float* dwte, float* dwpe, Ptr dout, const Inputs& in, int, int, int B, int T,
                          int C) override {
    // By position (doc_mask, cp): every position the index covers, up to the sequence length.
    cuda::embedding_backward(dwte, dwpe, B16(dout), in.index, in.unique, B * T, B, in.pos_index ? in.pos_range : T, C,
                             in.pos_index, partials(B * T, C, cuda::embedding_partials_floats(C)), s_);
  }
  void norm_forward(bool rms, Ptr out, float* mean, float* rstd, Ptr inout, Ptr add, Ptr w, Ptr b, int N, int C,
                    float eps) override {
    if (rms)
      cuda::rmsnorm_forward(B16(out), rstd, B16(inout), B16(add), B16(w), N, C, eps, s_, &scalar_paths_);
    else
      cuda::layernorm_forward(B16(out), mean, rstd, B16(inout), B16(add), B16(w), B16(b), N, C, eps, s_,
                              &scalar_paths_);
  }
  void norm_backward(bool rms, Ptr dinp, float* dw, float* db, Ptr dout, Ptr inp, Ptr w, const float* mean,
                     const float* rstd, int N, int C) override {
    if (rms)
      cuda::rmsnorm_backward(B16(dinp), dw, B16(dout), B16(inp), B16(w), rstd, N, C, norm_partials(N, C), s_,
                             &scalar_paths_);
    else
      cuda::layernorm_backward(B16(dinp), dw, db, B16(dout), B16(inp), B16(w), mean, rstd, N, C, norm_partials(N, C),
                               s_, &scalar_paths_);
  }
  void add_act(Ptr inout, Ptr x, int64_t n) override { cuda::add_bf16(B16(inout), B16(x), n, s_, &scalar_paths_); }
  void linear_forward(Ptr out, Ptr inp, Ptr w, Ptr bias, int M, int K, int N, WLayout layout) override {
    if (layout == WLayout::out_in)
      cuda::gemm(*gemm_, false, true, M, N, K, B16(inp), K, B16(w), K, 0.0f, B16(out), N, B16(bias), s_);
    else
      cuda::gemm(*gemm_, false, false, M, N, K, B16(inp), K, B16(w), N, 0.0f, B16(out), N, B16(bias), s_);
  }
  void linear_backward(Ptr dinp, float* dw, float* dbias, Ptr dout, Ptr inp, Ptr w, int M, int K, int N,
                       WLayout layout) override {
    // With dW, dbias rides its GEMM: the epilogue writes dout's column sums (cuBLASLt's order,
    // fixed by the shape) into a scratch, added into dbias after (+=, as without it). Alone, a
    // pass of its own.
    // Where cuBLASLt has no algorithm for that epilogue, the plain GEMM and the pass, said once.
    float* bias_grad = dw && dbias ? partials(M, N) : nullptr;
    auto weight_grad = [&](int m, int n, const bf16* a, const bf16* b, cuda::BiasGradOf of) {
      if (bias_grad &&
          !cuda::gemm_f32out_bias_grad(*gemm_, true, false, m, n, M, a, m, b, n, 1.0f, dw, n, of, bias_grad, s_)) {
        if (!bias_pass_said_)
          spdlog::warn(
              "cuBLASLt has no bias-gradient epilogue for a {}x{}x{} weight gradient: the bias "
              "gradients are summed in a pass of their own (slower)",
              m, n, M);
        bias_pass_said_ = true;
        bias_grad = nullptr;
      }
      if (!bias_grad && dw) cuda::gemm_f32out(*gemm_, true, false, m, n, M, a, m, b, n, 1.0f, dw, n, s_);
    };
    if (layout == WLayout::out_in) {  // W [N, K]: dinp = dout W, dW += dout^T inp
      if (dinp) cuda::gemm(*gemm_, false, false, M, K, N, B16(dout), N, B16(w), K, 0.0f, B16(dinp), K, nullptr, s_);
      weight_grad(N, K, B16(dout), B16(inp), cuda::BiasGradOf::a);
    } else {  // W [K, N]: dinp = dout W^T, dW += inp^T dout
      if (dinp) cuda::gemm(*gemm_, false, true, M, K, N, B16(dout), N, B16(w), N, 0.0f, B16(dinp), K, nullptr, s_);
      weight_grad(K, N, B16(inp), B16(dout), cuda::BiasGradOf::b);
    }
    if (bias_grad)
      cuda::add_f32(dbias, bias_grad, N, s_, &scalar_paths_);
    else if (dbias)
      cuda::bias_backward(dbias, B16(dout), M, N, partials(M, N), s_, &scalar_paths_);
  }
  // The experts' GEMMs as strided batches: one cuBLASLt call per GEMM for every expert.
  void linear_forward_grouped(Ptr out, Ptr inp, Ptr w, int G, int64_t w_stride, int M, int K, int N,
                              WLayout layout) override {
    LOOM_ASSERT(layout == WLayout::out_in);
    cuda::gemm_batched(*gemm_, false, true, M, N, K, B16(inp), K, B16(w), K, 0.0f, B16(out), N,
                       {G, int64_t(M) * K, w_stride, int64_t(M) * N}, s_);
  }
  void linear_backward_grouped(Ptr dinp, float* dw, Ptr dout, Ptr inp, Ptr w, int G, int64_t w_stride, int M, int K,
                               int N, WLayout layout) override {
    LOOM_ASSERT(layout == WLayout::out_in);  // W [N, K]: dinp = dout W, dW += dout^T inp
    if (dinp)
      cuda::gemm_batched(*gemm_, false, false, M, K, N, B16(dout), N, B16(w), K, 0.0f, B16(dinp), K,
                         {G, int64_t(M) * N, w_stride, int64_t(M) * K}, s_);
    if (dw)
      cuda::gemm_batched_f32out(*gemm_, true, false, N, K, M, B16(dout), N, B16(inp), K, 1.0f, dw, K,
                                {G, int64_t(M) * N, int64_t(M) * K, w_stride}, s_);
  }
  // Sized on the device (kernels/cuda/gemm_ragged.cu): no wait for the counts.
  void linear_forward_ragged(Ptr out, Ptr inp, Ptr w, int G, int64_t w_stride, const int32_t* counts, int sources,
                             int64_t R, int K, int N) override {
    cuda::gemm_ragged_rows(B16(out), B16(inp), B16(w), w_stride, true, counts, sources, G, R, K, N, s_);
  }
  void linear_backward_ragged(Ptr dinp, float* dw, Ptr dout, Ptr inp, Ptr w, int G, int64_t w_stride,
                              const int32_t* counts, int sources, int64_t R, int K, int N) override {
    // W [N, K]: dinp = dout W, dW += dout^T inp
    if (dinp) cuda::gemm_ragged_rows(B16(dinp), B16(dout), B16(w), w_stride, false, counts, sources, G, R, N, K, s_);
    if (dw) cuda::gemm_ragged_wgrad(dw, B16(dout), B16(inp), w_stride, counts, sources, G, N, K, s_);
  }
  void act_forward(bool swiglu, Ptr act, Ptr fc, int N, int F) override {
    if (swiglu)
      cuda::swiglu_forward(B16(act), B16(fc), N, F, s_, &scalar_paths_);
    else
      cuda::gelu_forward(B16(act), B16(fc), int64_t(N) * F, s_, &scalar_paths_);
  }
  void act_backward(bool swiglu, Ptr dfc, Ptr fc, Ptr dact, int N, int F) override {
    if (swiglu)
      cuda::swiglu_backward(B16(dfc), B16(fc), B16(dact), N, F, s_, &scalar_paths_);
    else
      cuda::gelu_backward(B16(dfc), B16(fc), B16(dact), int64_t(N) * F, s_, &scalar_paths_);
  }
  // gpt2 with d_ff a multiple of 8 (cuBLASLt's aux stride): GELU's backward rides the epilogue
  // of the GEMM that makes its input gradient. Forward keeps GELU a kernel of its own:
  // selective recompute recomputes it, and that must match the first pass to the bit, which a
  // GEMM epilogue's GELU (on the fp32 accumulator) would not.
  void down_act_backward(bool swiglu, Ptr dfc, float* dw, float* db, Ptr dout, Ptr act, Ptr fc, Ptr w, Ptr dact, int N,
                         int F, int C, WLayout layout) override {
    if (swiglu || !traits_.fused_dgelu || layout != WLayout::in_out)
      return Backend::down_act_backward(swiglu, dfc, dw, db, dout, act, fc, w, dact, N, F, C, layout);
    linear_backward(Ptr(), dw, db, dout, act, w, N, F, C, layout);
    cuda::gemm_dgelu(*gemm_, false, true, N, F, C, B16(dout), C, B16(w), C, B16(dfc), F, B16(fc), s_);
  }
  void rope(bool inverse, Ptr qkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D,
            const int32_t* pos) override {
    if (inverse)
      cuda::rope_backward(B16(qkv), cos, sin, B, T, H, KV, D, pos, s_);
    else
      cuda::rope_forward(B16(qkv), cos, sin, B, T, H, KV, D, pos, s_);
  }
  void attention_forward(Ptr out, Ptr stats, Ptr qkv, const AttentionShape& a) override {
    cuda::attention_forward(B16(out), stats.as<float>(), B16(qkv), a.B, a.T, a.H, a.KV, a.D, a.pos, s_);
  }
  void attention_backward(Ptr dqkv, Ptr dout, Ptr out, Ptr qkv, Ptr stats, float* scratch,
                          const AttentionShape& a) override {
    // dQ from the dS dK/dV stores, where the plan holds it; else recomputed. Said once.
    const int64_t need = flash_ds_elems(a.B, a.T, a.H, a.D, a.pos != nullptr), have = ws_[5].numel();
    if (!ds_path_said_)
      spdlog::info("attention backward: {}", need > 0 && have >= need ? "dQ from the stored dS (dK/dV writes it)"
                                             : need > 0 && ds_left_out_
                                                 ? "dQ recomputes S and dP (the stored dS left out: no room for it)"
                                                 : "dQ recomputes S and dP (no stored dS at this shape)");
    ds_path_said_ = true;
    cuda::attention_backward(B16(dqkv), B16(dout), B16(out), B16(qkv), stats.as<float>(), scratch, a.B, a.T, a.H, a.KV,
                             a.D, a.pos, s_, have ? ws_[5].data<bf16>() : nullptr, have);
  }
  const int32_t* cp_position_table() const override {
    return ws_.size() > 4 && ws_[4].numel() ? ws_[4].data<int32_t>() : nullptr;
  }
  void attention_kv_extract(Ptr kv, Ptr qkv, int B, int T, int H, int KV, int D) override {
    cuda::attention_kv_extract(B16(kv), B16(qkv), B, T, H, KV, D, s_);
  }
  void attention_block_forward(float* acc, float* ml, Ptr qkv, Ptr kv, const AttentionBlockShape& shape, bool first,
                               float*) override {
    cuda::attention_block_forward(acc, ml, B16(qkv), B16(kv), shape, first, s_);
  }
  void attention_block_finish(Ptr out, float* lse, const float* acc, const float* ml, int B, int Tq, int H,
                              int D) override {
    cuda::attention_block_finish(B16(out), lse, acc, ml, B, Tq, H, D, s_);
  }
  void attention_block_delta(float* delta, Ptr dout, Ptr out, int B, int Tq, int H, int D) override {
    cuda::attention_block_delta(delta, B16(dout), B16(out), B, Tq, H, D, s_);
  }
  void attention_block_backward(float* dq, float* dkv, Ptr dout, Ptr qkv, Ptr kv, const float* lse, const float* delta,
                                const AttentionBlockShape& shape, float*) override {
    cuda::attention_block_backward(dq, dkv, B16(dout), B16(qkv), B16(kv), lse, delta, shape, s_);
  }
  void attention_block_grads_store(Ptr dqkv, const float* dq, const float* dkv, int B, int T, int H, int KV,
                                   int D) override {
    cuda::attention_block_grads_store(B16(dqkv), dq, dkv, B, T, H, KV, D, s_);
  }
  void moe_route(float* probs, int32_t* idx, float* w, Ptr logits, int N, int E, int k) override {
    cuda::moe_route(probs, idx, w, B16(logits), N, E, k, s_);
  }
  void moe_plan(int32_t* row_of, int32_t* token_of, int32_t* counts, const int32_t* idx, int N, int E, int k, int cap,
                int slot, int rows, int32_t* scratch) override {
    cuda::moe_plan(row_of, token_of, counts, idx, N, E, k, cap, slot, rows, scratch, s_);
  }
  void moe_ep_maps(int32_t* map_in, int32_t* map_out, const int32_t* from, int P, int El, int slot) override {
    cuda::moe_ep_maps(map_in, map_out, from, P, El, slot, s_);
  }
  void moe_stats_add(double* st, const int32_t* counts, const float* prob_sums, int N, int E, int k) override {
    cuda::moe_stats_add(st, counts, prob_sums, N, E, k, s_);
  }
  void moe_aux_grad(float* g, const int32_t* counts, double scale, int N, int E, int k) override {
    cuda::moe_aux_grad(g, counts, scale, N, E, k, s_);
  }
  void moe_gather(Ptr rows, Ptr x, const int32_t* token_of_row, int R, int C) override {
    cuda::moe_gather(B16(rows), B16(x), token_of_row, R, C, s_);
  }
  void moe_combine(Ptr out, Ptr rows, const int32_t* row_of, const float* w, int N, int k, int C) override {
    cuda::moe_combine(B16(out), B16(rows), row_of, w, N, k, C, s_);
  }
  void moe_combine_backward(Ptr drows, float* dw, Ptr dout, Ptr rows, const int32_t* row_of, const float* w, int N,
                            int k, int C) override {
    cuda::moe_combine_backward(B16(drows), dw, B16(dout), B16(rows), row_of, w, N, k, C, s_);
  }
  void moe_scatter_add(Ptr dx, Ptr drows, const int32_t* row_of, int N, int k, int C) override {
    cuda::moe_scatter_add(B16(dx), B16(drows), row_of, N, k, C, s_);
  }
  void moe_router_backward(Ptr dlogits, const float* probs, const int32_t* idx, const float* w, const float* dw,
                           const float* aux_g, int N, int E, int k) override {
    cuda::moe_router_backward(B16(dlogits), probs, idx, w, dw, aux_g, N, E, k, s_);
  }
  void column_sums(float* out, const float* probs, int N, int E) override {
    cuda::column_sums(out, probs, N, E, partials(N, E), s_);
  }
  void crossentropy(Ptr logits, float* losses, const Inputs& in, int N, int V, int valid, float dloss) override {
    cuda::crossentropy_forward_backward(B16(logits), losses, in.targets, N, V, valid, dloss, s_);
  }
  void ce_stats(Ptr logits, const Inputs& in, int N, int Vl, int valid, int v0, float* rowmax, float* target) override {
    cuda::crossentropy_shard_stats(B16(logits), in.targets, N, Vl, valid, v0, rowmax, target, s_);
  }
  void ce_sumexp(Ptr logits, const float* rowmax, int N, int Vl, int valid, float* sumexp) override {
    cuda::crossentropy_shard_sumexp(B16(logits), rowmax, N, Vl, valid, sumexp, s_);
  }
  void ce_finish(Ptr logits, float* losses, const Inputs& in, int N, int Vl, int valid, int v0, const float* rowmax,
                 const float* sumexp, const float* target, float dloss) override {
    cuda::crossentropy_shard_finish(B16(logits), losses, in.targets, N, Vl, valid, v0, rowmax, sumexp, target, dloss,
                                    s_);
  }

 private:
  BackendTraits traits_;
  Allocator& alloc_;
  Stream stream_;
  cudaStream_t s_;
  std::vector<Tensor> ws_;  // cuda_backend_plan: GEMM workspace, inputs, norm partials, column partials, cp positions,
                            // stored dS
  // The column sums' scratch (one stream: a call's stages finish before the next call's start).
  float* partials(int rows, int cols, int64_t floats = -1) {
    if (floats < 0) floats = cuda::column_partials_floats(rows, cols);
    LOOM_CHECK(floats <= ws_[3].numel(), "the CUDA backend planned {} floats of column partials; {} x {} needs {}",
               ws_[3].numel(), rows, cols, floats);
    return ws_[3].data<float>();
  }
  float* norm_partials(int rows, int cols) { return partials(rows, cols, cuda::norm_partials_floats(rows, cols)); }
  std::unique_ptr<cuda::GemmContext> gemm_;
  // A kernel's element-by-element path for a tensor off 16 bytes: a warning once per kernel and tensor.
  bool bias_pass_said_ = false;  // a bias-gradient epilogue refused, said once
  bool ds_path_said_ = false;    // which dQ the attention backward runs, said once
  bool ds_left_out_ = false;     // the plan left the stored dS out for the device's memory (set once)
  cuda::ScalarPathsOnce scalar_paths_{[](const std::string& line) { spdlog::warn("{}", line); }};
  int N_ = 0;
  // The host waits for the stream's work so far (and knows every upload issued has landed).
  void synchronize() {
    LOOM_CUDA_CHECK(cudaStreamSynchronize(s_));
    synced_uploads_ = uploads_;
  }
  // Pinned staging for the inputs, a slot per micro-batch of a step, so an upload does not wait
  // for the stream; slot k's `done` marks the end of its last upload, the `upload`-th issued.
  struct Staged {
    cudaEvent_t done = nullptr;
    int64_t upload = 0;
  };
  int32_t* staging_ = nullptr;
  int64_t slot_elems_ = 0;
  int next_slot_ = 0;
  std::vector<Staged> staged_;
  int64_t uploads_ = 0, synced_uploads_ = 0;  // uploads issued, and landed as of the last sync
};

}  // namespace

#if defined(LOOM_CUDA_EMULATION)
std::unique_ptr<Backend> cuda_emulated_backend(const ModelDims& dims, Allocator& alloc) {
  return std::make_unique<CudaBackend>(dims, alloc);
}
#else
std::unique_ptr<Backend> cuda_backend(const ModelDims& dims, Allocator& alloc) {
  return std::make_unique<CudaBackend>(dims, alloc);
}
#endif

}  // namespace loom
