// Every CUDA kernel wrapper called at a model's shapes under the emulation's LaunchRecorder:
// the launch configurations the real host code makes (grids, blocks, dynamic shared memory),
// checked against sm_90's limits without running a kernel or touching memory. Shared by the
// shape-walk test and the register check (tests/cuda/ptxas_check.py, via loom_launch_table).
#pragma once
#include <string>
#include <vector>

#include "kernels/cuda/ops_cuda.h"

namespace loom::testing_cuda {

struct ModelShape {
  std::string name;
  int B, T, C, H, KV, D, F, V, E, k;  // E = 0: dense
  int64_t params;                     // on one rank: the optimizer's table
};

// From the default job to Llama 3 70B at eight sequences of 8192 on one rank.
inline std::vector<ModelShape> model_shapes() {
  return {{"default job", 8, 128, 128, 4, 4, 32, 512, 512, 0, 0, 900000},
          {"gpt2 124M, B 16 T 1024", 16, 1024, 768, 12, 12, 64, 3072, 50257, 0, 0, 124000000},
          {"llama 1.1B, B 4 T 2048", 4, 2048, 2048, 32, 4, 64, 5632, 32000, 0, 0, 1100000000},
          {"llama3 8B, B 1 T 8192", 1, 8192, 4096, 32, 8, 128, 14336, 128256, 0, 0, 8030000000},
          {"mixtral-shaped 8x, B 2 T 4096", 2, 4096, 4096, 32, 8, 128, 14336, 32000, 8, 2, 46700000000},
          {"llama3 70B, B 8 T 8192", 8, 8192, 8192, 64, 8, 128, 28672, 128256, 0, 0, 70600000000}};
}

// Calls every wrapper of kernels/cuda/ops_cuda.h but the GEMMs once, as a step would at `s`,
// with pointers that are never dereferenced (a recorder is active). Returns the number of
// launches it should make.
int call_every_kernel(const ModelShape& s);

}  // namespace loom::testing_cuda
