#include "launch/bench.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "kernels/ops.h"
#include "launch/trainer.h"
#include "runtime/error.h"
#include "runtime/mesh.h"
#include "runtime/trace.h"

namespace loom {

namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown cpu";
}

std::string cache_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::string base = xdg ? xdg : home ? std::string(home) + "/.cache" : "/tmp";
  return base + "/loom/cpu_peak.json";
}

double gemm_rate(int n, double seconds) {
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  cpu::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);  // warm up
  double best = 0.0;
  auto start = std::chrono::steady_clock::now();
  do {
    auto t0 = std::chrono::steady_clock::now();
    cpu::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * double(n) / s);
  } while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds);
  return best;
}

}  // namespace

std::vector<GemmRate> bench_gemm(int threads) {
  threads_set(threads);
  std::vector<GemmRate> out;
  for (int n : {256, 512, 1024, 2048}) out.push_back({n, gemm_rate(n, 0.5)});
  return out;
}

double cpu_peak_flops(int threads, bool remeasure) {
  const std::string path = cache_path();
  const std::string key = fmt::format("{} | threads {}", cpu_model(), threads);
  nlohmann::json cache = nlohmann::json::object();
  {
    std::ifstream in(path);
    if (in) try {
        in >> cache;
      } catch (...) {
        cache = nlohmann::json::object();  // an unreadable cache is remeasured, not fatal
      }
  }
  if (!remeasure && cache.contains(key) && cache[key].is_number()) return cache[key].get<double>();
  double peak = 0.0;
  for (int n : {1024, 2048}) peak = std::max(peak, gemm_rate(n, 0.4));
  cache[key] = peak;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::ofstream out(path);
  if (out) out << cache.dump(2) << "\n";
  return peak;
}

void bench_train(const Config& cfg, const TrainOptions& where) {
  LOOM_CHECK(cfg.train.steps >= 2, "loom bench train needs train.steps >= 2 (step 1 is a warm-up)");
  TrainOptions opt = where;
  opt.quiet = true;
  TrainResult r = train_run(cfg, opt);
  if (where.world_rank != 0) return;
  fmt::print(
      "bench train: {} d_model {} layers {} B {} T {} on {} ({} ranks, {} threads each): {:.1f} tokens/s, "
      "MFU {:.1f}%\n",
      cfg.model.arch, cfg.model.d_model, cfg.model.n_layer, cfg.train.micro_batch, cfg.model.seq_len,
      cfg.train.device == "cuda" ? "cuda" : "cpu", where.world_size,
      cfg.train.threads > 0 ? std::to_string(cfg.train.threads) : std::string("auto"), r.tokens_per_s, 100.0 * r.mfu);
  fmt::print("{{\"tokens_per_s\": {:.6g}, \"mfu\": {:.6g}}}\n", r.tokens_per_s, r.mfu);
}

}  // namespace loom

namespace loom {

void bench_comm(const TrainOptions& where, double max_mb) {
  Trace trace(false);
  MeshDims dims;
  dims.dp = where.world_size;
  MeshOptions mo;
  mo.use_mpi = where.use_mpi;
  mo.trace = &trace;
  DeviceMesh mesh(dims, where.world_rank, where.world_size, mo);
  ProcessGroup& g = mesh.world_group();
  const int n = g.size();
  LOOM_CHECK(n > 1, "loom bench comm needs at least 2 ranks: run it under mpirun -np N or srun -n N");
  threads_set(1);
  if (g.rank() == 0)
    fmt::print("{} ranks, MPI backend, f32\n{:<15} {:>10} {:>12} {:>12} {:>12}\n", n, "collective", "bytes", "time us",
               "algbw GB/s", "busbw GB/s");
  const int64_t max_bytes = int64_t(max_mb * 1024 * 1024);
  std::vector<float> a(size_t(max_bytes / 4) + size_t(n)), b(a.size());
  for (CommOp op :
       {CommOp::all_reduce, CommOp::reduce_scatter, CommOp::all_gather, CommOp::all_to_all, CommOp::broadcast}) {
    for (int64_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
      const int64_t count = bytes / 4 / n * n;  // total elements, divisible by n
      auto once = [&] {
        switch (op) {
          case CommOp::all_reduce:
            g.all_reduce(Buf(a.data(), count)).wait();
            break;
          case CommOp::reduce_scatter:
            g.reduce_scatter(Buf(a.data(), count), Buf(b.data(), count / n)).wait();
            break;
          case CommOp::all_gather:
            g.all_gather(Buf(a.data(), count / n), Buf(b.data(), count)).wait();
            break;
          case CommOp::all_to_all: {
            std::vector<int64_t> c(size_t(n), count / n);
            g.all_to_all_v(Buf(a.data(), count), c, Buf(b.data(), count), c).wait();
            break;
          }
          default:
            g.broadcast(Buf(a.data(), count), 0).wait();
            break;
        }
      };
      once();  // warm-up
      const int iters = int(std::clamp<int64_t>(int64_t(64) * 1024 * 1024 / std::max<int64_t>(bytes, 1), 3, 200));
      g.barrier().wait();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) once();
      float us =
          float(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters);
      g.all_reduce(Buf(&us, 1), ReduceOp::max).wait();  // the slowest rank sets the time
      // nccl-tests: bus bandwidth = algorithm bandwidth x 2(n-1)/n for all-reduce, (n-1)/n for
      // reduce-scatter, all-gather and all-to-all, 1 for broadcast.
      const double size = double(count) * 4, algbw = size / (us * 1e3);
      const double factor = op == CommOp::all_reduce  ? 2.0 * (n - 1) / n
                            : op == CommOp::broadcast ? 1.0
                                                      : double(n - 1) / n;
      if (g.rank() == 0)
        fmt::print("{:<15} {:>10} {:>12.1f} {:>12.3f} {:>12.3f}\n", comm_op_name(op), int64_t(size), us, algbw,
                   algbw * factor);
    }
  }
}

}  // namespace loom
