#include "train/bench.h"

#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>
#include <vector>

#include "kernels/ops.h"
#include "plan/kernel_model.h"
#include "runtime/error.h"
#include "runtime/file.h"
#include "runtime/json_read.h"
#include "runtime/launch_env.h"
#include "runtime/mesh.h"
#include "runtime/trace.h"
#include "train/trainer.h"

namespace loom {

namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown cpu";
}

std::string cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::string base = xdg ? xdg : home ? std::string(home) + "/.cache" : "/tmp";
  return base + "/loom";
}
std::string cache_path() {
  return cache_dir() + "/cpu_peak.json";
}

// An unreadable cache (damaged, not JSON, nested past the bound) is remeasured, not fatal.
nlohmann::json json_read_or_empty(const std::string& path) {
  try {
    const std::string text = input_read_all(path, "", int64_t(16) << 20);
    if (!json_problem(text).empty()) return nlohmann::json::object();
    const nlohmann::json j = nlohmann::json::parse(text);
    return j.is_object() ? j : nlohmann::json::object();
  } catch (...) {
    return nlohmann::json::object();
  }
}

void json_write(const std::string& path, const nlohmann::json& j) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  file_write_atomic(path, [&](std::FILE* f) {
    const std::string text = j.dump(2) + "\n";
    file_write(f, text.data(), text.size(), path);
  });
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M", std::gmtime(&now));
  return when;
}

// The host's copy bandwidth over `threads` cores: the best of 5 copies of 256 MiB, each core
// its own slice, counting the bytes read and written.
double cpu_copy_bandwidth(int threads) {
  const size_t n = size_t(64) << 20;  // floats
  std::vector<float> a(n, 1.0f), b(n, 0.0f);
  double best = 0;
  for (int rep = 0; rep < 6; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < threads; ++t) {
      const size_t lo = n * size_t(t) / size_t(threads), hi = n * size_t(t + 1) / size_t(threads);
      std::memcpy(b.data() + lo, a.data() + lo, (hi - lo) * 4);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::max(best, 2.0 * double(n) * 4 / s);  // the first one faults the pages in
  }
  return best;
}

// The GEMM rate of `reps` timed runs of an n x n x n fp32 GEMM, after a warm-up.
std::vector<double> gemm_rates(int n, int reps) {
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  cpu::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);  // warm up
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    cpu::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(2.0 * n * n * double(n) / s);
  }
  return rates;
}

}  // namespace

std::vector<GemmRate> bench_gemm(int threads) {
  threads_set(threads);
  std::vector<GemmRate> out;
  for (int n : {256, 512, 1024, 2048}) {
    auto r = gemm_rates(n, n >= 1024 ? 5 : 20);
    out.push_back({n, *std::max_element(r.begin(), r.end())});
  }
  return out;
}

PeakMeasure cpu_peak_measure(int reps) {
  const int keep = omp_get_max_threads();
  threads_set(1);
  std::vector<double> all;
  for (int n : {1024, 2048})
    for (double r : gemm_rates(n, reps)) all.push_back(r);
  threads_set(keep);
  std::sort(all.begin(), all.end());
  PeakMeasure m;
  m.per_core = all.back();
  m.low = all.front();
  m.median = all[all.size() / 2];
  m.runs = int(all.size());
  return m;
}

