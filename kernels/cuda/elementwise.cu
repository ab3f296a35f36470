// Pointwise and column-reduction kernels. Column reductions (bias, embedding gradients) sum in
// a fixed order without atomics: the bias gradient in two stages over row chunks (common.cuh);
// the token embedding gradient gives each distinct token of the batch one block that walks
// that token's positions in order.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace loom::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void to_bf16_kernel(bf16* out, const float* in, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = b(in[i]);
}
__global__ void to_f32_kernel(float* out, const bf16* in, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = f(in[i]);
}

// Row m's contribution to column c of the bias gradient.
struct BiasGrad {
  const bf16* dout;
  int N;
  __device__ void operator()(int m, int c, float& a, float&) const { a += f(dout[int64_t(m) * N + c]); }
};

__global__ void embedding_forward_kernel(bf16* out, const int32_t* tokens, const bf16* wte, int v0, int Vl,
                                         const bf16* wpe, const int32_t* pos, int T, int C, int64_t total) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  int64_t row = i / C;
  int c = int(i % C), t = pos ? pos[row] : int(row % T), id = tokens[row] - v0;
  float e = id >= 0 && id < Vl ? f(wte[int64_t(id) * C + c]) : 0.0f;
  if (wpe) e += f(wpe[int64_t(t) * C + c]);
  out[i] = b(e);
}

// One block per distinct token: its positions' rows summed in fp32 in order, added once.
// index: ids[U], starts[U + 1], positions (token_index's packing).
__global__ void embedding_wte_backward_kernel(float* dwte, const bf16* dout, const int32_t* index, int U, int C) {
  const int u = blockIdx.x, id = index[u];
  const int32_t* starts = index + U;
  const int32_t* pos = index + 2 * U + 1;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float d = 0.0f;
    for (int k = starts[u]; k < starts[u + 1]; ++k) d += f(dout[int64_t(pos[k]) * C + c]);
    dwte[int64_t(id) * C + c] += d;
  }
}

// One thread per (t, c): the rows at position t summed in order, added once: the B rows at
// index t of their sequence, or (pos_index, data.doc_mask) the rows position_index lists.
__global__ void embedding_wpe_backward_kernel(float* dwpe, const bf16* dout, const int32_t* pos_index, int B, int T,
                                              int C) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(T) * C) return;
  float d = 0.0f;
  if (pos_index) {
    const int t = int(i / C), c = int(i % C);
    const int32_t* rows = pos_index + T + 1;
    for (int k = pos_index[t]; k < pos_index[t + 1]; ++k) d += f(dout[int64_t(rows[k]) * C + c]);
  } else {
    for (int bi = 0; bi < B; ++bi) d += f(dout[int64_t(bi) * T * C + i]);
  }
  dwpe[i] += d;
}

template <bool Inverse>
__global__ void rope_kernel(bf16* qkv, const float* cos, const float* sin, const int32_t* pos, int T, int H, int KV,
                            int D, int64_t total) {
  // One thread per (row, head of q or k, pair index i < D/2).
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int half = D / 2;
  int i = int(idx % half);
  int64_t rest = idx / half;
  int h = int(rest % (H + KV));
  int64_t row = rest / (H + KV);
  int t = pos ? pos[row] : int(row % T);
  bf16* x = qkv + row * (H + 2 * KV) * D + h * D;
  float x1 = f(x[i]), x2 = f(x[i + half]), c = cos[t * half + i], sn = Inverse ? -sin[t * half + i] : sin[t * half + i];
  x[i] = b(x1 * c - x2 * sn);
  x[i + half] = b(x2 * c + x1 * sn);
}

constexpr float kGeluScale = 0.7978845608028654f;

__global__ void add_bf16_kernel(bf16* acc, const bf16* x, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) acc[i] = b(f(acc[i]) + f(x[i]));
}
__global__ void add_f32_kernel(float* acc, const float* x, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) acc[i] += x[i];
}

__global__ void gelu_forward_kernel(bf16* out, const bf16* inp, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = f(inp[i]);
  out[i] = b(0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x))));
}

__global__ void gelu_backward_kernel(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = f(inp[i]);
  float th = tanhf(kGeluScale * (x + 0.044715f * x * x * x));
  float g = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
  dinp[i] = b(g * f(dout[i]));
}

__global__ void swiglu_forward_kernel(bf16* out, const bf16* inp, int F, int64_t total) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  int64_t n = i / F;
  int j = int(i % F);
  float g = f(inp[n * 2 * F + j]), u = f(inp[n * 2 * F + F + j]);
  out[i] = b(g / (1.0f + __expf(-g)) * u);
}

__global__ void swiglu_backward_kernel(bf16* dinp, const bf16* inp, const bf16* dout, int F, int64_t total) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  int64_t n = i / F;
  int j = int(i % F);
  float g = f(inp[n * 2 * F + j]), u = f(inp[n * 2 * F + F + j]), dy = f(dout[i]);
  float sig = 1.0f / (1.0f + __expf(-g));
  dinp[n * 2 * F + j] = b(dy * u * sig * (1.0f + g * (1.0f - sig)));
  dinp[n * 2 * F + F + j] = b(dy * g * sig);
}

}  // namespace

