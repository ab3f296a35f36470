// One token's routing arithmetic, shared by the CPU kernels (kernels/cpu/moe.cpp) and their
// CUDA twins (kernels/cuda/moe.cu): each runs it per token, in the same order, so both devices
// route alike. And the size of the device plan's scratch, which the activation plan reserves. `logit(e)` reads logit e
// as a float; `store(e, v)` writes the logit gradient.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

namespace loom::moe_row {

// The device's routing plan (kernels/cuda/moe.cu) works on chunks of this many assignments and
// needs this much int32 scratch for A assignments over E experts: each one's rank within its
// chunk, each chunk's count per expert, each expert's first row.
constexpr int kPlanChunk = 256;
LOOM_HOST_DEVICE inline int64_t plan_scratch_ints(int64_t A, int E) {
  return A + (A + kPlanChunk - 1) / kPlanChunk * E + E;
}

// A layer's statistics for the metrics, kStats values a layer that each hold an integer, so
// their sums over micro-batches, ranks and stages are exact in any order (the same on every
// layout): [0] the load-balancing loss E sum_e f_e P_e (f_e: expert e's share of the N*k
// assignments, P_e its mean probability) in units of 1 / kAuxUnit, [1] E times the busiest
// expert's assignments, [2] the dropped assignments, [3] the assignments, [4] the micro-batches.
constexpr int kStats = 5;
constexpr double kAuxUnit = 4294967296.0;  // 2^32: the loss to ~2e-10 a micro-batch
LOOM_HOST_DEVICE inline void stats_add(double* st, const int32_t* counts, const float* prob_sums, int N, int E, int k) {
  const int64_t A = int64_t(N) * k;
  double aux = 0.0;
  int64_t busiest = 0, kept = 0;
  for (int e = 0; e < E; ++e) {
    const float share = float(double(counts[e]) / double(A));
    aux += double(share) * double(prob_sums[e]) / N;
    busiest = counts[e] > busiest ? counts[e] : busiest;
    kept += counts[E + e];
  }
  st[0] += rint(E * aux * kAuxUnit);
  st[1] += double(E * busiest);
  st[2] += double(A - kept);
  st[3] += double(A);
  st[4] += 1;
}

// Softmax over the E experts into p, the top k (ties to the lower index) into id, and their
// probabilities renormalized to sum to one into wt (Mixtral).
template <class Logit>
LOOM_HOST_DEVICE inline void route(float* p, int32_t* id, float* wt, int E, int k, Logit logit) {
  float mx = -INFINITY;
  for (int e = 0; e < E; ++e) mx = fmaxf(mx, logit(e));
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) sum += (p[e] = expf(logit(e) - mx));
  for (int e = 0; e < E; ++e) p[e] /= sum;
  float sel = 0.0f;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken = taken || id[i] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    id[j] = best;
    sel += p[best];
  }
  for (int j = 0; j < k; ++j) wt[j] = p[id[j]] / sel;
}

// The router's backward for one token: g the gradients of its k weights, aux_g the
// load-balancing loss's gradient per expert probability; through the renormalization and the
// softmax into the E logits.
template <class Store>
LOOM_HOST_DEVICE inline void router_backward(const float* p, const int32_t* id, const float* wt, const float* g,
                                             const float* aux_g, int E, int k, Store store) {
  // w_j = p_j / s with s the sum of the selected: d p_j = (g_j - sum_i g_i w_i) / s.
  float s = 0.0f, gw = 0.0f;
  for (int j = 0; j < k; ++j) s += p[id[j]], gw += g[j] * wt[j];
  float dp_dot_p = 0.0f;  // sum_e dp_e p_e for the softmax's backward
  for (int e = 0; e < E; ++e) dp_dot_p += aux_g[e] * p[e];
  for (int j = 0; j < k; ++j) dp_dot_p += (g[j] - gw) / s * p[id[j]];
  for (int e = 0; e < E; ++e) {
    float dp = aux_g[e];
    for (int j = 0; j < k; ++j)
      if (id[j] == e) dp += (g[j] - gw) / s;
    store(e, p[e] * (dp - dp_dot_p));
  }
}

}  // namespace loom::moe_row
