// A run's data keys checked against each other and against the files they name
// (data/inputs_check.h).
#include "data/inputs_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <vector>

#include "data/shards.h"
#include "runtime/error.h"

namespace loom {

namespace {
// The same file: the same name, or the same device and inode (another spelling, a hard link).
bool same_file(const std::string& a, const std::string& b) {
  if (a == b) return true;
  struct stat x {
  }, y{};
  return ::stat(a.c_str(), &x) == 0 && ::stat(b.c_str(), &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}
}  // namespace

bool file_is_token_shard(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  int32_t magic = 0;
  const bool read = ::pread(fd, &magic, sizeof magic, 0) == ssize_t(sizeof magic);
  ::close(fd);
  return read && (magic == kShardMagic || magic == kShardMagicU32);
}

std::vector<std::string> data_inputs_check(const Config& cfg) {
  const DataConfig& d = cfg.data;
  std::vector<std::string> notes;
  if (d.source == DataKind::synthetic) {
    if (!d.val_path.empty())
      notes.push_back(fmt::format(
          "data.val_path = '{}' is set but data.source = \"synthetic\", which validates on its own corpus and "
          "never reads it; set data.source (and data.path), or remove data.val_path",
          d.val_path));
    return notes;
  }
  std::vector<std::pair<std::string, std::string>> train;  // (key, path)
  if (d.sources.empty()) train.push_back({"data.path", d.path});
  for (size_t i = 0; i < d.sources.size(); ++i)
    train.push_back({fmt::format("data.sources entry {}", i + 1), d.sources[i].path});
  for (size_t i = 0; i < train.size(); ++i)
    for (size_t j = i + 1; j < train.size(); ++j)
      LOOM_CHECK(!same_file(train[i].second, train[j].second),
                 "{} ('{}') and {} ('{}') are the same file; a mixture names each of its files once (give it the "
                 "weight of both)",
                 train[i].first, train[i].second, train[j].first, train[j].second);
  // Validating on the training tokens measures no generalization; a parity check against a
  // reference may mean it (the PyTorch fixtures do), so it is said, not refused.
  if (!d.val_path.empty())
    for (const auto& [key, path] : train)
      if (same_file(d.val_path, path))
        notes.push_back(fmt::format(
            "data.val_path ('{}') is {} ('{}'), the same file: validation reads the tokens it trains on; give it "
            "held-out data, or leave it unset (the last 10% of the training data is held out)",
            d.val_path, key, path));
  if (d.source == DataKind::text) {
    std::vector<std::pair<std::string, std::string>> all = train;
    if (!d.val_path.empty()) all.push_back({"data.val_path", d.val_path});
    for (const auto& [key, path] : all)
      LOOM_CHECK(!file_is_token_shard(path),
                 "{} '{}' is a token shard (an llm.c header), and data.source = \"text\" would train on its bytes; "
                 "set data.source = \"tokens\"",
                 key, path);
  }
  return notes;
}

}  // namespace loom
