#if LOOM_HAVE_CUDA
#include "model/model_cuda.h"

#include <cmath>
#include <cstring>

#include "kernels/cuda/check.h"
#include "kernels/ops.h"

namespace loom {

using cuda::bf16;

struct CudaModel::Impl {
  Config cfg;
  bool llama;
  Recompute policy;
  // gpt2 with d_ff a multiple of 8 (cuBLASLt's aux stride): GELU's backward rides the epilogue
  // of the GEMM that makes its input gradient. Forward keeps GELU a kernel of its own: selective
  // recompute recomputes it, and that must match the first pass to the bit, which a GEMM
  // epilogue's GELU (on the fp32 accumulator) would not.
  bool fused_dgelu;
  int B, T, C, H, KV, D, F, V, L, N, qkv, fc;
  int64_t Vp;  // the logits' row stride: V rounded up to 64, so every GEMM row starts aligned
  cudaStream_t s;
  cuda::GemmContext gemm;
  Tensor params, grads, master, m, v;  // bf16, bf16, f32, f32, f32
  // Activations, per layer unless named otherwise (bf16 unless f32 in the comment).
  Tensor residual, ln1, ln1_mean, ln1_rstd, qkv_a, atty, lse, res2, ln2, ln2_mean, ln2_rstd, fc_a, act;
  Tensor lnf, lnf_mean, lnf_rstd, logits, losses;
  Tensor dres, dln, datty, dqkv, dfc, dact, delta, norm_scratch, norm_out, rope_cos, rope_sin;
  Tensor inputs;      // i32: tokens [N], targets [N], the token index [up to 3N + 1]
  Tensor loss_sum;    // f32 [1]: summed per-token losses since the last loss_take
  Tensor clip_scale;  // f32 [1]: this step's clipping factor
  Tensor chunks;      // AdamChunk table of the multi-tensor AdamW
  int n_chunks = 0, unique_tokens = 0;
  // Pinned staging for the inputs, so their upload does not wait for the stream; `staged`
  // marks the previous upload's end, after which the staging buffer may be refilled.
  int32_t* staging = nullptr;
  cudaEvent_t staged = nullptr;

  ~Impl() {
    if (staging) cudaFreeHost(staging);
    if (staged) cudaEventDestroy(staged);
  }
  int32_t* tokens_d() { return inputs.data<int32_t>(); }
  int32_t* targets_d() { return inputs.data<int32_t>() + N; }
  int32_t* index_d() { return inputs.data<int32_t>() + 2 * int64_t(N); }

