// The whole model: a finite-difference check of every parameter tensor's gradient, recompute
// policies that change memory but not a single bit of the result, bitwise reproducibility,
// and a model split into chunks that computes what the whole one does, to the bit.
#include <cstring>

#include "kernels/moe_row.h"
#include "model/decoder_part.h"
#include "model/flops.h"
#include "runtime/exact_sum.h"
#include "testing.h"
#include "train/trainer.h"

using namespace loom;

namespace {
// gpt2, llama, or llama with MoE blocks 1 and 3 of 4 (mixtral; mixtral_cap: capacity 1.0, so
// that some assignments are dropped).
Config tiny(const std::string& arch) {
  Config c = config_defaults();
  const bool moe = arch.rfind("mixtral", 0) == 0;
  c.model.arch = moe || arch == "llama" ? Arch::llama : Arch::gpt2;
  c.model.n_layer = moe ? 4 : 2;
  if (moe) {
    c.model.moe.num_experts = 4;
    c.model.moe.every = 2;
    if (arch == "mixtral_cap") c.model.moe.capacity_factor = 1.0;
  }
  c.model.d_model = 16;
  c.model.n_head = 4;
  c.model.n_kv_head = arch != "gpt2" ? 2 : 0;
  c.model.vocab_size = 23;
  c.model.seq_len = 8;
  c.train.micro_batch = 2;
  c.train.global_batch = 4;
  c.train.steps = 4;
  c.train.warmup_steps = 1;
  c.train.threads = 1;
  c.data.val_every = 0;
  c.data.val_batches = 1;
  c.log.dir = "";
  config_validate(c);
  return c;
}
}  // namespace

class ModelTest : public ::testing::TestWithParam<const char*> {};

// A model (or a chunk of one) on the fp32 CPU backend, one rank.
struct Built {
  Allocator alloc;
  std::unique_ptr<Backend> be;
  std::unique_ptr<ProcessGroup> tp = local_group("tp", 0);
  Trace trace;
  std::unique_ptr<DecoderPart> chunk;
  Built(const Config& cfg, PartSpec spec = {}, DType dtype = DType::f32)
      : be(cpu_backend(model_dims(cfg), dtype, alloc)),
        chunk(std::make_unique<DecoderPart>(model_dims(cfg), spec, *be, *tp, trace)) {}
  float* params() { return chunk->params().as<float>(); }
  double loss_take() {
    const double v = ExactSum::value_of(chunk->loss_sum().data<double>());
    be->zero(Buf(chunk->loss_sum()));
    return v;
  }
};

