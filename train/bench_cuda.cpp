// `loom bench kernels`: the GPU's bf16 GEMM rate (cuBLASLt), the MLP GEMM with GELU separate
// and fused into its epilogue, a MoE layer's experts batched against one GEMM each, and causal
// attention forward and backward at three reference shapes and the config's, the flash
// kernels next to the WMMA and row-wise ones (ratios in one run are the numbers to trust on a
// shared machine) and their document-masked and context-parallel variants, and the memory-bound kernels of a step
// against the device copy rate. CUDA events time each one.
#include <fmt/core.h>

#include <algorithm>
#include <vector>

#include "runtime/error.h"
#include "train/bench.h"

#if LOOM_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/gemm_plan.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/reference/attention_reference.h"
#include "kernels/flash_ds.h"
#include "model/context_parallel.h"
#include "model/flops.h"
#include "model/layout.h"
#include "runtime/comm/nccl_group.h"
#include "runtime/cuda_check.h"
#endif

namespace loom {

#if LOOM_HAVE_CUDA
namespace {

// Milliseconds per call of fn on stream s: one warm-up, then `reps` calls between two events.
template <class Fn>
double time_ms(cudaStream_t s, int reps, Fn fn) {
  cudaEvent_t a, b;
  LOOM_CUDA_CHECK(cudaEventCreate(&a));
  LOOM_CUDA_CHECK(cudaEventCreate(&b));
  fn();
  LOOM_CUDA_CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < reps; ++i) fn();
  LOOM_CUDA_CHECK(cudaEventRecord(b, s));
  LOOM_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0.0f;
  LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(ms) / reps;
}

template <class X>
X* device_zeros(size_t n) {
  X* p = nullptr;
  LOOM_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(X)));
  LOOM_CUDA_CHECK(cudaMemset(p, 0, std::max<size_t>(n, 1) * sizeof(X)));
  return p;
}

