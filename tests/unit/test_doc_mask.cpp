// data.doc_mask: two documents packed into one sequence, with the mask, compute what each
// document computes alone as a sequence of its own: the same losses and, summed, the same
// gradients (gpt2's learned positions and llama's RoPE both restart with each document).
// Without the mask the packed sequence differs (the test can fail).
#include <algorithm>
#include <cmath>
#include <map>

#include "data/batches.h"
#include "model/decoder_part.h"
#include "runtime/exact_sum.h"
#include "testing.h"
#include "train/trainer.h"

using namespace loom;

namespace {
constexpr int32_t kDoc = 22;  // the token that opens a document

Config doc_cfg(const std::string& arch, int T, const std::string& recompute = "none") {
  Config c = config_defaults();
  c.model.arch = choice_parse<Arch>(arch).value();
  c.model.n_layer = 2;
  c.model.d_model = 16;
  c.model.n_head = 4;
  c.model.n_kv_head = arch == "llama" ? 2 : 0;
  c.model.vocab_size = 23;
  c.model.seq_len = T;
  c.train.micro_batch = 1;
  c.train.global_batch = 1;
  c.train.threads = 1;
  c.train.recompute = choice_parse<Recompute>(recompute).value();
  c.data.val_every = 0;
  c.log.dir = "";
  config_validate(c);
  return c;
}

struct Run {
  Allocator alloc;
  std::unique_ptr<Backend> be;
  std::unique_ptr<ProcessGroup> tp = local_group("tp", 0);
  Trace trace;
  std::unique_ptr<DecoderPart> chunk;
  explicit Run(const Config& cfg) : be(cpu_backend(model_dims(cfg), DType::f32, alloc)) {
    chunk = std::make_unique<DecoderPart>(model_dims(cfg), PartSpec{}, *be, *tp, trace);
  }
  float* params() { return chunk->params().as<float>(); }
  // The loss summed over the tokens, and the gradients by tensor name.
  double loss_and_grads(const std::vector<int32_t>& tok, const std::vector<int32_t>& tgt, bool mask,
                        std::map<std::string, std::vector<float>>& grads) {
    DecoderPart& c = *chunk;
    std::vector<int32_t> pos(tok.size());
    doc_positions(tok.data(), int(tok.size()), 1, kDoc, pos.data());
    Inputs in{tok.data(), tgt.data()};
    if (mask) in.pos = pos.data();
    c.zero_grad();
    c.forward(in, 1.0f, c.flat());
    c.backward(in, c.flat());
    const double v = ExactSum::value_of(c.loss_sum().data<double>());
    std::fill_n(c.loss_sum().data<double>(), kExactDigits, 0.0);
    for (auto& s : c.registry().all()) grads[s.name].assign(c.grads() + s.offset, c.grads() + s.offset + s.numel());
    return v;
  }
};

// Copies each tensor's leading elements by name (the position table is longer in the longer model).
void params_copy(Run& to, Run& from) {
  for (auto& s : to.chunk->registry().all()) {
    const ParamSpec& f = from.chunk->registry().at(s.name);
    std::copy_n(from.params() + f.offset, std::min(s.numel(), f.numel()), to.params() + s.offset);
  }
}

void packed_equals_apart(const std::string& arch, const std::string& recompute) {
  threads_set(1);
  // Document A (3 tokens) then B (5), each opened by kDoc; targets are the next tokens.
  const std::vector<int32_t> a = {kDoc, 4, 9}, b = {kDoc, 7, 1, 15, 3};
  const std::vector<int32_t> ta = {4, 9, 2}, tb = {7, 1, 15, 3, 11};
  std::vector<int32_t> packed = a, tpacked = ta;
  packed.insert(packed.end(), b.begin(), b.end());
  tpacked.insert(tpacked.end(), tb.begin(), tb.end());

  Run whole(doc_cfg(arch, 8, recompute)), ra(doc_cfg(arch, 3, recompute)), rb(doc_cfg(arch, 5, recompute));
  registry_init(whole.chunk->registry(), whole.params(), 11);
  params_copy(ra, whole);
  params_copy(rb, whole);
  std::map<std::string, std::vector<float>> gw, ga, gb, gplain;
  const double lw = whole.loss_and_grads(packed, tpacked, true, gw);
  const double la = ra.loss_and_grads(a, ta, false, ga);
  const double lb = rb.loss_and_grads(b, tb, false, gb);
  EXPECT_NEAR(lw, la + lb, 1e-5 * std::abs(lw)) << arch;
  for (auto& [name, g] : gw) {
    for (size_t i = 0; i < g.size(); ++i) {
      const float x = (i < ga[name].size() ? ga[name][i] : 0.0f) + (i < gb[name].size() ? gb[name][i] : 0.0f);
      ASSERT_NEAR(g[i], x, 1e-5f + 1e-4f * std::abs(x)) << arch << " " << name << "[" << i << "]";
    }
  }
  // Without the mask, B's tokens see A's: the loss is another.
  const double plain = whole.loss_and_grads(packed, tpacked, false, gplain);
  EXPECT_GT(std::abs(plain - lw), 1e-4 * std::abs(lw)) << arch;  // 20x the tolerance above
}
// The masked model's gradient of every tensor against finite differences of its masked loss
// (directional, in float32 as test_model.cpp's check): three documents, one a single token,
// the first cut off at the sequence's start.
void gradient_matches_finite_differences(const std::string& arch) {
  threads_set(1);
  const std::vector<int32_t> tok = {5, 8, kDoc, 4, 9, 1, kDoc, kDoc, 7, 1, 15, 3};
  std::vector<int32_t> tgt(tok.size());
  for (size_t i = 0; i < tok.size(); ++i) tgt[i] = int32_t((i * 5 + 2) % 22);
  Run r(doc_cfg(arch, int(tok.size())));
  registry_init(r.chunk->registry(), r.params(), 13);
  std::map<std::string, std::vector<float>> grads, unused;
  r.loss_and_grads(tok, tgt, true, grads);
  for (auto& s : r.chunk->registry().all()) {
    double rms = 0;
    for (int64_t i = 0; i < s.numel(); ++i) rms += double(r.params()[s.offset + i]) * r.params()[s.offset + i];
    rms = std::sqrt(rms / double(s.numel()));
    auto dir = test::randn(size_t(s.numel()), std::hash<std::string>{}(s.name), float(std::max(rms, 0.05)));
    for (int64_t i = s.global_numel(); i < s.numel(); ++i) dir[size_t(i)] = 0.0f;  // padded rows
    double analytic = 0;
    for (int64_t i = 0; i < s.numel(); ++i) analytic += double(grads[s.name][size_t(i)]) * dir[size_t(i)];
    const float h = 2e-2f;
    std::vector<float> keep(r.params() + s.offset, r.params() + s.offset + s.numel());
    auto loss_at = [&](float sign) {
      for (int64_t i = 0; i < s.numel(); ++i) r.params()[s.offset + i] = keep[size_t(i)] + sign * h * dir[size_t(i)];
      return r.loss_and_grads(tok, tgt, true, unused);
    };
    const double numeric = (loss_at(1) - loss_at(-1)) / (2 * h);
    std::copy(keep.begin(), keep.end(), r.params() + s.offset);
    EXPECT_NEAR(analytic, numeric, 2e-2 * std::abs(numeric) + 2e-4) << arch << " " << s.name;
  }
}
}  // namespace