TEST_P(ModelTest, GradientMatchesFiniteDifferences) {
  Config cfg = tiny(GetParam());
  // The loss differenced here is the cross-entropy alone (the load-balancing term's gradient
  // is checked against PyTorch in test_parity.cpp).
  cfg.model.moe.aux_loss_coef = 0;
  threads_set(1);
  const int B = 2, T = cfg.model.seq_len, N = B * T;
  Built m(cfg);
  DecoderPart& c = *m.chunk;
  registry_init(c.registry(), m.params(), 7);
  // Norm gains and biases off their defaults, so their gradients are not degenerate.
  auto noise = test::randn(c.num_params(), 8, 0.05f);
  for (auto& s : c.registry().all())
    if (s.shape.size() == 1)
      for (int64_t i = 0; i < s.numel(); ++i) m.params()[s.offset + i] += noise[s.offset + i] * 4;
  // Routers with decided preferences: no token near a tie that a step would flip.
  for (auto& s : c.registry().all())
    if (s.name.find("gate.weight") != std::string::npos)
      for (int64_t i = 0; i < s.numel(); ++i) m.params()[s.offset + i] *= 20;
  std::vector<int32_t> tok(N), tgt(N);
  for (int i = 0; i < N; ++i) tok[i] = (i * 7 + 3) % 23, tgt[i] = (i * 5 + 1) % 23;
  const Inputs in{tok.data(), tgt.data()};
  c.zero_grad();
  c.forward(in, 1.0f / N, c.flat());
  c.backward(in, c.flat());
  m.loss_take();
  std::vector<float> grad(c.grads(), c.grads() + c.num_params());
  auto loss = [&] {
    c.forward(in, 0.0f, c.flat());
    return m.loss_take() / N;
  };

  // Directional derivative along a random direction per tensor: robust in float32.
  for (auto& s : c.registry().all()) {
    // Under a capacity, a step of the router moves tokens between experts whose capacity is
    // full, so which are dropped changes: the loss steps there (the router's gradient is
    // checked without a capacity, mixtral).
    if (cfg.model.moe.capacity_factor > 0 && s.name.find("gate.weight") != std::string::npos) continue;
    // Step relative to the tensor's own scale: tiny embeddings under RMSNorm are far from
    // linear over a step that is large next to them.
    double rms = 0;
    for (int64_t i = 0; i < s.numel(); ++i) rms += double(m.params()[s.offset + i]) * m.params()[s.offset + i];
    rms = std::sqrt(rms / double(s.numel()));
    auto dir = test::randn(size_t(s.numel()), std::hash<std::string>{}(s.name), float(std::max(rms, 0.05)));
    // Padded vocabulary rows are never read: they have no gradient to check.
    for (int64_t i = s.global_numel(); i < s.numel(); ++i) dir[size_t(i)] = 0.0f;
    double analytic = 0;
    for (int64_t i = 0; i < s.numel(); ++i) analytic += double(grad[s.offset + i]) * dir[i];
    const float h = 2e-2f;
    std::vector<float> keep(m.params() + s.offset, m.params() + s.offset + s.numel());
    for (int64_t i = 0; i < s.numel(); ++i) m.params()[s.offset + i] = keep[i] + h * dir[i];
    double up = loss();
    for (int64_t i = 0; i < s.numel(); ++i) m.params()[s.offset + i] = keep[i] - h * dir[i];
    double down = loss();
    std::copy(keep.begin(), keep.end(), m.params() + s.offset);
    double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(analytic, numeric, 2e-2 * std::abs(numeric) + 2e-4) << s.name;
  }
  // The padded rows got no gradient.
  for (auto& s : c.registry().all())
    for (int64_t i = s.global_numel(); i < s.numel(); ++i) ASSERT_EQ(grad[s.offset + size_t(i)], 0.0f) << s.name;
}

// Two chunks (the embedding with block 0; block 1 with the head), the first's output handed
// to the second and the second's input gradient back, against the whole model as one chunk:
// the same loss and the same gradient of every tensor, to the bit.
TEST_P(ModelTest, ChunksComposeToTheWholeModel) {
  Config cfg = tiny(GetParam());
  cfg.model.tie_embeddings = false;  // a head without the embedding holds its own lm_head
  threads_set(1);
  const int N = cfg.train.micro_batch * cfg.model.seq_len;
  Built whole(cfg), first(cfg, {{{0, 2}}}), second(cfg, {{{2, -1}}});
  registry_init(whole.chunk->registry(), whole.params(), 3);
  registry_init(first.chunk->registry(), first.params(), 3);
  registry_init(second.chunk->registry(), second.params(), 3);
  std::vector<int32_t> tok(N), tgt(N);
  for (int i = 0; i < N; ++i) tok[i] = (i * 11 + 2) % 23, tgt[i] = (i * 3 + 5) % 23;
  const Inputs in{tok.data(), tgt.data()};
  const int64_t rows = int64_t(N) * cfg.model.d_model;
  for (Built* b : {&whole, &first, &second}) b->chunk->zero_grad();
  whole.chunk->forward(in, 1.0f / N, whole.chunk->flat());
  whole.chunk->backward(in, whole.chunk->flat());
  first.chunk->forward(in, 1.0f / N, first.chunk->flat());
  std::memcpy(second.chunk->input().p, first.chunk->output().p, size_t(rows) * 4);
  second.chunk->forward(in, 1.0f / N, second.chunk->flat());
  second.chunk->backward(in, second.chunk->flat());
  std::memcpy(first.chunk->grad_output().p, second.chunk->grad_input().p, size_t(rows) * 4);
  first.chunk->backward(in, first.chunk->flat());
  EXPECT_EQ(whole.loss_take(), second.loss_take());
  for (auto& s : whole.chunk->registry().all()) {
    Built& part = first.chunk->registry().find(s.name) ? first : second;
    const ParamSpec& p = part.chunk->registry().at(s.name);
    EXPECT_EQ(0, std::memcmp(whole.chunk->grads() + s.offset, part.chunk->grads() + p.offset, size_t(s.numel()) * 4))
        << s.name;
  }
}

