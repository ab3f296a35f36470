// What stays in a checkpoint directory (retention.h): pruning, the removal of what a rollback
// or a diverged run leaves, and the clean-up of a step directory, loom's own files only.
#include "checkpoint/retention.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <regex>

#include "checkpoint/manifest.h"
#include "runtime/error.h"

namespace loom {

namespace fs = std::filesystem;

// The names loom writes in a step directory: the manifest and the ranks' files, and their
// temporaries (temporary_name's, and the plain .tmp of earlier versions), which a process killed
// while it wrote leaves behind. Anything else there is someone else's and is never deleted.
bool loom_step_file(const std::string& name) {
  static const std::regex re(R"((manifest\.json|rank-[0-9]{5,}\.h5)(\.tmp(-[0-9]+-[0-9a-f]{8})?)?)");
  return std::regex_match(name, re);
}

std::vector<std::string> step_dir_foreign(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    // A link is never loom's, whatever its name and wherever it points.
    if (!loom_step_file(name) || e.symlink_status(ec).type() != fs::file_type::regular) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string names_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 3; ++i) out += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > 3) out += fmt::format(" and {} more", names.size() - 3);
  return out;
}

// Removes loom's files from a step directory, but for `keep`, and the directory itself once
// nothing is left: the manifest first (it stops being a checkpoint before its files go). What
// loom did not write stays, and a warning names it.
void step_dir_clear(const std::string& dir, const std::set<std::string>& keep, bool quiet) {
  std::error_code ec;
  if (!keep.count("manifest.json")) fs::remove(dir + "/manifest.json", ec);
  for (auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (loom_step_file(name) && !keep.count(name) && e.symlink_status(ec).type() == fs::file_type::regular)
      fs::remove(e.path(), ec);
  }
  if (!keep.empty()) return;
  const std::vector<std::string> left = step_dir_foreign(dir);
  if (left.empty()) {
    fs::remove(dir, ec);
  } else if (!quiet) {
    spdlog::warn("checkpoint: left '{}' in place: it holds {}, which loom did not write", dir, names_list(left));
  }
}

// Complete as far as can be seen without reading it whole: its manifest reads and every file it
// names is there, a regular file.
bool checkpoint_sound(const std::string& dir) {
  try {
    const Manifest m = manifest_read(dir);
    for (auto& [name, t] : m.tensors)
      for (const ShardRef& s : t.shards)
        if (!ckpt_file_check(dir + "/" + s.file).empty()) return false;
    return true;
  } catch (const Error&) {
    return false;
  }
}

void checkpoints_prune(const std::string& root, int64_t step, int keep, int64_t proven, bool quiet) {
  // (Resume and rollback see to it that no complete checkpoint is newer than the one a run
  // continues from.) Only sound checkpoints count toward keep and only they are pruned: one
  // whose manifest or files are damaged is left as it is, for whoever investigates.
  std::vector<std::string> partial;
  const std::vector<std::string> done = checkpoints_complete(root, &partial);
  std::vector<std::string> sound;
  for (const std::string& d : done)
    if (checkpoint_step_of(d) != step && checkpoint_sound(d)) sound.push_back(d);
  // The newest whose weights are known good, unless `step` itself is (it is never pruned).
  const auto good = step < proven ? sound.end() : std::find_if(sound.begin(), sound.end(), [&](const std::string& d) {
    return checkpoint_step_of(d) < proven;
  });
  for (auto d = sound.begin() + std::min<long>(std::max(keep - 1, 0), long(sound.size())); d != sound.end(); ++d)
    if (d != good) step_dir_clear(*d, {}, quiet);
  for (auto& p : partial)
    if (checkpoint_step_of(p) < step) step_dir_clear(p, {}, quiet);
}

std::string checkpoint_newest_before(const std::string& root, int64_t before) {
  for (const std::string& d : checkpoints_complete(root))
    if (checkpoint_step_of(d) < before) return d;
  return "";
}

std::vector<std::string> checkpoints_remove_from(const std::string& root, int64_t from, bool quiet) {
  std::vector<std::string> partial, gone;
  std::vector<std::string> all = checkpoints_complete(root, &partial);
  all.insert(all.end(), partial.begin(), partial.end());
  for (const std::string& d : all)
    if (checkpoint_step_of(d) >= from) {
      step_dir_clear(d, {}, quiet);
      gone.push_back(d);
    }
  std::sort(gone.begin(), gone.end());
  return gone;
}

}  // namespace loom
