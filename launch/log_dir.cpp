#include "launch/log_dir.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "checkpoint/manifest.h"
#include "train/fault.h"

namespace loom {

namespace fs = std::filesystem;

namespace {
// "runs/x/" and "runs/x" are one directory: its siblings are named after "runs/x".
std::string without_trailing_slash(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}
}  // namespace

bool log_dir_holds_run(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(dir + "/metrics.jsonl", ec);
  // Anything but a regular file (a link, a FIFO) is left to the metrics writer, which refuses it.
  return !ec && fs::is_regular_file(st) && fs::file_size(dir + "/metrics.jsonl", ec) > 0 && !ec;
}

std::vector<std::string> log_dir_family(const std::string& given) {
  const std::string dir = without_trailing_slash(given);
  std::map<int64_t, std::string> numbered;
  std::error_code ec;
  if (fs::exists(fs::symlink_status(dir, ec))) numbered[1] = dir;
  const fs::path path(dir);
  const fs::path parent = path.has_parent_path() ? path.parent_path() : fs::path(".");
  const std::string stem = path.filename().string() + "-";
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= stem.size() || name.compare(0, stem.size(), stem) != 0 || name.size() - stem.size() > 9)
      continue;
    const std::string digits = name.substr(stem.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits[0] == '0') continue;
    const int64_t k = std::stoll(digits);
    if (k >= 2) numbered[k] = path.has_parent_path() ? (parent / name).string() : name;
  }
  std::vector<std::string> out;
  for (auto& [k, d] : numbered) out.push_back(d);
  return out;
}

LogDirChoice log_dir_choose(const std::string& given, bool continues) {
  if (given.empty()) return {given, ""};
  const std::string dir = without_trailing_slash(given);
  const std::vector<std::string> family = log_dir_family(dir);
  if (continues) {  // the newest run's directory: where the run being continued wrote
    for (auto it = family.rbegin(); it != family.rend(); ++it)
      if (log_dir_holds_run(*it))
        return {*it, *it == dir ? "" : fmt::format("log.dir '{}': this run continues the run there", dir)};
    return {given, ""};
  }
  if (!log_dir_holds_run(dir)) return {given, ""};
  // The newest sibling when it holds no run yet (a run refused at start leaves its lock file),
  // else the next number.
  int64_t next = 2;
  if (family.size() > 1) {
    const std::string& newest = family.back();
    if (!log_dir_holds_run(newest)) return {newest, fmt::format("log.dir '{}' holds another run's logs", dir)};
    next = std::stoll(newest.substr(newest.rfind('-') + 1)) + 1;
  }
  const std::string chosen = fmt::format("{}-{}", dir, next);
  return {chosen, fmt::format("log.dir '{}' holds another run's logs", dir)};
}

bool run_continues(const Config& cfg) {
  if (run_restarted()) return true;
  const std::string& resume = cfg.checkpoint.resume;
  if (resume.empty() || resume == "none") return false;
  std::error_code ec;
  if (resume != "latest") return fs::exists(resume, ec);
  try {  // a checkpoint.dir that cannot be read is said by the resume itself
    return !cfg.checkpoint.dir.empty() && !checkpoints_complete(cfg.checkpoint.dir).empty();
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace loom
