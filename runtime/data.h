// Token streams and the layout-independent batch order of DESIGN 5: sequence k covers
// tokens [k*T, k*T + T] (inputs the first T, targets the last T) and the global batch of
// step s holds sequences s*G .. s*G+G-1, split over dp ranks, then micro-batches, in order.
// Sources: a built-in synthetic corpus, a text file (byte tokens), or llm.c token shards.
// With data.shuffle, each epoch visits the sequences in a seeded order that is a pure
// function of (seed, epoch): any step's batch is known without replaying the ones before.
// Not here: tokenizers.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/config.h"

namespace loom {

class TokenStream {
 public:
  virtual ~TokenStream() = default;
  virtual int64_t num_tokens() const = 0;
  // Tokens [start, start + count) into out.
  virtual void read(int64_t start, int64_t count, int32_t* out) const = 0;
};

// An order-1 Markov source over V tokens: each token has four successors drawn by a seeded
// hash, taken with probabilities 0.55, 0.25, 0.10, 0.05, and any token uniformly with 0.05.
// Its unigram entropy is close to log V while its entropy rate is about 1.6 nats, so a model
// that learns the structure drives its loss far below the unigram entropy. Any token at any
// position is computed in O(block) without generating the prefix: the stream restarts
// from a hashed token every 4096 tokens.
class SyntheticStream : public TokenStream {
 public:
  SyntheticStream(int vocab_size, uint64_t seed);
  int64_t num_tokens() const override { return int64_t(1) << 40; }
  void read(int64_t start, int64_t count, int32_t* out) const override;
  // Exact entropy rate and unigram (stationary) entropy of the chain, in nats.
  double entropy_rate() const;
  double unigram_entropy() const;

 private:
  std::vector<double> stationary() const;
  int V_;
  uint64_t seed_;
};

// A slice of tokens held in memory.
class MemoryStream : public TokenStream {
 public:
  MemoryStream(std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin, int64_t end)
      : tokens_(std::move(tokens)), begin_(begin), end_(end) {}
  int64_t num_tokens() const override { return end_ - begin_; }
  void read(int64_t start, int64_t count, int32_t* out) const override;

 private:
  std::shared_ptr<const std::vector<int32_t>> tokens_;
  int64_t begin_, end_;
};

// llm.c token shards: 256 int32 header (magic 20240520, version 1, token count), then
// uint16 tokens. Every id is checked against vocab_size.
std::vector<int32_t> shard_read(const std::string& path, int vocab_size);
void shard_write(const std::string& path, const std::vector<int32_t>& tokens);
constexpr int32_t kShardMagic = 20240520;

struct DataStreams {
  std::unique_ptr<TokenStream> train, val;  // val may be null
  std::string describe;
};
// Builds the streams of data.source. Without data.val_path, text and token sources hold out
// their last 10% for validation.
DataStreams data_open(const Config& cfg);

// Reads micro-batch `micro` of dp rank `rank` for optimizer step `step`: inputs and targets
// [B, T]. Sequence indices wrap around the stream (epochs); `shuffle` permutes each epoch.
void batch_read(const TokenStream& s, const Config& cfg, int64_t step, int rank, int micro, int32_t* inputs,
                int32_t* targets, bool shuffle = false);
// A keyed permutation of [0, n): a 4-round Feistel network on the smallest even number of
// bits that holds n, walking cycles until the value falls below n. O(1), no tables.
int64_t sequence_permute(int64_t k, int64_t n, uint64_t key);
int64_t num_sequences(const TokenStream& s, int T);

}  // namespace loom
