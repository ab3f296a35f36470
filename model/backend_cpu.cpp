// The CPU backend: the kernels of kernels/cpu on the host, inline (its stream is the host).
// fp32 calls them as they are. bf16 stores activations and weights in bf16 and computes in
// fp32: the pointwise, norm and attention kernels widen on load and round once on store;
// GEMMs (OpenBLAS, fp32 only) read operands widened into planned fp32 buffers, a block of rows
// at a time, and round their outputs once. Weight gradients are fp32 throughout.
#include <omp.h>

#include <cmath>
#include <cstring>

#include "kernels/clip.h"
#include "model/backend.h"
#include "runtime/exact_sum.h"

namespace loom {

namespace {

constexpr int kRowBlock = 128;  // rows of a bf16 GEMM widened at a time

// The widest input (K) and output (N) dimensions and the largest weight of this rank's linears.
struct GemmDims {
  int64_t kmax = 0, nmax = 0, wmax = 0;
};
GemmDims gemm_dims(const ModelDims& dims) {
  const int tp = dims.tp;
  const int64_t C = dims.C, D = dims.D, H = dims.H / tp, KV = dims.KV / tp;
  const int64_t F = dims.F / tp, V = dims.V_padded() / tp;
  const int64_t qkv = (H + 2 * KV) * D, fc = dims.arch == Arch::llama ? 2 * F : F;
  GemmDims g;
  for (int64_t k : {C, H * D, F}) g.kmax = std::max(g.kmax, k);
  for (int64_t n : {qkv, C, fc, V}) g.nmax = std::max(g.nmax, n);
  for (int64_t w : {C * qkv, H * D * C, C * fc, F * C, V * C}) g.wmax = std::max(g.wmax, w);
  if (const int64_t E = dims.moe.num_experts; E > 0) {  // experts are whole under tp; the router
    const int64_t Fe = dims.F;
    g.kmax = std::max({g.kmax, Fe});
    g.nmax = std::max({g.nmax, 2 * Fe, E});
    g.wmax = std::max({g.wmax, 2 * Fe * C, E * C});
  }
  return g;
}

}  // namespace

std::vector<PlanItem> cpu_backend_plan(const ModelDims& dims, DType dtype) {
  if (dtype == DType::f32) return {};
  const GemmDims g = gemm_dims(dims);
  const int64_t rows = std::min<int64_t>(kRowBlock, int64_t(dims.B) * dims.T_local());
  // A block of rows of a GEMM's input (x), its output or output gradient (y), and its input
  // gradient (dx); the weight; the bias.
  return {{"gemm_wide_w", g.wmax, DType::f32, Mem::workspace},
          {"gemm_wide_x", rows * g.kmax, DType::f32, Mem::workspace},
          {"gemm_wide_y", rows * g.nmax, DType::f32, Mem::workspace},
          {"gemm_wide_dx", rows * g.kmax, DType::f32, Mem::workspace},
          {"gemm_wide_bias", g.nmax, DType::f32, Mem::workspace}};
}

namespace {

using cpu::ld;

class CpuBackend final : public Backend {
 public:
  CpuBackend(const ModelDims& dims, DType dtype, Allocator& alloc)
      : traits_(backend_traits(DeviceKind::cpu, dtype, dims)), alloc_(alloc) {
    for (auto& item : cpu_backend_plan(dims, dtype)) wide_.push_back(alloc.empty(item));
    if (!wide_.empty()) rows_ = int(wide_[X].numel() / std::max<int64_t>(1, gemm_dims(dims).kmax));
  }
  const BackendTraits& traits() const override { return traits_; }
  const Stream& stream() const override { return host_stream(); }
  Allocator& alloc() override { return alloc_; }
  bool is_bf16() const { return traits_.dtype == DType::bf16; }