TEST(DocMask, GradientMatchesFiniteDifferences) {
  gradient_matches_finite_differences("gpt2");
  gradient_matches_finite_differences("llama");
}

TEST(DocMask, PackedDocumentsComputeWhatEachDoesAloneGpt2) {
  packed_equals_apart("gpt2", "none");
}
TEST(DocMask, PackedDocumentsComputeWhatEachDoesAloneLlama) {
  packed_equals_apart("llama", "none");
}
TEST(DocMask, RecomputeKeepsTheMask) {
  packed_equals_apart("llama", "selective");
  packed_equals_apart("gpt2", "full");
}

TEST(DocMask, PositionsRestartAtTheDocumentToken) {
  const std::vector<int32_t> tok = {5, 6, kDoc, 1, kDoc, kDoc, 3, 4, kDoc, 9};
  std::vector<int32_t> pos(tok.size());
  doc_positions(tok.data(), 5, 2, kDoc, pos.data());  // two sequences of 5
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 0, 1, 0, 0, 1, 2, 0, 1}));
}

TEST(DocMask, WhatCannotRunIsRefusedWithTheReason) {
  auto refused = [](const std::string& sets) {
    Config c = config_defaults();
    config_load_string(c, sets, "t");
    return test::error_of([&] { config_validate(c); });
  };
  EXPECT_NE(refused("[data]\ndoc_mask = true\n").find("needs the token that opens each document"), std::string::npos);
  EXPECT_EQ(refused("[data]\ndoc_mask = true\ndoc_token = 3\n[train]\ndevice = \"cuda-emulated\"\n"), "")
      << "the CUDA kernels take the positions";
  EXPECT_NE(refused("[data]\ndoc_mask = true\ndoc_token = 512\n").find("is not a token of the vocabulary"),
            std::string::npos);
}
