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

// What made a shard, in its header's spare words (llm.c's readers look only at the first
// three): the tokenizer's kind, an xxh64 of its files, its vocabulary size and the token that
// opens each document, and its files' absolute paths where they fit. `kind` is empty for a
// shard without a record (llm.c's, or an earlier loom's).
struct TokenizerRecord {
  std::string kind;
  uint64_t hash = 0;
  int64_t vocab_size = 0;
  int32_t doc_token = -1;
  std::vector<std::string> files;
  bool operator==(const TokenizerRecord& o) const {
    return kind == o.kind && hash == o.hash && vocab_size == o.vocab_size && doc_token == o.doc_token;
  }
  std::string describe() const;  // "gpt2 (50257 tokens, files xxh64 0123456789abcdef)"
};
TokenizerRecord shard_record_read(const std::string& path);

// A shard written as its tokens come, into an open file (file_write_atomic's): the header with
// no count, the tokens, then the header again with the count (finish()).
class ShardAppender {
 public:
  ShardAppender(std::FILE* f, std::string path, int width, TokenizerRecord record);
  void append(const int32_t* ids, size_t n);
  void finish();
  int64_t count() const { return count_; }

 private:
  std::FILE* f_;
  std::string path_;
  int width_;
  TokenizerRecord record_;
  int64_t count_ = 0;
  std::vector<uint8_t> raw_;
};

// A whole shard into memory (tests and tools).
std::vector<int32_t> shard_read(const std::string& path, int vocab_size);
// Writes GPT-2's uint16 format where every id fits, else LLaMA-3's uint32 one; width 2 or 4
// forces one (2 refuses ids above 65535).
void shard_write(const std::string& path, const std::vector<int32_t>& tokens, int width = 0,
                 const TokenizerRecord& record = {});


}  // namespace loom
