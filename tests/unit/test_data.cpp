// Data order and sources, token shards, safetensors, tokenizers and the optimizer's
// arithmetic, each against values computed independently here.
#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "checkpoint/safetensors.h"
#include "data/batches.h"
#include "data/shard_writer.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "model/backend.h"
#include "optim/adamw.h"
#include "runtime/error.h"
#include "runtime/exact_sum.h"
#include "runtime/file.h"
#include "runtime/file_set.h"
#include "testing.h"
#include "train/trainer.h"

using namespace loom;
using loom::test::error_of;

TEST(Data, BatchOrderFollowsTheDesign) {
  auto toks = std::make_shared<std::vector<int32_t>>(1000);
  for (int i = 0; i < 1000; ++i) (*toks)[size_t(i)] = i;
  MemoryStream s(toks, 0, 1000);
  Config c = config_defaults();
  c.model.seq_len = 10;
  c.train.micro_batch = 2;
  c.train.global_batch = 6;
  std::vector<int32_t> in(20), tg(20);
  // Step 3, micro-batch 2 of 3: sequences 3*6 + 4 and + 5.
  batch_read(s, c, 3, 0, 2, in.data(), tg.data());
  EXPECT_EQ(in[0], 220);
  EXPECT_EQ(tg[0], 221);
  EXPECT_EQ(in[10], 230);
  EXPECT_EQ(tg[19], 240);  // targets reach token k*T + T
  // Wrap-around: 99 sequences of 10 (+1) tokens, so sequence 99 is sequence 0.
  c.train.global_batch = 2;
  batch_read(s, c, 49, 0, 0, in.data(), tg.data());  // sequences 98, 99
  EXPECT_EQ(in[0], 980);
  EXPECT_EQ(in[10], 0);
}

TEST(Data, ShuffleIsAPermutationPerEpochAndLayoutIndependent) {
  for (int64_t n : {1, 2, 5, 99, 1000, 4097}) {
    std::vector<int> seen(size_t(n), 0);
    for (int64_t k = 0; k < n; ++k) ++seen[size_t(sequence_permute(k, n, 42))];
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), n) << n;
  }
  int64_t moved = 0;
  for (int64_t k = 0; k < 1000; ++k) moved += sequence_permute(k, 1000, 1) != sequence_permute(k, 1000, 2);
  EXPECT_GT(moved, 900);  // another key, another order
  auto toks = std::make_shared<std::vector<int32_t>>(1001);
  for (int i = 0; i <= 1000; ++i) (*toks)[size_t(i)] = i;
  MemoryStream s(toks, 0, 1001);
  Config c = config_defaults();
  c.model.seq_len = 10;
  c.train.micro_batch = 2;
  c.train.global_batch = 4;
  // 100 sequences, 25 steps an epoch: one epoch visits each once; dp 2 reads the same set.
  std::vector<int> seen(100, 0);
  std::vector<int32_t> in(20), tg(20);
  std::multiset<int32_t> one, two;
  for (int step = 0; step < 25; ++step) {
    for (int micro = 0; micro < 2; ++micro) {
      batch_read(s, c, step, 0, micro, in.data(), tg.data(), true);
      ++seen[size_t(in[0] / 10)], ++seen[size_t(in[10] / 10)];
      one.insert(in[0]), one.insert(in[10]);
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 100);
  c.parallel.dp = 2;
  for (int step = 0; step < 25; ++step)
    for (int rank = 0; rank < 2; ++rank) {
      batch_read(s, c, step, rank, 0, in.data(), tg.data(), true);
      two.insert(in[0]), two.insert(in[10]);
    }
  EXPECT_EQ(one, two);
}

