#include "runtime/data.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

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

std::vector<int32_t> shard_read(const std::string& path, int vocab_size) {
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in, "cannot open token shard '{}'; check data.path (make shards with `loom data`)", path);
  int32_t header[256] = {};
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  LOOM_CHECK(in.gcount() == sizeof(header), "token shard '{}' is shorter than its 1024-byte header", path);
  LOOM_CHECK(header[0] == kShardMagic,
             "'{}' is not an llm.c token shard: magic {} where {} was expected; make shards with `loom data`", path,
             header[0], kShardMagic);
  LOOM_CHECK(header[1] == 1, "token shard '{}' has version {}; loom reads version 1 (uint16 tokens)", path, header[1]);
  const int64_t count = header[2];
  LOOM_CHECK(count >= 0, "token shard '{}' has a negative token count {}", path, count);
  // Checked against the file before anything is allocated for it.
  const int64_t body = int64_t(std::filesystem::file_size(path)) - int64_t(sizeof(header));
  LOOM_CHECK(count * 2 <= body,
             "token shard '{}' is truncated: its header says {} tokens ({} bytes) but the body has {} bytes", path,
             count, count * 2, body);
  std::vector<uint16_t> raw(static_cast<size_t>(count));
  in.read(reinterpret_cast<char*>(raw.data()), std::streamsize(count * 2));
  LOOM_CHECK(in.gcount() == count * 2,
             "token shard '{}' is truncated: its header says {} tokens ({} bytes) but the body has {} bytes", path,
             count, count * 2, int64_t(in.gcount()));
  std::vector<int32_t> tokens(raw.begin(), raw.end());
  for (size_t i = 0; i < tokens.size(); ++i)
    LOOM_CHECK(tokens[i] < vocab_size,
               "token shard '{}' holds token id {} at position {}, but model.vocab_size is {}; raise "
               "model.vocab_size or re-tokenize",
               path, tokens[i], i, vocab_size);
  return tokens;
}

void shard_write(const std::string& path, const std::vector<int32_t>& tokens) {
  LOOM_CHECK(tokens.size() < (size_t(1) << 31), "a shard holds fewer than 2^31 tokens; split the input");
  int32_t header[256] = {};
  header[0] = kShardMagic;
  header[1] = 1;
  header[2] = int32_t(tokens.size());
  std::vector<uint16_t> raw(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    LOOM_CHECK(tokens[i] >= 0 && tokens[i] < 65536, "token id {} does not fit a uint16 shard", tokens[i]);
    raw[i] = uint16_t(tokens[i]);
  }
  file_write_atomic(path, [&](std::FILE* f) {
    file_write(f, header, sizeof(header), path);
    file_write(f, raw.data(), raw.size() * 2, path);
  });
}

namespace {

std::shared_ptr<std::vector<int32_t>> load_tokens(const Config& cfg, const std::string& path) {
  namespace fs = std::filesystem;
  LOOM_CHECK(fs::exists(path), "data file '{}' does not exist; check data.path / data.val_path", path);
  auto out = std::make_shared<std::vector<int32_t>>();
  if (cfg.data.source == "text") {
    LOOM_CHECK(cfg.model.vocab_size >= 256,
               "data.source = \"text\" uses byte tokens (0..255); set model.vocab_size >= 256 (it is {})",
               cfg.model.vocab_size);
    std::ifstream in(path, std::ios::binary);
    LOOM_CHECK(in, "cannot read text file '{}'", path);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    out->assign(bytes.size(), 0);
    for (size_t i = 0; i < bytes.size(); ++i) (*out)[i] = int32_t(uint8_t(bytes[i]));
    return out;
  }
  std::vector<std::string> files;
  if (fs::is_directory(path)) {
    for (auto& e : fs::directory_iterator(path))
      if (e.path().extension() == ".bin") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    LOOM_CHECK(!files.empty(), "directory '{}' holds no .bin token shards", path);
  } else {
    files.push_back(path);
  }
  for (auto& f : files) {
    auto t = shard_read(f, cfg.model.vocab_size);
    out->insert(out->end(), t.begin(), t.end());
  }
  return out;
}

}  // namespace

DataStreams data_open(const Config& cfg) {
  DataStreams d;
  const int T = cfg.model.seq_len;
  if (cfg.data.source == "synthetic") {
    auto train = std::make_unique<SyntheticStream>(cfg.model.vocab_size, 0x10003);
    d.describe = fmt::format("synthetic corpus: unigram entropy {:.3f} nats, entropy rate {:.3f} nats",
                             train->unigram_entropy(), train->entropy_rate());
    d.train = std::move(train);
    // The same chain, read from far beyond anything training reaches.
    struct Offset : TokenStream {
      SyntheticStream s;
      int64_t at;
      Offset(int V, int64_t a) : s(V, 0x10003), at(a) {}
      int64_t num_tokens() const override { return int64_t(1) << 30; }
      void read(int64_t st, int64_t c, int32_t* o) const override { s.read(at + st, c, o); }
    };
    d.val = std::make_unique<Offset>(cfg.model.vocab_size, int64_t(1) << 39);
    return d;
  }
  auto train = load_tokens(cfg, cfg.data.path);
  const int64_t n = int64_t(train->size());
  if (!cfg.data.val_path.empty()) {
    auto val = load_tokens(cfg, cfg.data.val_path);
    LOOM_CHECK(int64_t(val->size()) > T, "validation data '{}' has {} tokens, fewer than seq_len + 1 = {}",
               cfg.data.val_path, val->size(), T + 1);
    d.val = std::make_unique<MemoryStream>(val, 0, int64_t(val->size()));
    d.train = std::make_unique<MemoryStream>(train, 0, n);
  } else {
    int64_t split = n - n / 10;
    if (n - split > T)
      d.val = std::make_unique<MemoryStream>(train, split, n);
    else
      split = n;  // too small to hold out a sequence: no validation
    d.train = std::make_unique<MemoryStream>(train, 0, split);
  }
  LOOM_CHECK(d.train->num_tokens() > T,
             "training data '{}' has {} tokens, fewer than model.seq_len + 1 = {}; use more data or a "
             "shorter seq_len",
             cfg.data.path, d.train->num_tokens(), T + 1);
  d.describe = fmt::format("{} '{}': {} training tokens, {} validation tokens", cfg.data.source, cfg.data.path,
                           d.train->num_tokens(), d.val ? d.val->num_tokens() : 0);
  return d;
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

void batch_read(const TokenStream& s, const Config& cfg, int64_t step, int rank, int micro, int32_t* inputs,
                int32_t* targets, bool shuffle) {
  const int T = cfg.model.seq_len, B = cfg.train.micro_batch, G = cfg.train.global_batch;
  const int per_rank = G / cfg.parallel.dp;
  const int64_t nseq = num_sequences(s, T);
  std::vector<int32_t> buf(size_t(T) + 1);
  for (int b = 0; b < B; ++b) {
    const int64_t g = step * G + int64_t(rank) * per_rank + int64_t(micro) * B + b;
    int64_t k = g % nseq;
    if (shuffle) k = sequence_permute(k, nseq, hash3(uint64_t(cfg.train.seed), uint64_t(g / nseq), 0x5f1e));
    s.read(k * T, T + 1, buf.data());
    std::copy_n(buf.data(), T, inputs + int64_t(b) * T);
    std::copy_n(buf.data() + 1, T, targets + int64_t(b) * T);
  }
}

}  // namespace loom
