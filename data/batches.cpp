#include "data/batches.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>

#include "runtime/error.h"
#include "runtime/file.h"

namespace loom {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finalizer: a good counter-based hash
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) {
  return mix(mix(mix(a) ^ b) ^ c);
}

constexpr int64_t kBlock = 4096;
constexpr double kSuccP[4] = {0.55, 0.25, 0.10, 0.05};
constexpr double kNoise = 0.05;

}  // namespace

SyntheticStream::SyntheticStream(int vocab_size, uint64_t seed) : V_(vocab_size), seed_(seed) {
  LOOM_CHECK(vocab_size >= 2, "the synthetic corpus needs model.vocab_size >= 2");
}

void SyntheticStream::read(int64_t start, int64_t count, int32_t* out) const {
  int64_t pos = start;
  while (count > 0) {
    int64_t block = pos / kBlock, in_block = pos % kBlock;
    int64_t n = std::min(count, kBlock - in_block);
    // Walk the block from its start to reach the state at `in_block`.
    uint64_t tok = hash3(seed_, uint64_t(block), 0x5eed) % uint64_t(V_);
    for (int64_t i = 0; i < in_block + n; ++i) {
      if (i > 0) {
        double u = double(hash3(seed_ ^ 0xabcdef, uint64_t(block), uint64_t(i)) >> 11) * 0x1.0p-53;
        int j = 0;  // successor j with probability kSuccP[j]; j == 4: noise
        for (double acc = 0.0; j < 4; ++j)
          if (u < (acc += kSuccP[j])) break;
        if (j < 4)
          tok = hash3(seed_, tok, uint64_t(j) + 1) % uint64_t(V_);
        else
          tok = hash3(seed_ ^ 0x1234, uint64_t(block), uint64_t(i)) % uint64_t(V_);
      }
      if (i >= in_block) out[i - in_block] = int32_t(tok);
    }
    out += n;
    pos += n;
    count -= n;
  }
}

std::vector<double> SyntheticStream::stationary() const {
  std::vector<double> pi(size_t(V_), 1.0 / V_);
  std::vector<double> next(static_cast<size_t>(V_));
  for (int it = 0; it < 200; ++it) {
    std::fill(next.begin(), next.end(), kNoise / V_);
    for (int a = 0; a < V_; ++a)
      for (int j = 0; j < 4; ++j)
        next[hash3(seed_, uint64_t(a), uint64_t(j) + 1) % uint64_t(V_)] += pi[size_t(a)] * kSuccP[j];
    pi.swap(next);
  }
  return pi;
}

double SyntheticStream::unigram_entropy() const {
  double h = 0.0;
  for (double p : stationary())
    if (p > 0) h -= p * std::log(p);
  return h;
}

double SyntheticStream::entropy_rate() const {
  auto pi = stationary();
  double h = 0.0;
  for (int a = 0; a < V_; ++a) {
    // Successors can collide; merge them, then add the uniform noise everywhere.
    std::vector<std::pair<uint64_t, double>> succ;
    for (int j = 0; j < 4; ++j) {
      uint64_t b = hash3(seed_, uint64_t(a), uint64_t(j) + 1) % uint64_t(V_);
      auto it = std::find_if(succ.begin(), succ.end(), [&](auto& s) { return s.first == b; });
      if (it == succ.end())
        succ.push_back({b, kSuccP[j]});
      else
        it->second += kSuccP[j];
    }
    double ha = 0.0, u = kNoise / V_;
    for (auto& [b, p] : succ) ha -= (p + u) * std::log(p + u);
    ha -= double(V_ - int(succ.size())) * u * std::log(u);
    h += pi[size_t(a)] * ha;
  }
  return h;
}

void MemoryStream::read(int64_t start, int64_t count, int32_t* out) const {
  LOOM_ASSERT(start >= 0 && start + count <= num_tokens());
  std::copy_n(tokens_->data() + begin_ + start, count, out);
}