TEST(Data, SyntheticIsRandomAccessAndStructured) {
  SyntheticStream s(512, 7);
  std::vector<int32_t> all(10000), part(777);
  s.read(0, 10000, all.data());
  s.read(4000, 777, part.data());  // crosses a 4096-token block boundary
  EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + 4000));
  EXPECT_GT(s.unigram_entropy(), 5.5);
  EXPECT_LT(s.entropy_rate(), 1.8);
  EXPECT_GT(s.entropy_rate(), 1.2);
  // The empirical bigram entropy of a sample agrees with the exact rate.
  std::vector<int32_t> big(400000);
  s.read(0, int64_t(big.size()), big.data());
  std::map<std::pair<int, int>, int> pairs;
  std::map<int, int> firsts;
  for (size_t i = 0; i + 1 < big.size(); ++i) ++pairs[{big[i], big[i + 1]}], ++firsts[big[i]];
  double h = 0, n = double(big.size() - 1);
  for (auto& [p, c] : pairs) h -= c / n * std::log(double(c) / firsts[p.first]);
  EXPECT_NEAR(h, s.entropy_rate(), 0.15);  // the sample under-counts rare successors
}

namespace {
std::string tmp(const std::string& name) {
  return ::testing::TempDir() + name;
}
}  // namespace

TEST(Data, ShardsRoundTripAndRefuseBadInput) {
  std::vector<int32_t> t = {1, 2, 65535, 0, 7};
  shard_write(tmp("ok.bin"), t);
  EXPECT_EQ(shard_read(tmp("ok.bin"), 65536), t);
  EXPECT_NE(error_of([&] { shard_read(tmp("ok.bin"), 100); }).find("token id 65535 at position 2"), std::string::npos);
  {  // truncated body: drop the last token's bytes
    std::ifstream in(tmp("ok.bin"), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(tmp("trunc.bin"), std::ios::binary) << bytes.substr(0, bytes.size() - 2);
    bytes[0] = 'X';
    std::ofstream(tmp("magic.bin"), std::ios::binary) << bytes;
  }
  EXPECT_NE(error_of([&] { shard_read(tmp("trunc.bin"), 65536); }).find("is truncated"), std::string::npos);
  EXPECT_NE(error_of([&] { shard_read(tmp("magic.bin"), 65536); }).find("is not an llm.c token shard"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              shard_read(tmp("missing.bin"), 65536);
            }).find("token shard '" + tmp("missing.bin") + "' does not exist"),
            std::string::npos);
}

TEST(Safetensors, RoundTripAndShapeErrors) {
  ParamRegistry reg;
  reg.add("a.weight", {3, 2}, ParamSpec::Init::normal);
  reg.add("transformer.wpe.weight", {4, 2}, ParamSpec::Init::normal);
  std::vector<float> p(reg.numel());
  registry_init(reg, p.data(), 1);
  model_save(reg, p.data(), tmp("m.safetensors"));
  std::vector<float> q(reg.numel());
  EXPECT_TRUE(model_load(reg, q.data(), tmp("m.safetensors")).empty());
  EXPECT_EQ(p, q);

  ParamRegistry wide;  // a model whose a.weight is [3, 5]
  wide.add("a.weight", {3, 5}, ParamSpec::Init::normal);
  std::vector<float> w(wide.numel());
  EXPECT_NE(error_of([&] {
              model_load(wide, w.data(), tmp("m.safetensors"));
            }).find("tensor 'a.weight' has shape [3, 2] but the model expects [3, 5]"),
            std::string::npos);
  ParamRegistry more;
  more.add("b.weight", {2}, ParamSpec::Init::zeros);
  EXPECT_NE(error_of([&] { model_load(more, w.data(), tmp("m.safetensors")); }).find("has no tensor 'b.weight'"),
            std::string::npos);
  // A longer position table loads its first rows; a shorter one is refused.
  ParamRegistry shorter, longer;
  shorter.add("transformer.wpe.weight", {2, 2}, ParamSpec::Init::zeros);
  longer.add("transformer.wpe.weight", {8, 2}, ParamSpec::Init::zeros);
  std::vector<float> s(4), l(16);
  auto unused = model_load(shorter, s.data(), tmp("m.safetensors"));
  EXPECT_EQ(unused, std::vector<std::string>{"a.weight"});
  EXPECT_EQ(s[3], p[reg.at("transformer.wpe.weight").offset + 3]);
  EXPECT_NE(error_of([&] { model_load(longer, l.data(), tmp("m.safetensors")); }).find("above the position table"),
            std::string::npos);
  std::ofstream(tmp("junk.safetensors")) << "not a safetensors file at all";
  EXPECT_NE(error_of([&] { safetensors_read(tmp("junk.safetensors")); }).find("is not a safetensors file"),
            std::string::npos);
}

