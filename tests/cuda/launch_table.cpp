// Prints every kernel's largest block (threads) and dynamic shared memory over the model shapes
// of launch_shapes.h, as the emulation records the real wrappers' launches: the table the
// register check (ptxas_check.py) holds nvcc's per-kernel register counts against.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include "tests/cuda/launch_shapes.h"

int main() {
  struct Most {
    unsigned long long threads = 0;
    size_t shared = 0;
  };
  std::map<std::string, Most> most;
  for (const auto& s : loom::testing_cuda::model_shapes()) {
    loom::emu::LaunchRecorder rec;
    loom::testing_cuda::call_every_kernel(s);
    if (cudaGetLastError() != cudaSuccess) {
      std::fprintf(stderr, "a launch at %s is past the device's limits\n", s.name.c_str());
      return 1;
    }
    for (const auto& r : rec.records()) {
      const std::string base = r.kernel.substr(0, r.kernel.find('<'));
      Most& m = most[base];
      m.threads = std::max(m.threads, 1ull * r.block.x * r.block.y * r.block.z);
      m.shared = std::max(m.shared, r.dynamic_shared);
    }
  }
  std::printf("kernel,threads,dynamic_shared\n");
  for (const auto& [k, m] : most) std::printf("%s,%llu,%zu\n", k.c_str(), m.threads, m.shared);
  return 0;
}