  bf16* P(size_t off) { return params.data<bf16>() + off; }
  bf16* G(size_t off) { return grads.data<bf16>() + off; }
  template <class X>
  X* at(const Tensor& t, int l, int64_t per) {
    return t.data<X>() + int64_t(l) * per;
  }
  // The architecture's norm (RMSNorm for llama, LayerNorm for gpt2); mean and bias unused by
  // RMSNorm. With add not null, in += add first (the residual add, fused).
  void norm_forward(bf16* out, float* mean, float* rstd, bf16* in, const bf16* add, const bf16* w, const bf16* bias) {
    const float eps = float(cfg.model.norm_eps);
    if (llama)
      cuda::rmsnorm_forward(out, rstd, in, add, w, N, C, eps, s);
    else
      cuda::layernorm_forward(out, mean, rstd, in, add, w, bias, N, C, eps, s);
  }
  // dinp +=, dw +=, dbias +=.
  void norm_backward(bf16* dinp, bf16* dw, bf16* dbias, const bf16* dout, const bf16* in, const bf16* w,
                     const float* mean, const float* rstd) {
    if (llama)
      cuda::rmsnorm_backward(dinp, dw, dout, in, w, rstd, N, C, s);
    else
      cuda::layernorm_backward(dinp, dw, dbias, dout, in, w, mean, rstd, N, C, s);
  }
  // Block l's activations: its own copy, or the shared one backward refills (full recompute
  // shares all of them, selective the activation function's output).
  struct Layer {
    bf16 *ln1, *qkv, *atty, *res2, *ln2, *fc, *act;
    float *lse, *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
  };
  Layer layer(int l) {
    const int k = policy == Recompute::full ? 0 : l, a = policy == Recompute::none ? l : 0;
    const int64_t NC = int64_t(N) * C;
    return {at<bf16>(ln1, k, NC),
            at<bf16>(qkv_a, k, int64_t(N) * qkv),
            at<bf16>(atty, k, NC),
            at<bf16>(res2, k, NC),
            at<bf16>(ln2, k, NC),
            at<bf16>(fc_a, k, int64_t(N) * fc),
            at<bf16>(act, a, int64_t(N) * F),
            at<float>(lse, k, int64_t(B) * H * T),
            at<float>(ln1_mean, k, N),
            at<float>(ln1_rstd, k, N),
            at<float>(ln2_mean, k, N),
            at<float>(ln2_rstd, k, N)};
  }
  // The activation function: act from fc.
  void activation_forward(bf16* act_out, const bf16* fc_in) {
    if (llama)
      cuda::swiglu_forward(act_out, fc_in, N, F, s);
    else
      cuda::gelu_forward(act_out, fc_in, int64_t(N) * F, s);
  }
  // Block l's forward from residual[l] (o: its weight offsets). pending, the previous block's
  // attention branch, is added into residual[l] first; a recomputation in backward passes
  // null (residual[l] already holds the sum) and stops before the down projection, whose
  // output backward does not need.
  void block_forward(const std::vector<size_t>& o, int l, const bf16* pending, bool recomputing) {
    auto w = [&](WField f) { return o[size_t(f)] == SIZE_MAX ? nullptr : P(o[size_t(f)]); };
    bf16* in = residual.data<bf16>() + int64_t(l) * N * C;
    const Layer y = layer(l);
    norm_forward(y.ln1, y.ln1_mean, y.ln1_rstd, in, pending, w(NORM1_W), w(NORM1_B));
    linear_forward(y.qkv, y.ln1, w(QKV_W), w(QKV_B), N, C, qkv);
    if (llama) cuda::rope_forward(y.qkv, rope_cos.f32(), rope_sin.f32(), B, T, H, KV, D, s);
    cuda::attention_forward(y.atty, y.lse, y.qkv, B, T, H, KV, D, s);
    linear_forward(y.res2, y.atty, w(PROJ_W), w(PROJ_B), N, C, C);
    norm_forward(y.ln2, y.ln2_mean, y.ln2_rstd, y.res2, in, w(NORM2_W), w(NORM2_B));
    linear_forward(y.fc, y.ln2, w(FC_W), w(FC_B), N, C, fc);
    activation_forward(y.act, y.fc);
    if (!recomputing) linear_forward(in + int64_t(N) * C, y.act, w(DOWN_W), w(DOWN_B), N, F, C);
  }
  void linear_forward(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, int M, int K, int Nn) {
    if (llama)
      cuda::gemm(gemm, false, true, M, Nn, K, inp, K, w, K, 0.0f, out, Nn, bias, s);
    else
      cuda::gemm(gemm, false, false, M, Nn, K, inp, K, w, Nn, 0.0f, out, Nn, bias, s);
  }
  // dinp overwritten (if not null); dw += ; dbias += (if not null).
  void linear_backward(bf16* dinp, bf16* dw, bf16* dbias, const bf16* dout, const bf16* inp, const bf16* w, int M,
                       int K, int Nn) {
    if (llama) {
      if (dinp) cuda::gemm(gemm, false, false, M, K, Nn, dout, Nn, w, K, 0.0f, dinp, K, nullptr, s);
      cuda::gemm(gemm, true, false, Nn, K, M, dout, Nn, inp, K, 1.0f, dw, K, nullptr, s);
    } else {
      if (dinp) cuda::gemm(gemm, false, true, M, K, Nn, dout, Nn, w, Nn, 0.0f, dinp, K, nullptr, s);
      cuda::gemm(gemm, true, false, K, Nn, M, inp, K, dout, Nn, 1.0f, dw, Nn, nullptr, s);
    }
    if (dbias) cuda::bias_backward(dbias, dout, M, Nn, s);
  }
};

namespace {
Tensor dev(Allocator& a, int64_t n, DType t, Mem m) {
  return a.empty({std::max<int64_t>(n, 1)}, t, m);
}
}  // namespace

CudaModel::CudaModel(const Config& cfg, Allocator& a, int B, cudaStream_t stream)
    : p_(std::make_unique<Impl>()), layout_(model_layout(cfg)) {
  Impl& x = *p_;
  x.cfg = cfg;
  x.llama = cfg.model.arch == "llama";
  x.policy = recompute_from(cfg.train.recompute);
  x.fused_dgelu = !x.llama && cfg.model.d_ff % 8 == 0;
  x.B = B, x.T = cfg.model.seq_len, x.C = cfg.model.d_model, x.H = cfg.model.n_head, x.KV = cfg.kv_heads();
  x.D = cfg.head_dim(), x.F = cfg.model.d_ff, x.V = cfg.model.vocab_size, x.L = cfg.model.n_layer, x.N = B * x.T;
  x.qkv = (x.H + 2 * x.KV) * x.D;
  x.Vp = (int64_t(x.V) + 63) / 64 * 64;
  x.fc = x.llama ? 2 * x.F : x.F;
  x.s = stream;
  const int64_t n = int64_t(layout_.reg.numel()), N = x.N, C = x.C, L = x.L;
  x.params = dev(a, n, DType::bf16, Mem::params);
  x.grads = dev(a, n, DType::bf16, Mem::grads);
  x.master = dev(a, n, DType::f32, Mem::optim);
  x.m = dev(a, n, DType::f32, Mem::optim);
  x.v = dev(a, n, DType::f32, Mem::optim);
  auto act = [&](int64_t per, int64_t copies, DType t) { return dev(a, per * copies, t, Mem::activations); };
  x.residual = act(N * C, L + 1, DType::bf16);
  const int64_t keep = x.policy == Recompute::full ? 1 : L, keep_act = x.policy == Recompute::none ? L : 1;
  x.ln1 = act(N * C, keep, DType::bf16);
  x.ln1_mean = act(N, keep, DType::f32);
  x.ln1_rstd = act(N, keep, DType::f32);
  x.qkv_a = act(N * x.qkv, keep, DType::bf16);
  x.atty = act(N * C, keep, DType::bf16);
  x.lse = act(int64_t(B) * x.H * x.T, keep, DType::f32);
  x.res2 = act(N * C, keep, DType::bf16);
  x.ln2 = act(N * C, keep, DType::bf16);
  x.ln2_mean = act(N, keep, DType::f32);
  x.ln2_rstd = act(N, keep, DType::f32);
  x.fc_a = act(N * x.fc, keep, DType::bf16);
  x.act = act(N * x.F, keep_act, DType::bf16);
  x.lnf = act(N * C, 1, DType::bf16);
  x.lnf_mean = act(N, 1, DType::f32);
  x.lnf_rstd = act(N, 1, DType::f32);
  x.logits = act(N * x.Vp, 1, DType::bf16);
  x.losses = act(N, 1, DType::f32);
  auto ws = [&](int64_t count, DType t) { return dev(a, count, t, Mem::workspace); };
  const int64_t n_inputs = 5 * N + 1;
  x.inputs = ws(n_inputs, DType::i32);
  LOOM_CUDA_CHECK(cudaMallocHost(&x.staging, size_t(n_inputs) * 4));
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&x.staged, cudaEventDisableTiming));
  LOOM_CUDA_CHECK(cudaEventRecord(x.staged, stream));
  x.loss_sum = ws(1, DType::f32);
  x.clip_scale = ws(1, DType::f32);
  LOOM_CUDA_CHECK(cudaMemsetAsync(x.loss_sum.f32(), 0, 4, stream));
  {
    std::vector<cuda::AdamSpan> spans;
    for (auto& sp : layout_.reg.all()) spans.push_back({int64_t(sp.offset), int64_t(sp.numel()), sp.decay});
    const auto table = cuda::adamw_chunks(spans);
    x.n_chunks = int(table.size());
    x.chunks = dev(a, int64_t(table.size() * sizeof(cuda::AdamChunk) / 4), DType::i32, Mem::optim);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(x.chunks.data<int32_t>(), table.data(), table.size() * sizeof(cuda::AdamChunk),
                                    cudaMemcpyHostToDevice, stream));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  x.dres = ws(N * C, DType::bf16);
  x.dln = ws(N * C, DType::bf16);
  x.datty = ws(N * C, DType::bf16);
  x.dqkv = ws(N * x.qkv, DType::bf16);
  x.dfc = ws(N * x.fc, DType::bf16);
  x.dact = ws(x.fused_dgelu ? 0 : N * x.F, DType::bf16);
  x.delta = ws(int64_t(B) * x.H * x.T, DType::f32);
  x.norm_scratch = ws(1024, DType::f32);
  x.norm_out = ws(1, DType::f32);
  if (x.llama) {
    std::vector<float> cs(size_t(x.T) * x.D / 2), sn(cs.size());
    cpu::rope_table(cs.data(), sn.data(), x.T, x.D, float(cfg.model.rope_theta));
    x.rope_cos = ws(int64_t(cs.size()), DType::f32);
    x.rope_sin = ws(int64_t(sn.size()), DType::f32);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(x.rope_cos.f32(), cs.data(), cs.size() * 4, cudaMemcpyHostToDevice, stream));
    LOOM_CUDA_CHECK(cudaMemcpyAsync(x.rope_sin.f32(), sn.data(), sn.size() * 4, cudaMemcpyHostToDevice, stream));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
}