// Corrupt headers are refused before anything is allocated for them: a file shorter than the
// size field, a header size near 2^64, a shape whose element count overflows.
TEST(Safetensors, CorruptHeadersAreRefusedBeforeAllocating) {
  std::ofstream(tmp("tiny.safetensors"), std::ios::binary) << "abc";
  EXPECT_NE(error_of([&] { safetensors_read(tmp("tiny.safetensors")); }).find("is not a safetensors file"),
            std::string::npos);
  {
    std::ofstream out(tmp("huge.safetensors"), std::ios::binary);
    const uint64_t n = ~uint64_t(0) - 4;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  EXPECT_NE(error_of([&] { safetensors_read(tmp("huge.safetensors")); }).find("does not fit its 10 bytes"),
            std::string::npos);
  {
    const std::string h = R"({"w":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,0]}})";
    std::ofstream out(tmp("overflow.safetensors"), std::ios::binary);
    const uint64_t n = h.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << h << "12345678";
  }
  EXPECT_NE(
      error_of([&] { safetensors_read(tmp("overflow.safetensors")); }).find("larger than the file's 8 data bytes"),
      std::string::npos);
}

// A write that fails leaves the file that was there (and no temporary); a full disk is an
// error that names the file, for atomic writes and for streamed ones (metrics.jsonl).
TEST(Files, FailedWritesNeverReplaceTheFile) {
  const std::string path = tmp("durable.txt");
  file_write_atomic(path, [&](std::FILE* f) { file_write(f, "old", 3, path); });
  EXPECT_NE(error_of([&] {
              file_write_atomic(path, [&](std::FILE* f) {
                file_write(f, "new, half", 9, path);
                loom::fail("the write broke off");
              });
            }).find("broke off"),
            std::string::npos);
  std::ifstream in(path);
  std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, "old");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  // A device is never written as a log (the full disk itself: dist.checkpoint_full_disk).
  EXPECT_NE(error_of([&] { DurableAppend full("/dev/full", "w"); }).find("'/dev/full' is a character device"),
            std::string::npos);
}

namespace {
std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
}  // namespace

// A set of files replaces its names together: a rename that fails (here, a directory put at the
// second name after the checks) puts the first name back as it was, and a name that held no file
// holds none again.
TEST(Files, ASetReplacesAllItsNamesOrNone) {
  const std::string a = tmp("set_a.txt"), b = tmp("set_b.txt"), c = tmp("set_c.txt");
  // What loom made beside a name (its temporaries, the old file kept): PATH.<anything>.
  auto beside = [](const std::string& p) {
    int n = 0;
    const std::string name = std::filesystem::path(p).filename().string() + ".";
    for (auto& e : std::filesystem::directory_iterator(std::filesystem::path(p).parent_path()))
      n += e.path().filename().string().rfind(name, 0) == 0;
    return n;
  };
  for (const std::string& p : {a, b, c}) std::filesystem::remove_all(p);
  file_write_atomic(a, [&](std::FILE* f) { file_write(f, "old a", 5, a); });
  file_write_atomic(b, [&](std::FILE* f) { file_write(f, "old b", 5, b); });
  {
    FileSet set("the test");
    for (const std::string& p : {c, a, b}) file_write(set.open(p), "new", 3, p);
    std::filesystem::remove(b);
    std::filesystem::create_directories(b + "/in_the_way");
    EXPECT_NE(error_of([&] { set.commit(); }).find("nothing was replaced"), std::string::npos);
  }
  EXPECT_EQ(slurp(a), "old a");
  EXPECT_FALSE(std::filesystem::exists(c));
  for (const std::string& p : {a, b, c}) EXPECT_EQ(beside(p), 0) << p;
  std::filesystem::remove_all(b);
  {
    FileSet set("the test");
    for (const std::string& p : {a, b}) file_write(set.open(p), "new", 3, p);
    set.commit({c});
  }
  EXPECT_EQ(slurp(a), "new");
  EXPECT_EQ(slurp(b), "new");
  EXPECT_EQ(beside(a), 0);
  {
    FileSet dropped("the test");  // never committed: nothing changes, no temporary stays
    file_write(dropped.open(a), "newer", 5, a);
  }
  EXPECT_EQ(slurp(a), "new");
  EXPECT_EQ(beside(a), 0);
}