double cpu_peak_flops(int threads, bool remeasure) {
  const std::string path = cache_path();
  const std::string key = fmt::format("{} | per core", cpu_model());
  nlohmann::json cache = json_read_or_empty(path);
  const bool cached = cache.contains(key) && cache[key].is_object() && cache[key].contains("peak");
  double load = -1;
  ::getloadavg(&load, 1);
  // A figure measured while other processes ran (load 1 or more) is measured again once the
  // machine is quiet (load under 0.5): a busy measurement is low, and a low peak inflates every
  // MFU. Only then: a measurement costs seconds, and a busy machine would pay it every run.
  const double then = cached ? cache[key].value("load", 99.0) : 99.0;
  const bool quieter = cached && then >= 1.0 && load >= 0 && load < 0.5;
  if (cached && !remeasure && !quieter) return cache[key]["peak"].get<double>() * threads;
  const PeakMeasure m = cpu_peak_measure(8);
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M", std::gmtime(&now));
  // A busy machine measures low: a later, lower measurement never replaces a higher one.
  if (!cached || m.per_core > cache[key]["peak"].get<double>())
    cache[key] = {{"peak", m.per_core}, {"median", m.median},       {"low", m.low}, {"runs", m.runs},
                  {"load", load},       {"cores", cores_visible()}, {"when", when}};
  else if (load >= 0 && load < then)
    cache[key]["load"] = load;  // confirmed on a quieter machine: not measured again for this load
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  file_write_atomic(path, [&](std::FILE* f) {
    const std::string text = cache.dump(2) + "\n";
    file_write(f, text.data(), text.size(), path);
  });
  return cache[key]["peak"].get<double>() * threads;
}

RooflineRates roofline_rates(DeviceKind kind, int threads) {
  const std::string path = cache_dir() + "/roofline.json";
  nlohmann::json cache = json_read_or_empty(path);
  RooflineRates r;
  if (kind == DeviceKind::cuda) {
    const std::string key = cuda_device_name() + " | bf16";
    if (!cache.contains(key) || !cache[key].is_object() || !cache[key].contains("copy_bw")) {
      const RooflineRates m = cuda_roofline_measure();
      cache[key] = {{"copy_bw", m.copy_bw}, {"gemm_flops", m.gemm_flops}, {"when", utc_now()}};
      json_write(path, cache);
    }
    r.copy_bw = cache[key]["copy_bw"].get<double>();
    r.gemm_flops = cache[key]["gemm_flops"].get<double>();
    r.source = fmt::format("{}: device-to-device copy and a bf16 GEMM of 8192^3, measured {} ({})", key,
                           cache[key].value("when", std::string("earlier")), path);
    return r;
  }
  // The CPU, and the emulated device, whose kernels run on the host's cores.
  const std::string key = fmt::format("{} | copy, {} threads", cpu_model(), threads);
  if (!cache.contains(key) || !cache[key].is_object() || !cache[key].contains("copy_bw")) {
    cache[key] = {{"copy_bw", cpu_copy_bandwidth(threads)}, {"when", utc_now()}};
    json_write(path, cache);
  }
  r.copy_bw = cache[key]["copy_bw"].get<double>();
  r.gemm_flops = cpu_peak_flops(threads);
  r.source = fmt::format("{}: memcpy measured {} ({}); fp32 GEMM peak {}", plural(threads, "core"),
                         cache[key].value("when", std::string("earlier")), path, cpu_peak_describe());
  return r;
}

