// The training loop of one rank, on any device and layout: a Trainer with explicit phases
// (build, init, step, validate, finish), and train_run, which is parse-free: build -> init ->
// steps -> finish. The composition order lives in Trainer's constructor.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "model/backend_profile.h"
#include "runtime/config.h"
#include "runtime/device_policy.h"
#include "runtime/metrics.h"
#include "runtime/tensorboard.h"

namespace loom {

struct TrainResult {
  std::vector<double> losses;                   // per step
  std::vector<double> grad_norms;               // per step, before clipping
  std::vector<double> aux_losses;               // per step with MoE layers: the load-balancing loss, mean over layers
  std::vector<std::pair<int64_t, double>> val;  // (step, val_loss)
  std::vector<float> params;                    // final weights, Hugging Face layout
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> names;  // name -> (offset, numel) in params
  MemLedger mem;                                                           // this rank's ledger at the end
  double seconds = 0;       // the training loop's wall time, first step to the last validation
  double tokens_per_s = 0;  // mean over steps after the first
  double mfu = 0;
  double comm_exposed_ms = 0;           // summed over steps
  int stopped_by = 0;                   // the signal that stopped the run early, or 0
  int threads = 0;                      // per rank, as chosen
  DeviceKind device = DeviceKind::cpu;  // train.device, as resolved
  int64_t steps_done = 0;
  OpProfile profile;       // log.profile_steps: every op family's totals over those steps
  RooflineRates roofline;  // and the device's rates it is judged against
  int64_t activation_bytes() const { return mem.of(Mem::activations); }
};

struct TrainOptions {
  bool quiet = false;    // no console output (tests)
  bool verbose = false;  // the start-up's activation plan, memory ledger, FLOPs and step-time prediction
  bool keep_params = false;
  // Where this process sits; use_mpi needs MPI initialized (MpiWorld) by the caller.
  int world_rank = 0, world_size = 1;
  bool use_mpi = false;
  std::string command;   // the command line, for log.dir/run.json
  std::string log_note;  // why the logs go elsewhere than log.dir as given (launch/log_dir.h), or ""
};

// cfg must have passed config_validate.
TrainResult train_run(const Config& cfg, const TrainOptions& opt = {});

using Clock = std::chrono::steady_clock;
// Milliseconds from t until now.
inline double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// What the training loop does around its steps: metrics.jsonl, the console line every log.every steps and validation on
// its cadence; at the end, the last validation and the run's tokens/s and MFU (step 1 is a warm-up and not timed). Only
// the lead rank writes and prints; validate() runs on every rank.
class StepLog {
 public:
  StepLog(const Config& cfg, const TrainOptions& opt, bool has_val, TrainResult& result);
  // The step-time model's split for this run (log.cluster), printed now and beside the
  // measured one at the end.
  void predict(DeviceKind device, int world);
  // m as filled by step_rates; validate returns the validation loss.
  void after_step(const StepMetrics& m, const std::function<double()>& validate);
  // stopped: the run ends early on a signal (no final validation; the stop is recorded).
  void finish(const std::function<double()>& validate, int64_t tokens_per_step, double flops_model, double peak,
              int stopped_by, int64_t steps_done);

 private:
  void validation(int64_t step, const std::function<double()>& validate);
  const Config& cfg_;
  const TrainOptions& opt_;
  const bool lead_, print_, has_val_;
  TrainResult& result_;
  MetricsWriter metrics_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // log.tensorboard, rank 0
  StepSplit measured_;                              // summed over this process's steps after its first
  std::optional<StepSplit> predicted_;
  std::string cluster_, rates_;  // the prediction's cluster and the rates it assumed
  double timed_ms_ = 0.0;
  int64_t seen_ = 0;  // steps this process ran (a resumed run starts past 0)
  Clock::time_point start_ = Clock::now();
};

// One rank's training: build (mesh -> backend -> chunk -> data parallel + optimizer), init,
// steps, validation, finish. Collective: every rank of the job makes one and calls the same
// methods in the same order.
class Trainer {
 public:
  Trainer(const Config& cfg, const TrainOptions& opt);
  ~Trainer();
  // Weights from init.from, or drawn from train.seed.
  void init();
  // One optimizer step (0-based): the micro-batch schedule, gradient reduction, update.
  StepMetrics step(int64_t step);
  // metrics.jsonl, the console line, and validation on its cadence (StepLog).
  void report(const StepMetrics& m);
  // The mean loss over `batches` validation batches of train.global_batch sequences (-1:
  // data.val_batches, or as many as the data holds if fewer).
  double validate(int64_t batches = -1);
  // How many whole batches the validation data holds (0: none; huge for synthetic data), and
  // what it is.
  int64_t val_batches_available() const;
  const std::string& data_describe() const;
  // At a step boundary, collective: whether a stop signal reached any rank (every rank gets
  // the same answer, so all stop at the same step), and a checkpoint whose files every rank
  // has written is committed.
  bool between_steps();
  // The first step to run: 0, or the step a resumed checkpoint was saved after.
  int64_t first_step() const;
  // The step to run after the last one: the next, or an earlier one after a rollback.
  int64_t next_step() const;
  // The final validation, export.final, the trace; the run's result.
  TrainResult finish();
  // The whole model's fp32 weights in the Hugging Face layout; collective.
  std::vector<float> weights_hf();
  int64_t steps() const;

 private:
  struct Parts;
  std::unique_ptr<Parts> p_;
};

// Sets OpenMP and OpenBLAS threads; 0: OMP_NUM_THREADS if set, else this node's cores divided
// among its ranks. Returns the count in effect.
int threads_set(int threads);

// The fp32 GEMM peak of `threads` cores: this machine's per-core peak (cpu_peak_measure,
// cached under ~/.cache/loom; a remeasurement replaces it only when higher) times threads.
// Every layout divides by the same per-core figure times the cores it uses.
// A figure measured at load 1 or more is measured again when the machine is quieter.
double cpu_peak_flops(int threads, bool remeasure = false);
// The cached per-core figure, when and at what load it was measured, and where it is kept.
std::string cpu_peak_describe();
// bf16 dense peak of the current GPU from a table (H100/H200 SXM 989 TFLOP/s, A100 312); 0 when
// the GPU is not in the table, or there is none (MFU is then not reported).
double cuda_peak_flops();
// The roofline of a device kind: its copy bandwidth and GEMM rate in the compute dtype (on a
// GPU bf16 cuBLASLt, measured once per GPU model; on the CPU and the emulated device, which
// runs on the host, the cores' copy bandwidth over `threads` and cpu_peak_flops), cached in
// ~/.cache/loom/roofline.json like the CPU peak.
RooflineRates roofline_rates(DeviceKind kind, int threads);

}  // namespace loom
