// data.doc_mask: two documents packed into one sequence, with the mask, compute what each
// document computes alone as a sequence of its own: the same losses and, summed, the same
// gradients (gpt2's learned positions and llama's RoPE both restart with each document).
// Without the mask the packed sequence differs (the test can fail).
#include <cmath>
#include <map>

#include "launch/trainer.h"
#include "model/chunk.h"
#include "runtime/data.h"
#include "testing.h"

using namespace loom;

namespace {
constexpr int32_t kDoc = 22;  // the token that opens a document

Config doc_cfg(const std::string& arch, int T, const std::string& recompute = "none") {
  Config c = config_defaults();
  c.model.arch = arch;
  c.model.n_layer = 2;
  c.model.d_model = 16;
  c.model.n_head = 4;
  c.model.n_kv_head = arch == "llama" ? 2 : 0;
  c.model.vocab_size = 23;
  c.model.seq_len = T;
  c.train.micro_batch = 1;
  c.train.global_batch = 1;
  c.train.threads = 1;
  c.train.recompute = recompute;
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
  std::unique_ptr<Chunk> chunk;
  explicit Run(const Config& cfg) : be(cpu_backend(cfg, DType::f32, alloc)) {
    chunk = std::make_unique<Chunk>(cfg, ChunkSpec{}, *be, *tp, trace);
  }
  float* params() { return chunk->params().as<float>(); }
  // The loss summed over the tokens, and the gradients by tensor name.
  double loss_and_grads(const std::vector<int32_t>& tok, const std::vector<int32_t>& tgt, bool mask,
                        std::map<std::string, std::vector<float>>& grads) {
    Chunk& c = *chunk;
    std::vector<int32_t> pos(tok.size());
    doc_positions(tok.data(), int(tok.size()), 1, kDoc, pos.data());
    Inputs in{tok.data(), tgt.data()};
    if (mask) in.pos = pos.data();
    c.zero_grad();
    c.forward(in, 1.0f, c.flat());
    c.backward(in, c.flat());
    double v = *c.loss_sum().data<double>();
    *c.loss_sum().data<double>() = 0.0;
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
}  // namespace

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
