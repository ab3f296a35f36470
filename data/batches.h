// Token streams and the layout-independent batch order (docs/data.md): sequence k covers
// tokens [k*T, k*T + T] (inputs the first T, targets the last T) and the global batch of
// step s holds sequences s*G .. s*G+G-1, split over dp ranks, then micro-batches, in order.
// Sources: a built-in synthetic corpus, a text file (byte tokens), llm.c token shards
// (data/shards.h, mapped and read lazily), or a weighted mixture of files.
// With data.shuffle, each epoch visits the sequences in a seeded order that is a pure
// function of (seed, epoch): any step's batch is known without replaying the ones before.
// Not here: tokenizers.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/shards.h"
#include "data/token_stream.h"
#include "runtime/config.h"

namespace loom {

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

// Tokens [begin, end) of another stream (a held-out tail, say).
class SliceStream : public TokenStream {
 public:
  SliceStream(std::shared_ptr<const TokenStream> s, int64_t begin, int64_t end);
  int64_t num_tokens() const override { return end_ - begin_; }
  void read(int64_t start, int64_t count, int32_t* out) const override;

 private:
  std::shared_ptr<const TokenStream> s_;
  int64_t begin_, end_;
};

// The sequences a run reads, by global sequence index g: sequence k of a stream
// covers tokens [k*T, k*T + T]. One stream: g wraps around its sequences (epochs), each
// epoch in a seeded order with shuffle. A mixture: g's source comes from a block of kSlots
// positions, each source holding a share of them in proportion to its weight, spread evenly
// over the block (the same in every block); a source's own sequences follow as for one
// stream, in its own seeded order per epoch, in the order the blend asks for them (each
// sequence once per epoch). Every sequence is a function of (seed, g) alone.
class Sequences {
 public:
  struct Source {
    std::shared_ptr<const TokenStream> stream;
    double weight = 1.0;
    std::string name;
  };
  static constexpr int64_t kSlots = 10000;
  Sequences(std::vector<Source> sources, int T, uint64_t seed, bool shuffle);
  // Sequence g: T + 1 tokens into out.
  void read(int64_t g, int32_t* out) const;
  int source_of(int64_t g) const { return locate(g).first; }
  // Sequences read before any source starts its second epoch.
  int64_t epoch_sequences() const;
  const std::vector<Source>& sources() const { return src_; }
  // The share of sequences each source gets (its weight rounded to slots of kSlots).
  double share(size_t j) const { return double(slots_[j]) / double(block_); }

 private:
  std::pair<int, int64_t> locate(int64_t g) const;  // (source, g's index among that source's reads)
  std::vector<Source> src_;
  std::vector<int64_t> nseq_, slots_;
  std::vector<int> source_;    // by position in the block
  std::vector<int64_t> rank_;  // by position: its rank among its source's positions
  int64_t block_ = 1;
  int T_;
  uint64_t seed_;
  bool shuffle_;
};

struct DataStreams {
  std::unique_ptr<Sequences> train, val;  // val may be null
  std::string describe;
};
// Builds the sequences of data.source (data.path, or the mixture of data.sources). Without
// data.val_path, a directory's *_val shards validate, else text and token sources hold out
// their last 10% (a mixture: each source's, blended with the same weights).
DataStreams data_open(const Config& cfg);

// What a data path holds, by its look: tokens for a directory (of shards), a .bin file or a
// file opening with an llm.c shard magic, else text. A path that is missing, or neither a
// regular file nor a directory, is an Error naming `key`.
DataKind data_source_of(const std::string& path, const std::string& key = "data.path");
// data.source for a config that names data (data.path, [[data.sources]]) but not data.source:
// what the files hold (one kind for all of them); data.source = "synthetic" given with a path
// is refused, as the path would be ignored.
void data_source_infer(Config& cfg);

// The global batch's micro-batch j (0 .. global_batch / micro_batch - 1) that dp rank `rank`
// computes as its `micro`-th: contiguous blocks (j = rank x m + micro), or under
// parallel.invariant with ZeRO-2/3 interleaved (j = micro x dp + rank: each micro-batch's
// reduce-scatter then adds a subtree of the canonical tree, parallel/grad_tree.h).
int64_t micro_batch_index(const Config& cfg, int rank, int micro);
// Reads micro-batch `micro` of dp rank `rank` for optimizer step `step`: inputs and targets
// [B, T].
void batch_read(const Sequences& s, const Config& cfg, int64_t step, int rank, int micro, int32_t* inputs,
                int32_t* targets);
// Each token's position in its document, for [B, T] tokens where `doc` opens a document (the
// sequence's first token is at 0 whatever it is): data.doc_mask's attention and positions.
void doc_positions(const int32_t* tokens, int T, int B, int32_t doc, int32_t* pos);
// One stream, as Sequences with train.seed: `shuffle` permutes each epoch.
void batch_read(const TokenStream& s, const Config& cfg, int64_t step, int rank, int micro, int32_t* inputs,
                int32_t* targets, bool shuffle = false);
// Tokens of each source in step `step`'s global batch (inputs: T per sequence).
std::vector<int64_t> step_source_tokens(const Sequences& s, const Config& cfg, int64_t step);
// A keyed permutation of [0, n): a 4-round Feistel network on the smallest even number of
// bits that holds n, walking cycles until the value falls below n. O(1), no tables.
int64_t sequence_permute(int64_t k, int64_t n, uint64_t key);
int64_t num_sequences(const TokenStream& s, int T);

}  // namespace loom
