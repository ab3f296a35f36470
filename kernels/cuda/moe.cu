// Mixture-of-experts routing, its plan, permutation and combination: the twins of
// kernels/cpu/moe.cpp, one thread per token (or row), each doing its own row's work in a fixed
// order (no atomics), so no launch needs a count from the host.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/moe_row.h"
#include "runtime/cuda_check.h"

namespace loom::cuda {

namespace {

constexpr int kThreads = 128;

__global__ void moe_route_kernel(float* probs, int32_t* idx, float* w, const bf16* logits, int N, int E, int k) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const bf16* l = logits + int64_t(t) * E;
  moe_row::route(probs + int64_t(t) * E, idx + int64_t(t) * k, w + int64_t(t) * k, E, k,
                 [l](int e) { return f(l[e]); });
}

// The routing plan in three launches over chunks of kPlanChunk assignments, with no atomics,
// so its rows are the CPU's to the bit: (1) each assignment's rank among its chunk's earlier
// assignments to the same expert, and each chunk's count per expert; (2) per expert, the
// chunks' counts turned into their bases (an exclusive scan in chunk order), the routed and
// kept totals, and the experts' first rows; (3) each assignment's row: its expert's first row
// plus its rank in token order, if that is under the capacity.
constexpr int kPlanChunk = moe_row::kPlanChunk;

__global__ void moe_plan_count_kernel(int32_t* rank, int32_t* chunk_counts, const int32_t* idx, int A, int E) {
  LOOM_DYNAMIC_SHARED(int32_t, smem, 16);  // the chunk's experts [kPlanChunk], then counts [E]
  int32_t *expert = smem, *count = smem + kPlanChunk;
  const int t = threadIdx.x;
  const int64_t i = int64_t(blockIdx.x) * kPlanChunk + t;
  const int e = i < A ? idx[i] : -1;
  expert[t] = e;
  for (int x = t; x < E; x += kPlanChunk) count[x] = 0;
  __syncthreads();
  if (e >= 0) {
    int r = 0;
    for (int j = 0; j < t; ++j) r += expert[j] == e;
    bool last = true;
    for (int j = t + 1; j < kPlanChunk && last; ++j) last = expert[j] != e;
    rank[i] = r;
    if (last) count[e] = r + 1;  // one writer per expert: its chunk's last assignment
  }
  __syncthreads();
  for (int x = t; x < E; x += kPlanChunk) chunk_counts[int64_t(blockIdx.x) * E + x] = count[x];
}

__global__ void moe_plan_scan_kernel(int32_t* counts, int32_t* chunk_counts, int32_t* start, int chunks, int E, int cap,
                                     int slot) {
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t run = 0;
    for (int c = 0; c < chunks; ++c) {
      const int32_t n = chunk_counts[int64_t(c) * E + e];
      chunk_counts[int64_t(c) * E + e] = run;
      run += n;
    }
    counts[e] = run;
    counts[E + e] = run < cap ? run : cap;
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int e = 0, at = 0; e < E; ++e) {
      start[e] = slot > 0 ? e * slot : at;
      at += counts[E + e];
    }
}

__global__ void moe_plan_place_kernel(int32_t* row_of, int32_t* token_of, const int32_t* idx, const int32_t* rank,
                                      const int32_t* chunk_base, const int32_t* start, int A, int E, int k, int cap) {
  const int64_t i = int64_t(blockIdx.x) * kPlanChunk + threadIdx.x;
  if (i >= A) return;
  const int e = idx[i];
  const int32_t p = chunk_base[int64_t(blockIdx.x) * E + e] + rank[i];
  row_of[i] = p < cap ? start[e] + p : -1;
  if (p < cap) token_of[start[e] + p] = int32_t(i / k);
}

// One block per (source rank r, local expert j) run of received rows; its first thread finds
// where the run starts on both sides (P * El is small), then the block writes both maps.
__global__ void moe_ep_maps_kernel(int32_t* map_in, int32_t* map_out, const int32_t* from, int P, int El, int slot) {
  __shared__ int64_t at[3];  // source-major start, expert-major start, length
  const int r = blockIdx.x / El, j = blockIdx.x % El;
  if (threadIdx.x == 0) {
    auto len = [&](int rr, int jj) { return int64_t(from ? from[rr * El + jj] : slot); };
    int64_t p = 0, q = 0;
    for (int s = 0; s < r * El + j; ++s) p += len(s / El, s % El);
    for (int jj = 0; jj < j; ++jj)
      for (int rr = 0; rr < P; ++rr) q += len(rr, jj);
    for (int rr = 0; rr < r; ++rr) q += len(rr, j);
    at[0] = p, at[1] = q, at[2] = len(r, j);
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < at[2]; i += blockDim.x) {
    map_in[at[1] + i] = int32_t(at[0] + i);
    map_out[at[0] + i] = int32_t(at[1] + i);
  }
}