  void copy(Buf dst, Buf src) override {
    LOOM_ASSERT(dst.count == src.count);
    if (dst.dtype == src.dtype) {
      std::memcpy(dst.data, src.data, dst.bytes());
    } else if (dst.dtype == DType::f32 && src.dtype == DType::bf16) {
      cpu::widen(static_cast<float*>(dst.data), static_cast<const bf16*>(src.data), dst.count);
    } else {
      LOOM_ASSERT(dst.dtype == DType::bf16 && src.dtype == DType::f32);
      cpu::narrow(static_cast<bf16*>(dst.data), static_cast<const float*>(src.data), dst.count);
    }
  }
  void zero(Buf b) override { std::memset(b.data, 0, b.bytes()); }
  void add(Buf acc, Buf x) override {
    LOOM_ASSERT(acc.dtype == DType::f32 && x.dtype == DType::f32 && acc.count == x.count);
    cpu::add_inplace(static_cast<float*>(acc.data), static_cast<const float*>(x.data), acc.count);
  }
  void upload(Buf dst, const void* host) override { std::memcpy(dst.data, host, dst.bytes()); }
  void download(void* host, Buf src) override { std::memcpy(host, src.data, src.bytes()); }
  Inputs stage_inputs(const int32_t* tokens, const int32_t* targets, const int32_t* pos, int, int, int, int) override {
    return {tokens, targets, nullptr, 0, pos};
  }

  // Each chunk's sum by one thread in double, in element order; the chunks' sums exactly: the
  // result depends on neither the thread count nor the table's order.
  void grad_sum_squares(double* out, const float* grads, const OptTable& t) override {
    const auto& c = t.host;
    part_.assign(c.size(), 0.0);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < c.size(); ++i) {
      if (!c[i].norm) continue;
      const float* g = grads + c[i].grad;
      double s = 0.0;
      for (int32_t k = 0; k < c[i].n; ++k) s += double(g[k]) * g[k];
      part_[i] = s;
    }
    ExactSum sum;
    for (double p : part_) sum.add(p);
    sum.digits_to(out);
  }
  void clip_scale(float* scale, const double* sum_squares, double max_norm) override {
    ExactSum sum;
    sum.digits_from(sum_squares);
    *scale = float(clip_coef(std::sqrt(sum.value()), max_norm));
  }
  void adamw(float* master, Ptr params, const float* grads, float* M, float* V, const OptTable& t, const AdamScalars& a,
             const float* grad_scale) override {
    const auto& c = t.host;
    const float scale = *grad_scale;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < c.size(); ++i) {
      const OptChunk& ch = c[i];
      const float decay = ch.decay ? a.decay_factor : 1.0f;
      float* m = M + ch.state;
      float* v = V + ch.state;
      const float* gr = grads + ch.grad;
      float* p = master ? master + ch.state : params.as<float>() + ch.param;
      // torch.optim.AdamW's arithmetic: decoupled decay, m as a lerp, bias corrections folded
      // into the step size and the denominator.
#pragma omp simd
      for (int32_t k = 0; k < ch.n; ++k) {
        const float g = scale == 1.0f ? gr[k] : gr[k] * scale;
        const float pk = p[k] * decay;
        const float mk = m[k] + (g - m[k]) * (1.0f - a.beta1);
        const float vk = v[k] * a.beta2 + (1.0f - a.beta2) * g * g;
        const float denom = std::sqrt(vk) / a.bc2_sqrt + a.eps;
        p[k] = pk - a.lr_step * (mk / denom);
        m[k] = mk;
        v[k] = vk;
      }
      if (master) cpu::narrow(params.as<bf16>() + ch.param, p, ch.n);
    }
  }
  void loss_accumulate(double* acc, const float* losses, int N) override {
    double s = 0.0;
    for (int n = 0; n < N; ++n) s += losses[n];
    exact_accumulate(acc, s);
  }

