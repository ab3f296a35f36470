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

void bench_train(const Config& cfg) {
  TrainResult r = train_run(cfg, {.quiet = true});
  LOOM_CHECK(cfg.train.steps >= 2, "loom bench train needs train.steps >= 2 (step 1 is a warm-up)");
  fmt::print("bench train: {} d_model {} layers {} B {} T {} threads {}: {:.1f} tokens/s, MFU {:.1f}%\n",
             cfg.model.arch, cfg.model.d_model, cfg.model.n_layer, cfg.train.micro_batch, cfg.model.seq_len,
             cfg.train.threads, r.tokens_per_s, 100.0 * r.mfu);
  fmt::print("{{\"tokens_per_s\": {:.6g}, \"mfu\": {:.6g}}}\n", r.tokens_per_s, r.mfu);
}

}  // namespace loom