// JSON Lines memory is planned before anything is read: with 200 MB to spend, a batch of 8 MB
// and records up to 64 MB (about 8 bytes per byte) do not fit, so a --max-record of 64 is
// refused, and the default becomes what fits (17 MB), a longer record a bad one.
TEST(Data, JsonLinesMemoryIsPlannedBeforeReading) {
  const std::string in = tmp("plan.jsonl"), out = tmp("plan.bin");
  std::ofstream(in) << "{\"text\": \"short\"}\n{\"text\": \"" << std::string(18 << 20, 'x') << "\"}\n";
  DataOptions opt;
  opt.inputs = {in};
  opt.output = out;
  opt.format = "jsonl";
  opt.threads = 1;
  opt.quiet = true;
  opt.memory_bytes = int64_t(200) << 20;
  opt.memory_from = "the test's";
  opt.max_record_mb = 64;
  EXPECT_NE(error_of([&] { data_run(opt); })
                .find("--max-record 64 MB: a batch of records (8 MB on 1 thread) and one "
                      "of 64 MB take about 0.6 GiB"),
            std::string::npos);
  opt.max_record_mb = 0;
  EXPECT_NE(error_of([&] { data_run(opt); }).find("line 2 is longer than 17 MB (--max-record)"), std::string::npos);
  opt.max_record_mb = 19;
  opt.memory_bytes = -1;  // unknown: as given
  data_run(opt);
  EXPECT_EQ(shard_read(out, 256).size(), size_t(5 + (18 << 20)));
}