SliceStream::SliceStream(std::shared_ptr<const TokenStream> s, int64_t begin, int64_t end)
    : s_(std::move(s)), begin_(begin), end_(end) {
  LOOM_ASSERT(0 <= begin && begin <= end && end <= s_->num_tokens());
}

void SliceStream::read(int64_t start, int64_t count, int32_t* out) const {
  LOOM_ASSERT(start >= 0 && start + count <= num_tokens());
  s_->read(begin_ + start, count, out);
}

Sequences::Sequences(std::vector<Source> sources, int T, uint64_t seed, bool shuffle)
    : src_(std::move(sources)), T_(T), seed_(seed), shuffle_(shuffle) {
  LOOM_CHECK(!src_.empty(), "no data sources");
  double sum = 0;
  for (const Source& s : src_) {
    nseq_.push_back(num_sequences(*s.stream, T));
    LOOM_CHECK(nseq_.back() > 0, "data '{}' has {} tokens, fewer than model.seq_len + 1 = {}", s.name,
               s.stream->num_tokens(), T + 1);
    LOOM_CHECK(s.weight >= 0, "data source '{}' has a negative weight {}", s.name, s.weight);
    sum += s.weight;
  }
  LOOM_CHECK(sum > 0 && std::isfinite(sum), "the weights of the data sources sum to {}; give one a positive weight",
             sum);
  if (src_.size() == 1) {
    slots_ = {1};
  } else {
    // Slots in proportion to the weights, by largest remainder; a positive weight gets one at least.
    block_ = kSlots;
    std::vector<double> exact;
    int64_t given = 0;
    for (const Source& s : src_) {
      exact.push_back(s.weight / sum * double(kSlots));
      slots_.push_back(int64_t(std::floor(exact.back())));
      given += slots_.back();
    }
    std::vector<size_t> order(src_.size());
    for (size_t j = 0; j < order.size(); ++j) order[j] = j;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return exact[a] - double(slots_[a]) > exact[b] - double(slots_[b]); });
    for (size_t i = 0; given < kSlots; ++i, ++given) ++slots_[order[i % order.size()]];
    for (size_t j = 0; j < src_.size(); ++j)
      if (src_[j].weight > 0 && slots_[j] == 0) {
        ++slots_[j];
        --*std::max_element(slots_.begin(), slots_.end());
      }
  }
  // The block's positions walk its slots by a golden-ratio stride (coprime to kSlots), which
  // spreads each source's run of slots evenly: any few consecutive sequences hold each source
  // close to its share. Each position's source, and its rank among that source's positions.
  std::vector<int64_t> begin, seen(src_.size(), 0);
  int64_t at = 0;
  for (int64_t n : slots_) begin.push_back(std::exchange(at, at + n));
  for (int64_t p = 0; p < block_; ++p) {
    const int64_t slot = p * 6181 % block_;
    const int j = int(std::upper_bound(begin.begin(), begin.end(), slot) - begin.begin()) - 1;
    source_.push_back(j);
    rank_.push_back(seen[size_t(j)]++);
  }
}

std::pair<int, int64_t> Sequences::locate(int64_t g) const {
  const int64_t blk = g / block_, p = g % block_;
  const int j = source_[size_t(p)];
  return {j, blk * slots_[size_t(j)] + rank_[size_t(p)]};
}

void Sequences::read(int64_t g, int32_t* out) const {
  const auto [j, i] = locate(g);
  const int64_t n = nseq_[size_t(j)];
  int64_t k = i % n;
  // Source 0's key is the one-stream key of earlier versions: their runs read the same order.
  if (shuffle_) k = sequence_permute(k, n, hash3(seed_, uint64_t(i / n), 0x5f1e + uint64_t(j)));
  src_[size_t(j)].stream->read(k * T_, T_ + 1, out);
}

