// `loom report RUN_DIR... [--out report.html]`: one self-contained HTML page (inline SVG, no
// scripts, nothing fetched) from what runs left in their log.dir: train and validation loss,
// throughput and MFU over steps (several runs overlaid), the mean step's split as stacked bars
// (and the step-time model's prediction beside it where the run printed one), memory (the
// ledger's categories, its peak and the measured resident peak), and each run's resolved
// config and facts.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace loom {

struct RunRecord {
  std::string dir, name;
  std::map<int64_t, nlohmann::json> steps;  // by step; a resumed run's later line wins
  std::map<int64_t, double> val;            // step -> val_loss
  std::set<int64_t> warmup;                 // each start's first step (untimed, as the run summary)
  nlohmann::json split;                     // the last {"split_ms": ...} line, or null
  std::string config, facts;                // config.toml and run.json, as written
};

// Reads a log.dir: one record a run (a log.dir from before runs had a directory each may hold
// several, each started from step 1; a resume or restart continues its run's record). An Error
// when it holds no metrics.jsonl with a step in it.
std::vector<RunRecord> report_read(const std::string& dir);
// The run directories `dir` names: itself where it holds metrics.jsonl (or is no directory),
// else those of its subdirectories that do, in order of name (dir-2 before dir-10).
std::vector<std::string> report_dirs(const std::string& dir);
std::string report_html(const std::vector<RunRecord>& runs);
// Reads every directory, writes the page to `out` atomically (empty: report.html, or the first
// free report-N.html, N = 2, 3, ...: an earlier page is never overwritten), and says where.
void report_write(const std::vector<std::string>& dirs, const std::string& out);

}  // namespace loom
