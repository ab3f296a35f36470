// metrics.jsonl (one JSON object per optimizer step, appended by rank 0) and the console
// progress line. One run at a time writes a log.dir (a lock, .metrics.lock, refuses a second).
// A run appends to the file it finds and opens its part, at its first line, with a header,
// {"run": K, "started": ..., "ranks": N}: a second run in the same log.dir never overwrites the
// first, and readers take the lines after the last header. Floats print in the shortest form that reads
// back as the same double (json_number), so a reader derives from them what loom derived (a float32 for
// TensorBoard, a bitwise comparison of two runs); a value that is not finite (a diverged loss) prints as null, so the
// file stays JSON. Each line is flushed as it is written, and the file fsynced when the run closes it.
#pragma once
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/file.h"

namespace loom {

struct StepMetrics {
  int64_t step = 0, steps = 0;
  double loss = 0, grad_norm = 0, lr = 0;
  int64_t tokens = 0;  // tokens seen so far, all ranks
  double step_ms = 0, tokens_per_s = 0, mfu = 0, hfu = 0;
  double compute_ms = 0, comm_exposed_ms = 0, bubble_ms = 0, optimizer_ms = 0, data_ms = 0, ckpt_block_ms = 0;
  MemLedger mem;
  int64_t rss_peak_b = 0;  // measured: this process's peak resident memory (getrusage), rank 0
  // Payload bytes the dp group moved during the step, per collective (see ProcessGroup).
  int64_t dp_all_reduce_b = 0, dp_reduce_scatter_b = 0, dp_all_gather_b = 0;
  int64_t dp_send_b = 0;  // point-to-point: parallel.invariant's tree collectives
  int64_t tp_all_reduce_b = 0, tp_reduce_scatter_b = 0, tp_all_gather_b = 0;
  double t_unix = 0;                     // wall clock at the step's end (seconds since the epoch): drill reports
  std::string skipped;                   // why the update was skipped (non-finite, spike, sdc), or empty
  std::vector<int> stragglers;           // ranks slower than their peers for several steps in a row
  std::vector<double> stage_compute_ms;  // pipelines: each stage's compute in the step (its dp rank 0's)
  std::vector<int> sdc_ranks;            // ranks whose gradients differed from their recomputation
  // MoE: the load-balancing loss (mean over MoE layers and micro-batches; not in `loss`) and
  // per MoE layer the expert load (most assignments on one expert over the mean) and the
  // fraction of assignments dropped by capacity.
  struct MoeLayer {
    int layer;
    double load, dropped;
  };
  double aux_loss = 0;
  std::vector<MoeLayer> moe;
  // The emulated device only (-1 elsewhere): host synchronizations with the device during the
  // forward and backward of the step's micro-batches, and during the whole step.
  int64_t host_syncs_compute = -1, host_syncs = -1;
  // The emulated device only (-1 elsewhere): device work issued one call at a time in the step
  // (kernels, GEMMs, async copies and memsets: each pays a launch gap on a GPU) and graph launches.
  int64_t device_ops = -1, graph_launches = -1;
  // A mixture only: the step's input tokens from each source, by its path.
  std::vector<std::pair<std::string, int64_t>> source_tokens;
};

// Milliseconds per step by where they went (the step-time model's terms, and what it does not
// model: data and checkpoint blocking).
struct StepSplit {
  double step = 0, compute = 0, comm = 0, bubble = 0, optimizer = 0, data = 0, ckpt = 0;
};
// The modelled term whose measurement is furthest from its prediction, as
// "communication 2.1x predicted" (or "" when no term differs by 1 ms and 10%).
std::string split_gap(const StepSplit& predicted, const StepSplit& measured);
// Both splits side by side, a term a line, with measured / predicted.
std::string split_table(const StepSplit& predicted, const StepSplit& measured);

class MetricsWriter {
 public:
  // dir empty: no file. ranks: for the run header.
  explicit MetricsWriter(const std::string& dir, int ranks = 1);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void step(const StepMetrics& m);
  void validation(int64_t step, double val_loss);
  void stopped(int64_t step, const char* signal);  // {"step": N, "stopped": "SIGTERM"}
  // {"split_ms": {"predicted": {...}, "measured": {...}}, "cluster": ..., "gap": ...}: the mean
  // step's split (total, compute, comm_exposed, bubble, optimizer, data, ckpt_block)
  void split(const StepSplit& predicted, const StepSplit& measured, const std::string& cluster);
  void close() { out_.close(); }                     // flush, fsync, close; errors are raised
  const std::string& path() const { return path_; }  // "" where nothing is written

 private:
  void line(const std::string& text);
  int ranks_ = 1;
  std::string path_;
  std::unique_ptr<DirLock> lock_;
  DurableAppend out_;
};

// Fills step (1-based), steps, tokens, tokens_per_s, mfu and hfu from m.step_ms; flops are per
// token (model and hardware), peak in FLOP/s; a peak of 0 reports no MFU rather than a guess.
void step_rates(StepMetrics& m, int64_t step, int64_t steps, int64_t tokens_per_step, double flops_model,
                double flops_hardware, double peak);
std::string progress_line(const StepMetrics& m, double eta_s);
// This process's peak resident set, bytes (what the ledger's host bytes are measured against).
int64_t rss_peak_bytes();
// Seconds left at the pace of the steps this process ran (`steps_run` in `elapsed_s`), not the
// step number: a resumed run starts past step 0.
double eta_seconds(double elapsed_s, int64_t steps_run, int64_t steps_left);
std::string format_duration(double seconds);
// Milliseconds with about 4 significant digits and never an exponent: 0.849, 60.05, 14210.
std::string ms_text(double ms);
// A double as metrics.jsonl writes it: the shortest text that reads back as the same double, or
// null where it is not finite.
std::string json_number(double v);

}  // namespace loom