TEST_P(ModelTest, RecomputeIsBitwiseIdenticalAndSavesMemory) {
  TrainResult r[3];
  const Recompute policies[] = {Recompute::none, Recompute::selective, Recompute::full};
  for (int i = 0; i < 3; ++i) {
    Config cfg = tiny(GetParam());
    cfg.train.recompute = policies[i];
    r[i] = train_run(cfg, {.quiet = true, .keep_params = true});
  }
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(r[i].losses, r[0].losses) << policies[i];
    ASSERT_EQ(r[i].params.size(), r[0].params.size());
    EXPECT_EQ(0, std::memcmp(r[i].params.data(), r[0].params.data(), r[0].params.size() * 4)) << policies[i];
  }
  EXPECT_LT(r[1].activation_bytes(), r[0].activation_bytes());
  EXPECT_LT(r[2].activation_bytes(), r[1].activation_bytes());
}

TEST_P(ModelTest, SameSeedIsBitwiseReproducible) {
  Config cfg = tiny(GetParam());
  cfg.train.threads = 2;
  auto a = train_run(cfg, {.quiet = true, .keep_params = true});
  auto b = train_run(cfg, {.quiet = true, .keep_params = true});
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(0, std::memcmp(a.params.data(), b.params.data(), a.params.size() * 4));
  cfg.train.seed += 1;
  auto c = train_run(cfg, {.quiet = true, .keep_params = true});
  EXPECT_NE(a.losses, c.losses);  // the seed does reach the weights
  ASSERT_FALSE(a.val.empty());
}

// bf16 on the CPU (bf16 storage, fp32 arithmetic, fp32 main gradients and master weights)
// against fp32, same model and data: the loss curves agree within 1e-2 relative at every step,
// yet differ (the run really is bf16), with half the parameter and activation bytes.
TEST_P(ModelTest, Bf16TracksFp32WithHalfTheMemory) {
  Config cfg = tiny(GetParam());
  cfg.train.steps = 20;
  auto f32 = train_run(cfg, {.quiet = true});
  cfg.train.dtype = DTypeChoice::bf16;
  auto bf = train_run(cfg, {.quiet = true});
  ASSERT_EQ(bf.losses.size(), f32.losses.size());
  double worst = 0;
  for (size_t s = 0; s < f32.losses.size(); ++s)
    worst = std::max(worst, std::abs(bf.losses[s] - f32.losses[s]) / f32.losses[s]);
  EXPECT_LT(worst, 1e-2);
  EXPECT_GT(worst, 0.0);
  EXPECT_LT(bf.mem.of(Mem::params), f32.mem.of(Mem::params) * 6 / 10);
  EXPECT_LT(bf.activation_bytes(), f32.activation_bytes() * 6 / 10);
  EXPECT_GT(bf.mem.of(Mem::master), 0);  // the fp32 master weights
  EXPECT_EQ(f32.mem.of(Mem::master), 0);
}

INSTANTIATE_TEST_SUITE_P(Arch, ModelTest, ::testing::Values("gpt2", "llama", "mixtral", "mixtral_cap"));

TEST(ActPlan, FullRecomputeKeepsOnlyBlockInputs) {
  Config cfg = tiny("gpt2");
  cfg.model.n_layer = 12;
  const int B = 2;
  auto none = act_plan(model_dims(cfg), B, Recompute::none), full = act_plan(model_dims(cfg), B, Recompute::full);
  const int64_t NC = int64_t(B) * cfg.model.seq_len * cfg.model.d_model;
  // Full keeps L+1 residuals; everything per layer becomes one shared copy.
  EXPECT_EQ(full.buffers[0].copies, 13);
  EXPECT_EQ(full.buffers[0].numel, NC);
  for (size_t i = 1; i < full.buffers.size(); ++i)  // (the MoE buffers of a dense model are empty)
    if (full.buffers[i].numel > 0) {
      EXPECT_EQ(full.buffers[i].copies, 1) << full.buffers[i].name;
    }
  EXPECT_GT(none.activation_bytes(), 5 * full.activation_bytes());
}