CudaModel::~CudaModel() = default;

void CudaModel::weights_from(const float* host) {
  Impl& x = *p_;
  const int64_t n = int64_t(num_params());
  LOOM_CUDA_CHECK(cudaMemcpyAsync(x.master.f32(), host, size_t(n) * 4, cudaMemcpyHostToDevice, x.s));
  cuda::to_bf16(x.params.data<bf16>(), x.master.f32(), n, x.s);
  LOOM_CUDA_CHECK(cudaStreamSynchronize(x.s));
}

void CudaModel::weights_to(float* host) const {
  LOOM_CUDA_CHECK(cudaMemcpyAsync(host, p_->master.f32(), num_params() * 4, cudaMemcpyDeviceToHost, p_->s));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(p_->s));
}

void CudaModel::zero_grad() {
  LOOM_CUDA_CHECK(cudaMemsetAsync(p_->grads.data<bf16>(), 0, num_params() * 2, p_->s));
}

void CudaModel::forward(const int32_t* tokens, const int32_t* targets, float dloss) {
  Impl& x = *p_;
  const int N = x.N, C = x.C, T = x.T, B = x.B;
  const auto names = head_names(x.llama);
  auto off = [&](const char* name) { return layout_.reg.at(name).offset; };
  {
    // Refill the staging buffer once the previous upload has left it.
    LOOM_CUDA_CHECK(cudaEventSynchronize(x.staged));
    const auto index = cuda::token_index(tokens, N, 0, x.V, &x.unique_tokens);
    std::memcpy(x.staging, tokens, size_t(N) * 4);
    std::memcpy(x.staging + N, targets, size_t(N) * 4);
    std::memcpy(x.staging + 2 * int64_t(N), index.data(), index.size() * 4);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(x.inputs.data<int32_t>(), x.staging, (2 * size_t(N) + index.size()) * 4,
                                    cudaMemcpyHostToDevice, x.s));
    LOOM_CUDA_CHECK(cudaEventRecord(x.staged, x.s));
  }
  bf16* res = x.residual.data<bf16>();
  cuda::embedding_forward(res, x.tokens_d(), x.P(off(names.wte)), 0, x.V, names.wpe ? x.P(off(names.wpe)) : nullptr, B,
                          T, C, x.s);
  // Each block's second residual add is fused into the next norm (the next block's first, or
  // the final one): `pending` is the branch still to be added into the stream.
  const bf16* pending = nullptr;
  for (int l = 0; l < x.L; ++l) {
    x.block_forward(layout_.layer_offsets[size_t(l)], l, pending, false);
    pending = x.layer(l).res2;
  }
  bf16* last = res + int64_t(x.L) * N * C;
  x.norm_forward(x.lnf.data<bf16>(), x.lnf_mean.f32(), x.lnf_rstd.f32(), last, pending, x.P(off(names.norm_w)),
                 names.norm_b ? x.P(off(names.norm_b)) : nullptr);
  const bf16* lm = x.P(off(x.cfg.model.tie_embeddings ? names.wte : "lm_head.weight"));
  cuda::gemm(x.gemm, false, true, N, x.V, C, x.lnf.data<bf16>(), C, lm, C, 0.0f, x.logits.data<bf16>(), int(x.Vp),
             nullptr, x.s);
  cuda::crossentropy_forward_backward(x.logits.data<bf16>(), x.Vp, x.losses.f32(), x.targets_d(), N, x.V, dloss, x.s);
  cuda::loss_accumulate(x.loss_sum.f32(), x.losses.f32(), N, x.s);
}