  void embedding_forward(Ptr out, const Inputs& in, Ptr wte, int v0, int Vl, Ptr wpe, int B, int T, int C) override {
    if (is_bf16())
      cpu::embedding_forward(out.as<bf16>(), in.tokens, wte.as<bf16>(), v0, Vl, wpe.as<bf16>(), B, T, C, in.pos);
    else
      cpu::embedding_forward(out.as<float>(), in.tokens, wte.as<float>(), v0, Vl, wpe.as<float>(), B, T, C, in.pos);
  }
  void embedding_backward(float* dwte, float* dwpe, Ptr dout, const Inputs& in, int v0, int Vl, int B, int T,
                          int C) override {
    if (is_bf16())
      cpu::embedding_backward(dwte, v0, Vl, dwpe, dout.as<bf16>(), in.tokens, B, T, C, in.pos);
    else
      cpu::embedding_backward(dwte, v0, Vl, dwpe, dout.as<float>(), in.tokens, B, T, C, in.pos);
  }
  void norm_forward(bool rms, Ptr out, float* mean, float* rstd, Ptr inout, Ptr add, Ptr w, Ptr b, int N, int C,
                    float eps) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      if (rms)
        cpu::rmsnorm_forward(out.as<S>(), rstd, inout.as<S>(), add.as<S>(), w.as<S>(), N, C, eps);
      else
        cpu::layernorm_forward(out.as<S>(), mean, rstd, inout.as<S>(), add.as<S>(), w.as<S>(), b.as<S>(), N, C, eps);
    });
  }
  void norm_backward(bool rms, Ptr dinp, float* dw, float* db, Ptr dout, Ptr inp, Ptr w, const float* mean,
                     const float* rstd, int N, int C) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      if (rms)
        cpu::rmsnorm_backward(dinp.as<S>(), dw, dout.as<S>(), inp.as<S>(), w.as<S>(), rstd, N, C);
      else
        cpu::layernorm_backward(dinp.as<S>(), dw, db, dout.as<S>(), inp.as<S>(), w.as<S>(), mean, rstd, N, C);
    });
  }
  void add_act(Ptr inout, Ptr x, int64_t n) override {
    if (!is_bf16()) return cpu::add_inplace(inout.as<float>(), x.as<float>(), n);
    bf16* a = inout.as<bf16>();
    const bf16* b = x.as<bf16>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) cpu::st(a[i], ld(a[i]) + ld(b[i]));
  }
  void linear_forward(Ptr out, Ptr inp, Ptr w, Ptr bias, int M, int K, int N, WLayout layout) override {
    if (!is_bf16())
      return cpu::matmul_forward(out.as<float>(), inp.as<float>(), w.as<float>(), bias.as<float>(), M, K, N, layout);
    float* W = widen_into(wide_[WEIGHT], w, int64_t(K) * N);
    const float* bias32 = bias ? widen_into(wide_[BIAS], bias, N) : nullptr;
    for (int r0 = 0; r0 < M; r0 += rows_) {
      const int R = std::min(rows_, M - r0);
      float* a = widen_into(wide_[X], inp + int64_t(r0) * K, int64_t(R) * K);
      float* o = wide_[Y].f32();
      cpu::matmul_forward(o, a, W, bias32, R, K, N, layout);
      cpu::narrow((out + int64_t(r0) * N).as<bf16>(), o, int64_t(R) * N);
    }
  }
  void linear_backward(Ptr dinp, float* dw, float* dbias, Ptr dout, Ptr inp, Ptr w, int M, int K, int N,
                       WLayout layout) override {
    if (!is_bf16())
      return cpu::matmul_backward(dinp.as<float>(), dw, dbias, dout.as<float>(), inp.as<float>(), w.as<float>(), M, K,
                                  N, layout);
    float* W = dinp ? widen_into(wide_[WEIGHT], w, int64_t(K) * N) : nullptr;
    for (int r0 = 0; r0 < M; r0 += rows_) {
      const int R = std::min(rows_, M - r0);
      float* dy = widen_into(wide_[Y], dout + int64_t(r0) * N, int64_t(R) * N);
      float* x = dw ? widen_into(wide_[X], inp + int64_t(r0) * K, int64_t(R) * K) : nullptr;
      float* dx = dinp ? wide_[DX].f32() : nullptr;
      cpu::matmul_backward(dx, dw, dbias, dy, x, W, R, K, N, layout);
      if (dx) cpu::narrow((dinp + int64_t(r0) * K).as<bf16>(), dx, int64_t(R) * K);
    }
  }
  // The counts are in host memory here: one linear per run, as the padded layout's experts.
  void linear_forward_ragged(Ptr out, Ptr inp, Ptr w, int G, int64_t w_stride, const int32_t* counts, int sources,
                             int64_t R, int K, int N) override {
    int64_t r0 = 0;
    for (int g = 0; g < G; ++g) {
      const int64_t n = ragged_rows(counts, sources, G, g);
      if (n > 0) linear_forward(out + r0 * N, inp + r0 * K, w + g * w_stride, Ptr(), int(n), K, N, WLayout::out_in);
      r0 += n;
    }
    LOOM_ASSERT(r0 == R);
  }
  void linear_backward_ragged(Ptr dinp, float* dw, Ptr dout, Ptr inp, Ptr w, int G, int64_t w_stride,
                              const int32_t* counts, int sources, int64_t R, int K, int N) override {
    int64_t r0 = 0;
    for (int g = 0; g < G; ++g) {
      const int64_t n = ragged_rows(counts, sources, G, g);
      if (n > 0)
        linear_backward(dinp ? dinp + r0 * K : Ptr(), dw ? dw + g * w_stride : nullptr, nullptr, dout + r0 * N,
                        inp + r0 * K, w + g * w_stride, int(n), K, N, WLayout::out_in);
      r0 += n;
    }
    LOOM_ASSERT(r0 == R);
  }
  void act_forward(bool swiglu, Ptr act, Ptr fc, int N, int F) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      if (swiglu)
        cpu::swiglu_forward(act.as<S>(), fc.as<S>(), N, F);
      else
        cpu::gelu_forward(act.as<S>(), fc.as<S>(), int64_t(N) * F);
    });
  }
  void act_backward(bool swiglu, Ptr dfc, Ptr fc, Ptr dact, int N, int F) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      if (swiglu)
        cpu::swiglu_backward(dfc.as<S>(), fc.as<S>(), dact.as<S>(), N, F);
      else
        cpu::gelu_backward(dfc.as<S>(), fc.as<S>(), dact.as<S>(), int64_t(N) * F);
    });
  }
  void moe_route(float* probs, int32_t* idx, float* w, Ptr logits, int N, int E, int k) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      cpu::moe_route(probs, idx, w, logits.as<S>(), N, E, k);
    });
  }
  void moe_plan(int32_t* row_of, int32_t* token_of, int32_t* counts, const int32_t* idx, int N, int E, int k, int cap,
                int slot, int rows, int32_t*) override {
    cpu::moe_plan(row_of, token_of, counts, idx, N, E, k, cap, slot, rows);
  }
  void moe_ep_maps(int32_t* map_in, int32_t* map_out, const int32_t* from, int P, int El, int slot) override {
    cpu::moe_ep_maps(map_in, map_out, from, P, El, slot);
  }
  void moe_stats_add(double* st, const int32_t* counts, const float* prob_sums, int N, int E, int k) override {
    cpu::moe_stats_add(st, counts, prob_sums, N, E, k);
  }
  void moe_aux_grad(float* g, const int32_t* counts, double scale, int N, int E, int k) override {
    cpu::moe_aux_grad(g, counts, scale, N, E, k);
  }
  void moe_gather(Ptr rows, Ptr x, const int32_t* token_of_row, int R, int C) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      cpu::moe_gather(rows.as<S>(), x.as<S>(), token_of_row, R, C);
    });
  }
  void moe_combine(Ptr out, Ptr rows, const int32_t* row_of, const float* w, int N, int k, int C) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      cpu::moe_combine(out.as<S>(), rows.as<S>(), row_of, w, N, k, C);
    });
  }
  void moe_combine_backward(Ptr drows, float* dw, Ptr dout, Ptr rows, const int32_t* row_of, const float* w, int N,
                            int k, int C) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      cpu::moe_combine_backward(drows.as<S>(), dw, dout.as<S>(), rows.as<S>(), row_of, w, N, k, C);
    });
  }
  void moe_scatter_add(Ptr dx, Ptr drows, const int32_t* row_of, int N, int k, int C) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      cpu::moe_scatter_add(dx.as<S>(), drows.as<S>(), row_of, N, k, C);
    });
  }
  void moe_router_backward(Ptr dlogits, const float* probs, const int32_t* idx, const float* w, const float* dw,
                           const float* aux_g, int N, int E, int k) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      cpu::moe_router_backward(dlogits.as<S>(), probs, idx, w, dw, aux_g, N, E, k);
    });
  }
  void column_sums(float* out, const float* probs, int N, int E) override {
    cpu::column_sums(out, probs, N, E);
  }
  void rope(bool inverse, Ptr qkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D,
            const int32_t* pos) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      if (inverse)
        cpu::rope_backward(qkv.as<S>(), cos, sin, B, T, H, KV, D, pos);
      else
        cpu::rope_forward(qkv.as<S>(), cos, sin, B, T, H, KV, D, pos);
    });
  }
  void attention_forward(Ptr out, Ptr stats, Ptr qkv, const AttentionShape& shape) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      cpu::attention_forward(out.as<S>(), stats.as<S>(), qkv.as<S>(), shape);
    });
  }
  // The probabilities forward kept are zero outside each document: no mask here.
  void attention_backward(Ptr dqkv, Ptr dout, Ptr, Ptr qkv, Ptr stats, float*, const AttentionShape& shape) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      cpu::attention_backward(dqkv.as<S>(), dout.as<S>(), qkv.as<S>(), stats.as<S>(), shape);
    });
  }
  void attention_kv_extract(Ptr kv, Ptr qkv, int B, int T, int H, int KV, int D) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      cpu::attention_kv_extract(kv.as<S>(), qkv.as<S>(), B, T, H, KV, D);
    });
  }
  void attention_block_forward(float* acc, float* ml, Ptr qkv, Ptr kv, const AttentionBlockShape& shape, bool first,
                               float* scratch) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      cpu::attention_block_forward(acc, ml, qkv.as<S>(), kv.as<S>(), shape, first, scratch);
    });
  }
  void attention_block_finish(Ptr out, float* lse, const float* acc, const float* ml, int B, int Tq, int H,
                              int D) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      cpu::attention_block_finish(out.as<S>(), lse, acc, ml, B, Tq, H, D);
    });
  }
  void attention_block_delta(float* delta, Ptr dout, Ptr out, int B, int Tq, int H, int D) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      cpu::attention_block_delta(delta, dout.as<S>(), out.as<S>(), B, Tq, H, D);
    });
  }
  void attention_block_backward(float* dq, float* dkv, Ptr dout, Ptr qkv, Ptr kv, const float* lse, const float* delta,
                                const AttentionBlockShape& shape, float* scratch) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      cpu::attention_block_backward(dq, dkv, dout.as<S>(), qkv.as<S>(), kv.as<S>(), lse, delta, shape, scratch);
    });
  }
  void attention_block_grads_store(Ptr dqkv, const float* dq, const float* dkv, int B, int T, int H, int KV,
                                   int D) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      cpu::attention_block_grads_store(dqkv.as<S>(), dq, dkv, B, T, H, KV, D);
    });
  }
  void crossentropy(Ptr logits, float* losses, const Inputs& in, int N, int V, int valid, float dloss) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      cpu::crossentropy_forward_backward(logits.as<S>(), losses, in.targets, N, V, valid, dloss);
    });
  }
  void ce_stats(Ptr logits, const Inputs& in, int N, int Vl, int valid, int v0, float* rowmax, float* target) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      cpu::crossentropy_shard_stats(logits.as<S>(), in.targets, N, Vl, valid, v0, rowmax, target);
    });
  }
  void ce_sumexp(Ptr logits, const float* rowmax, int N, int Vl, int valid, float* sumexp) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      cpu::crossentropy_shard_sumexp(logits.as<S>(), rowmax, N, Vl, valid, sumexp);
    });
  }
  void ce_finish(Ptr logits, float* losses, const Inputs& in, int N, int Vl, int valid, int v0, const float* rowmax,
                 const float* sumexp, const float* target, float dloss) override {
    dispatch([&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      cpu::crossentropy_shard_finish(logits.as<S>(), losses, in.targets, N, Vl, valid, v0, rowmax, sumexp, target,
                                     dloss);
    });
  }

 private:
  // Calls f with a null pointer of the storage type, which picks the kernel instantiation.
  template <class F>
  void dispatch(F&& f) {
    if (is_bf16())
      f(static_cast<bf16*>(nullptr));
    else
      f(static_cast<float*>(nullptr));
  }
  float* widen_into(Tensor& buf, Ptr src, int64_t n) {
    LOOM_ASSERT(n <= buf.numel());
    cpu::widen(buf.f32(), src.as<bf16>(), n);
    return buf.f32();
  }

  enum Wide { WEIGHT, X, Y, DX, BIAS };
  BackendTraits traits_;
  Allocator& alloc_;
  std::vector<Tensor> wide_;  // bf16 GEMMs: cpu_backend_plan's buffers, in its order (Wide)
  int rows_ = kRowBlock;
  std::vector<double> part_;
};

}  // namespace

std::unique_ptr<Backend> cpu_backend(const ModelDims& dims, DType dtype, Allocator& alloc) {
  LOOM_CHECK(dtype == DType::f32 || dtype == DType::bf16, "the CPU computes in f32 or bf16, not {}", dtype_name(dtype));
  return std::make_unique<CpuBackend>(dims, dtype, alloc);
}

}  // namespace loom