TEST(Data, AShardsTokenCountIsCheckedAgainstItsSizeFirst) {
  int32_t header[256] = {};
  header[0] = kShardMagic, header[1] = 1, header[2] = 2147483647;  // 4 GiB of tokens claimed
  {
    std::ofstream out(tmp("liar.bin"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
    out << "0123456789";
  }
  EXPECT_NE(error_of([&] { shard_read(tmp("liar.bin"), 65536); }).find("but the body has 10 bytes"), std::string::npos);
}

TEST(Tokenizer, Gpt2PretokenizerSplitsLikeTheRegex) {
  auto w = gpt2_pretokenize("Hello world's  test\n\nfoo 123!!");
  // The regex branch \s+(?!\S) gives back one character before a word, so two newlines split.
  std::vector<std::string> want = {"Hello", " world", "'s", " ", " test", "\n", "\n", "foo", " 123", "!!"};
  EXPECT_EQ(w, want);
}

TEST(Tokenizer, Gpt2BpeMergesByRank) {
  std::ofstream(tmp("vocab.json"))
      << R"({"h":0,"e":1,"l":2,"o":3,"\u0120":4,"he":5,"hel":6,"hell":7,"hello":8,"\u0120hello":9})";
  std::ofstream(tmp("merges.txt")) << "#version: 0.2\nh e\nhe l\nhel l\nhell o\n\u0120 hello\n";
  Gpt2Bpe bpe(tmp("vocab.json"), tmp("merges.txt"));
  auto ids = bpe.encode("hello hello hel");
  EXPECT_EQ(ids, (std::vector<int32_t>{8, 9, 4, 6}));
  EXPECT_EQ(bpe.decode(ids), "hello hello hel");
  EXPECT_EQ(tokenize_bytes("A\xff"), (std::vector<int32_t>{65, 255}));
}

// AdamW over the chunk table against the formula in double: fp32 weights updated in place,
// and (bf16 compute) fp32 master weights with the bf16 parameters their rounding; without
// clipping, and with a max norm below the gradients' so that the scale is applied.
TEST(Optim, AdamWMatchesTheFormulaInDouble) {
  ParamRegistry reg;
  reg.add("w", {2, 2}, ParamSpec::Init::normal);  // decays
  reg.add("b", {3}, ParamSpec::Init::zeros);      // does not
  Config cfg = config_defaults();
  config_validate(cfg);
  for (auto [master, max_norm] : {std::pair{false, 0.0}, {true, 0.0}, {false, 0.25}, {true, 0.25}}) {
    Allocator alloc;
    auto be = cpu_backend(model_dims(cfg), master ? DType::bf16 : DType::f32, alloc);
    AdamW opt(*be, opt_chunks(reg, {0}, 1024, 0), int64_t(reg.numel()), master);
    auto p = test::randn(7, 1), g0 = test::randn(7, 2);
    std::vector<bf16> low(7);
    if (master) std::copy(p.begin(), p.end(), opt.master());
    std::vector<double> P(p.begin(), p.end()), M(7, 0), Vv(7, 0);
    const AdamWHyper h{0.1, 0.9, 0.95, 1e-8, 0.1};
    for (int step = 1; step <= 3; ++step) {
      std::vector<float> g(7);
      for (int i = 0; i < 7; ++i) g[i] = g0[i] * float(step);
      opt.norm_squares(g.data());
      opt.update(master ? Ptr(low.data(), 2) : Ptr(p.data(), 4), g.data(), h, step, max_norm);
      double norm = 0;
      for (int i = 0; i < 7; ++i) norm += double(g[i]) * g[i];
      norm = std::sqrt(norm);
      const double scale = max_norm > 0 ? std::min(1.0, max_norm / (norm + 1e-6)) : 1.0;
      if (max_norm > 0) {
        ASSERT_LT(scale, 0.5) << "the test must clip";
      }
      for (int i = 0; i < 7; ++i) {
        double wd = i < 4 ? h.weight_decay : 0.0;
        const double gi = double(g[i]) * scale;
        P[i] *= 1 - h.lr * wd;
        M[i] = h.beta1 * M[i] + (1 - h.beta1) * gi;
        Vv[i] = h.beta2 * Vv[i] + (1 - h.beta2) * gi * gi;
        double mh = M[i] / (1 - std::pow(h.beta1, step)), vh = Vv[i] / (1 - std::pow(h.beta2, step));
        P[i] -= h.lr * mh / (std::sqrt(vh) + h.eps);
      }
    }
    for (int i = 0; i < 7; ++i) {
      const float got = master ? opt.master()[i] : p[i];
      EXPECT_NEAR(got, P[i], 1e-6) << i << " max_norm " << max_norm;
      if (master) {
        EXPECT_EQ(low[size_t(i)].bits, f32_to_bf16(got)) << i;
      }
    }
  }
}

// The norm over the table (replicated tensors on one tp rank only) and clip_grad_norm_'s factor.
TEST(Optim, ClipScalesToTheMaxNorm) {
  ParamRegistry reg;
  reg.add("g", {2}, ParamSpec::Init::zeros);
  Config cfg = config_defaults();
  config_validate(cfg);
  Allocator alloc;
  auto be = cpu_backend(model_dims(cfg), DType::f32, alloc);
  OptTable t{opt_chunks(reg, {0}, 1024, 0), {}};
  std::vector<float> g = {3, 4};
  std::array<double, kExactDigits> ss{};  // the sum's digits (runtime/exact_sum.h)
  auto value = [&] {
    ExactSum s;
    s.digits_from(ss.data());
    return s.value();
  };
  float scale = 0;
  be->grad_sum_squares(ss.data(), g.data(), t);
  EXPECT_EQ(value(), 25.0);
  be->clip_scale(&scale, ss.data(), 1.0);
  EXPECT_FLOAT_EQ(scale, float(1.0 / (5.0 + 1e-6)));
  be->clip_scale(&scale, ss.data(), 10.0);
  EXPECT_EQ(scale, 1.0f);  // below the max: untouched
  be->clip_scale(&scale, ss.data(), 0.0);
  EXPECT_EQ(scale, 1.0f);                             // 0: no clipping
  OptTable other{opt_chunks(reg, {0}, 1024, 1), {}};  // tp rank 1 holds a copy of the replicated tensor
  be->grad_sum_squares(ss.data(), g.data(), other);
  EXPECT_EQ(value(), 0.0);
}

TEST(Optim, Schedules) {
  TrainConfig t;
  t.lr = 1.0, t.min_lr = 0.1, t.warmup_steps = 10, t.steps = 110;
  t.schedule = LrSchedule::cosine;
  EXPECT_DOUBLE_EQ(lr_at(t, 0), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(t, 9), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(t, 10), 1.0);
  EXPECT_NEAR(lr_at(t, 60), 0.55, 1e-12);
  EXPECT_NEAR(lr_at(t, 110), 0.1, 1e-12);
  t.schedule = LrSchedule::linear;
  EXPECT_NEAR(lr_at(t, 60), 0.55, 1e-12);
  t.schedule = LrSchedule::constant;
  EXPECT_DOUBLE_EQ(lr_at(t, 100), 1.0);
  t.schedule = LrSchedule::wsd;  // stable until step 88 (the last 20%, 22 steps, decays)
  EXPECT_DOUBLE_EQ(lr_at(t, 87), 1.0);
  EXPECT_NEAR(lr_at(t, 88), 1.0 - 0.9 * 1.0 / 22.0, 1e-12);
  EXPECT_NEAR(lr_at(t, 98), 1.0 - 0.9 * 11.0 / 22.0, 1e-12);
  EXPECT_DOUBLE_EQ(lr_at(t, 109), 0.1);  // the last step trains at min_lr
  t.decay_frac = 0.5;                    // 55 steps decay
  EXPECT_DOUBLE_EQ(lr_at(t, 54), 1.0);
  EXPECT_NEAR(lr_at(t, 55), 1.0 - 0.9 / 55.0, 1e-12);
  EXPECT_DOUBLE_EQ(lr_at(t, 109), 0.1);
  t.steps = 20, t.warmup_steps = 10, t.decay_frac = 0.8;  // the decay waits for the warmup to end
  EXPECT_DOUBLE_EQ(lr_at(t, 9), 1.0);
  EXPECT_NEAR(lr_at(t, 10), 1.0 - 0.9 / 10.0, 1e-12);
  EXPECT_DOUBLE_EQ(lr_at(t, 19), 0.1);
  t.steps = 3, t.warmup_steps = 0, t.decay_frac = 0.01;  // at least one step decays
  EXPECT_DOUBLE_EQ(lr_at(t, 1), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(t, 2), 0.1);
}

// MFU's CPU peak is one per-core figure times the cores a run uses, so every layout divides
// by the same thing; a remeasurement (on a busier machine, say) never lowers it.
TEST(Bench, CpuPeakIsPerCoreAndOnlyRises) {
  const std::string dir = tmp("cache_home");
  std::filesystem::create_directories(dir + "/loom");
  const char* old = std::getenv("XDG_CACHE_HOME");
  const std::string keep = old ? old : "";
  setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  const double one = cpu_peak_flops(1);
  EXPECT_GT(one, 0);
  EXPECT_EQ(cpu_peak_flops(2), 2 * one);
  EXPECT_EQ(cpu_peak_flops(8), 8 * one);
  // A far better figure on record is kept when a new measurement comes in lower.
  std::string text;
  {
    std::ifstream in(dir + "/loom/cpu_peak.json");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const auto at = text.find("\"peak\": ");
  ASSERT_NE(at, std::string::npos) << text;
  const auto end = text.find_first_of(",\n}", at);
  text.replace(at, end - at, "\"peak\": 1e15");
  std::ofstream(dir + "/loom/cpu_peak.json") << text;
  EXPECT_EQ(cpu_peak_flops(1, /*remeasure=*/true), 1e15);
  EXPECT_EQ(cpu_peak_flops(3), 3e15);
  if (old)
    setenv("XDG_CACHE_HOME", keep.c_str(), 1);
  else
    unsetenv("XDG_CACHE_HOME");
}
