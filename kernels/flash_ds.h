// The scratch of the flash backward's stored dS: dK/dV (kernels/cuda/attention_flash_bwd.cu)
// writes each (query tile, key tile) of 64 x 64 on or below the diagonal as bf16, and dQ = dS K
// (attention_flash_ds.cu) reads it back. Sizes only, for the memory plan; no kernel here.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

namespace loom {

constexpr int kFlashDsTile = 64;  // queries and keys of a stored dS tile

// Tiles a (sequence, head) stores: the causal lower part of a T x T grid of 64 x 64 tiles.
LOOM_HOST_DEVICE inline int64_t flash_ds_tiles(int T) {
  const int64_t n = (int64_t(T) + kFlashDsTile - 1) / kFlashDsTile;
  return n * (n + 1) / 2;
}

// bf16 elements the stored dS needs (B * H * T^2 / 2 and the diagonal's tiles); 0 where the
// kernels recompute dS instead: head dims other than 64, document masks.
LOOM_HOST_DEVICE inline int64_t flash_ds_elems(int B, int T, int H, int D, bool doc_mask) {
  if (D != 64 || doc_mask) return 0;
  return int64_t(B) * H * flash_ds_tiles(T) * kFlashDsTile * kFlashDsTile;
}

// What the CUDA backend plans for it (model/backend_plan.cpp): the whole store up to 1 GiB, none
// past that (dQ then recomputes, as it did before the store), and none where the device's memory
// has no room for it beside the rest of the plan (plan/memory.h's attention_ds_fit: a run that
// fit before the store still runs). GPT-2 124M at B16 T1024: 214 MB; the 1.1B's B4 T2048 H32 at
// head dim 64 would be 570 MB.
constexpr int64_t kFlashDsMaxBytes = int64_t(1) << 30;
inline int64_t flash_ds_planned_elems(int B, int T, int H, int D, bool doc_mask) {
  const int64_t n = flash_ds_elems(B, T, H, D, doc_mask);
  return 2 * n <= kFlashDsMaxBytes ? n : 0;
}

}  // namespace loom
