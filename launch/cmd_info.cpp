// `loom info`: what this build has and what it sees, from the libraries themselves.
#include <cblas.h>
#include <omp.h>
#include <spdlog/spdlog.h>

#include "checkpoint/h5.h"
#include "launch/command.h"
#include "runtime/launch_env.h"
#if LOOM_HAVE_MPI
#include "runtime/comm/mpi_group.h"
#endif
#if LOOM_HAVE_CUDA
#include "runtime/comm/nccl_group.h"
#endif

extern "C" char* openblas_get_config(void);

namespace loom {

namespace {
void info_print() {
  fmt::print("loom {} ({} build)\n", LOOM_VERSION, LOOM_BUILD_TYPE);
  fmt::print("CPU: {} visible; OpenBLAS: {}; OpenMP {} (max threads {}, wait policy {})\n",
             plural(cores_visible(), "core"), openblas_get_config(), _OPENMP, omp_get_max_threads(),
             std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "the runtime's default");
#if LOOM_HAVE_CUDA
  fmt::print("CUDA kernels: in this build; {}\nNCCL: {}\n", cuda_describe(), nccl_version());
#else
  fmt::print("CUDA kernels: not in this build (no CUDA toolkit at build time)\nNCCL: not in this build\n");
#endif
#if LOOM_HAVE_MPI
  fmt::print("MPI: {}\n", mpi_library_version());
#else
  fmt::print("MPI: not in this build (LOOM_MPI=OFF): one process only\n");
#endif
  fmt::print("checkpoints: {}\n", checkpoint_libraries());
  fmt::print("spdlog: {}.{}.{}  fmt: {}\n", SPDLOG_VER_MAJOR, SPDLOG_VER_MINOR, SPDLOG_VER_PATCH, FMT_VERSION);
}
}  // namespace

void cmd_info_add(CLI::App& app, Commands& out) {
  auto* info = app.add_subcommand("info", "build options, library versions and devices");
  out.push_back({info, false, [](const CommandContext&) {
                   info_print();
                   return 0;
                 }});
}

}  // namespace loom
