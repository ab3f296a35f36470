// The inference path: the KV-cached forward against PyTorch (the parity fixtures' step-1 loss
// is PyTorch's forward of their init weights) and against itself fed in pieces; sampling;
// where a weights file's shape comes from.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/hf_export.h"
#include "checkpoint/safetensors.h"
#include "data/batches.h"
#include "model/cached_decoder.h"
#include "testing.h"

using namespace loom;

namespace {
std::string fixture(const std::string& arch) {
  return std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/parity_" + arch + "/";
}
Config fixture_config(const std::string& arch) {
  Config cfg = config_defaults();
  config_load_file(cfg, fixture(arch) + "config.toml");
  config_set(cfg, "data.path=" + fixture(arch) + "tokens.bin");
  config_set(cfg, "data.val_path=" + fixture(arch) + "tokens.bin");
  config_validate(cfg);
  return cfg;
}
// Mean cross-entropy of targets under logits [n, V], in double.
double mean_ce(const std::vector<float>& logits, const int32_t* targets, int n, int V) {
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    const float* l = logits.data() + size_t(i) * V;
    double mx = *std::max_element(l, l + V), z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(double(l[v]) - mx);
    sum += std::log(z) + mx - l[targets[i]];
  }
  return sum / n;
}
}  // namespace

class DecodeFixture : public ::testing::TestWithParam<const char*> {};

// The first step's loss is the mean over the global batch of the init weights' forward, as
// PyTorch computed it: a decoder that gets any layer wrong (a transposed weight, the wrong
// rope rows, a norm without its bias) misses it by far more than 1e-5.
TEST_P(DecodeFixture, ForwardMatchesPyTorch) {
  const Config cfg = fixture_config(GetParam());
  CachedDecoder dec(model_dims(cfg), [](const ParamRegistry& reg, float* w) {
    return model_load(reg, w, fixture(GetParam()) + "init.safetensors");
  });
  std::ifstream in(fixture(GetParam()) + "losses.json");
  const double want = nlohmann::json::parse(in)["losses"][0].get<double>();
  const int T = cfg.model.seq_len, G = cfg.train.global_batch;
  const std::vector<int32_t> tokens = shard_read(fixture(GetParam()) + "tokens.bin", cfg.model.vocab_size);
  double sum = 0;
  for (int s = 0; s < G; ++s) {  // sequence s of step 1 starts at token s*T (data.shuffle off)
    dec.reset();
    auto logits = dec.forward(tokens.data() + size_t(s) * T, T, /*all_rows=*/true);
    sum += mean_ce(logits, tokens.data() + size_t(s) * T + 1, T, cfg.model.vocab_size);
  }
  EXPECT_NEAR(sum / G, want, 1e-5 * want);
}

// Fed one token, then a few, then the rest, the cache must give what one pass gives: a
// cache written at the wrong position or read past the query's own position breaks this.
TEST_P(DecodeFixture, CachedPiecesMatchOnePass) {
  const Config cfg = fixture_config(GetParam());
  CachedDecoder dec(model_dims(cfg), [](const ParamRegistry& reg, float* w) {
    return model_load(reg, w, fixture(GetParam()) + "init.safetensors");
  });
  const int T = cfg.model.seq_len, V = cfg.model.vocab_size;
  const std::vector<int32_t> tokens = shard_read(fixture(GetParam()) + "tokens.bin", V);
  const auto whole = dec.forward(tokens.data(), T, true);
  dec.reset();
  std::vector<float> pieces;
  for (auto [at, n] : {std::pair{0, 1}, {1, 4}, {5, 1}, {6, T - 6}}) {
    auto l = dec.forward(tokens.data() + at, n, true);
    pieces.insert(pieces.end(), l.begin(), l.end());
  }
  ASSERT_EQ(pieces.size(), whole.size());
  ASSERT_EQ(dec.pos(), T);
  double worst = 0;
  for (size_t i = 0; i < whole.size(); ++i) worst = std::max(worst, double(std::abs(pieces[i] - whole[i])));
  EXPECT_LT(worst, 1e-5);
  // The last row alone is the last row of the whole (a one-row GEMM rounds differently).
  dec.reset();
  auto last = dec.forward(tokens.data(), T);
  ASSERT_EQ(last.size(), size_t(V));
  for (int v = 0; v < V; ++v) EXPECT_NEAR(last[size_t(v)], whole[size_t(T - 1) * V + v], 1e-6);
  // A full context refuses more.
  EXPECT_THROW(dec.forward(tokens.data(), 1), Error);
}
INSTANTIATE_TEST_SUITE_P(Arch, DecodeFixture, ::testing::Values("gpt2", "llama"));

