// `loom report RUN_DIR... [--out report.html]`: one self-contained HTML page (inline SVG, no
// scripts, nothing fetched) from what runs left in their log.dir: train and validation loss,
// throughput and MFU over steps (several runs overlaid), the mean step's split as stacked bars
// (and the step-time model's prediction beside it where the run printed one), memory (the
// ledger's categories, its peak and the measured resident peak), and each run's resolved
// config and facts.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom {

struct RunRecord {
  std::string dir, name;
  std::map<int64_t, nlohmann::json> steps;  // by step; a resumed run's later line wins
  std::map<int64_t, double> val;            // step -> val_loss
  nlohmann::json split;                     // the last {"split_ms": ...} line, or null
  std::string config, facts;                // config.toml and run.json, as written
};

// Reads a log.dir; an Error when it holds no metrics.jsonl with a step in it.
RunRecord report_read(const std::string& dir);
std::string report_html(const std::vector<RunRecord>& runs);
// Reads every directory, writes the page to `out` atomically (empty: report.html, or the first
// free report-N.html, N = 2, 3, ...: an earlier page is never overwritten), and says where.
void report_write(const std::vector<std::string>& dirs, const std::string& out);

}  // namespace loom