int64_t Sequences::epoch_sequences() const {
  int64_t best = INT64_MAX;
  for (size_t j = 0; j < src_.size(); ++j) {
    if (slots_[j] == 0) continue;
    // Source j asks for its sequence nseq (its second epoch) at this block's position of that rank.
    const int64_t blk = nseq_[j] / slots_[j], rank = nseq_[j] % slots_[j];
    for (int64_t p = 0; p < block_; ++p)
      if (size_t(source_[size_t(p)]) == j && rank_[size_t(p)] == rank) best = std::min(best, blk * block_ + p);
  }
  return best;
}

namespace {

std::shared_ptr<const TokenStream> stream_open(const Config& cfg, const std::string& path) {
  if (cfg.data.source == DataKind::text) {
    std::error_code dir_ec;
    LOOM_CHECK(!std::filesystem::is_directory(path, dir_ec),
               "data.source = \"text\" reads one text file, and '{}' is a directory; tokenize a directory "
               "with `loom data DIR OUT.bin` and train on the shard",
               path);
    input_check(path, "data file (data.path, data.val_path or data.sources)");
    LOOM_CHECK(cfg.model.vocab_size >= 256,
               "data.source = \"text\" uses byte tokens (0..255); set model.vocab_size >= 256 (it is {})",
               cfg.model.vocab_size);
    // Four bytes of tokens per byte of text: a text source is for small data (make shards of more).
    const std::string bytes = input_read_all(path, "data file", int64_t(4) << 30);
    auto out = std::make_shared<std::vector<int32_t>>(bytes.size(), 0);
    for (size_t i = 0; i < bytes.size(); ++i) (*out)[i] = int32_t(uint8_t(bytes[i]));
    return std::make_shared<MemoryStream>(out, 0, int64_t(out->size()));
  }
  return std::make_shared<ShardStream>(shard_files(path), cfg.model.vocab_size);
}

}  // namespace