TEST(Sample, GreedyTopKAndSeeds) {
  const std::vector<float> logits = {0.5f, 2.0f, 1.0f, 2.0f, -1.0f};
  std::mt19937_64 rng(7);
  EXPECT_EQ(token_sample(logits.data(), 5, {0.0, 0}, rng), 1);                               // ties: the lower id
  for (int i = 0; i < 50; ++i) EXPECT_EQ(token_sample(logits.data(), 5, {1.5, 1}, rng), 1);  // top-1 is greedy
  for (int i = 0; i < 200; ++i) {
    const int t = token_sample(logits.data(), 5, {1.0, 2}, rng);
    EXPECT_TRUE(t == 1 || t == 3) << t;  // top-2: only the two largest
  }
  auto draws = [&](uint64_t seed) {
    std::mt19937_64 r(seed);
    std::vector<int> out;
    for (int i = 0; i < 64; ++i) out.push_back(token_sample(logits.data(), 5, {1.0, 0}, r));
    return out;
  };
  EXPECT_EQ(draws(3), draws(3));
  EXPECT_NE(draws(3), draws(4));
  // The draws follow softmax(logits / temperature): each frequency within 4 standard errors.
  const double temp = 0.7;
  std::vector<double> p(5);
  double z = 0;
  for (int v = 0; v < 5; ++v) z += p[size_t(v)] = std::exp(logits[size_t(v)] / temp);
  std::vector<int> count(5);
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++count[size_t(token_sample(logits.data(), 5, {temp, 0}, rng))];
  for (int v = 0; v < 5; ++v) {
    const double q = p[size_t(v)] / z, se = std::sqrt(q * (1 - q) / n);
    EXPECT_NEAR(double(count[size_t(v)]) / n, q, 4 * se + 1e-9) << "token " << v;
  }
}

TEST(ModelConfigFind, FromLoomMetadataHuggingFaceConfigOrNeither) {
  const std::string dir = ::testing::TempDir() + "loom_shape/";
  std::filesystem::create_directories(dir);
  const float x = 0;
  // loom's export carries its [model] section.
  safetensors_write(dir + "loom.safetensors", {{"a", {1}, &x}},
                    {{"loom.model",
                      "[model]\narch = \"llama\"\nn_layer = 3\nd_model = 64\nn_head = 4\n"
                      "n_kv_head = 2\nvocab_size = 300\nseq_len = 32\n"}});
  Config a = model_config_find(dir + "loom.safetensors");
  EXPECT_EQ(a.model.arch, Arch::llama);
  EXPECT_EQ(a.model.n_layer, 3);
  EXPECT_EQ(a.kv_heads(), 2);
  EXPECT_FALSE(a.model.tie_embeddings);  // llama's default, filled by validate
  // Hugging Face ships config.json beside the weights.
  const std::string hf = dir + "hf/";
  std::filesystem::create_directories(hf);
  safetensors_write(hf + "model.safetensors", {{"a", {1}, &x}});
  std::ofstream(hf + "config.json") << R"({"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12,
      "n_positions": 1024, "vocab_size": 50257, "layer_norm_epsilon": 1e-05, "n_inner": null,
      "activation_function": "gelu_new"})";
  Config g = model_config_find(hf + "model.safetensors");
  EXPECT_EQ(g.model.arch, Arch::gpt2);
  EXPECT_EQ(g.model.d_model, 768);
  EXPECT_EQ(g.model.d_ff, 3072);
  EXPECT_EQ(g.model.seq_len, 1024);
  EXPECT_EQ(g.model.vocab_size, 50257);
  std::ofstream(hf + "config.json") << R"({"model_type": "llama", "hidden_size": 2048, "num_attention_heads": 32,
      "num_key_value_heads": 4, "num_hidden_layers": 22, "intermediate_size": 5632, "vocab_size": 32000,
      "max_position_embeddings": 2048, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": null,
      "tie_word_embeddings": false})";
  Config l = model_config_find(hf);
  EXPECT_EQ(l.model.arch, Arch::llama);
  EXPECT_EQ(l.kv_heads(), 4);
  EXPECT_EQ(l.model.d_ff, 5632);
  EXPECT_FALSE(l.model.tie_embeddings);
  std::ofstream(hf + "config.json") << R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
      "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 300, "max_position_embeddings": 64,
      "rope_scaling": {"type": "llama3", "factor": 8.0}})";
  EXPECT_NE(test::error_of([&] { model_config_find(hf); }).find("rope_scaling"), std::string::npos);
  // Neither: say to pass --config.
  safetensors_write(dir + "bare.safetensors", {{"a", {1}, &x}});
  EXPECT_NE(test::error_of([&] { model_config_find(dir + "bare.safetensors"); }).find("pass --config"),
            std::string::npos);
}
