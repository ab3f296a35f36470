// Real pretraining data: both llm.c shard formats mapped and read lazily, bad shards refused
// with what is wrong, and mixtures of sources whose every sequence is a function of (seed, g).
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "data/batches.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "testing.h"

using namespace loom;
using loom::test::error_of;

namespace {
std::string tmp(const std::string& name) {
  return ::testing::TempDir() + name;
}
bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}
std::vector<int32_t> iota(int n, int from = 0) {
  std::vector<int32_t> t(size_t(n), 0);
  for (int i = 0; i < n; ++i) t[size_t(i)] = from + i;
  return t;
}
int64_t rss_bytes() {  // resident now (not the peak)
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * int64_t(::sysconf(_SC_PAGESIZE));
}
Config tiny_cfg(int T = 4, int G = 4, int B = 2, int dp = 1) {
  Config c = config_defaults();
  c.model.seq_len = T;
  c.model.vocab_size = 1 << 20;
  c.train.global_batch = G;
  c.train.micro_batch = B;
  c.parallel.dp = dp;
  return c;
}
}  // namespace

TEST(Shards, LlamaFormatHoldsIdsAboveUint16AndTheWriterPicksIt) {
  const std::vector<int32_t> big = {0, 70000, 128255, 5}, small = {0, 65535, 3};
  shard_write(tmp("u32.bin"), big);
  shard_write(tmp("u16.bin"), small);
  EXPECT_EQ(shard_header_read(tmp("u32.bin")).width, 4);
  EXPECT_EQ(shard_header_read(tmp("u16.bin")).width, 2);
  EXPECT_EQ(std::filesystem::file_size(tmp("u32.bin")), 1024u + 16u);
  EXPECT_EQ(shard_read(tmp("u32.bin"), 128256), big);
  EXPECT_EQ(shard_read(tmp("u16.bin"), 65536), small);
  EXPECT_TRUE(has(error_of([&] { shard_write(tmp("x.bin"), big, 2); }), "does not fit a uint16 shard"));
  // Not the GPT-2 format's version under LLaMA-3's magic, nor the other way round.
  std::string bytes;
  {
    std::ifstream in(tmp("u32.bin"), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[4] = 1;
  std::ofstream(tmp("v1magic.bin"), std::ios::binary) << bytes;
  EXPECT_TRUE(has(error_of([&] { shard_read(tmp("v1magic.bin"), 128256); }), "LLaMA-3's magic but version 1"));
}

TEST(Shards, ACountThatDisagreesWithTheSizeIsRefusedBeforeReading) {
  shard_write(tmp("ok.bin"), iota(10));
  {
    std::ofstream extra(tmp("ok.bin"), std::ios::binary | std::ios::app);
    extra << "zz";  // one token more than the header says
  }
  EXPECT_TRUE(has(error_of([&] { ShardStream({tmp("ok.bin")}, 100); }), "has 22 bytes after its header"));
  std::filesystem::resize_file(tmp("ok.bin"), 1024 + 18);  // one token short
  EXPECT_TRUE(has(error_of([&] { ShardStream({tmp("ok.bin")}, 100); }), "is truncated: its header says 10 tokens"));
}

TEST(Shards, ADirectorysValidationShardsAreNotTrainedOn) {
  namespace fs = std::filesystem;
  const std::string dir = tmp("with_val/");
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"corpus.bin", "corpus_val.bin", "fineweb_train_000001.bin", "fineweb_val_000000.bin"})
    shard_write(dir + f, iota(8));
  EXPECT_EQ(shard_files(dir), (std::vector<std::string>{dir + "corpus.bin", dir + "fineweb_train_000001.bin"}));
  EXPECT_EQ(shard_files(dir, true), (std::vector<std::string>{dir + "corpus_val.bin", dir + "fineweb_val_000000.bin"}));
}

TEST(Shards, OneSourceHoldsOneFormat) {
  namespace fs = std::filesystem;
  const std::string dir = tmp("mixed_formats/");
  fs::remove_all(dir);
  fs::create_directories(dir);
  shard_write(dir + "a.bin", iota(8));
  shard_write(dir + "b.bin", iota(8), 4);
  const std::string e = error_of([&] { ShardStream(shard_files(dir), 100); });
  EXPECT_TRUE(has(e, "are of different formats")) << e;
  EXPECT_TRUE(has(e, "b.bin")) << e;
}