void bench_train(const Config& config, const TrainOptions& where, const BenchTrainOptions& b) {
  LOOM_CHECK(config.train.steps >= 2, "loom bench train needs train.steps >= 2 (step 1 is a warm-up)");
  // A benchmark measures; it does not save: nothing goes into the training run's log.dir,
  // checkpoints or exports, and it starts from the config's initial weights, not a checkpoint.
  Config cfg = config;
  cfg.log.dir.clear();
  cfg.log.trace = cfg.log.grad_norms = cfg.log.tensorboard = false;
  cfg.log.trace_steps.clear();
  cfg.checkpoint.dir.clear();
  cfg.checkpoint.every = 0;
  cfg.checkpoint.resume = "none";
  cfg.export_final.clear();
  cfg.log.profile_steps = b.profile ? fmt::format("2:{}", cfg.train.steps) : "";  // step 1 warms up
  TrainOptions opt = where;
  opt.quiet = true;
  TrainResult r = train_run(cfg, opt);
  if (where.world_rank != 0) return;
  fmt::print("bench train: {} d_model {} layers {} B {} T {} on {} ({}, {} each): {:.1f} tokens/s, MFU {:.1f}%\n",
             cfg.model.arch, cfg.model.d_model, cfg.model.n_layer, cfg.train.micro_batch, cfg.model.seq_len,
             device_name(r.device), plural(where.world_size, "rank"), plural(r.threads, "thread"), r.tokens_per_s,
             100.0 * r.mfu);
  fmt::print("{{\"tokens_per_s\": {:.6g}, \"mfu\": {:.6g}}}\n", r.tokens_per_s, r.mfu);
  if (!b.profile) return;
  fmt::print("roofline profile, steps 2 to {} ({}):\n{}", r.steps_done, device_name(r.device),
             profile_table(r.profile, r.roofline));
  if (r.device != DeviceKind::cpu) fmt::print("{}", launch_gap_line(r.profile));
  if (cfg.log.cluster != "auto" && cfg.log.cluster != "none") {  // the prediction's terms beside the measured ones
    try {
      fmt::print("{}", profile_prediction_compare(cluster_load(cfg.log.cluster, "log.cluster"), cfg, r.profile));
    } catch (const Error& e) {  // the run has measured: a file that cannot predict it is said, not fatal
      fmt::print("no prediction from log.cluster: {}\n", e.what());
    }
  }
  if (!b.write_cluster.empty()) {
    profile_cluster_write(b.write_cluster, cfg, r);
    fmt::print("wrote the measured rates into {}\n", b.write_cluster);
  }
}

std::string launch_gap_line(const OpProfile& p) {
  if (p.steps == 0) return "";
  // A launch's cost in a stream, eager: the kernel model's, fitted on the H200's back-to-back
  // launches. Replayed from a graph: about half of it, a figure no GPU here has measured.
  const double eager_s = KernelModelConstants{}.launch_s, graph_s = eager_s / 2;
  const double n = double(p.steps);
  double calls = 0;
  for (const ProfileRow& r : p.rows) calls += double(r.calls);
  const bool counted = p.launches >= 0;
  const double launches = (counted ? double(p.launches) : calls) / n;
  return fmt::format(
      "launch gaps, predicted: {}{:.0f} launches a step ({}) at {:.1f} us each (the kernel model's launch cost) = "
      "{:.2f} ms a step on a GPU, part of its idle time above; a CUDA graph replaying them at ~{:.1f} us each would "
      "save ~{:.2f} ms a step\n",
      counted ? "" : "at least ", launches,
      counted ? "counted by the emulated device's runtime: kernels, GEMMs, async copies and memsets"
              : "the profile's op calls; the emulated device counts the launches themselves",
      1e6 * eager_s, 1e3 * launches * eager_s, 1e6 * graph_s, 1e3 * launches * (eager_s - graph_s));
}

std::string cpu_peak_describe() {
  const nlohmann::json cache = json_read_or_empty(cache_path());
  try {
    const auto& r = cache.at(fmt::format("{} | per core", cpu_model()));
    return fmt::format("{:.1f} GFLOP/s per core, the best of {} single-thread GEMMs measured {} at load {:.1f} ({})",
                       r.at("peak").get<double>() / 1e9, r.value("runs", 0), r.value("when", std::string("earlier")),
                       r.value("load", -1.0), cache_path());
  } catch (...) {
    return "not measured";
  }
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
  LOOM_CHECK(std::isfinite(max_mb) && max_mb > 0 && max_mb <= 16384,
             "--max-mb {} must be above 0 and at most 16384 (each rank holds two buffers of it)", max_mb);
  const int64_t max_bytes = int64_t(max_mb * 1024 * 1024);
  std::vector<float> a, b;
  try {
    a.resize(size_t(max_bytes / 4) + size_t(n));
    b.resize(a.size());
  } catch (const std::bad_alloc&) {
    fail("--max-mb {}: this rank cannot hold two buffers of {} MB; lower --max-mb", max_mb, max_mb);
  }
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
