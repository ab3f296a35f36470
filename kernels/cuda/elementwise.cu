// Pointwise and column-reduction kernels. The pointwise ones move 128-bit words (see below). Column reductions (bias,
// embedding gradients) sum in a fixed order without atomics: the bias gradient in two stages over row chunks
// (common.cuh); the token embedding gradient gives each distinct token of the batch one block that walks that token's
// positions in order, the frequent ones cut into pieces summed in a fixed order.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace loom::cuda {

namespace {

constexpr int kThreads = 256;

// Pointwise kernels: thread t owns elements [8t, 8t + 8), one 128-bit word per bf16 operand
// (two per fp32 one) where every pointer is on 16 bytes (`vec`); the last n % 8 elements, and
// all of them where a pointer is not aligned, go element by element. Each reads and writes
// every element once: DRAM bandwidth bounds them all (bytes per element beside each).
__device__ __forceinline__ int64_t pack_start() {
  return (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kPack;
}
inline int pack_blocks(int64_t n) {
  return blocks_for((n + kPack - 1) / kPack, kThreads);
}
__device__ __forceinline__ void load8(float (&x)[kPack], const bf16* __restrict__ p, int64_t i, int64_t n, bool vec) {
  if (vec) return unpack8(x, load128(p + i));
#pragma unroll
  for (int k = 0; k < kPack; ++k) x[k] = i + k < n ? f(p[i + k]) : 0.0f;
}
__device__ __forceinline__ void load8(float (&x)[kPack], const float* __restrict__ p, int64_t i, int64_t n, bool vec) {
  if (vec) {
    const int4 lo = load128(p + i), hi = load128(p + i + 4);
    std::memcpy(x, &lo, 16);
    std::memcpy(x + 4, &hi, 16);
    return;
  }
#pragma unroll
  for (int k = 0; k < kPack; ++k) x[k] = i + k < n ? p[i + k] : 0.0f;
}
__device__ __forceinline__ void store8(bf16* __restrict__ p, const float (&x)[kPack], int64_t i, int64_t n, bool vec) {
  if (vec) return store128(p + i, pack8(x));
#pragma unroll
  for (int k = 0; k < kPack; ++k)
    if (i + k < n) p[i + k] = b(x[k]);
}
__device__ __forceinline__ void store8(float* __restrict__ p, const float (&x)[kPack], int64_t i, int64_t n, bool vec) {
  if (vec) {
    int4 lo, hi;
    std::memcpy(&lo, x, 16);
    std::memcpy(&hi, x + 4, 16);
    store128(p + i, lo);
    store128(p + i + 4, hi);
    return;
  }
#pragma unroll
  for (int k = 0; k < kPack; ++k)
    if (i + k < n) p[i + k] = x[k];
}

// 4 bytes read, 2 written per element.
__global__ void to_bf16_kernel(bf16* __restrict__ out, const float* __restrict__ in, int64_t n, bool aligned) {
  const int64_t i = pack_start();
  if (i >= n) return;
  const bool vec = aligned && i + kPack <= n;
  float x[kPack];
  load8(x, in, i, n, vec);
  store8(out, x, i, n, vec);
}
// 2 bytes read, 4 written per element.
__global__ void to_f32_kernel(float* __restrict__ out, const bf16* __restrict__ in, int64_t n, bool aligned) {
  const int64_t i = pack_start();
  if (i >= n) return;
  const bool vec = aligned && i + kPack <= n;
  float x[kPack];
  load8(x, in, i, n, vec);
  store8(out, x, i, n, vec);
}

// Row m's contribution to column c of the bias gradient.
struct BiasGrad {
  const bf16* dout;
  int N;
  __device__ void operator()(int m, int c, float& a, float&) const { a += f(dout[int64_t(m) * N + c]); }
  __device__ void word(int m, int c, float (&a)[kPack], float (&)[kPack]) const {
    float dy[kPack];
    unpack8(dy, load128(dout + int64_t(m) * N + c));
#pragma unroll
    for (int k = 0; k < kPack; ++k) a[k] += dy[k];
  }
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

// The token embedding's gradient. A token of up to kEmbeddingPiece positions (nearly every token
// of a batch) gets a block that walks its positions in order and adds their sum once. The
// frequent ones, which token_index puts first (up to kMaxFrequentTokens of them), are cut into
// pieces of L positions: a block a piece sums it in order into a row of partials, and a block a
// token adds its pieces in order, so no block walks more than max(kEmbeddingPiece, L) positions
// (a token of 600 positions took one block through all of them). L is kEmbeddingPiece doubled
// until the pieces fit kMaxEmbeddingPieces rows: the order of every sum is set by the batch alone.
__device__ __forceinline__ bool frequent(const int32_t* starts, int u) {
  return u < kMaxFrequentTokens && starts[u + 1] - starts[u] > kEmbeddingPiece;
}

// One block per token that is not frequent: its positions' rows summed in fp32 in order, added once.
// index: ids[U], starts[U + 1], positions (token_index's packing).
__global__ void embedding_wte_backward_kernel(float* dwte, const bf16* dout, const int32_t* index, int U, int C) {
  const int u = blockIdx.x, id = index[u];
  const int32_t* starts = index + U;
  const int32_t* pos = index + 2 * U + 1;
  if (frequent(starts, u)) return;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float d = 0.0f;
    for (int k = starts[u]; k < starts[u + 1]; ++k) d += f(dout[int64_t(pos[k]) * C + c]);
    dwte[int64_t(id) * C + c] += d;
  }
}

// The frequent tokens' pieces, as every block of the two kernels below finds them from the
// starts of the first kMaxFrequentTokens tokens: K tokens, pieces of L positions; `first` is
// row 0 of the token (or piece) this block takes, -1 where it takes none.
struct Pieces {
  int K, L, token, first, count;
};
template <bool kByPiece>
__device__ Pieces find_pieces(const int32_t* starts, int U) {
  __shared__ int32_t st[kMaxFrequentTokens + 1];
  __shared__ Pieces out;
  const int n = U < kMaxFrequentTokens ? U : kMaxFrequentTokens;
  for (int i = threadIdx.x; i <= n; i += blockDim.x) st[i] = starts[i];
  __syncthreads();
  if (threadIdx.x == 0) {
    Pieces p{0, kEmbeddingPiece, -1, -1, 0};
    while (p.K < n && st[p.K + 1] - st[p.K] > kEmbeddingPiece) ++p.K;
    for (;; p.L *= 2) {
      int total = 0;
      for (int u = 0; u < p.K; ++u) total += (st[u + 1] - st[u] + p.L - 1) / p.L;
      if (total <= kMaxEmbeddingPieces) break;
    }
    // By piece: the piece blockIdx.x (its token, its first position in `first`); by token: the
    // token blockIdx.x's first row of partials and its pieces.
    int row = 0;
    for (int u = 0; u < p.K; ++u) {
      const int pieces = (st[u + 1] - st[u] + p.L - 1) / p.L;
      if (kByPiece && int(blockIdx.x) < row + pieces) {
        p.token = u, p.first = st[u] + (int(blockIdx.x) - row) * p.L;
        p.count = st[u + 1] - p.first < p.L ? st[u + 1] - p.first : p.L;
        break;
      }
      if (!kByPiece && int(blockIdx.x) == u) {
        p.token = u, p.first = row, p.count = pieces;
        break;
      }
      row += pieces;
    }
    out = p;
  }
  __syncthreads();
  return out;
}

// A piece's positions summed in order into its row of partials (the row blockIdx.x).
__global__ void embedding_piece_kernel(float* partials, const bf16* dout, const int32_t* index, int U, int C) {
  const Pieces p = find_pieces<true>(index + U, U);
  if (p.token < 0) return;
  const int32_t* pos = index + 2 * U + 1;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float d = 0.0f;
    for (int k = p.first; k < p.first + p.count; ++k) d += f(dout[int64_t(pos[k]) * C + c]);
    partials[int64_t(blockIdx.x) * C + c] = d;
  }
}

// A frequent token's pieces added in order, then into its row of dwte once.
__global__ void embedding_frequent_kernel(float* dwte, const float* partials, const int32_t* index, int U, int C) {
  const Pieces p = find_pieces<false>(index + U, U);
  if (p.token < 0) return;
  const int id = index[p.token];
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float d = 0.0f;
    for (int r = p.first; r < p.first + p.count; ++r) d += partials[int64_t(r) * C + c];
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

// acc += x, rounded once: 4 bytes read and 2 written per element in bf16, 8 and 4 in fp32.
template <class T>
__global__ void add_kernel(T* __restrict__ acc, const T* __restrict__ x, int64_t n, bool aligned) {
  const int64_t i = pack_start();
  if (i >= n) return;
  const bool vec = aligned && i + kPack <= n;
  float a[kPack], v[kPack];
  load8(a, acc, i, n, vec);
  load8(v, x, i, n, vec);
#pragma unroll
  for (int k = 0; k < kPack; ++k) a[k] += v[k];
  store8(acc, a, i, n, vec);
}

__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float gelu_grad(float x) {
  const float th = tanhf(kGeluScale * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
}

// 2 bytes read, 2 written per element.
__global__ void gelu_forward_kernel(bf16* __restrict__ out, const bf16* __restrict__ inp, int64_t n, bool aligned) {
  const int64_t i = pack_start();
  if (i >= n) return;
  const bool vec = aligned && i + kPack <= n;
  float x[kPack];
  load8(x, inp, i, n, vec);
#pragma unroll
  for (int k = 0; k < kPack; ++k) x[k] = gelu(x[k]);
  store8(out, x, i, n, vec);
}

// 4 bytes read (inp, dout), 2 written per element.
__global__ void gelu_backward_kernel(bf16* __restrict__ dinp, const bf16* __restrict__ inp,
                                     const bf16* __restrict__ dout, int64_t n, bool aligned) {
  const int64_t i = pack_start();
  if (i >= n) return;
  const bool vec = aligned && i + kPack <= n;
  float x[kPack], dy[kPack];
  load8(x, inp, i, n, vec);
  load8(dy, dout, i, n, vec);
#pragma unroll
  for (int k = 0; k < kPack; ++k) x[k] = gelu_grad(x[k]) * dy[k];
  store8(dinp, x, i, n, vec);
}

// SwiGLU over inp [N, 2F] (gate | up) to out [N, F]: thread t owns output elements [8t, 8t + 8),
// inside one row when F % 8 == 0 (then in words); else element by element.
// Forward: 4 bytes read (gate, up), 2 written per output element.
__global__ void swiglu_forward_kernel(bf16* __restrict__ out, const bf16* __restrict__ inp, int F, int64_t total,
                                      bool aligned) {
  const int64_t i = pack_start();
  if (i >= total) return;
  if (aligned) {  // F % 8 == 0: the 8 are in row i / F
    const int64_t n = i / F;
    const int j = int(i % F);
    float g[kPack], u[kPack];
    unpack8(g, load128(inp + n * 2 * F + j));
    unpack8(u, load128(inp + n * 2 * F + F + j));
#pragma unroll
    for (int k = 0; k < kPack; ++k) g[k] = g[k] / (1.0f + __expf(-g[k])) * u[k];
    store128(out + i, pack8(g));
    return;
  }
  for (int64_t e = i; e < i + kPack && e < total; ++e) {
    const int64_t n = e / F;
    const int j = int(e % F);
    const float g = f(inp[n * 2 * F + j]), u = f(inp[n * 2 * F + F + j]);
    out[e] = b(g / (1.0f + __expf(-g)) * u);
  }
}

__device__ __forceinline__ void swiglu_grad(float g, float u, float dy, float& dg, float& du) {
  const float sig = 1.0f / (1.0f + __expf(-g));
  dg = dy * u * sig * (1.0f + g * (1.0f - sig));
  du = dy * g * sig;
}

// Backward: 6 bytes read (gate, up, dout), 4 written (dgate, dup) per output element.
__global__ void swiglu_backward_kernel(bf16* __restrict__ dinp, const bf16* __restrict__ inp,
                                       const bf16* __restrict__ dout, int F, int64_t total, bool aligned) {
  const int64_t i = pack_start();
  if (i >= total) return;
  if (aligned) {
    const int64_t n = i / F;
    const int j = int(i % F);
    float g[kPack], u[kPack], dy[kPack];
    unpack8(g, load128(inp + n * 2 * F + j));
    unpack8(u, load128(inp + n * 2 * F + F + j));
    unpack8(dy, load128(dout + i));
#pragma unroll
    for (int k = 0; k < kPack; ++k) swiglu_grad(g[k], u[k], dy[k], g[k], u[k]);
    store128(dinp + n * 2 * F + j, pack8(g));
    store128(dinp + n * 2 * F + F + j, pack8(u));
    return;
  }
  for (int64_t e = i; e < i + kPack && e < total; ++e) {
    const int64_t n = e / F;
    const int j = int(e % F);
    float dg, du;
    swiglu_grad(f(inp[n * 2 * F + j]), f(inp[n * 2 * F + F + j]), f(dout[e]), dg, du);
    dinp[n * 2 * F + j] = b(dg);
    dinp[n * 2 * F + F + j] = b(du);
  }
}

}  // namespace

void to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t s, ScalarPaths* paths) {
  if (n == 0) return;
  LOOM_LAUNCH(to_bf16_kernel, pack_blocks(n), kThreads, 0, s)
  (out, in, n, aligned16(paths, "to_bf16", {{"out", out}, {"in", in}}));
  LOOM_CUDA_LAUNCHED();
}
void to_f32(float* out, const bf16* in, int64_t n, cudaStream_t s, ScalarPaths* paths) {
  if (n == 0) return;
  LOOM_LAUNCH(to_f32_kernel, pack_blocks(n), kThreads, 0, s)
  (out, in, n, aligned16(paths, "to_f32", {{"out", out}, {"in", in}}));
  LOOM_CUDA_LAUNCHED();
}
void add_bf16(bf16* acc, const bf16* x, int64_t n, cudaStream_t s, ScalarPaths* paths) {
  if (n == 0) return;
  LOOM_LAUNCH(add_kernel<bf16>, pack_blocks(n), kThreads, 0, s)
  (acc, x, n, aligned16(paths, "add_bf16", {{"acc", acc}, {"x", x}}));
  LOOM_CUDA_LAUNCHED();
}
void add_f32(float* acc, const float* x, int64_t n, cudaStream_t s, ScalarPaths* paths) {
  if (n == 0) return;
  LOOM_LAUNCH(add_kernel<float>, pack_blocks(n), kThreads, 0, s)
  (acc, x, n, aligned16(paths, "add_f32", {{"acc", acc}, {"x", x}}));
  LOOM_CUDA_LAUNCHED();
}
void bias_backward(float* dbias, const bf16* dout, int M, int N, float* partials, cudaStream_t s, ScalarPaths* paths) {
  column_sums_2stage_words<true>(dbias, nullptr, BiasGrad{dout, N}, M, N,
                                 N % kPack == 0 && aligned16(paths, "bias_backward", {{"dout", dout}}), partials, s);
}
void embedding_forward(bf16* out, const int32_t* tokens, const bf16* wte, int v0, int Vl, const bf16* wpe, int B, int T,
                       int C, const int32_t* pos, cudaStream_t s) {
  const int64_t total = int64_t(B) * T * C;
  LOOM_LAUNCH(embedding_forward_kernel, blocks_for(total, kThreads), kThreads, 0, s)
  (out, tokens, wte, v0, Vl, wpe, pos, T, C, total);
  LOOM_CUDA_LAUNCHED();
}
std::vector<int32_t> token_index(const int32_t* tokens, int N, int v0, int Vl, int* unique) {
  std::vector<int32_t> count(size_t(Vl), 0);
  for (int n = 0; n < N; ++n)
    if (tokens[n] >= v0 && tokens[n] < v0 + Vl) ++count[size_t(tokens[n] - v0)];
  // The order of the ids: the first kMaxFrequentTokens of those with more than
  // kEmbeddingPiece positions (embedding_backward cuts them into pieces), then the others.
  std::vector<int32_t> order, rest;
  for (int v = 0; v < Vl; ++v) {
    if (count[size_t(v)] == 0) continue;
    const bool frequent = count[size_t(v)] > kEmbeddingPiece && int(order.size()) < kMaxFrequentTokens;
    (frequent ? order : rest).push_back(v);
  }
  const int U = int(order.size() + rest.size());
  order.insert(order.end(), rest.begin(), rest.end());
  std::vector<int32_t> next(size_t(Vl), 0);  // id v's next slot among the positions
  int placed = 0;
  for (int v : order) next[size_t(v)] = placed, placed += count[size_t(v)];
  std::vector<int32_t> index(size_t(2 * U + 1 + placed));
  int32_t *ids = index.data(), *starts = ids + U, *pos = starts + U + 1;
  for (int u = 0; u < U; ++u) ids[u] = order[size_t(u)], starts[u] = next[size_t(order[size_t(u)])];
  starts[U] = placed;
  for (int n = 0; n < N; ++n)
    if (tokens[n] >= v0 && tokens[n] < v0 + Vl) pos[next[size_t(tokens[n] - v0)]++] = n;
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
void embedding_backward(float* dwte, float* dwpe, const bf16* dout, const int32_t* index, int U, int N, int B, int T,
                        int C, const int32_t* pos_index, float* partials, cudaStream_t s) {
  if (U > 0) {
    LOOM_LAUNCH(embedding_wte_backward_kernel, U, kThreads, 0, s)(dwte, dout, index, U, C);
    LOOM_CUDA_LAUNCHED();
    // At most N / (kEmbeddingPiece + 1) frequent tokens, and 2 N / kEmbeddingPiece pieces: the
    // blocks past the batch's find nothing to do.
    const int frequent = std::min({U, kMaxFrequentTokens, N / (kEmbeddingPiece + 1)});
    if (frequent > 0) {
      const int pieces = std::min(kMaxEmbeddingPieces, 2 * N / kEmbeddingPiece);
      LOOM_LAUNCH(embedding_piece_kernel, pieces, kThreads, 0, s)(partials, dout, index, U, C);
      LOOM_CUDA_LAUNCHED();
      LOOM_LAUNCH(embedding_frequent_kernel, frequent, kThreads, 0, s)(dwte, partials, index, U, C);
      LOOM_CUDA_LAUNCHED();
    }
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
void gelu_forward(bf16* out, const bf16* inp, int64_t n, cudaStream_t s, ScalarPaths* paths) {
  if (n == 0) return;
  LOOM_LAUNCH(gelu_forward_kernel, pack_blocks(n), kThreads, 0, s)
  (out, inp, n, aligned16(paths, "gelu_forward", {{"out", out}, {"inp", inp}}));
  LOOM_CUDA_LAUNCHED();
}
void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n, cudaStream_t s, ScalarPaths* paths) {
  if (n == 0) return;
  LOOM_LAUNCH(gelu_backward_kernel, pack_blocks(n), kThreads, 0, s)
  (dinp, inp, dout, n, aligned16(paths, "gelu_backward", {{"dinp", dinp}, {"inp", inp}, {"dout", dout}}));
  LOOM_CUDA_LAUNCHED();
}
void swiglu_forward(bf16* out, const bf16* inp, int N, int F, cudaStream_t s, ScalarPaths* paths) {
  const int64_t total = int64_t(N) * F;
  if (total == 0) return;
  const bool aligned = F % kPack == 0 && aligned16(paths, "swiglu_forward", {{"out", out}, {"inp", inp}});
  LOOM_LAUNCH(swiglu_forward_kernel, pack_blocks(total), kThreads, 0, s)(out, inp, F, total, aligned);
  LOOM_CUDA_LAUNCHED();
}
void swiglu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int N, int F, cudaStream_t s, ScalarPaths* paths) {
  const int64_t total = int64_t(N) * F;
  if (total == 0) return;
  const bool aligned =
      F % kPack == 0 && aligned16(paths, "swiglu_backward", {{"dinp", dinp}, {"inp", inp}, {"dout", dout}});
  LOOM_LAUNCH(swiglu_backward_kernel, pack_blocks(total), kThreads, 0, s)(dinp, inp, dout, F, total, aligned);
  LOOM_CUDA_LAUNCHED();
}

}  // namespace loom::cuda