TEST(Shards, ReadsCrossShardsAndNameTheShardOfABadIdWhenItIsRead) {
  namespace fs = std::filesystem;
  const std::string dir = tmp("three/");
  fs::remove_all(dir);
  fs::create_directories(dir);
  shard_write(dir + "0.bin", iota(5, 0));
  shard_write(dir + "1.bin", {});
  std::vector<int32_t> second = iota(5, 5);
  second[3] = 999;  // position 3 of 2.bin
  shard_write(dir + "2.bin", second);
  ShardStream s(shard_files(dir), 100);  // opening reads headers only: the bad id is not seen yet
  EXPECT_EQ(s.num_tokens(), 10);
  std::vector<int32_t> out(6);
  s.read(2, 5, out.data());
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 5), (std::vector<int32_t>{2, 3, 4, 5, 6}));
  const std::string e = error_of([&] { s.read(4, 6, out.data()); });
  EXPECT_TRUE(has(e, "2.bin' holds token id 999 at position 3")) << e;
}

// A dataset of 3 GB (sparse: it costs no disk) opens in header reads and reading sequences
// from its far end makes nothing resident but the pages read.
TEST(Shards, AHugeShardIsMappedNotRead) {
  const std::string path = tmp("huge.bin");
  const int64_t tokens = int64_t(1500) * 1000 * 1000;
  {
    int32_t header[256] = {kShardMagic, 1, int32_t(tokens)};
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
  }
  std::filesystem::resize_file(path, 1024 + uint64_t(tokens) * 2);
  const int64_t before = rss_bytes();
  ShardStream s({path}, 50257);
  EXPECT_EQ(s.num_tokens(), tokens);
  std::vector<int32_t> seq(1025);
  for (int64_t k = 0; k < 64; ++k) s.read(tokens - 1025 - k * 1000003, 1025, seq.data());
  EXPECT_EQ(seq[7], 0);
  // 64 sequences touch at most 128 pages; reading it whole would take 6 GB as int32.
  EXPECT_LT(rss_bytes() - before, int64_t(4) << 20);
  std::filesystem::remove(path);
}

TEST(Sources, ConfigTablesRoundTripAndBadWeightsAreRefused) {
  Config c = config_defaults();
  config_load_string(c,
                     "[data]\nsource = \"tokens\"\n[[data.sources]]\npath = \"a.bin\"\nweight = 0.7\n"
                     "[[data.sources]]\npath = \"b dir/\"\nweight = 3\n",
                     "t");
  ASSERT_EQ(c.data.sources.size(), 2u);
  EXPECT_EQ(c.data.sources[1].path, "b dir/");
  EXPECT_EQ(c.data.sources[1].weight, 3.0);
  Config back = config_defaults();
  config_load_string(back, config_to_toml(c), "roundtrip");
  EXPECT_EQ(back.data.sources, c.data.sources);
  Config set = config_defaults();
  config_set(set, "data.sources=[{path = \"a.bin\", weight = 0.7}, {path = \"b dir/\", weight = 3}]");
  EXPECT_EQ(set.data.sources, c.data.sources);

  auto refused = [](const std::string& toml) {
    Config x = config_defaults();
    return error_of([&] {
      config_load_string(x, "[data]\nsource = \"tokens\"\n" + toml, "t");
      config_validate(x);
    });
  };
  EXPECT_TRUE(has(refused("[[data.sources]]\npath = \"a\"\nweight = -1\n"), "has weight -1"));
  EXPECT_TRUE(has(refused("[[data.sources]]\npath = \"a\"\nweight = 0\n"), "sum to 0"));
  EXPECT_TRUE(has(refused("[[data.sources]]\npath = \"a\"\nwieght = 1\n"), "'wieght' is not a source's key"));
  EXPECT_TRUE(has(refused("[[data.sources]]\nweight = 1\n"), "has no path"));
  EXPECT_TRUE(has(refused("path = \"x\"\n[[data.sources]]\npath = \"a\"\n"), "are both set"));
}

namespace {
std::shared_ptr<const TokenStream> numbered(int64_t n, int32_t base) {  // token i = base + i
  auto t = std::make_shared<std::vector<int32_t>>(iota(int(n), base));
  return std::make_shared<MemoryStream>(t, 0, n);
}
}  // namespace