DataStreams data_open(const Config& cfg) {
  DataStreams d;
  const int T = cfg.model.seq_len;
  const uint64_t seed = uint64_t(cfg.train.seed);
  if (cfg.data.source == DataKind::synthetic) {
    auto train = std::make_shared<SyntheticStream>(cfg.model.vocab_size, 0x10003);
    d.describe = fmt::format("synthetic corpus: unigram entropy {:.3f} nats, entropy rate {:.3f} nats",
                             train->unigram_entropy(), train->entropy_rate());
    d.train = std::make_unique<Sequences>(std::vector<Sequences::Source>{{train, 1.0, "synthetic"}}, T, seed,
                                          cfg.data.shuffle);
    // The same chain, read from far beyond anything training reaches.
    auto val = std::make_shared<SliceStream>(train, int64_t(1) << 39, (int64_t(1) << 39) + (int64_t(1) << 30));
    d.val = std::make_unique<Sequences>(std::vector<Sequences::Source>{{val, 1.0, "synthetic"}}, T, seed, false);
    if (cfg.data.doc_mask)
      d.describe +=
          fmt::format("; attention and positions kept inside documents (opened by token {})", cfg.doc_token());
    return d;
  }
  std::vector<DataSource> given = cfg.data.sources;
  if (given.empty()) given.push_back({cfg.data.path, 1.0});
  std::vector<Sequences::Source> train, val;
  std::string no_val;  // sources too small to hold out a sequence
  for (const DataSource& s : given) {
    auto all = stream_open(cfg, s.path);
    const int64_t n = all->num_tokens();
    int64_t split = n;
    // A directory's own validation shards (llm.c's layout), else the last 10%.
    const std::vector<std::string> held = cfg.data.source == DataKind::tokens && cfg.data.val_path.empty()
                                              ? shard_files(s.path, true)
                                              : std::vector<std::string>{};
    if (!held.empty()) {
      val.push_back(
          {std::make_shared<ShardStream>(held, cfg.model.vocab_size), s.weight, s.path + " (its _val shards)"});
    } else if (cfg.data.val_path.empty() && n / 10 > T) {
      split = n - n / 10;
      val.push_back({std::make_shared<SliceStream>(all, split, n), s.weight, s.path});
    } else if (cfg.data.val_path.empty() && s.weight > 0) {
      no_val += fmt::format("{}'{}'", no_val.empty() ? "" : ", ", s.path);
    }
    LOOM_CHECK(split > T,
               "training data '{}' has {} tokens, fewer than model.seq_len + 1 = {}; use more data or a shorter "
               "seq_len",
               s.path, split, T + 1);
    train.push_back({split == n ? all : std::make_shared<SliceStream>(all, 0, split), s.weight, s.path});
  }
  if (!cfg.data.val_path.empty()) {
    auto v = stream_open(cfg, cfg.data.val_path);
    LOOM_CHECK(v->num_tokens() > T, "validation data '{}' has {} tokens, fewer than seq_len + 1 = {}",
               cfg.data.val_path, v->num_tokens(), T + 1);
    d.val = std::make_unique<Sequences>(std::vector<Sequences::Source>{{v, 1.0, cfg.data.val_path}}, T, seed, false);
  } else if (!val.empty()) {
    double w = 0;
    for (auto& v : val) w += v.weight;
    if (w > 0) d.val = std::make_unique<Sequences>(std::move(val), T, seed, false);
  }
  d.train = std::make_unique<Sequences>(std::move(train), T, seed, cfg.data.shuffle);
  const int64_t val_tokens = [&] {
    int64_t t = 0;
    if (d.val)
      for (auto& s : d.val->sources()) t += s.stream->num_tokens();
    return t;
  }();
  if (d.train->sources().size() == 1) {
    d.describe = fmt::format("{} '{}': {} training tokens, {} validation tokens", cfg.data.source,
                             d.train->sources()[0].name, d.train->sources()[0].stream->num_tokens(), val_tokens);
  } else {
    std::string parts;
    for (size_t j = 0; j < d.train->sources().size(); ++j) {
      const auto& s = d.train->sources()[j];
      parts += fmt::format("{}'{}' {:.2f}% ({} tokens)", parts.empty() ? "" : ", ", s.name, 100 * d.train->share(j),
                           s.stream->num_tokens());
    }
    d.describe = fmt::format("{} mixture of {} sources: {}; {} validation tokens", cfg.data.source,
                             d.train->sources().size(), parts, val_tokens);
  }
  if (!no_val.empty()) d.describe += fmt::format("; no validation from {} (too small to hold out a sequence)", no_val);
  if (cfg.data.source == DataKind::tokens)
    if (const TokenizerRecord r = shard_record_read(shard_files(given[0].path).front()); !r.kind.empty())
      d.describe += fmt::format("; made by tokenizer {}{}", r.describe(),
                                !cfg.set_keys.count("model.vocab_size") && cfg.model.vocab_size == r.vocab_size
                                    ? ", whose vocabulary model.vocab_size takes"
                                    : "");
  if (cfg.data.doc_mask)
    d.describe += fmt::format("; attention and positions kept inside documents (opened by token {})", cfg.doc_token());
  return d;
}

DataKind data_source_of(const std::string& path, const std::string& key) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  LOOM_CHECK(fs::exists(st), "data file '{}' does not exist; check {}", path, key);
  if (fs::is_directory(st)) return DataKind::tokens;
  LOOM_CHECK(fs::is_regular_file(st), "data file '{}' is not a regular file or a directory; check {}", path, key);
  if (fs::path(path).extension() == ".bin") return DataKind::tokens;
  int32_t magic = 0;
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(&magic), sizeof(magic));
  return in && (magic == kShardMagic || magic == kShardMagicU32) ? DataKind::tokens : DataKind::text;
}

