// The training loop of one rank: build the model, load or initialize weights, then for each
// optimizer step read the micro-batches, run forward and backward, clip, update, and report.
// The composition order for distributed layouts (DESIGN 3) will live in one function here.
#pragma once
#include <chrono>
#include <functional>
#include <vector>

#include "runtime/config.h"
#include "runtime/metrics.h"

namespace loom {

struct TrainResult {
  std::vector<double> losses;                                              // per step
  std::vector<std::pair<int64_t, double>> val;                             // (step, val_loss)
  std::vector<float> params;                                               // final flat parameters
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> names;  // name -> (offset, numel)
  int64_t activation_bytes = 0;                                            // the ledger's live activations
  double tokens_per_s = 0;                                                 // mean over steps after the first
  double mfu = 0;
  double comm_exposed_ms = 0, comm_total_ms = 0;  // summed over steps
};

struct TrainOptions {
  bool quiet = false;  // no console output (tests)
  bool keep_params = false;
  // Where this process sits; use_mpi needs MPI initialized (MpiWorld) by the caller.
  int world_rank = 0, world_size = 1;
  bool use_mpi = false;
  // Fault drills, at the start of a step (1-based); -1: never. exit: the rank calls exit(3);
  // hang: the rank stops and never communicates again (the watchdog's case).
  int fault_exit_rank = -1, fault_exit_step = -1;
  int fault_hang_rank = -1, fault_hang_step = -1;
};

// cfg must have passed config_validate. train.device = cuda (or auto, resolved to cuda) runs
// train_run_cuda.
TrainResult train_run(const Config& cfg, const TrainOptions& opt = {});
// train.device = auto: "cuda" when `gpus` (visible devices; 0 in a build without CUDA) > 0 and
// the GPU path runs this layout (dp = tp = 1, ZeRO 0, dtype not f32); otherwise
// "cpu", with *why saying what kept a visible GPU idle. "cpu" and "cuda" come back as they are.
// Fails when dtype = bf16 asks for the GPU path and it cannot run.
std::string device_resolve(const Config& cfg, int gpus, std::string* why);
TrainResult train_run_cuda(const Config& cfg, const TrainOptions& opt);

using Clock = std::chrono::steady_clock;
// Milliseconds from t until now, for the step-time split.
inline double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// What both training loops (CPU and CUDA) do around their steps: the fault drills before a
// step; after it, metrics.jsonl, the console line every log.every steps and validation on its
// cadence; at the end, the last validation and the run's tokens/s and MFU (step 1 is a
// warm-up and not timed). Only the lead rank writes and prints; validate() runs on every rank.
class StepLog {
 public:
  StepLog(const Config& cfg, const TrainOptions& opt, bool has_val, TrainResult& result);
  // The drills of TrainOptions due at the start of `step` (0-based): exit(3), or hang forever.
  void fault_drills(int64_t step) const;
  // m as filled by step_rates; validate returns the validation loss.
  void after_step(const StepMetrics& m, const std::function<double()>& validate);
  void finish(const std::function<double()>& validate, int64_t tokens_per_step, double flops_model, double peak);

 private:
  void validation(int64_t step, const std::function<double()>& validate);
  const Config& cfg_;
  const TrainOptions& opt_;
  const bool lead_, print_, has_val_;
  TrainResult& result_;
  MetricsWriter metrics_;
  double timed_ms_ = 0.0;
  Clock::time_point start_ = Clock::now();
};

// Sets OpenMP and OpenBLAS threads; 0: OMP_NUM_THREADS if set, else this node's cores divided
// among its ranks. Returns the count in effect.
int threads_set(int threads);

// Measured fp32 GEMM rate of this machine for `threads`, cached under ~/.cache/loom.
double cpu_peak_flops(int threads, bool remeasure = false);

}  // namespace loom