// The masked variants of causal attention at one shape, on the same tensor-core tiles, against
// the unmasked kernels' times (flash_f, flash_b): document masks (data.doc_mask, documents of
// T/4 tokens) and context parallel at cp 2 (both ranks' blocks run here one after the other:
// the same pairs of the sequence, split as cp_positions splits them; their times include the
// finish, delta and gradient-store kernels). Rates count the pairs a mask leaves visible, so
// "x unmasked" is the masked kernels' rate over the unmasked ones'. The buffers are the
// unmasked run's.
void bench_masked_attention(int B, int T, int H, int KV, int D, double flash_f, double flash_b, cuda::bf16* qkv,
                            cuda::bf16* out, cuda::bf16* dout, cuda::bf16* dqkv, float* lse, float* scratch,
                            cudaStream_t s) {
  using cuda::bf16;
  const std::string shape = fmt::format("B{} T{} H{} KV{} D{}", B, T, H, KV, D);
  const double causal_f = 2.0 * B * H * double(T) * T * D;
  auto line = [&](const char* what, double ms, double flops, double base_ms, double base_flops) {
    fmt::print("{:<34} {:>10.3f} {:>10.1f}   {:.2f}x unmasked\n", fmt::format("attention {} {}", what, shape), ms,
               flops / ms / 1e9, (flops / ms) / (base_flops / base_ms));
  };
  {  // document masks: pos[b, t] = t - (its document's start)
    const int L = std::max(1, T / 4);
    std::vector<int32_t> host(size_t(B) * T);
    double pairs = 0;
    for (int t = 0; t < T; ++t) host[size_t(t)] = t % L, pairs += t % L + 1;
    for (int b = 1; b < B; ++b) std::copy(host.begin(), host.begin() + T, host.begin() + size_t(b) * T);
    int32_t* pos = device_zeros<int32_t>(host.size());
    LOOM_CUDA_CHECK(cudaMemcpy(pos, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    const double f = time_ms(s, 5, [&] { cuda::attention_forward(out, lse, qkv, B, T, H, KV, D, pos, s); });
    const double bw =
        time_ms(s, 5, [&] { cuda::attention_backward(dqkv, dout, out, qkv, lse, scratch, B, T, H, KV, D, pos, s); });
    const double visible = causal_f * pairs / (double(T) * T / 2);
    line("fwd doc mask", f, visible, flash_f, causal_f);
    line("bwd doc mask", bw, 2.5 * visible, flash_b, 2.5 * causal_f);
    cudaFree(pos);
  }
  if (T % 4 == 0) {  // context parallel at cp 2
    const int cp = 2, Tl = T / cp;
    const size_t nol = size_t(B) * Tl * H * D;
    const size_t nkv = size_t(B) * Tl * 2 * KV * D, nsl = size_t(B) * H * Tl;
    std::vector<int32_t> table;
    for (int r = 0; r < cp; ++r) {
      const auto p = cp_positions(T, cp, r);
      table.insert(table.end(), p.begin(), p.end());
    }
    int32_t* pos = device_zeros<int32_t>(table.size());
    LOOM_CUDA_CHECK(cudaMemcpy(pos, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    bf16* kv = device_zeros<bf16>(cp * nkv);
    float *acc = device_zeros<float>(nol), *ml = device_zeros<float>(2 * nsl), *dkv = device_zeros<float>(cp * nkv);
    for (int r = 0; r < cp; ++r)  // rank r's qkv is qkv's first rows: the values do not matter here
      cuda::attention_kv_extract(kv + r * nkv, qkv, B, Tl, H, KV, D, s);
    const double f = time_ms(s, 5, [&] {
      for (int r = 0; r < cp; ++r) {
        for (int j = 0; j < cp; ++j) {
          const int src = (r + cp - j) % cp;  // the ring's order, own block first
          cuda::attention_block_forward(acc, ml, qkv, kv + src * nkv,
                                        {B, Tl, Tl, H, KV, D, pos + r * Tl, pos + src * Tl}, j == 0, s);
        }
        cuda::attention_block_finish(out, lse, acc, ml, B, Tl, H, D, s);
      }
    });
    const double bw = time_ms(s, 5, [&] {
      for (int r = 0; r < cp; ++r) {
        cuda::attention_block_delta(scratch, dout, out, B, Tl, H, D, s);
        for (int src = 0; src < cp; ++src)
          cuda::attention_block_backward(acc, dkv + src * nkv, dout, qkv, kv + src * nkv, lse, scratch,
                                         {B, Tl, Tl, H, KV, D, pos + r * Tl, pos + src * Tl}, s);
        cuda::attention_block_grads_store(dqkv, acc, dkv + r * nkv, B, Tl, H, KV, D, s);
      }
    });
    line("fwd cp 2 blocks", f, causal_f, flash_f, causal_f);
    line("bwd cp 2 blocks", bw, 2.5 * causal_f, flash_b, 2.5 * causal_f);
    for (void* p : {(void*)pos, (void*)kv, (void*)acc, (void*)ml, (void*)dkv}) cudaFree(p);
  }
}

// Causal attention forward and backward at one shape, TFLOP/s with the causal half of the
// scores: forward 2 B H T^T D (two products), backward 2.5 times that. Prints one line per
// kernel and a summary line `attention loom ...: fwd X bwd Y TFLOP/s` that
// examples/attention_vs_torch.py reads to set PyTorch's flash and cuDNN beside it.
void bench_attention(int B, int T, int H, int KV, int D, bool rowwise, cudaStream_t s) {
  using cuda::bf16;
  const size_t nq = size_t(B) * T * (H + 2 * KV) * D, no = size_t(B) * T * H * D, ns = size_t(B) * H * T;
  bf16 *qkv = device_zeros<bf16>(nq), *out = device_zeros<bf16>(no), *dout = device_zeros<bf16>(no),
       *dqkv = device_zeros<bf16>(nq);
  float *lse = device_zeros<float>(ns), *scratch = device_zeros<float>(ns);
  // The stored dS where training plans it (head dim 64): the flash backward as training runs it.
  const int64_t ds_elems = flash_ds_planned_elems(B, T, H, D, false);
  bf16* ds = ds_elems > 0 ? device_zeros<bf16>(size_t(ds_elems)) : nullptr;
  const double fwd = 2.0 * B * H * double(T) * T * D, bwd = 2.5 * fwd;
  const std::string shape = fmt::format("B{} T{} H{} KV{} D{}", B, T, H, KV, D);
  enum Kind { flash, wmma, rows };
  double flash_f = 0, flash_b = 0;
  for (Kind k : {flash, wmma, rows}) {
    if (k == wmma && D != 64 && D != 128) continue;
    if (k == rows && !rowwise) continue;
    const double f = time_ms(s, 5, [&] {
      if (k == flash) cuda::attention_forward(out, lse, qkv, B, T, H, KV, D, nullptr, s);
      if (k == wmma) cuda::reference::attention_forward_wmma(out, lse, qkv, B, T, H, KV, D, nullptr, s);
      if (k == rows) cuda::reference::attention_forward_rowwise(out, lse, qkv, B, T, H, KV, D, nullptr, s);
    });
    const double bw = time_ms(s, 5, [&] {
      if (k == flash)
        cuda::attention_backward(dqkv, dout, out, qkv, lse, scratch, B, T, H, KV, D, nullptr, s, ds, ds_elems);
      if (k == wmma)
        cuda::reference::attention_backward_wmma(dqkv, dout, out, qkv, lse, scratch, B, T, H, KV, D, nullptr, s);
      if (k == rows)
        cuda::reference::attention_backward_rowwise(dqkv, dout, out, qkv, lse, scratch, B, T, H, KV, D, nullptr, s);
    });
    const char* name = k == flash ? "flash" : k == wmma ? "wmma" : "row-wise";
    fmt::print("{:<34} {:>10.3f} {:>10.1f}\n", fmt::format("attention fwd {} {}", name, shape), f, fwd / f / 1e9);
    fmt::print("{:<34} {:>10.3f} {:>10.1f}\n", fmt::format("attention bwd {} {}", name, shape), bw, bwd / bw / 1e9);
    if (k == flash)
      flash_f = f, flash_b = bw;
    else
      fmt::print("flash speedup over {} {}: forward {:.1f}x, backward {:.1f}x\n", name, shape, f / flash_f,
                 bw / flash_b);
  }
  fmt::print("attention loom {}: fwd {:.1f} bwd {:.1f} TFLOP/s\n", shape, fwd / flash_f / 1e9, bwd / flash_b / 1e9);
  bench_masked_attention(B, T, H, KV, D, flash_f, flash_b, qkv, out, dout, dqkv, lse, scratch, s);
  for (void* p : {(void*)qkv, (void*)out, (void*)dout, (void*)dqkv, (void*)lse, (void*)scratch, (void*)ds}) cudaFree(p);
}

// The memory-bound kernels of a step at the config's shape: achieved TB/s over the bytes each
// must move, and its fraction of the device-to-device copy rate measured first.
void bench_memory_kernels(const Config& cfg, cudaStream_t s) {
  using cuda::bf16;
  const int N = cfg.train.micro_batch * cfg.model.seq_len, C = cfg.model.d_model, F = cfg.model.d_ff,
            V = cfg.model.vocab_size;
  const int64_t NC = int64_t(N) * C, NF = int64_t(N) * F;
  const int64_t big = std::max<int64_t>({2 * NC, 2 * NF, int64_t(N) * V});  // bf16 elements
  bf16 *x = device_zeros<bf16>(size_t(big)), *y = device_zeros<bf16>(size_t(big)), *z = device_zeros<bf16>(size_t(big)),
       *w = device_zeros<bf16>(size_t(C)), *bias = device_zeros<bf16>(size_t(C));
  float *mean = device_zeros<float>(size_t(N)), *rstd = device_zeros<float>(size_t(N)),
        *dw = device_zeros<float>(size_t(C)), *db = device_zeros<float>(size_t(C)),
        *part = device_zeros<float>(size_t(cuda::column_partials_floats(N, std::max(C, 4 * C)))),
        *losses = device_zeros<float>(size_t(N));
  int32_t* targets = device_zeros<int32_t>(size_t(N));
  std::vector<float> ones(size_t(C), 1.0f);
  {
    std::vector<uint16_t> one_bf16(size_t(C), 0x3f80);  // the weight 1: LayerNorm's rows stay finite
    LOOM_CUDA_CHECK(cudaMemcpy(w, one_bf16.data(), size_t(C) * 2, cudaMemcpyHostToDevice));
  }
  const double copy_bytes = 2.0 * double(big) * 2;
  const double copy =
      time_ms(s, 10, [&] { LOOM_CUDA_CHECK(cudaMemcpyAsync(y, x, size_t(big) * 2, cudaMemcpyDeviceToDevice, s)); });
  const double peak = copy_bytes / copy / 1e9;  // TB/s
  fmt::print("\n{:<44} {:>9} {:>9} {:>8} {:>7}\n", "memory-bound kernel", "ms", "MB moved", "TB/s", "copy");
  auto row = [&](const std::string& name, double bytes, double ms) {
    const double tbs = bytes / ms / 1e9;
    fmt::print("{:<44} {:>9.4f} {:>9.1f} {:>8.2f} {:>6.0f}%\n", name, ms, bytes / 1e6, tbs, 100.0 * tbs / peak);
  };
  row(fmt::format("device copy {} MB", int64_t(big) * 2 / 1000000), copy_bytes, copy);
  const std::string nc = fmt::format(" {}x{}", N, C);
  row("layernorm fwd" + nc, 4.0 * NC + 8.0 * N,
      time_ms(s, 20, [&] { cuda::layernorm_forward(z, mean, rstd, x, nullptr, w, bias, N, C, 1e-5f, s); }));
  row("layernorm fwd + residual add" + nc, 8.0 * NC + 8.0 * N,
      time_ms(s, 20, [&] { cuda::layernorm_forward(z, mean, rstd, x, y, w, bias, N, C, 1e-5f, s); }));
  row("layernorm dinp" + nc, 8.0 * NC + 8.0 * N,
      time_ms(s, 20, [&] { cuda::layernorm_backward(z, nullptr, nullptr, y, x, w, mean, rstd, N, C, part, s); }));
  row("layernorm dweight+dbias" + nc, 4.0 * NC + 8.0 * N,
      time_ms(s, 20, [&] { cuda::layernorm_backward(nullptr, dw, db, y, x, w, mean, rstd, N, C, part, s); }));
  row("rmsnorm fwd + residual add" + nc, 8.0 * NC + 4.0 * N,
      time_ms(s, 20, [&] { cuda::rmsnorm_forward(z, rstd, x, y, w, N, C, 1e-5f, s); }));
  row("rmsnorm dinp" + nc, 8.0 * NC + 4.0 * N,
      time_ms(s, 20, [&] { cuda::rmsnorm_backward(z, nullptr, y, x, w, rstd, N, C, part, s); }));
  row("rmsnorm dweight" + nc, 4.0 * NC + 4.0 * N,
      time_ms(s, 20, [&] { cuda::rmsnorm_backward(nullptr, dw, y, x, w, rstd, N, C, part, s); }));
  row("bias backward" + nc, 2.0 * NC, time_ms(s, 20, [&] { cuda::bias_backward(dw, y, N, C, part, s); }));
  row("residual add bf16" + nc, 6.0 * NC, time_ms(s, 20, [&] { cuda::add_bf16(z, x, NC, s); }));
  const std::string nf = fmt::format(" {}x{}", N, F);
  row("gelu fwd" + nf, 4.0 * NF, time_ms(s, 20, [&] { cuda::gelu_forward(z, x, NF, s); }));
  row("gelu bwd" + nf, 6.0 * NF, time_ms(s, 20, [&] { cuda::gelu_backward(z, x, y, NF, s); }));
  row("swiglu fwd" + nf, 6.0 * NF, time_ms(s, 20, [&] { cuda::swiglu_forward(z, x, N, F, s); }));
  row("swiglu bwd" + nf, 10.0 * NF, time_ms(s, 20, [&] { cuda::swiglu_backward(z, x, y, N, F, s); }));
  row("to_f32" + nc, 6.0 * NC, time_ms(s, 20, [&] { cuda::to_f32(reinterpret_cast<float*>(z), x, NC, s); }));
  row("to_bf16" + nc, 6.0 * NC, time_ms(s, 20, [&] { cuda::to_bf16(z, reinterpret_cast<const float*>(y), NC, s); }));
  // The loss rewrites its logits with their gradient: a fresh copy before each call would be
  // timed too, so the same buffer is reused (a gradient of zeros is as costly to compute).
  row(fmt::format("crossentropy fwd+bwd {}x{}", N, V), 4.0 * N * double(V) + 8.0 * N,
      time_ms(s, 10, [&] { cuda::crossentropy_forward_backward(z, losses, targets, N, V, V, 1.0f / N, s); }));
  {
    // AdamW over the model's parameters (a flat table of 8192-element chunks).
    const int64_t P = param_count(model_dims(cfg));
    std::vector<cuda::OptChunkDev> table;
    for (int64_t k = 0; k < P; k += 8192) table.push_back({k, k, k, int32_t(std::min<int64_t>(8192, P - k)), 1, 1});
    auto* chunks = device_zeros<cuda::OptChunkDev>(table.size());
    LOOM_CUDA_CHECK(cudaMemcpy(chunks, table.data(), table.size() * sizeof(cuda::OptChunkDev), cudaMemcpyHostToDevice));
    float *master = device_zeros<float>(size_t(P)), *g = device_zeros<float>(size_t(P)),
          *m = device_zeros<float>(size_t(P)), *v = device_zeros<float>(size_t(P)), *one = device_zeros<float>(1);
    LOOM_CUDA_CHECK(cudaMemcpy(one, ones.data(), 4, cudaMemcpyHostToDevice));
    bf16* params = device_zeros<bf16>(size_t(P));
    row(fmt::format("adamw {}M params", P / 1000000), 30.0 * double(P), time_ms(s, 10, [&] {
          cuda::adamw_multi(master, params, g, m, v, chunks, int(table.size()), 1e-3f, 1.0f, 0.9f, 0.95f, 1e-8f, 1.0f,
                            one, s);
        }));
    for (void* p : {(void*)chunks, (void*)master, (void*)g, (void*)m, (void*)v, (void*)one, (void*)params}) cudaFree(p);
  }
  for (void* p : {(void*)x, (void*)y, (void*)z, (void*)w, (void*)bias, (void*)mean, (void*)rstd, (void*)dw, (void*)db,
                  (void*)part, (void*)losses, (void*)targets})
    cudaFree(p);
}

}  // namespace

void bench_kernels(const Config& cfg) {
  LOOM_CHECK(cuda_device_count() > 0, "loom bench kernels needs a CUDA device; none is visible");
  using cuda::bf16;
  cudaStream_t s;
  LOOM_CUDA_CHECK(cudaStreamCreate(&s));
  bench_memory_kernels(cfg, s);
  cuda::GemmContext ctx;
  fmt::print("\n{:<34} {:>10} {:>10}\n", "kernel", "ms", "TFLOP/s");
  for (int n : {1024, 2048, 4096, 8192}) {
    bf16 *a = device_zeros<bf16>(size_t(n) * n), *b = device_zeros<bf16>(size_t(n) * n),
         *c = device_zeros<bf16>(size_t(n) * n);
    const double ms =
        time_ms(s, 10, [&] { cuda::gemm(ctx, false, false, n, n, n, a, n, b, n, 0.0f, c, n, nullptr, s); });
    fmt::print("{:<34} {:>10.3f} {:>10.1f}\n", fmt::format("gemm bf16 {}^3", n), ms, 2.0 * n * n * n / ms / 1e9);
    cudaFree(a), cudaFree(b), cudaFree(c);
  }
  const int B = cfg.train.micro_batch, T = cfg.model.seq_len, H = cfg.model.n_head, KV = cfg.kv_heads(),
            D = cfg.head_dim();
  {
    // The MLP's first GEMM and GELU at the config's shape: separate kernels against the fused
    // epilogue, forward (GELU after the GEMM) and backward (GELU' after the input-gradient GEMM).
    const int N = B * T, C = cfg.model.d_model, F = cfg.model.d_ff;
    bf16 *x = device_zeros<bf16>(size_t(N) * C), *w = device_zeros<bf16>(size_t(C) * F),
         *bias = device_zeros<bf16>(size_t(F)), *pre = device_zeros<bf16>(size_t(N) * F),
         *act = device_zeros<bf16>(size_t(N) * F), *dx = device_zeros<bf16>(size_t(N) * F);
    const double flops = 2.0 * N * C * F;
    const double sep = time_ms(s, 10, [&] {
      cuda::gemm(ctx, false, false, N, F, C, x, C, w, F, 0.0f, pre, F, bias, s);
      cuda::gelu_forward(act, pre, int64_t(N) * F, s);
    });
    const double fused =
        time_ms(s, 10, [&] { cuda::gemm_gelu(ctx, false, false, N, F, C, x, C, w, F, act, F, bias, pre, s); });
    const double sep_b = time_ms(s, 10, [&] {
      cuda::gemm(ctx, false, true, N, F, C, x, C, w, C, 0.0f, dx, F, nullptr, s);
      cuda::gelu_backward(act, pre, dx, int64_t(N) * F, s);
    });
    const double fused_b =
        time_ms(s, 10, [&] { cuda::gemm_dgelu(ctx, false, true, N, F, C, x, C, w, C, act, F, pre, s); });
    const std::string shape = fmt::format("{}x{}x{}", N, F, C);
    fmt::print("{:<34} {:>10.3f} {:>10.1f}\n", "gemm+gelu separate " + shape, sep, flops / sep / 1e9);
    fmt::print("{:<34} {:>10.3f} {:>10.1f}\n", "gemm+gelu fused " + shape, fused, flops / fused / 1e9);
    fmt::print("{:<34} {:>10.3f} {:>10.1f}\n", "gemm+dgelu separate " + shape, sep_b, flops / sep_b / 1e9);
    fmt::print("{:<34} {:>10.3f} {:>10.1f}\n", "gemm+dgelu fused " + shape, fused_b, flops / fused_b / 1e9);
    fmt::print("GELU epilogue speedup: forward {:.2f}x, backward {:.2f}x\n", sep / fused, sep_b / fused_b);
    // Training uses the fused backward only (forward keeps GELU a kernel for exact recompute).
    fmt::print("train.gelu_epilogue: \"{}\" is faster at this shape (backward {:.3f} ms fused, {:.3f} ms separate)\n",
               fused_b <= sep_b ? "fused" : "separate", fused_b, sep_b);
    for (void* p : {(void*)x, (void*)w, (void*)bias, (void*)pre, (void*)act, (void*)dx}) cudaFree(p);
  }
  if (const int E = cfg.model.moe.num_experts; E > 0) {
    // A MoE layer's experts: their two forward GEMMs as one strided batch each (the padded
    // layout of a capacity), as runs sized on the device (dropless: kernels/cuda/gemm_ragged.cu)
    // and as one cuBLASLt GEMM per expert (what dropless would be with its sizes on the host),
    // at the rows an expert gets: its slot from every ep rank, or an even share of the
    // assignments.
    const int P = cfg.parallel.ep, El = E / P, N = B * T, C = cfg.model.d_model, F = cfg.model.d_ff;
    const int64_t slot = moe_slot(model_dims(cfg), N);
    const int M = int(slot ? P * slot : std::max<int64_t>(1, int64_t(N) * cfg.model.moe.top_k * P / E));
    const int64_t wstride = 3 * int64_t(F) * C;
    bf16 *x = device_zeros<bf16>(size_t(El) * M * C), *w = device_zeros<bf16>(size_t(El) * wstride),
         *fc = device_zeros<bf16>(size_t(El) * M * 2 * F), *act = device_zeros<bf16>(size_t(El) * M * F),
         *y = device_zeros<bf16>(size_t(El) * M * C);
    const double flops = 2.0 * El * M * C * 3.0 * F;
    const double batched = time_ms(s, 10, [&] {
      cuda::gemm_batched(ctx, false, true, M, 2 * F, C, x, C, w, C, 0.0f, fc, 2 * F,
                         {El, int64_t(M) * C, wstride, int64_t(M) * 2 * F}, s);
      cuda::gemm_batched(ctx, false, true, M, C, F, act, F, w + 2 * int64_t(F) * C, F, 0.0f, y, C,
                         {El, int64_t(M) * F, wstride, int64_t(M) * C}, s);
    });
    const double loop = time_ms(s, 10, [&] {
      for (int e = 0; e < El; ++e)
        cuda::gemm(ctx, false, true, M, 2 * F, C, x + int64_t(e) * M * C, C, w + e * wstride, C, 0.0f,
                   fc + int64_t(e) * M * 2 * F, 2 * F, nullptr, s);
      for (int e = 0; e < El; ++e)
        cuda::gemm(ctx, false, true, M, C, F, act + int64_t(e) * M * F, F, w + e * wstride + 2 * int64_t(F) * C, F,
                   0.0f, y + int64_t(e) * M * C, C, nullptr, s);
    });
    const std::vector<int32_t> even(static_cast<size_t>(El), M);
    int32_t* counts = device_zeros<int32_t>(even.size());
    LOOM_CUDA_CHECK(cudaMemcpy(counts, even.data(), even.size() * 4, cudaMemcpyHostToDevice));
    const double ragged = time_ms(s, 10, [&] {
      cuda::gemm_ragged_rows(fc, x, w, wstride, true, counts, 1, El, int64_t(El) * M, C, 2 * F, s);
      cuda::gemm_ragged_rows(y, act, w + 2 * int64_t(F) * C, wstride, true, counts, 1, El, int64_t(El) * M, F, C, s);
    });
    const std::string shape = fmt::format("{} x {}x{}x{}", El, M, 2 * F, C);
    fmt::print("{:<34} {:>10.3f} {:>10.1f}\n", "moe experts batched " + shape, batched, flops / batched / 1e9);
    fmt::print("{:<34} {:>10.3f} {:>10.1f}\n", "moe experts per expert " + shape, loop, flops / loop / 1e9);
    fmt::print("{:<34} {:>10.3f} {:>10.1f}\n", "moe experts ragged " + shape, ragged, flops / ragged / 1e9);
    fmt::print("MoE experts: one batched GEMM per matrix {:.2f}x the per-expert loop; ragged (device-sized) {:.2f}x\n",
               loop / batched, loop / ragged);
    for (void* p : {(void*)x, (void*)w, (void*)fc, (void*)act, (void*)y, (void*)counts}) cudaFree(p);
  }
  // Attention at the three reference shapes (GPT-2 124M, the 1.1B GQA model, an 8B-class long
  // sequence) and the config's: the flash kernels, the WMMA ones beside them, and the
  // row-wise ones at the config's shape only (they are slow at the long one).
  struct AttnShape {
    int B, T, H, KV, D;
  };
  const AttnShape shapes[] = {{16, 1024, 12, 12, 64}, {4, 2048, 32, 4, 64}, {2, 8192, 32, 8, 128}, {B, T, H, KV, D}};
  for (const AttnShape& a : shapes) bench_attention(a.B, a.T, a.H, a.KV, a.D, &a == &shapes[3], s);
  cudaStreamDestroy(s);
}

RooflineRates cuda_roofline_measure() {
  LOOM_CHECK(cuda_device_count() > 0, "measuring the GPU's roofline needs a CUDA device; none is visible");
  using cuda::bf16;
  cudaStream_t s;
  LOOM_CUDA_CHECK(cudaStreamCreate(&s));
  RooflineRates r;
  {
    const size_t bytes = size_t(1) << 30;
    char *a = device_zeros<char>(bytes), *b = device_zeros<char>(bytes);
    const double ms =
        time_ms(s, 10, [&] { LOOM_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s)); });
    r.copy_bw = 2.0 * double(bytes) / (ms / 1e3);
    cudaFree(a), cudaFree(b);
  }
  {
    const int n = 8192;
    cuda::GemmContext ctx;
    bf16 *a = device_zeros<bf16>(size_t(n) * n), *b = device_zeros<bf16>(size_t(n) * n),
         *c = device_zeros<bf16>(size_t(n) * n);
    const double ms =
        time_ms(s, 10, [&] { cuda::gemm(ctx, false, false, n, n, n, a, n, b, n, 0.0f, c, n, nullptr, s); });
    r.gemm_flops = 2.0 * double(n) * n * n / (ms / 1e3);
    cudaFree(a), cudaFree(b), cudaFree(c);
  }
  LOOM_CUDA_CHECK(cudaStreamDestroy(s));
  return r;
}

std::string cuda_device_name() {
  int dev = 0;
  cudaDeviceProp prop{};
  LOOM_CUDA_CHECK(cudaGetDevice(&dev));
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  return prop.name;
}
#else
RooflineRates cuda_roofline_measure() {
  fail("measuring the GPU's roofline needs a build with CUDA");
}
std::string cuda_device_name() {
  return "no CUDA";
}
void bench_kernels(const Config&) {
  fail("loom bench kernels times CUDA kernels; this build has no CUDA (rebuild with LOOM_CUDA=ON)");
}
#endif

}  // namespace loom