__global__ void moe_gather_kernel(bf16* rows, const bf16* x, const int32_t* token_of_row, int R, int C) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(R) * C) return;
  const int64_t r = i / C, c = i % C;
  const int32_t t = token_of_row[r];
  rows[i] = t >= 0 ? x[int64_t(t) * C + c] : b(0.0f);
}

__global__ void moe_combine_kernel(bf16* out, const bf16* rows, const int32_t* row_of, const float* w, int N, int k,
                                   int C) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(N) * C) return;
  const int64_t t = i / C, c = i % C;
  float acc = 0.0f;
  for (int j = 0; j < k; ++j) {
    const int32_t r = row_of[t * k + j];
    if (r >= 0) acc += w[t * k + j] * f(rows[int64_t(r) * C + c]);
  }
  out[i] = b(acc);
}

// One warp per assignment: the dot product over C, and the row of drows.
__global__ void moe_combine_backward_kernel(bf16* drows, float* dw, const bf16* dout, const bf16* rows,
                                            const int32_t* row_of, const float* w, int A, int k, int C) {
  const int64_t a = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (a >= A) return;
  const int32_t r = row_of[a];
  if (r < 0) {
    if (lane == 0) dw[a] = 0.0f;
    return;
  }
  const bf16* d = dout + (a / k) * C;
  const bf16* y = rows + int64_t(r) * C;
  bf16* dy = drows + int64_t(r) * C;
  float dot = 0.0f;
  for (int c = lane; c < C; c += 32) {
    dot += f(d[c]) * f(y[c]);
    dy[c] = b(w[a] * f(d[c]));
  }
  dot = warp_sum(dot);
  if (lane == 0) dw[a] = dot;
}

__global__ void moe_scatter_add_kernel(bf16* dx, const bf16* drows, const int32_t* row_of, int N, int k, int C) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(N) * C) return;
  const int64_t t = i / C, c = i % C;
  float acc = f(dx[i]);
  for (int j = 0; j < k; ++j) {
    const int32_t r = row_of[t * k + j];
    if (r >= 0) acc += f(drows[int64_t(r) * C + c]);
  }
  dx[i] = b(acc);
}

__global__ void moe_router_backward_kernel(bf16* dlogits, const float* probs, const int32_t* idx, const float* w,
                                           const float* dw, const float* aux_g, int N, int E, int k) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  bf16* dl = dlogits + int64_t(t) * E;
  moe_row::router_backward(probs + int64_t(t) * E, idx + int64_t(t) * k, w + int64_t(t) * k, dw + int64_t(t) * k, aux_g,
                           E, k, [dl](int e, float v) { dl[e] = b(v); });
}

// One thread: the CPU twin's arithmetic (E is small).
__global__ void moe_stats_add_kernel(double* st, const int32_t* counts, const float* prob_sums, int N, int E, int k) {
  moe_row::stats_add(st, counts, prob_sums, N, E, k);
}

__global__ void moe_aux_grad_kernel(float* g, const int32_t* counts, double scale, int N, int E, int k) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e < E) g[e] = float(scale * float(double(counts[e]) / (double(N) * k)));
}

// Token t's router probability for expert e.
struct ProbColumn {
  const float* probs;
  int E;
  __device__ void operator()(int t, int e, float& a, float&) const { a += probs[int64_t(t) * E + e]; }
};

}  // namespace