TEST(ActPlan, TensorParallelQuartersTheLogitsAndSequenceParallelTheNormRegions) {
  Config cfg = tiny("gpt2");
  auto logits = [](const ActPlan& p) {
    for (auto& b : p.buffers)
      if (std::string(b.name) == "logits") return b.bytes();
    return int64_t(-1);
  };
  const int64_t one = logits(act_plan(model_dims(cfg), 2, Recompute::none));
  cfg.parallel.tp = 4;
  cfg.model.vocab_size = 256;  // padded to 256 at tp 1 and at tp 4 alike
  cfg.model.n_head = 4;
  Config full = cfg;
  full.parallel.tp = 1;
  EXPECT_EQ(logits(act_plan(model_dims(cfg), 2, Recompute::none)) * 4,
            logits(act_plan(model_dims(full), 2, Recompute::none)));
  EXPECT_GT(one, 0);
  cfg.parallel.sp = true;
  auto on = act_plan(model_dims(cfg), 2, Recompute::none);
  cfg.parallel.sp = false;
  auto off = act_plan(model_dims(cfg), 2, Recompute::none);
  for (size_t i = 0; i < on.buffers.size(); ++i) {
    std::string n = on.buffers[i].name;
    bool norm_region = n == "residual" || n.rfind("ln", 0) == 0 || n == "res2";
    if (n == "lnf_full")
      EXPECT_GT(on.buffers[i].numel, 0);
    else if (norm_region)
      EXPECT_EQ(on.buffers[i].numel * 4, off.buffers[i].numel) << n;
    else
      EXPECT_EQ(on.buffers[i].numel, off.buffers[i].numel) << n;
  }
}

// MFU's numerator (docs/metrics-and-reports.md) for GPT-2 124M, and what each recompute policy adds to HFU's on
// each path. The 124M count is the published one less the position table and the tied lm_head.
TEST(Flops, ModelFlopsAndRecomputeOnEachPath) {
  Config cfg = config_defaults();
  cfg.model.n_layer = 12, cfg.model.d_model = 768, cfg.model.n_head = 12, cfg.model.vocab_size = 50257;
  cfg.model.seq_len = 1024, cfg.model.d_ff = 3072;
  EXPECT_EQ(param_count(model_dims(cfg)), 124439808);
  const double n = 124439808.0 - 1024.0 * 768, attn = 12.0 * 12 * 768 * 1024, wte = 50257.0 * 768;
  const double down = 12.0 * 3072 * 768;
  FlopsPerToken f = flops_per_token(model_dims(cfg));
  EXPECT_EQ(f.model, 6 * n + attn);
  EXPECT_EQ(f.hardware, f.model);
  cfg.train.recompute = Recompute::selective;
  EXPECT_EQ(flops_per_token(model_dims(cfg), true).hardware, f.model + attn / 3);  // the CPU reruns attention's scores
  EXPECT_EQ(flops_per_token(model_dims(cfg), false).hardware, f.model);  // flash attention has no scores to redo
  cfg.train.recompute = Recompute::full;  // every block up to its down projection, on either backend
  EXPECT_EQ(flops_per_token(model_dims(cfg), true).hardware, f.model + 2 * (n - wte - down) + attn / 3);
  EXPECT_EQ(flops_per_token(model_dims(cfg), false).hardware, f.model + 2 * (n - wte - down) + attn / 3);
}