TEST(Sources, AMixtureBlendsByWeightAndEachSourceWalksItsOwnEpochs) {
  const int T = 4;
  // Source 0: 30 sequences (tokens 0..), source 1: 12 sequences (tokens 100000..).
  Sequences mix({{numbered(30 * T + 1, 0), 3.0, "a"}, {numbered(12 * T + 1, 100000), 1.0, "b"}}, T, 7, true);
  EXPECT_DOUBLE_EQ(mix.share(0), 0.75);
  std::map<int, int64_t> count;
  std::vector<std::vector<int32_t>> seen(2);  // each source's sequence starts, in order
  std::vector<int32_t> seq(T + 1);
  const int64_t N = 40000;
  for (int64_t g = 0; g < N; ++g) {
    const int j = mix.source_of(g);
    ++count[j];
    mix.read(g, seq.data());
    EXPECT_EQ(seq[0] >= 100000, j == 1);
    if (seen[size_t(j)].size() < 48) seen[size_t(j)].push_back(seq[0]);
  }
  EXPECT_EQ(count[0], 30000);  // 4 whole blocks: exact
  // Source 1's first 12 reads are its 12 sequences once each, its next 12 all of them again
  // in another seeded order (its second epoch).
  for (int e = 0; e < 2; ++e) {
    std::set<int32_t> epoch(seen[1].begin() + 12 * e, seen[1].begin() + 12 * e + 12);
    EXPECT_EQ(epoch.size(), 12u) << "epoch " << e;
  }
  EXPECT_NE(std::vector<int32_t>(seen[1].begin(), seen[1].begin() + 12),
            std::vector<int32_t>(seen[1].begin() + 12, seen[1].begin() + 24));
  // The sources interleave: the first 40 sequences are not one source's run.
  int firsts = 0;
  for (int64_t g = 0; g < 40; ++g) firsts += mix.source_of(g);
  EXPECT_GT(firsts, 3);
  EXPECT_LT(firsts, 20);
  // The first epoch ends where a source asks for a sequence a second time (source 0, 30
  // sequences at three quarters, near g = 40).
  std::vector<int64_t> before(2, 0);
  for (int64_t g = 0; g < mix.epoch_sequences(); ++g) ++before[size_t(mix.source_of(g))];
  EXPECT_EQ(before[0], 30);
  EXPECT_LE(before[1], 12);
  EXPECT_EQ(mix.source_of(mix.epoch_sequences()), 0);
}

// Every layout reads the same sequence g: dp 2 with one micro-batch against dp 1 with two.
TEST(Sources, AMixtureReadsTheSameSequencesAtEveryLayout) {
  const int T = 4;
  Sequences mix({{numbered(50 * T + 1, 0), 1.0, "a"}, {numbered(20 * T + 1, 100000), 1.0, "b"}}, T, 3, true);
  const Config dp2 = tiny_cfg(T, 4, 2, 2), dp1 = tiny_cfg(T, 4, 2, 1);
  for (int64_t step = 0; step < 30; ++step) {
    std::vector<int32_t> a(16), b(16), ta(16), tb(16);
    for (int r = 0; r < 2; ++r) batch_read(mix, dp2, step, r, 0, a.data() + r * 8, ta.data() + r * 8);
    for (int m = 0; m < 2; ++m) batch_read(mix, dp1, step, 0, m, b.data() + m * 8, tb.data() + m * 8);
    ASSERT_EQ(a, b) << "step " << step;
    ASSERT_EQ(ta, tb) << "step " << step;
    const std::vector<int64_t> n = step_source_tokens(mix, dp1, step);
    int from_b = 0;
    for (int i = 0; i < 4; ++i) from_b += a[size_t(i) * T] >= 100000;
    EXPECT_EQ(n[1], from_b * T);
    EXPECT_EQ(n[0] + n[1], 4 * T);
  }
}

TEST(Sources, OneSourceReadsAsBefore) {
  // One source: sequence g is sequence g mod n, in the seeded order of its epoch.
  const int T = 4;
  Sequences one({{numbered(10 * T + 1, 0), 1.0, "a"}}, T, 5, false);
  std::vector<int32_t> seq(T + 1);
  one.read(23, seq.data());
  EXPECT_EQ(seq[0], 3 * T);
  EXPECT_EQ(one.epoch_sequences(), 10);
  // Shuffled, the order earlier versions read (one seeded permutation per epoch): a golden list.
  Sequences shuffled({{numbered(10 * T + 1, 0), 1.0, "a"}}, T, 5, true);
  std::vector<int32_t> order;
  for (int64_t g = 0; g < 12; ++g) {
    shuffled.read(g, seq.data());
    order.push_back(seq[0] / T);
  }
  EXPECT_EQ(order, (std::vector<int32_t>{7, 9, 0, 1, 2, 4, 5, 8, 6, 3, 5, 3}));
}
