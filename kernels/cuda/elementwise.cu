// Pointwise and column-reduction kernels. Column reductions (bias, embedding gradients) give
// each thread one column and walk the rows in order: no atomics, a fixed summation order.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace loom::cuda {

namespace {

__global__ void to_bf16_kernel(bf16* out, const float* in, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = b(in[i]);
}
__global__ void to_f32_kernel(float* out, const bf16* in, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = f(in[i]);
}

__global__ void bias_backward_kernel(bf16* dbias, const bf16* dout, int M, int N) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= N) return;
  float s = 0.0f;
  for (int m = 0; m < M; ++m) s += f(dout[int64_t(m) * N + c]);
  dbias[c] = b(f(dbias[c]) + s);
}

__global__ void embedding_forward_kernel(bf16* out, const int32_t* tokens, const bf16* wte, int v0, int Vl,
                                         const bf16* wpe, int T, int C, int64_t total) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  int64_t row = i / C;
  int c = int(i % C), t = int(row % T), id = tokens[row] - v0;
  float e = id >= 0 && id < Vl ? f(wte[int64_t(id) * C + c]) : 0.0f;
  if (wpe) e += f(wpe[int64_t(t) * C + c]);
  out[i] = b(e);
}

// One thread per channel walks every token in order; a token's row is summed in fp32 and
// added to the bf16 gradient once per occurrence, as the CPU twin does.
__global__ void embedding_backward_kernel(bf16* dwte, int v0, int Vl, bf16* dwpe, const bf16* dout,
                                          const int32_t* tokens, int BT, int T, int C) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int n = 0; n < BT; ++n) {
    float d = f(dout[int64_t(n) * C + c]);
    int id = tokens[n] - v0;
    if (id >= 0 && id < Vl) dwte[int64_t(id) * C + c] = b(f(dwte[int64_t(id) * C + c]) + d);
    if (dwpe) dwpe[int64_t(n % T) * C + c] = b(f(dwpe[int64_t(n % T) * C + c]) + d);
  }
}

template <bool Inverse>
__global__ void rope_kernel(bf16* qkv, const float* cos, const float* sin, int T, int H, int KV, int D, int64_t total) {
  // One thread per (row, head of q or k, pair index i < D/2).
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int half = D / 2;
  int i = int(idx % half);
  int64_t rest = idx / half;
  int h = int(rest % (H + KV));
  int64_t row = rest / (H + KV);
  int t = int(row % T);
  bf16* x = qkv + row * (H + 2 * KV) * D + h * D;
  float x1 = f(x[i]), x2 = f(x[i + half]), c = cos[t * half + i], sn = Inverse ? -sin[t * half + i] : sin[t * half + i];
  x[i] = b(x1 * c - x2 * sn);
  x[i + half] = b(x2 * c + x1 * sn);
}

constexpr float kGeluScale = 0.7978845608028654f;

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

__global__ void add_kernel(bf16* acc, const bf16* x, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) acc[i] = b(f(acc[i]) + f(x[i]));
}

constexpr int kThreads = 256;

}  // namespace

void to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  to_bf16_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(out, in, n);
  LOOM_CUDA_LAUNCHED();
}
void to_f32(float* out, const bf16* in, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  to_f32_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(out, in, n);
  LOOM_CUDA_LAUNCHED();
}
void bias_backward(bf16* dbias, const bf16* dout, int M, int N, cudaStream_t s) {
  bias_backward_kernel<<<blocks_for(N, kThreads), kThreads, 0, s>>>(dbias, dout, M, N);
  LOOM_CUDA_LAUNCHED();
}
void embedding_forward(bf16* out, const int32_t* tokens, const bf16* wte, int v0, int Vl, const bf16* wpe, int B, int T,
                       int C, cudaStream_t s) {
  const int64_t total = int64_t(B) * T * C;
  embedding_forward_kernel<<<blocks_for(total, kThreads), kThreads, 0, s>>>(out, tokens, wte, v0, Vl, wpe, T, C, total);
  LOOM_CUDA_LAUNCHED();
}
void embedding_backward(bf16* dwte, int v0, int Vl, bf16* dwpe, const bf16* dout, const int32_t* tokens, int B, int T,
                        int C, cudaStream_t s) {
  embedding_backward_kernel<<<blocks_for(C, 128), 128, 0, s>>>(dwte, v0, Vl, dwpe, dout, tokens, B * T, T, C);
  LOOM_CUDA_LAUNCHED();
}
void rope_forward(bf16* qkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D, cudaStream_t s) {
  const int64_t total = int64_t(B) * T * (H + KV) * (D / 2);
  rope_kernel<false><<<blocks_for(total, kThreads), kThreads, 0, s>>>(qkv, cos, sin, T, H, KV, D, total);
  LOOM_CUDA_LAUNCHED();
}
void rope_backward(bf16* dqkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D, cudaStream_t s) {
  const int64_t total = int64_t(B) * T * (H + KV) * (D / 2);
  rope_kernel<true><<<blocks_for(total, kThreads), kThreads, 0, s>>>(dqkv, cos, sin, T, H, KV, D, total);
  LOOM_CUDA_LAUNCHED();
}
void gelu_forward(bf16* out, const bf16* inp, int64_t n, cudaStream_t s) {
  gelu_forward_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(out, inp, n);
  LOOM_CUDA_LAUNCHED();
}
void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n, cudaStream_t s) {
  gelu_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(dinp, inp, dout, n);
  LOOM_CUDA_LAUNCHED();
}
void swiglu_forward(bf16* out, const bf16* inp, int N, int F, cudaStream_t s) {
  const int64_t total = int64_t(N) * F;
  swiglu_forward_kernel<<<blocks_for(total, kThreads), kThreads, 0, s>>>(out, inp, F, total);
  LOOM_CUDA_LAUNCHED();
}
void swiglu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int N, int F, cudaStream_t s) {
  const int64_t total = int64_t(N) * F;
  swiglu_backward_kernel<<<blocks_for(total, kThreads), kThreads, 0, s>>>(dinp, inp, dout, F, total);
  LOOM_CUDA_LAUNCHED();
}
void add_inplace(bf16* acc, const bf16* x, int64_t n, cudaStream_t s) {
  add_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(acc, x, n);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace loom::cuda
