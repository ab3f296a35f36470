// llm.c's token shards: a header of 256 int32 (magic, version, token count), then the tokens.
// Two formats: GPT-2's (magic 20240520, version 1, uint16 tokens) and LLaMA-3's (magic
// 20240801, version 7, uint32 tokens). ShardStream maps a set of shards and reads them
// lazily: opening costs one header read per shard, a read touches only the pages it needs,
// and every id is checked against the vocabulary as it is read.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "data/token_stream.h"

namespace loom {

constexpr int32_t kShardMagic = 20240520;     // GPT-2: version 1, uint16
constexpr int32_t kShardMagicU32 = 20240801;  // LLaMA-3: version 7, uint32

struct ShardHeader {
  int width = 2;  // bytes per token
  int64_t count = 0;
};
// Reads and checks a shard's header against its size (the count must match the body exactly).
ShardHeader shard_header_read(const std::string& path);

class ShardStream : public TokenStream {
 public:
  // `files` in order; all of one format. Ids at or above vocab_size are refused when read.
  ShardStream(std::vector<std::string> files, int vocab_size);
  ~ShardStream() override;
  ShardStream(const ShardStream&) = delete;
  ShardStream& operator=(const ShardStream&) = delete;
  int64_t num_tokens() const override { return total_; }
  void read(int64_t start, int64_t count, int32_t* out) const override;
  int width() const { return width_; }
  size_t num_files() const { return shards_.size(); }

 private:
  struct Shard {
    std::string path;
    int64_t first = 0, count = 0;   // global index of its first token; its tokens
    const uint8_t* body = nullptr;  // the mapped tokens
    size_t map_bytes = 0;
    void* map = nullptr;
  };
  std::vector<Shard> shards_;
  int width_ = 2;
  int vocab_;
  int64_t total_ = 0;
};

// The .bin files of a directory (sorted), or the one file given. `val`: a directory's
// validation shards instead, those named *_val.bin or *_val_*.bin (`loom data`'s and llm.c's
// names), which training never reads.
std::vector<std::string> shard_files(const std::string& path, bool val = false);

// A whole shard into memory (tests and tools).
std::vector<int32_t> shard_read(const std::string& path, int vocab_size);
// Writes GPT-2's uint16 format where every id fits, else LLaMA-3's uint32 one; width 2 or 4
// forces one (2 refuses ids above 65535).
void shard_write(const std::string& path, const std::vector<int32_t>& tokens, int width = 0);

// A shard written as its tokens come, in bounded memory: into `f` (an open temporary, as
// file_write_atomic hands it; `path` names the shard in messages), its header's count filled in
// by finish(). Ids are checked as they come (negative, or above 65535 at width 2), and a shard
// of 2^31 tokens or more is refused.
class ShardAppender {
 public:
  ShardAppender(std::FILE* f, const std::string& path, int width);
  void append(const int32_t* tokens, size_t n);
  int64_t count() const { return count_; }
  // Moves the last `n` tokens out of this shard into `to`, a block at a time.
  void move_tail(int64_t n, ShardAppender& to);
  void finish();

 private:
  std::FILE* f_;
  std::string path_;
  int width_;
  int64_t count_ = 0;
  std::vector<uint8_t> raw_;
};

}  // namespace loom