void data_source_infer(Config& cfg) {
  DataConfig& d = cfg.data;
  std::vector<std::pair<std::string, std::string>> named;  // (path, key)
  if (!d.path.empty()) named.push_back({d.path, "data.path"});
  for (auto& s : d.sources) named.push_back({s.path, "[[data.sources]]"});
  if (named.empty()) return;
  if (cfg.set_keys.count("data.source")) {
    LOOM_CHECK(d.source != DataKind::synthetic,
               "{} = '{}' is set but data.source = \"synthetic\" would ignore it; remove data.source (loom tells "
               "token shards from text by the file) or the path",
               named[0].second, named[0].first);
    return;
  }
  std::optional<DataKind> kind;
  for (auto& [path, key] : named) {
    const DataKind k = data_source_of(path, key);
    LOOM_CHECK(!kind || k == *kind,
               "the data files are of two kinds: '{}' holds {} and '{}' {}; one run reads one kind (set "
               "data.source, or make shards of all of them with `loom data`)",
               named[0].first, *kind, path, k);
    kind = k;
  }
  d.source = *kind;
  cfg.set_keys.insert("data.source");
}

int64_t num_sequences(const TokenStream& s, int T) {
  return (s.num_tokens() - 1) / T;
}

int64_t sequence_permute(int64_t k, int64_t n, uint64_t key) {
  int bits = 2;
  while ((int64_t(1) << bits) < n) bits += 2;
  const int half = bits / 2;
  const uint64_t mask = (uint64_t(1) << half) - 1;
  uint64_t x = uint64_t(k);
  do {
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t l = x >> half, r = x & mask;
      x = (r << half) | ((l ^ hash3(key, round, r)) & mask);
    }
  } while (x >= uint64_t(n));  // a bijection on [0, 2^bits): walking the cycle ends inside [0, n)
  return int64_t(x);
}

int64_t micro_batch_index(const Config& cfg, int rank, int micro) {
  const int dp = cfg.parallel.dp;
  if (cfg.parallel.invariant && cfg.parallel.zero >= 2) {  // interleaved: the ranks' i-th form a subtree
    return int64_t(micro) * dp + rank;                     // rank r is the leaf r of each subtree
  }
  return int64_t(rank) * (cfg.train.global_batch / (cfg.train.micro_batch * dp)) + micro;
}

void batch_read(const Sequences& s, const Config& cfg, int64_t step, int rank, int micro, int32_t* inputs,
                int32_t* targets) {
  const int T = cfg.model.seq_len, B = cfg.train.micro_batch, G = cfg.train.global_batch;
  const int64_t j = micro_batch_index(cfg, rank, micro);
  std::vector<int32_t> buf(size_t(T) + 1);
  for (int b = 0; b < B; ++b) {
    s.read(step * G + j * B + b, buf.data());
    std::copy_n(buf.data(), T, inputs + int64_t(b) * T);
    std::copy_n(buf.data() + 1, T, targets + int64_t(b) * T);
  }
}

void batch_read(const TokenStream& s, const Config& cfg, int64_t step, int rank, int micro, int32_t* inputs,
                int32_t* targets, bool shuffle) {
  // The caller owns the stream: a shared_ptr that does not.
  std::shared_ptr<const TokenStream> view(std::shared_ptr<const TokenStream>{}, &s);
  const Sequences one({{view, 1.0, "stream"}}, cfg.model.seq_len, uint64_t(cfg.train.seed), shuffle);
  batch_read(one, cfg, step, rank, micro, inputs, targets);
}

void doc_positions(const int32_t* tokens, int T, int B, int32_t doc, int32_t* pos) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const int64_t i = int64_t(b) * T + t;
      pos[i] = t == 0 || tokens[i] == doc ? 0 : pos[i - 1] + 1;
    }
}

std::vector<int64_t> step_source_tokens(const Sequences& s, const Config& cfg, int64_t step) {
  std::vector<int64_t> out(s.sources().size(), 0);
  const int64_t G = cfg.train.global_batch;
  for (int64_t g = step * G; g < step * G + G; ++g) out[size_t(s.source_of(g))] += cfg.model.seq_len;
  return out;
}

}  // namespace loom