double CudaModel::loss_take() {
  Impl& x = *p_;
  float sum = 0.0f;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(&sum, x.loss_sum.f32(), 4, cudaMemcpyDeviceToHost, x.s));
  LOOM_CUDA_CHECK(cudaMemsetAsync(x.loss_sum.f32(), 0, 4, x.s));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(x.s));
  return double(sum);
}

void CudaModel::backward() {
  Impl& x = *p_;
  const int N = x.N, C = x.C, T = x.T, B = x.B;
  const auto names = head_names(x.llama);
  auto off = [&](const char* name) { return layout_.reg.at(name).offset; };
  bf16* res = x.residual.data<bf16>();
  bf16 *dres = x.dres.data<bf16>(), *dln = x.dln.data<bf16>();
  const char* lm = x.cfg.model.tie_embeddings ? names.wte : "lm_head.weight";
  // logits now hold their gradient: dlnf = dlogits @ W, dW += dlogits^T @ lnf.
  cuda::gemm(x.gemm, false, false, N, C, x.V, x.logits.data<bf16>(), int(x.Vp), x.P(off(lm)), C, 0.0f, dln, C, nullptr,
             x.s);
  cuda::gemm(x.gemm, true, false, x.V, C, N, x.logits.data<bf16>(), int(x.Vp), x.lnf.data<bf16>(), C, 1.0f,
             x.G(off(lm)), C, nullptr, x.s);
  LOOM_CUDA_CHECK(cudaMemsetAsync(dres, 0, size_t(N) * C * 2, x.s));
  const bf16* last = res + int64_t(x.L) * N * C;
  x.norm_backward(dres, x.G(off(names.norm_w)), names.norm_b ? x.G(off(names.norm_b)) : nullptr, dln, last,
                  x.P(off(names.norm_w)), x.lnf_mean.f32(), x.lnf_rstd.f32());
  for (int l = x.L - 1; l >= 0; --l) {
    const auto& o = layout_.layer_offsets[size_t(l)];
    auto w = [&](WField f) { return o[size_t(f)] == SIZE_MAX ? nullptr : x.P(o[size_t(f)]); };
    auto g = [&](WField f) { return o[size_t(f)] == SIZE_MAX ? nullptr : x.G(o[size_t(f)]); };
    const bf16* in = res + int64_t(l) * N * C;
    if (x.policy == Recompute::full) x.block_forward(o, l, nullptr, true);
    const Impl::Layer y = x.layer(l);
    if (x.policy == Recompute::selective) x.activation_forward(y.act, y.fc);
    bf16 *ln1 = y.ln1, *qkv = y.qkv, *atty = y.atty, *res2 = y.res2, *ln2 = y.ln2, *fc = y.fc, *act = y.act;
    bf16 *dact = x.dact.data<bf16>(), *dfc = x.dfc.data<bf16>(), *datty = x.datty.data<bf16>();
    bf16* dqkv = x.dqkv.data<bf16>();
    if (x.fused_dgelu) {  // GELU's backward in the epilogue of the GEMM that makes its input gradient
      x.linear_backward(nullptr, g(DOWN_W), g(DOWN_B), dres, act, w(DOWN_W), N, x.F, C);
      cuda::gemm_dgelu(x.gemm, false, true, N, x.F, C, dres, C, w(DOWN_W), C, dfc, x.F, fc, x.s);
    } else {
      x.linear_backward(dact, g(DOWN_W), g(DOWN_B), dres, act, w(DOWN_W), N, x.F, C);
      if (x.llama)
        cuda::swiglu_backward(dfc, fc, dact, N, x.F, x.s);
      else
        cuda::gelu_backward(dfc, fc, dact, int64_t(N) * x.F, x.s);
    }
    x.linear_backward(dln, g(FC_W), g(FC_B), dfc, ln2, w(FC_W), N, C, x.fc);
    x.norm_backward(dres, g(NORM2_W), g(NORM2_B), dln, res2, w(NORM2_W), y.ln2_mean, y.ln2_rstd);
    x.linear_backward(datty, g(PROJ_W), g(PROJ_B), dres, atty, w(PROJ_W), N, C, C);
    cuda::attention_backward(dqkv, datty, atty, qkv, y.lse, x.delta.f32(), B, T, x.H, x.KV, x.D, x.s);
    if (x.llama) cuda::rope_backward(dqkv, x.rope_cos.f32(), x.rope_sin.f32(), B, T, x.H, x.KV, x.D, x.s);
    x.linear_backward(dln, g(QKV_W), g(QKV_B), dqkv, ln1, w(QKV_W), N, C, x.qkv);
    x.norm_backward(dres, g(NORM1_W), g(NORM1_B), dln, in, w(NORM1_W), y.ln1_mean, y.ln1_rstd);
  }
  cuda::embedding_backward(x.G(off(names.wte)), names.wpe ? x.G(off(names.wpe)) : nullptr, dres, x.index_d(),
                           x.unique_tokens, B, T, C, x.s);
}