// Capacity: a router of zeros gives every token the same probabilities, so every token picks
// experts 0 and 1 (ties go to the lower id, kernels/ops.h). Each of them receives all N of its
// assignments and keeps `cap` = ceil(cf * N * k / E); the rest are dropped, counted here from
// that rule alone: the metric must say exactly k * (N - cap) of N * k, and the load 2 (N of a
// mean N k / E = N / 2 assignments).
TEST(Moe, CapacityDropsWhatAFullExpertCannotTake) {
  for (double cf : {1.0, 1.5, 2.0, 3.0}) {  // 3: a capacity past the N rows a slot holds
    Config cfg = tiny("mixtral");
    cfg.model.moe.capacity_factor = cf;
    config_validate(cfg);
    threads_set(1);
    Built m(cfg);
    DecoderPart& c = *m.chunk;
    registry_init(c.registry(), m.params(), 7);
    for (auto& s : c.registry().all())
      if (s.name.find("gate.weight") != std::string::npos) std::fill_n(m.params() + s.offset, s.numel(), 0.0f);
    const int N = cfg.train.micro_batch * cfg.model.seq_len, k = 2, E = 4;
    std::vector<int32_t> tok(size_t(N), 5), tgt(size_t(N), 6);
    c.zero_grad();
    c.forward({tok.data(), tgt.data()}, 1.0f / N, c.flat());
    c.backward({tok.data(), tgt.data()}, c.flat());
    const int64_t cap = int64_t(std::ceil(cf * N * k / E));
    const double dropped = double(k * (N - std::min<int64_t>(N, cap))) / (N * k);
    const std::vector<double> st = c.moe_stats_take();
    const int S = moe_row::kStats;
    ASSERT_EQ(st.size(), size_t(2 * S));  // two MoE layers
    for (int l = 0; l < 2; ++l) {
      const double* v = st.data() + S * l;
      for (int i = 0; i < S; ++i)  // what keeps their sums over ranks exact in any order
        EXPECT_EQ(v[i], std::rint(v[i])) << "statistic " << i << " of layer " << l << " holds an integer";
      EXPECT_EQ(v[4], 1.0) << "one micro-batch";
      EXPECT_EQ(v[3], double(N * k)) << "assignments";
      EXPECT_DOUBLE_EQ(v[2] / v[3], dropped) << "cf " << cf << " layer " << l;
      EXPECT_DOUBLE_EQ(v[1] / v[3], 2.0) << "load";
      EXPECT_NEAR(v[0] / moe_row::kAuxUnit, 1.0 * E * 0.5 * 0.25 * 2, 1e-6) << "aux: E sum f P, f = 1/2 on two experts";
    }
  }
}

// The dims the model takes are the config's: each field against the Config helper it replaces,
// on a config whose every such field differs from the default (a swapped or stale field shows).
TEST(ModelDims, EachFieldIsTheConfigs) {
  Config c = tiny("mixtral");
  c.model.d_model = 64;
  c.model.n_head = 8;
  c.model.n_kv_head = 4;
  c.model.seq_len = 32;
  c.model.vocab_size = 100;
  c.model.norm_eps = 1e-6;
  c.model.rope_theta = 5e5;
  c.parallel.tp = 2;
  c.parallel.sp = true;
  c.parallel.cp = 2;
  c.parallel.dp = 2;
  c.train.micro_batch = 1;
  c.train.global_batch = 8;
  c.train.recompute = Recompute::selective;
  c.data.doc_mask = true;
  c.data.doc_token = 0;
  config_validate(c);
  const ModelDims d = model_dims(c);
  EXPECT_TRUE(d.llama());
  EXPECT_EQ(d.B, 1);
  EXPECT_EQ(d.T, 32);
  EXPECT_EQ(d.T_local(), c.local_seq());
  EXPECT_EQ(d.C, 64);
  EXPECT_EQ(d.H, 8);
  EXPECT_EQ(d.KV, 4);
  EXPECT_EQ(d.D, c.head_dim());
  EXPECT_EQ(d.F, c.model.d_ff);
  EXPECT_EQ(d.L, 4);
  EXPECT_EQ(d.vocab, 100);
  EXPECT_EQ(d.V_padded(), c.vocab_padded());
  EXPECT_EQ(d.V_padded(), 128);
  EXPECT_EQ(d.norm_eps, 1e-6);
  EXPECT_EQ(d.rope_theta, 5e5);
  EXPECT_EQ(d.tied, c.model.tie_embeddings);
  EXPECT_EQ(d.moe_layers(), c.moe_layers());
  for (int l = 0; l < d.L; ++l) EXPECT_EQ(d.moe_block(l), c.moe_block(l)) << l;
  EXPECT_EQ(d.tp, 2);
  EXPECT_TRUE(d.sp);
  EXPECT_EQ(d.cp, 2);
  EXPECT_EQ(d.dp, 2);
  EXPECT_EQ(d.accum, c.accum_steps());
  EXPECT_EQ(d.accum, 4);
  EXPECT_TRUE(d.doc_mask);
  EXPECT_EQ(d.recompute, Recompute::selective);
  EXPECT_EQ(d.split_backward, c.pp_split_backward());
}
