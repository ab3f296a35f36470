#include "data/shard_set.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/error.h"
#include "runtime/file.h"

namespace loom {

bool shard_head(const std::string& head) {
  int32_t magic = 0;
  if (head.size() < sizeof magic) return false;
  std::memcpy(&magic, head.data(), sizeof magic);
  return magic == kShardMagic || magic == kShardMagicU32;
}

std::string shard_numbered(const std::string& path, int64_t k) {
  if (k == 0) return path;
  const std::filesystem::path p(path);
  return (p.parent_path() / fmt::format("{}_{:06d}{}", p.stem().string(), k, p.extension().string())).string();
}

std::vector<std::string> shards_numbered_existing(const std::string& path) {
  std::vector<std::string> out;
  std::error_code ec;
  for (int64_t k = 1;; ++k) {
    const std::string name = shard_numbered(path, k);
    if (!std::filesystem::exists(std::filesystem::symlink_status(name, ec))) break;
    out.push_back(name);
  }
  return out;
}

ShardSet::ShardSet(FileSet& files, std::string path, int width, TokenizerRecord record, int64_t max_tokens,
                   std::vector<std::string> inputs)
    : files_(files),
      path_(std::move(path)),
      width_(width),
      record_(std::move(record)),
      max_tokens_(max_tokens),
      inputs_(std::move(inputs)) {
  LOOM_CHECK(max_tokens_ > 0 && max_tokens_ <= kShardTokensMax, "a shard holds 1 to {} tokens, not {}", kShardTokensMax,
             max_tokens_);
  next();
}

ShardSet::~ShardSet() = default;

void ShardSet::next() {
  const std::string name = shard_numbered(path_, int64_t(shards_.size()));
  output_check(name, "the output");
  output_not_input(name, inputs_, "the output");
  output_kind_check(name, "a token shard (the last argument of loom data is the shard it writes)", &shard_head,
                    "the output");
  shards_.push_back(std::make_unique<ShardAppender>(files_.open(name), name, width_, record_));
  paths_.push_back(name);
}

void ShardSet::append(const int32_t* ids, size_t n) {
  while (n > 0) {
    ShardAppender& s = *shards_.back();
    if (s.count() == max_tokens_) {
      next();
      continue;
    }
    const size_t take = std::min(n, size_t(max_tokens_ - s.count()));
    s.append(ids, take);
    ids += take, n -= take, count_ += int64_t(take);
  }
}

void ShardSet::finish() {
  for (auto& s : shards_) s->finish();
}

std::vector<std::string> ShardSet::stale() const {
  std::vector<std::string> out;
  for (const std::string& name : shards_numbered_existing(path_)) {
    if (std::find(paths_.begin(), paths_.end(), name) != paths_.end()) continue;
    // A shard's name holding something else is left as it is.
    std::ifstream in(name, std::ios::binary);
    std::string head(4, '\0');
    if (file_kind_if_not_regular(name).empty() && in.read(head.data(), 4) && shard_head(head)) out.push_back(name);
  }
  return out;
}

}  // namespace loom