void moe_route(float* probs, int32_t* idx, float* w, const bf16* logits, int N, int E, int k, cudaStream_t s) {
  LOOM_LAUNCH(moe_route_kernel, blocks_for(N, kThreads), kThreads, 0, s)(probs, idx, w, logits, N, E, k);
  LOOM_CUDA_LAUNCHED();
}
void moe_plan(int32_t* row_of, int32_t* token_of, int32_t* counts, const int32_t* idx, int N, int E, int k, int cap,
              int slot, int rows, int32_t* scratch, cudaStream_t s) {
  LOOM_CHECK(slot == 0 || cap <= slot, "the padded MoE layout's slots of {} rows cannot hold a capacity of {}", slot,
             cap);
  const int64_t A = int64_t(N) * k;
  const int chunks = blocks_for(A, kPlanChunk);
  int32_t *rank = scratch, *chunk_counts = scratch + A, *start = chunk_counts + int64_t(chunks) * E;
  LOOM_CUDA_CHECK(cudaMemsetAsync(token_of, 0xff, size_t(rows) * sizeof(int32_t), s));  // -1: no token
  LOOM_LAUNCH(moe_plan_count_kernel, chunks, kPlanChunk, (kPlanChunk + E) * sizeof(int32_t), s)
  (rank, chunk_counts, idx, int(A), E);
  LOOM_CUDA_LAUNCHED();
  LOOM_LAUNCH(moe_plan_scan_kernel, 1, 256, 0, s)(counts, chunk_counts, start, chunks, E, cap, slot);
  LOOM_CUDA_LAUNCHED();
  LOOM_LAUNCH(moe_plan_place_kernel, chunks, kPlanChunk, 0, s)
  (row_of, token_of, idx, rank, chunk_counts, start, int(A), E, k, cap);
  LOOM_CUDA_LAUNCHED();
}
void moe_ep_maps(int32_t* map_in, int32_t* map_out, const int32_t* from, int P, int El, int slot, cudaStream_t s) {
  LOOM_LAUNCH(moe_ep_maps_kernel, P * El, kThreads, 0, s)(map_in, map_out, from, P, El, slot);
  LOOM_CUDA_LAUNCHED();
}
void moe_stats_add(double* st, const int32_t* counts, const float* prob_sums, int N, int E, int k, cudaStream_t s) {
  LOOM_LAUNCH(moe_stats_add_kernel, 1, 1, 0, s)(st, counts, prob_sums, N, E, k);
  LOOM_CUDA_LAUNCHED();
}
void moe_aux_grad(float* g, const int32_t* counts, double scale, int N, int E, int k, cudaStream_t s) {
  LOOM_LAUNCH(moe_aux_grad_kernel, blocks_for(E, kThreads), kThreads, 0, s)(g, counts, scale, N, E, k);
  LOOM_CUDA_LAUNCHED();
}
void moe_gather(bf16* rows, const bf16* x, const int32_t* token_of_row, int R, int C, cudaStream_t s) {
  if (R == 0) return;
  LOOM_LAUNCH(moe_gather_kernel, blocks_for(int64_t(R) * C, kThreads), kThreads, 0, s)(rows, x, token_of_row, R, C);
  LOOM_CUDA_LAUNCHED();
}
void moe_combine(bf16* out, const bf16* rows, const int32_t* row_of, const float* w, int N, int k, int C,
                 cudaStream_t s) {
  LOOM_LAUNCH(moe_combine_kernel, blocks_for(int64_t(N) * C, kThreads), kThreads, 0, s)(out, rows, row_of, w, N, k, C);
  LOOM_CUDA_LAUNCHED();
}
void moe_combine_backward(bf16* drows, float* dw, const bf16* dout, const bf16* rows, const int32_t* row_of,
                          const float* w, int N, int k, int C, cudaStream_t s) {
  const int64_t A = int64_t(N) * k;
  LOOM_LAUNCH(moe_combine_backward_kernel, blocks_for(A * 32, kThreads), kThreads, 0, s)
  (drows, dw, dout, rows, row_of, w, int(A), k, C);
  LOOM_CUDA_LAUNCHED();
}
void moe_scatter_add(bf16* dx, const bf16* drows, const int32_t* row_of, int N, int k, int C, cudaStream_t s) {
  LOOM_LAUNCH(moe_scatter_add_kernel, blocks_for(int64_t(N) * C, kThreads), kThreads, 0, s)(dx, drows, row_of, N, k, C);
  LOOM_CUDA_LAUNCHED();
}
void moe_router_backward(bf16* dlogits, const float* probs, const int32_t* idx, const float* w, const float* dw,
                         const float* aux_g, int N, int E, int k, cudaStream_t s) {
  LOOM_LAUNCH(moe_router_backward_kernel, blocks_for(N, kThreads), kThreads, 0, s)
  (dlogits, probs, idx, w, dw, aux_g, N, E, k);
  LOOM_CUDA_LAUNCHED();
}
void column_sums(float* out, const float* probs, int N, int E, float* partials, cudaStream_t s) {
  column_sums_2stage<false>(out, nullptr, ProbColumn{probs, E}, N, E, partials, s);
}

}  // namespace loom::cuda
