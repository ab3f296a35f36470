// The gradient clipping coefficient, shared by every clipping path: the CPU and tensor-parallel
// paths, ZeRO and the CUDA optimizer, whose kernel computes it on the device so the step never
// waits for the norm on the host.
#pragma once

#ifdef __CUDACC__
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

namespace loom {

// The factor clip_grad_norm_ scales gradients by: max_norm / (norm + 1e-6) when that is below
// 1, else 1 (and 1 when max_norm is 0: no clipping).
LOOM_HOST_DEVICE inline double clip_coef(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

}  // namespace loom