void to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  LOOM_LAUNCH(to_bf16_kernel, blocks_for(n, kThreads), kThreads, 0, s)(out, in, n);
  LOOM_CUDA_LAUNCHED();
}
void to_f32(float* out, const bf16* in, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  LOOM_LAUNCH(to_f32_kernel, blocks_for(n, kThreads), kThreads, 0, s)(out, in, n);
  LOOM_CUDA_LAUNCHED();
}
void add_bf16(bf16* acc, const bf16* x, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  LOOM_LAUNCH(add_bf16_kernel, blocks_for(n, kThreads), kThreads, 0, s)(acc, x, n);
  LOOM_CUDA_LAUNCHED();
}
void add_f32(float* acc, const float* x, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  LOOM_LAUNCH(add_f32_kernel, blocks_for(n, kThreads), kThreads, 0, s)(acc, x, n);
  LOOM_CUDA_LAUNCHED();
}
void bias_backward(float* dbias, const bf16* dout, int M, int N, float* partials, cudaStream_t s) {
  column_sums_2stage<true>(dbias, nullptr, BiasGrad{dout, N}, M, N, partials, s);
}
void embedding_forward(bf16* out, const int32_t* tokens, const bf16* wte, int v0, int Vl, const bf16* wpe, int B, int T,
                       int C, const int32_t* pos, cudaStream_t s) {
  const int64_t total = int64_t(B) * T * C;
  LOOM_LAUNCH(embedding_forward_kernel, blocks_for(total, kThreads), kThreads, 0, s)
  (out, tokens, wte, v0, Vl, wpe, pos, T, C, total);
  LOOM_CUDA_LAUNCHED();
}
std::vector<int32_t> token_index(const int32_t* tokens, int N, int v0, int Vl, int* unique) {
  std::vector<int32_t> count(size_t(Vl) + 1, 0);
  for (int n = 0; n < N; ++n)
    if (tokens[n] >= v0 && tokens[n] < v0 + Vl) ++count[size_t(tokens[n] - v0) + 1];
  int U = 0;
  for (int v = 0; v < Vl; ++v) U += count[size_t(v) + 1] > 0;
  for (int v = 0; v < Vl; ++v) count[size_t(v) + 1] += count[size_t(v)];  // count[v]: first slot of id v
  const int placed = count[size_t(Vl)];
  std::vector<int32_t> index(size_t(2 * U + 1 + placed));
  int32_t *ids = index.data(), *starts = ids + U, *pos = starts + U + 1;
  for (int v = 0, u = 0; v < Vl; ++v)
    if (count[size_t(v) + 1] > count[size_t(v)]) ids[u] = v, starts[u] = count[size_t(v)], ++u;
  starts[U] = placed;
  for (int n = 0; n < N; ++n)
    if (tokens[n] >= v0 && tokens[n] < v0 + Vl) pos[count[size_t(tokens[n] - v0)]++] = n;
  *unique = U;
  return index;
}
std::vector<int32_t> position_index(const int32_t* pos, int N, int T) {
  std::vector<int32_t> index(size_t(T) + 1 + size_t(N), 0);
  int32_t *starts = index.data(), *rows = starts + T + 1;
  for (int n = 0; n < N; ++n) {
    LOOM_CHECK(pos[n] >= 0 && pos[n] < T, "token {}'s position {} is outside [0, {})", n, pos[n], T);
    ++starts[pos[n] + 1];
  }
  for (int t = 0; t < T; ++t) starts[t + 1] += starts[t];
  std::vector<int32_t> next(starts, starts + T);
  for (int n = 0; n < N; ++n) rows[next[size_t(pos[n])]++] = n;
  return index;
}
void embedding_backward(float* dwte, float* dwpe, const bf16* dout, const int32_t* index, int U, int B, int T, int C,
                        const int32_t* pos_index, cudaStream_t s) {
  if (U > 0) {
    LOOM_LAUNCH(embedding_wte_backward_kernel, U, kThreads, 0, s)(dwte, dout, index, U, C);
    LOOM_CUDA_LAUNCHED();
  }
  if (dwpe) {
    LOOM_LAUNCH(embedding_wpe_backward_kernel, blocks_for(int64_t(T) * C, kThreads), kThreads, 0, s)
    (dwpe, dout, pos_index, B, T, C);
    LOOM_CUDA_LAUNCHED();
  }
}
void rope_forward(bf16* qkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D, const int32_t* pos,
                  cudaStream_t s) {
  const int64_t total = int64_t(B) * T * (H + KV) * (D / 2);
  LOOM_LAUNCH(rope_kernel<false>, blocks_for(total, kThreads), kThreads, 0, s)(qkv, cos, sin, pos, T, H, KV, D, total);
  LOOM_CUDA_LAUNCHED();
}
void rope_backward(bf16* dqkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D,
                   const int32_t* pos, cudaStream_t s) {
  const int64_t total = int64_t(B) * T * (H + KV) * (D / 2);
  LOOM_LAUNCH(rope_kernel<true>, blocks_for(total, kThreads), kThreads, 0, s)(dqkv, cos, sin, pos, T, H, KV, D, total);
  LOOM_CUDA_LAUNCHED();
}
void gelu_forward(bf16* out, const bf16* inp, int64_t n, cudaStream_t s) {
  LOOM_LAUNCH(gelu_forward_kernel, blocks_for(n, kThreads), kThreads, 0, s)(out, inp, n);
  LOOM_CUDA_LAUNCHED();
}
void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n, cudaStream_t s) {
  LOOM_LAUNCH(gelu_backward_kernel, blocks_for(n, kThreads), kThreads, 0, s)(dinp, inp, dout, n);
  LOOM_CUDA_LAUNCHED();
}
void swiglu_forward(bf16* out, const bf16* inp, int N, int F, cudaStream_t s) {
  const int64_t total = int64_t(N) * F;
  LOOM_LAUNCH(swiglu_forward_kernel, blocks_for(total, kThreads), kThreads, 0, s)(out, inp, F, total);
  LOOM_CUDA_LAUNCHED();
}
void swiglu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int N, int F, cudaStream_t s) {
  const int64_t total = int64_t(N) * F;
  LOOM_LAUNCH(swiglu_backward_kernel, blocks_for(total, kThreads), kThreads, 0, s)(dinp, inp, dout, F, total);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace loom::cuda
