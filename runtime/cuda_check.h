// Host-side checks for CUDA calls: the call, file, line and CUDA's own words.
#pragma once
#include <cuda_runtime.h>

#include "runtime/error.h"

#define LOOM_CUDA_CHECK(call)                                                                                   \
  do {                                                                                                          \
    cudaError_t e_ = (call);                                                                                    \
    LOOM_CHECK(e_ == cudaSuccess, "{} failed at {}:{}: {}", #call, __FILE__, __LINE__, cudaGetErrorString(e_)); \
  } while (0)
#define LOOM_CUDA_LAUNCHED() LOOM_CUDA_CHECK(cudaGetLastError())