void CudaModel::step(const AdamWHyper& h, int64_t step, double grad_clip) {
  Impl& x = *p_;
  cuda::sum_squares(x.norm_out.f32(), x.grads.data<bf16>(), int64_t(num_params()), x.norm_scratch.f32(), x.s);
  cuda::grad_clip_scale(x.clip_scale.f32(), x.norm_out.f32(), grad_clip, x.s);
  const double bc1 = 1.0 - std::pow(h.beta1, double(step)), bc2 = 1.0 - std::pow(h.beta2, double(step));
  cuda::adamw_multi(x.master.f32(), x.params.data<bf16>(), x.grads.data<bf16>(), x.m.f32(), x.v.f32(),
                    reinterpret_cast<const cuda::AdamChunk*>(x.chunks.data<int32_t>()), x.n_chunks, float(h.lr / bc1),
                    float(std::sqrt(bc2)), float(h.beta1), float(h.beta2), float(h.eps),
                    float(1.0 - h.lr * h.weight_decay), x.clip_scale.f32(), x.s);
}

double CudaModel::grad_norm() const {
  float ss = 0.0f;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(&ss, p_->norm_out.f32(), 4, cudaMemcpyDeviceToHost, p_->s));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(p_->s));
  return std::sqrt(double(ss));
}

double cuda_peak_flops() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return 0.0;
  const std::string name = prop.name;
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) return 989e12;
  if (name.find("A100") != std::string::npos) return 312e12;
  return 0.0;
}

}  // namespace loom
#endif
