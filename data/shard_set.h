// The shards of one `loom data` output: OUT.bin, and, past `max_tokens` (at most 2^31 - 1,
// what llm.c's int32 count holds), OUT_000001.bin, OUT_000002.bin, ... each a whole shard with
// the same record, so that a corpus of any size is written in one run (train on their
// directory). All are written through one FileSet and replace their names together; numbered
// shards an earlier run left past this run's last are removed then. Not here: the documents.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/shards.h"
#include "runtime/file_set.h"

namespace loom {

constexpr int64_t kShardTokensMax = (int64_t(1) << 31) - 1;

// Whether a file's first bytes are an llm.c shard's magic: what `loom data` may replace.
bool shard_head(const std::string& head);

// OUT's k-th shard's name: OUT itself for k = 0, else OUT's stem + "_%06d" + its extension.
std::string shard_numbered(const std::string& path, int64_t k);
// The numbered shards (k >= 1) that exist beside `path` from an earlier run, in order.
std::vector<std::string> shards_numbered_existing(const std::string& path);

class ShardSet {
 public:
  // `inputs`: what is read, which no shard may be (output_not_input).
  ShardSet(FileSet& files, std::string path, int width, TokenizerRecord record, int64_t max_tokens,
           std::vector<std::string> inputs);
  ~ShardSet();
  void append(const int32_t* ids, size_t n);
  void finish();  // each shard's header with its count
  int64_t count() const { return count_; }
  const std::vector<std::string>& paths() const { return paths_; }
  // What an earlier run left that this set does not write: numbered shards past its last.
  std::vector<std::string> stale() const;

 private:
  void next();  // the next shard
  FileSet& files_;
  std::string path_;
  int width_;
  TokenizerRecord record_;
  int64_t max_tokens_, count_ = 0;
  std::vector<std::string> inputs_, paths_;
  std::vector<std::unique_ptr<ShardAppender>> shards_;
};

}  // namespace loom
