// The counted ops (count_ops.h): each runs the real wrapper of kernels/cuda/ on the emulated
// device under a CountSession, at the shapes a step passes (model/backend_cuda.cpp and the
// decoder's op order in model/decoder_part.cpp), on buffers whose untouched pages cost nothing
// (the emulation runs only sampled blocks). Inputs are zeros but for the optimizer's table and
// the tokens (a Zipf-like batch: the most frequent token about 3% of it, as in real text):
// counts depend on shapes and indices, not on values. Compiled with the counting kernels
// (namespace loom::cuda_count); registers itself as the binary's count driver.
#include "kernels/emu/count_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "kernels/cuda/ops_cuda.h"
#include "kernels/flash_ds.h"
#include "runtime/exact_digits.h"

namespace loom::emu {

namespace {

using cuda::bf16;

// Device memory for one op's buffers, freed with it.
struct Arena {
  std::vector<std::pair<void*, size_t>> held;
  template <class T>
  T* get(int64_t n) {
    const size_t bytes = size_t(std::max<int64_t>(n, 1)) * sizeof(T);
    held.push_back({count_alloc(bytes), bytes});
    return static_cast<T*>(held.back().first);
  }
  ~Arena() {
    for (auto& [p, b] : held) count_free(p, b);
  }
};

// Runs fn's launches under a session: the op with those launches.
template <class Fn>
CountedOp counted(std::string name, std::string shape, double per_step, double min_bytes, Fn fn,
                  CountOptions opt = {}) {
  CountedOp op{std::move(name), std::move(shape), per_step, min_bytes, 0, true, {}};
  CountSession session(opt);
  fn();
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(op.name + ": " + cudaGetErrorString(e));
  op.launches = session.take();
  return op;
}

std::vector<CountedOp> attention(int B, int T, int H, int KV, int D) {
  Arena a;
  const int64_t row = int64_t(H + 2 * KV) * D, N = int64_t(B) * T;
  bf16 *qkv = a.get<bf16>(N * row), *out = a.get<bf16>(N * H * D), *dout = a.get<bf16>(N * H * D),
       *dqkv = a.get<bf16>(N * row);
  float *lse = a.get<float>(int64_t(B) * H * T), *scratch = a.get<float>(int64_t(B) * H * T);
  // The stored dS where the backend plans it (head dim 64): dQ = dS K, no recomputation.
  const int64_t ds_elems = flash_ds_elems(B, T, H, D, false);
  bf16* ds = ds_elems > 0 ? a.get<bf16>(ds_elems) : nullptr;
  const std::string shape = fmt::format("B{} T{} H{} KV{} D{}", B, T, H, KV, D);
  const double causal = 2.0 * B * H * double(T) * T * D;  // two products over the causal half
  // Every (batch, head) runs the same blocks: one of them (grid y and z), and a key or query tile
  // of each stratum (grid x).
  CountOptions opt;
  opt.samples[0] = 16, opt.samples[1] = 1, opt.samples[2] = 1;
  std::vector<CountedOp> ops;
  ops.push_back(counted(
      "attention fwd", shape, 1, 2.0 * N * (row + int64_t(H) * D) + 4.0 * B * H * T,
      [&] { cuda::attention_forward(out, lse, qkv, B, T, H, KV, D, nullptr, nullptr); }, opt));
  ops.back().model_flops = causal, ops.back().memory_bound = false;
  ops.push_back(counted(
      "attention bwd", shape, 1, 2.0 * N * (2 * row + 2 * int64_t(H) * D) + 8.0 * B * H * T,
      [&] {
        cuda::attention_backward(dqkv, dout, out, qkv, lse, scratch, B, T, H, KV, D, nullptr, nullptr, ds, ds_elems);
      },
      opt));
  ops.back().model_flops = 2.5 * causal, ops.back().memory_bound = false;
  if (ds) {  // the dQ that recomputes S and dP, where there is no store (document masks): not in the step
    ops.push_back(counted(
        "attention bwd, dQ recomputed (no store; not in the step)", shape, 0,
        2.0 * N * (2 * row + 2 * int64_t(H) * D) + 8.0 * B * H * T,
        [&] { cuda::attention_backward(dqkv, dout, out, qkv, lse, scratch, B, T, H, KV, D, nullptr, nullptr); }, opt));
    ops.back().model_flops = 2.5 * causal, ops.back().memory_bound = false;
  }
  return ops;
}

std::vector<CountedOp> step(const StepShape& s) {
  Arena a;
  const int N = s.B * s.T, C = s.C, F = s.F, V = s.V, L = s.layers;
  const int64_t NC = int64_t(N) * C, NF = int64_t(N) * F;
  const std::string nc = fmt::format("{}x{}", N, C), nf = fmt::format("{}x{}", N, F);
  bf16 *x = a.get<bf16>(NC), *y = a.get<bf16>(NC), *z = a.get<bf16>(NC), *w = a.get<bf16>(C), *bias = a.get<bf16>(C);
  float *mean = a.get<float>(N), *rstd = a.get<float>(N), *dw = a.get<float>(4 * int64_t(C)),
        *db = a.get<float>(4 * int64_t(C)), *part = a.get<float>(cuda::norm_partials_floats(N, C));
  std::vector<CountedOp> ops;
  const double norms = 2.0 * L + 1;  // two a layer and the final one
  if (!s.llama) {
    ops.push_back(counted("layernorm fwd + residual add", nc, norms, 8.0 * NC + 8.0 * N,
                          [&] { cuda::layernorm_forward(z, mean, rstd, x, y, w, bias, N, C, 1e-5f, nullptr); }));
    ops.push_back(counted("layernorm bwd (dinp, dweight, dbias)", nc, norms, 8.0 * NC + 8.0 * N,
                          [&] { cuda::layernorm_backward(z, dw, db, y, x, w, mean, rstd, N, C, part, nullptr); }));
    // The biases' gradients: qkv (3C), proj (C), fc (4C), fc2 (C) a layer. Each rides its
    // weight gradient's GEMM (BGRADA/BGRADB, uncounted as every GEMM is); what is left is
    // dbias += the epilogue's sums (model/backend_cuda.cpp's linear_backward).
    for (const auto& [what, cols] : {std::pair{"qkv", 3 * C}, {"proj", C}, {"fc", F}, {"fc2", C}}) {
      float *out = a.get<float>(cols), *sums = a.get<float>(cols);
      ops.push_back(counted(fmt::format("bias bwd {} (dW epilogue, +=)", what), fmt::format("1x{}", cols), L,
                            12.0 * cols, [&] { cuda::add_f32(out, sums, cols, nullptr); }));
    }
    {  // A bias's gradient without its weight's: a pass over dout of its own (no GPT-2 step has one).
      bf16* d = a.get<bf16>(int64_t(N) * 3 * C);
      float *out = a.get<float>(3 * C), *p = a.get<float>(cuda::column_partials_floats(N, 3 * C));
      ops.push_back(counted("bias bwd alone (no dW)", fmt::format("{}x{}", N, 3 * C), 0, 2.0 * N * 3 * C,
                            [&] { cuda::bias_backward(out, d, N, 3 * C, p, nullptr); }));
    }
    bf16 *act = a.get<bf16>(NF), *pre = a.get<bf16>(NF);
    ops.push_back(counted("gelu fwd", nf, L, 4.0 * NF, [&] { cuda::gelu_forward(act, pre, NF, nullptr); }));
  } else {
    ops.push_back(counted("rmsnorm fwd + residual add", nc, norms, 8.0 * NC + 4.0 * N,
                          [&] { cuda::rmsnorm_forward(z, rstd, x, y, w, N, C, 1e-5f, nullptr); }));
    ops.push_back(counted("rmsnorm bwd (dinp, dweight)", nc, norms, 8.0 * NC + 4.0 * N,
                          [&] { cuda::rmsnorm_backward(z, dw, y, x, w, rstd, N, C, part, nullptr); }));
    bf16 *fc = a.get<bf16>(2 * NF), *act = a.get<bf16>(NF), *dfc = a.get<bf16>(2 * NF);
    ops.push_back(counted("swiglu fwd", nf, L, 6.0 * NF, [&] { cuda::swiglu_forward(act, fc, N, F, nullptr); }));
    ops.push_back(counted("swiglu bwd", nf, L, 10.0 * NF, [&] { cuda::swiglu_backward(dfc, fc, act, N, F, nullptr); }));
    const int D = C / s.H;
    bf16* qkv = a.get<bf16>(int64_t(N) * (s.H + 2 * s.KV) * D);
    float *cs = a.get<float>(int64_t(s.T) * D / 2), *sn = a.get<float>(int64_t(s.T) * D / 2);
    const double rope_bytes = 4.0 * N * (s.H + s.KV) * D;
    ops.push_back(counted("rope fwd", fmt::format("{}x{}", N, (s.H + s.KV) * D), L, rope_bytes,
                          [&] { cuda::rope_forward(qkv, cs, sn, s.B, s.T, s.H, s.KV, D, nullptr, nullptr); }));
    ops.push_back(counted("rope bwd", fmt::format("{}x{}", N, (s.H + s.KV) * D), L, rope_bytes,
                          [&] { cuda::rope_backward(qkv, cs, sn, s.B, s.T, s.H, s.KV, D, nullptr, nullptr); }));
  }
  {
    bf16* logits = a.get<bf16>(int64_t(N) * V);
    float* losses = a.get<float>(N);
    int32_t* targets = a.get<int32_t>(N);
    CountOptions opt;
    opt.samples[0] = 8;
    ops.push_back(counted(
        "crossentropy fwd+bwd", fmt::format("{}x{}", N, V), 1, 4.0 * N * double(V) + 8.0 * N,
        [&] { cuda::crossentropy_forward_backward(logits, losses, targets, N, V, s.valid, 1.0f / N, nullptr); }, opt));
  }
  {
    // The batch's tokens: rank r drawn with weight 1 / (r + 3), the ranks shuffled over the ids.
    std::mt19937_64 rng(53);
    std::vector<double> weight(size_t(s.valid));
    for (size_t r = 0; r < weight.size(); ++r) weight[r] = 1.0 / (double(r) + 3.0);
    std::discrete_distribution<int> pick(weight.begin(), weight.end());
    std::vector<int32_t> ids(size_t(s.valid));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> tokens(static_cast<size_t>(N));
    for (auto& t : tokens) t = ids[size_t(pick(rng))];
    int unique = 0;
    const auto index = cuda::token_index(tokens.data(), N, 0, V, &unique);
    int32_t* dev_tokens = a.get<int32_t>(N);
    int32_t* dev_index = a.get<int32_t>(int64_t(index.size()));
    std::copy(tokens.begin(), tokens.end(), dev_tokens);
    std::copy(index.begin(), index.end(), dev_index);
    bf16 *wte = a.get<bf16>(int64_t(V) * C), *wpe = s.llama ? nullptr : a.get<bf16>(int64_t(s.T) * C);
    float *dwte = a.get<float>(int64_t(V) * C), *dwpe = s.llama ? nullptr : a.get<float>(int64_t(s.T) * C),
          *epart = a.get<float>(cuda::embedding_partials_floats(C));
    ops.push_back(counted("embedding fwd", nc, 1, 4.0 * NC + 4.0 * N, [&] {
      cuda::embedding_forward(z, dev_tokens, wte, 0, V, wpe, s.B, s.T, C, nullptr, nullptr);
    }));
    CountOptions all;
    all.samples[0] = 0;  // every distinct token: their blocks differ by the token's count
    ops.push_back(counted(
        "embedding bwd", nc, 1, 2.0 * NC + 8.0 * double(unique) * C + (s.llama ? 0 : 8.0 * s.T * C),
        [&] { cuda::embedding_backward(dwte, dwpe, z, dev_index, unique, N, s.B, s.T, C, nullptr, epart, nullptr); },
        all));
  }
  {
    // The optimizer over every parameter: the table of 8192-element chunks the trainer makes.
    const int64_t P = s.params;
    const int chunks = int((P + 8191) / 8192);
    auto* table = a.get<cuda::OptChunkDev>(chunks);
    for (int c = 0; c < chunks; ++c) {
      const int64_t k = int64_t(c) * 8192;
      table[c] = {k, k, k, int32_t(std::min<int64_t>(8192, P - k)), 1, 1};
    }
    float *master = a.get<float>(P), *g = a.get<float>(P), *m = a.get<float>(P), *v = a.get<float>(P);
    float* one = a.get<float>(1);
    *one = 1.0f;
    bf16* params = a.get<bf16>(P);
    double *sq = a.get<double>(kExactDigits), *scratch = a.get<double>(kExactDigits + 1);
    ops.push_back(counted("grad norm (sum of squares)", fmt::format("{}M params", P / 1000000), 1, 4.0 * double(P),
                          [&] { cuda::sum_squares_table(sq, g, table, chunks, scratch, nullptr); }));
    ops.push_back(counted("adamw", fmt::format("{}M params", P / 1000000), 1, 30.0 * double(P), [&] {
      cuda::adamw_multi(master, params, g, m, v, table, chunks, 1e-3f, 1.0f, 0.9f, 0.95f, 1e-8f, 1.0f, one, nullptr);
    }));
  }
  ops.push_back(counted("residual add", nc, 1, 6.0 * NC, [&] { cuda::add_bf16(z, x, NC, nullptr); }));
  return ops;
}

const CountDriver kDriver{&attention, &step};
const bool registered = (set_count_driver(&kDriver), true);

}  // namespace

}  // namespace loom::emu
