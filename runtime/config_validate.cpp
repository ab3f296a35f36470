// Config checks: every relation between keys that must hold before anything runs, each a
// one-line error that names the keys and the fix. The parsers of the keys whose values have a
// form of their own (parallel.pp_layers, the fault.* drills) are in config_parse.cpp.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "runtime/config.h"
#include "runtime/config_paths.h"
#include "runtime/error.h"

namespace loom {

namespace {
void check_positive(const std::string& key, int64_t v) {
  LOOM_CHECK(v > 0, "{} = {} must be positive", key, v);
}

// The shapes: heads that divide the width, gpt2 and llama each with its own rules, MoE keys.
void model_validate(Config& cfg) {
  auto& m = cfg.model;
  if (!cfg.set_keys.count("model.tie_embeddings")) m.tie_embeddings = m.arch == Arch::gpt2;
  check_positive("model.n_layer", m.n_layer);
  check_positive("model.d_model", m.d_model);
  check_positive("model.n_head", m.n_head);
  check_positive("model.vocab_size", m.vocab_size);
  check_positive("model.seq_len", m.seq_len);
  LOOM_CHECK(m.n_kv_head >= 0, "model.n_kv_head = {} must be >= 0 (0 means n_head)", m.n_kv_head);
  if (m.d_model % m.n_head != 0) {
    int near = 1;  // the divisor of d_model closest to what was asked
    for (int h = 1; h <= m.d_model; ++h)
      if (m.d_model % h == 0 && std::abs(h - m.n_head) <= std::abs(near - m.n_head)) near = h;
    fail("model.n_head = {} does not divide model.d_model = {}; use a divisor of d_model such as {}", m.n_head,
         m.d_model, near);
  }
  int kv = cfg.kv_heads();
  LOOM_CHECK(m.n_head % kv == 0,
             "model.n_head = {} is not a multiple of model.n_kv_head = {}; grouped-query "
             "attention needs n_head = k * n_kv_head",
             m.n_head, kv);
  if (m.arch == Arch::gpt2) {
    LOOM_CHECK(kv == m.n_head,
               "model.n_kv_head = {}: gpt2 has no grouped-query attention; "
               "use model.arch = \"llama\" or n_kv_head = n_head",
               m.n_kv_head);
    if (!m.d_ff) m.d_ff = 4 * m.d_model;
    LOOM_CHECK(m.d_ff == 4 * m.d_model, "model.d_ff = {}: gpt2 uses 4 * d_model = {}", m.d_ff, 4 * m.d_model);
  } else {
    LOOM_CHECK(cfg.head_dim() % 2 == 0, "llama needs an even head dim for RoPE; d_model / n_head = {}", cfg.head_dim());
    if (!m.d_ff) m.d_ff = (8 * m.d_model / 3 + 63) / 64 * 64;
  }
  check_positive("model.d_ff", m.d_ff);
  LOOM_CHECK(m.norm_eps > 0, "model.norm_eps = {} must be positive", m.norm_eps);
  LOOM_CHECK(m.rope_theta > 1, "model.rope_theta = {} must be above 1 (RoPE's base)", m.rope_theta);
  const MoeConfig& moe = m.moe;
  LOOM_CHECK(moe.num_experts >= 0, "model.moe.num_experts = {} must be >= 0 (0: dense)", moe.num_experts);
  if (moe.num_experts > 0) {
    LOOM_CHECK(m.arch == Arch::llama,
               "model.moe.num_experts = {} with model.arch = \"{}\": MoE layers are llama (Mixtral) blocks; set "
               "model.arch = \"llama\" or num_experts = 0",
               moe.num_experts, m.arch);
    LOOM_CHECK(moe.top_k >= 1 && moe.top_k <= moe.num_experts,
               "model.moe.top_k = {} must be between 1 and model.moe.num_experts = {}", moe.top_k, moe.num_experts);
    LOOM_CHECK(moe.every >= 1 && moe.every <= m.n_layer,
               "model.moe.every = {} must be between 1 and model.n_layer = {} (every k-th block is MoE)", moe.every,
               m.n_layer);
    LOOM_CHECK(moe.aux_loss_coef >= 0, "model.moe.aux_loss_coef = {} must be >= 0", moe.aux_loss_coef);
  } else {
    const MoeConfig plain;
    for (auto [key, differs] : {std::pair{"model.moe.top_k", moe.top_k != plain.top_k},
                                {"model.moe.capacity_factor", moe.capacity_factor != plain.capacity_factor},
                                {"model.moe.aux_loss_coef", moe.aux_loss_coef != plain.aux_loss_coef},
                                {"model.moe.every", moe.every != plain.every}})
      LOOM_CHECK(!differs,
                 "{} is set but model.moe.num_experts = 0, so it would do nothing; set num_experts or remove it", key);
  }
}

// The batch, the schedule, the optimizer, threads and the device.
void train_validate(Config& cfg) {
  auto& t = cfg.train;
  check_positive("train.micro_batch", t.micro_batch);
  check_positive("train.global_batch", t.global_batch);
  LOOM_CHECK(t.steps >= 0, "train.steps = {} must be >= 0", t.steps);
  check_positive("parallel.dp", cfg.parallel.dp);  // before it divides
  int per_step = t.micro_batch * cfg.parallel.dp;
  LOOM_CHECK(t.global_batch % per_step == 0,
             "train.global_batch = {} is not a multiple of micro_batch x dp = {} x {} = {}; "
             "make global_batch a multiple of {}",
             t.global_batch, t.micro_batch, cfg.parallel.dp, per_step, per_step);
  LOOM_CHECK(t.decay_frac > 0 && t.decay_frac <= 1, "train.decay_frac = {} must be in (0, 1]", t.decay_frac);
  LOOM_CHECK(t.decay_frac == TrainConfig{}.decay_frac || t.schedule == LrSchedule::wsd,
             "train.decay_frac is set but train.schedule = \"{}\"; it shapes the wsd schedule only", t.schedule);
  LOOM_CHECK(t.lr >= 0 && t.min_lr >= 0, "train.lr and train.min_lr must be >= 0");
  LOOM_CHECK(t.schedule == LrSchedule::constant || t.min_lr <= t.lr,
             "train.min_lr = {} is above train.lr = {}: the {} schedule would raise the learning rate as it decays; "
             "set train.min_lr to at most train.lr{}",
             t.min_lr, t.lr, t.schedule, cfg.set_keys.count("train.min_lr") ? "" : " (it was left at its default)");
  LOOM_CHECK(t.warmup_steps >= 0, "train.warmup_steps = {} must be >= 0", t.warmup_steps);
  LOOM_CHECK(t.beta1 >= 0 && t.beta1 < 1 && t.beta2 >= 0 && t.beta2 < 1,
             "train.beta1 and train.beta2 must be in [0, 1)");
  LOOM_CHECK(t.grad_clip >= 0, "train.grad_clip = {} must be >= 0 (0 turns clipping off)", t.grad_clip);
  LOOM_CHECK(t.threads >= 0, "train.threads = {} must be >= 0 (0 uses every core)", t.threads);
  // Far past any machine's cores: OpenMP would try to start them all and the run never would.
  LOOM_CHECK(t.threads <= kThreadsMax,
             "train.threads = {} is more threads than any node has cores; use 0 (every core) or the "
             "cores each rank should use",
             t.threads);
  LOOM_CHECK(t.weight_decay >= 0, "train.weight_decay = {} must be >= 0", t.weight_decay);
  LOOM_CHECK(t.eps > 0, "train.eps = {} must be positive (AdamW divides by sqrt(v) + eps)", t.eps);
  // auto is resolved when training starts (device_resolve): the GPU where its kernels run the model.
  // cuda-emulated runs the CUDA backend and kernels on the CPU emulation: the same rules.
  if (t.device == DeviceChoice::cuda || t.device == DeviceChoice::cuda_emulated) {
    LOOM_CHECK(LOOM_HAVE_CUDA || t.device != DeviceChoice::cuda,
               "train.device = \"cuda\": this build has no CUDA; rebuild with the CUDA toolkit, or check the CUDA "
               "path on the CPU with train.device = \"cuda-emulated\"");
    LOOM_CHECK(t.dtype != DTypeChoice::f32,
               "train.dtype = \"f32\" on train.device = \"{}\": the GPU path computes in bf16; use \"bf16\" or "
               "\"auto\"",
               t.device);
    const int hd = cfg.head_dim();
    LOOM_CHECK(hd == 32 || hd == 64 || hd == 128,
               "train.device = \"{}\": the CUDA attention kernels take head dims 32, 64 and 128, and "
               "d_model / n_head = {}; change model.n_head or use train.device = \"cpu\"",
               t.device, hd);
  }
}

// The sources, the tokenizer and its files, validation and document masks.
void data_validate(Config& cfg) {
  auto& m = cfg.model;
  auto& d = cfg.data;
  if (d.source != DataKind::synthetic)
    LOOM_CHECK(!d.path.empty() || !d.sources.empty(), "data.source = \"{}\" needs data.path (or [[data.sources]])",
               d.source);
  if (!d.sources.empty()) {
    LOOM_CHECK(d.source != DataKind::synthetic,
               "[[data.sources]] is a mixture of files; set data.source = \"tokens\" (or \"text\") for them");
    LOOM_CHECK(d.path.empty(),
               "data.path = '{}' and [[data.sources]] are both set; a run reads one or the other (put the path in a "
               "source of its own)",
               d.path);
    double sum = 0;
    for (size_t i = 0; i < d.sources.size(); ++i) {
      const DataSource& s = d.sources[i];
      LOOM_CHECK(!s.path.empty(), "data.sources entry {} has an empty path", i + 1);
      LOOM_CHECK(s.weight >= 0 && std::isfinite(s.weight),
                 "data.sources entry {} ('{}') has weight {}; weights are shares, >= 0", i + 1, s.path, s.weight);
      sum += s.weight;
    }
    LOOM_CHECK(sum > 0 && std::isfinite(sum),
               "the weights of [[data.sources]] sum to {}; give at least one source a positive weight (and keep "
               "them finite)",
               sum);
    for (size_t i = 0; i < d.sources.size(); ++i)
      for (size_t j = i + 1; j < d.sources.size(); ++j)
        LOOM_CHECK(d.sources[i].path != d.sources[j].path,
                   "data.sources entries {} and {} are both '{}'; give a source once, with the sum of the weights",
                   i + 1, j + 1, d.sources[i].path);
  }
  if (!d.tokenizer.empty()) config_one_of("data.tokenizer", d.tokenizer, {"byte", "gpt2", "llama3", "hf", "spm"});
  LOOM_CHECK(d.tokenizer != "llama3" || std::filesystem::is_regular_file(d.tokenizer_dir + "/tokenizer.model"),
             "data.tokenizer = \"llama3\" needs data.tokenizer_dir, a directory with LLaMA-3's tokenizer.model (it is "
             "'{}'; `tools/tokenizer_files.sh DIR llama3` writes it)",
             d.tokenizer_dir);
  LOOM_CHECK(d.source != DataKind::text || d.tokenizer == "byte" || d.tokenizer.empty(),
             "data.tokenizer = \"{0}\" with data.source = \"text\", which reads bytes; tokenize with `loom data "
             "--tokenizer {0}` and train on data.source = \"tokens\"",
             d.tokenizer);
  LOOM_CHECK(d.tokenizer != "gpt2" || (std::filesystem::is_regular_file(d.tokenizer_dir + "/vocab.json") &&
                                       std::filesystem::is_regular_file(d.tokenizer_dir + "/merges.txt")),
             "data.tokenizer = \"gpt2\" needs data.tokenizer_dir, a directory with vocab.json and merges.txt (it is "
             "'{}'; `tools/tokenizer_files.sh DIR` writes them)",
             d.tokenizer_dir);
  LOOM_CHECK(d.tokenizer == "gpt2" || d.tokenizer == "llama3" || d.tokenizer_dir.empty(),
             "data.tokenizer_dir is set but data.tokenizer = \"{}\"; it belongs to gpt2 and llama3", d.tokenizer);
  const bool file_kind = d.tokenizer == "hf" || d.tokenizer == "spm";
  LOOM_CHECK(!file_kind || std::filesystem::is_regular_file(d.tokenizer_file),
             "data.tokenizer = \"{}\" needs data.tokenizer_file, its {} (it is '{}')", d.tokenizer,
             d.tokenizer == "hf" ? "tokenizer.json" : "SentencePiece model", d.tokenizer_file);
  LOOM_CHECK(file_kind || d.tokenizer_file.empty(),
             "data.tokenizer_file is set but data.tokenizer = \"{}\"; it belongs to hf and spm", d.tokenizer);
  LOOM_CHECK(d.val_every >= 0 && d.val_batches >= 0, "data.val_every and data.val_batches must be >= 0");
  LOOM_CHECK(d.doc_token >= -1 && d.doc_token < m.vocab_size,
             "data.doc_token = {} is not a token of the vocabulary (0 .. model.vocab_size - 1 = {}; -1: the "
             "tokenizer's)",
             d.doc_token, m.vocab_size - 1);
  if (d.doc_mask) {
    LOOM_CHECK(cfg.doc_token() >= 0,
               "data.doc_mask needs the token that opens each document: set data.tokenizer (gpt2, llama3) or "
               "data.doc_token, or train on shards that record their tokenizer (`loom data`)");
    LOOM_CHECK(cfg.doc_token() < m.vocab_size,
               "data.doc_mask: the document token {} (data.tokenizer = \"{}\") is outside model.vocab_size = {}; "
               "set data.doc_token",
               cfg.doc_token(), d.tokenizer, m.vocab_size);
  }
}

// The layout: every degree divides what it splits, and no key that would do nothing at degree 1.
// parallel.invariant: the layouts its tree covers so far (docs/invariant.md says which and why).
void invariant_validate(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  const auto pow2 = [](int n) { return n > 0 && (n & (n - 1)) == 0; };
  const char* off = "or set parallel.invariant = false";
  LOOM_CHECK(p.ep == 1,
             "parallel.invariant with parallel.ep = {}: expert parallelism mixes ranks' tokens in one expert's GEMM, "
             "so its bits depend on the layout; set parallel.ep = 1, {}",
             p.ep, off);
  LOOM_CHECK(pow2(p.cp),
             "parallel.invariant with parallel.cp = {}: the cp ranks' parts of a sequence meet in a binary tree, so cp "
             "must be a power of two, {}",
             p.cp, off);
  LOOM_CHECK(p.grad_reduce_dtype == GradReduce::f32,
             "parallel.invariant with parallel.grad_reduce_dtype = \"bf16\": rounding each rank's partial sums "
             "changes the bits with the layout; set it to \"f32\", {}",
             off);
  LOOM_CHECK(pow2(p.dp),
             "parallel.invariant with parallel.dp = {}: the ranks' blocks of micro-batches must be subtrees of one "
             "binary tree, so dp must be a power of two, {}",
             p.dp, off);
  LOOM_CHECK(p.dp == 1 || p.zero >= 2 || pow2(cfg.accum_steps()),
             "parallel.invariant over dp = {}: each rank's block of {} micro-batches (train.global_batch / "
             "(train.micro_batch x parallel.dp)) must be a power of two to form a subtree (ZeRO-2/3 interleave them "
             "instead); change train.global_batch, {}",
             p.dp, cfg.accum_steps(), off);
}

void parallel_validate(Config& cfg) {
  auto& m = cfg.model;
  auto& t = cfg.train;
  const int kv = cfg.kv_heads();
  auto& p = cfg.parallel;
  check_positive("parallel.dp", p.dp);
  check_positive("parallel.tp", p.tp);
  check_positive("parallel.pp", p.pp);
  check_positive("parallel.ep", p.ep);
  if (p.ep > 1) {
    LOOM_CHECK(m.moe.num_experts > 0, "parallel.ep = {} needs MoE layers (model.moe.num_experts > 0); set ep = 1",
               p.ep);
    LOOM_CHECK(m.moe.num_experts % p.ep == 0,
               "parallel.ep = {} does not divide model.moe.num_experts = {}; each ep rank holds num_experts / ep "
               "experts",
               p.ep, m.moe.num_experts);
    LOOM_CHECK((p.dp * p.cp) % p.ep == 0,
               "parallel.ep = {} does not divide parallel.dp x parallel.cp = {} x {}; the ep group is carved from dp "
               "x cp, so pick ep among the divisors of {}",
               p.ep, p.dp, p.cp, p.dp * p.cp);
  }
  check_positive("parallel.cp", p.cp);
  if (p.cp > 1) {
    LOOM_CHECK(m.seq_len % (2 * p.cp) == 0,
               "parallel.cp = {} cuts each sequence into 2 x cp = {} chunks, which model.seq_len = {} does not "
               "divide; pick seq_len a multiple of {}",
               p.cp, 2 * p.cp, m.seq_len, 2 * p.cp);
    LOOM_CHECK(p.cp_overlap || p.cp_attention == CpAttentionKind::ring,
               "parallel.cp_overlap = false applies to the ring; parallel.cp_attention = \"allgather\" overlaps "
               "nothing; remove it or use the ring");
  } else {
    const ParallelConfig plain;
    for (auto [key, differs] : {std::pair{"parallel.cp_attention", p.cp_attention != plain.cp_attention},
                                {"parallel.cp_overlap", p.cp_overlap != plain.cp_overlap}})
      LOOM_CHECK(!differs, "{} is set but parallel.cp = 1, so it would do nothing; set parallel.cp or remove it", key);
  }
  LOOM_CHECK(p.zero == 3 || p.zero3_reshard == Zero3Reshard::after_forward,
             "parallel.zero3_reshard = \"after_step\" but parallel.zero = {}, so it would do nothing; set "
             "parallel.zero = 3 or remove it",
             p.zero);
  LOOM_CHECK(p.pp_virtual >= 1, "parallel.pp_virtual = {} must be >= 1", p.pp_virtual);
  if (cfg.pp_v_shape() && !cfg.set_keys.count("parallel.pp_virtual")) p.pp_virtual = 2;  // the V's two chunks
  LOOM_CHECK(p.pp_virtual == 2 || !cfg.pp_v_shape(),
             "parallel.pp_schedule = \"{}\" places two model chunks on each stage (a V); set parallel.pp_virtual = 2 "
             "or leave it unset",
             p.pp_schedule);
  LOOM_CHECK(p.pp_virtual == 1 || p.pp_schedule == PpSchedule::interleaved || cfg.pp_v_shape(),
             "parallel.pp_virtual = {} needs parallel.pp_schedule = \"interleaved\"; set it, or set pp_virtual = 1",
             p.pp_virtual);
  // Set away from their defaults without stages, they would do nothing (a printed config,
  // which names every key, still loads).
  const ParallelConfig plain;
  for (auto [key, differs] : {std::pair{"parallel.pp_schedule", p.pp_schedule != plain.pp_schedule},
                              {"parallel.pp_virtual", p.pp_virtual != plain.pp_virtual},
                              {"parallel.pp_layers", p.pp_layers != plain.pp_layers}})
    LOOM_CHECK(p.pp > 1 || !differs,
               "{} is set but parallel.pp = 1, so it would do nothing; set parallel.pp or remove it", key);
  pipeline_layers_given(cfg);  // the split must work
  if (p.pp > 1) {
    LOOM_CHECK(p.pp_schedule != PpSchedule::interleaved || cfg.accum_steps() % p.pp == 0,
               "parallel.pp_schedule = \"interleaved\" needs a multiple of parallel.pp = {} micro-batches per step, "
               "not {} (train.global_batch / (train.micro_batch x parallel.dp)); change train.global_batch or "
               "train.micro_batch",
               p.pp, cfg.accum_steps());
    LOOM_CHECK(!cfg.pp_split_backward() || m.moe.num_experts == 0,
               "parallel.pp_schedule = \"{}\" with MoE layers is not supported yet (the split backward of a MoE "
               "layer is not written); use 1f1b or interleaved",
               p.pp_schedule);
    LOOM_CHECK(!cfg.pp_split_backward() || cfg.train.recompute != Recompute::full,
               "parallel.pp_schedule = \"{}\" with train.recompute = \"full\" would recompute every block twice "
               "(once for each half of the split backward); use train.recompute = \"selective\" or \"none\"",
               p.pp_schedule);
    LOOM_CHECK(p.pp_schedule != PpSchedule::dualpipev || cfg.accum_steps() >= 2 * p.pp,
               "parallel.pp_schedule = \"dualpipev\" needs at least 2 x parallel.pp = {} micro-batches per step ({} = "
               "train.global_batch / (train.micro_batch x parallel.dp)); raise train.global_batch or lower "
               "train.micro_batch",
               2 * p.pp, cfg.accum_steps());
    LOOM_CHECK(cfg.fault.sdc_every == 0, "fault.sdc_every with parallel.pp > 1 is not supported; set it to 0");
  }
  if (p.tp > 1) {  // tensor parallel splits heads, KV heads, MLP width and vocabulary
    LOOM_CHECK(m.n_head % p.tp == 0,
               "parallel.tp = {} does not divide model.n_head = {}; pick tp among the divisors of n_head", p.tp,
               m.n_head);
    LOOM_CHECK(kv % p.tp == 0,
               "parallel.tp = {} does not divide the {} key/value heads (model.n_kv_head); each tp rank "
               "needs whole kv heads",
               p.tp, kv);
    LOOM_CHECK(m.d_ff % p.tp == 0, "parallel.tp = {} does not divide model.d_ff = {}", p.tp, m.d_ff);
    // Any vocabulary splits: loom pads it to a multiple of 64 x tp (Config::vocab_padded).
  }
  if (p.sp) {
    LOOM_CHECK(p.tp > 1, "parallel.sp = true needs tensor parallelism (parallel.tp > 1)");
    LOOM_CHECK(int64_t(t.micro_batch) * cfg.local_seq() % p.tp == 0,
               "parallel.sp: micro_batch x seq_len{} = {} tokens do not split over tp = {}", p.cp > 1 ? " / cp" : "",
               t.micro_batch * cfg.local_seq(), p.tp);
  }
  LOOM_CHECK(p.bucket_mb > 0, "parallel.bucket_mb = {} must be positive", p.bucket_mb);
  LOOM_CHECK(p.timeout_s >= 0, "parallel.timeout_s = {} must be >= 0 (0 turns the watchdog off)", p.timeout_s);
  LOOM_CHECK(p.zero >= 0 && p.zero <= 3, "parallel.zero = {} is not one of 0|1|2|3", p.zero);
  if (p.invariant) invariant_validate(cfg);
}

// The drills: each parses, names a rank of the job, and could fire.
void fault_validate(Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  const FaultConfig& f = cfg.fault;
  const int world = cfg.world();
  LOOM_CHECK(!cfg.log.grad_norms || world == 1,
             "log.grad_norms writes the whole model's gradients from one rank; run it with dp = cp = tp = pp = 1 "
             "(the layout has {})",
             plural(world, "rank"));
  // Each drill parses, names a rank of the job, and could fire: its step is run, and a
  // checkpoint drill's step is one that saves (fault.slow's second field is milliseconds).
  const CheckpointConfig& ck = cfg.checkpoint;
  const auto saves = [&](int64_t step) { return ck.every > 0 && (step % ck.every == 0 || step == cfg.train.steps); };
  struct Drill {
    const char* key;
    const std::string* value;
    bool ranked, phased, stepped, checkpoint;
  };
  for (const Drill& d :
       {Drill{"fault.kill", &f.kill, true, true, true, false}, Drill{"fault.exit", &f.exit, true, true, true, false},
        Drill{"fault.hang", &f.hang, true, false, true, false}, Drill{"fault.slow", &f.slow, true, false, false, false},
        Drill{"fault.nan", &f.nan, true, false, true, false},
        Drill{"fault.bitflip", &f.bitflip, true, false, true, false},
        Drill{"fault.ckpt_corrupt", &f.ckpt_corrupt, false, false, true, true},
        Drill{"fault.enospc", &f.enospc, false, false, true, true}}) {
    const FaultAt at = fault_parse(d.key, *d.value, d.ranked, d.phased);
    if (!at.set()) continue;
    LOOM_CHECK(!d.ranked || at.rank < world, "{} = \"{}\" names rank {}, but the job has {} (pp x dp x cp x tp)", d.key,
               *d.value, at.rank, plural(world, "rank"));
    if (!d.stepped) continue;
    LOOM_CHECK(at.step >= 1 && at.step <= cfg.train.steps,
               "{} = \"{}\": step {} is never run (steps count from 1 to train.steps = {})", d.key, *d.value, at.step,
               cfg.train.steps);
    LOOM_CHECK(!(d.checkpoint || at.phase == "checkpoint") || saves(at.step),
               "{} = \"{}\": no checkpoint is saved after step {} (checkpoint.every = {}); pick a step that saves",
               d.key, *d.value, at.step, ck.every);
  }
  LOOM_CHECK(f.sdc_every == 0 || p.zero <= 1,
             "fault.sdc_every compares each rank's whole gradients before they are reduced, which ZeRO-{} does not "
             "hold; use parallel.zero = 0 or 1, or fault.sdc_every = 0",
             p.zero);
  LOOM_CHECK(f.bitflip.empty() || p.zero <= 2,
             "fault.bitflip flips a weight of the full parameter buffer, which ZeRO-3 does not hold; use parallel.zero "
             "<= 2");
  LOOM_CHECK(f.grace_s >= 0, "fault.grace_s = {} must be >= 0 (0: no limit)", f.grace_s);
  if (p.pp > 1 && !f.nan.empty()) {  // the NaN seeds the head's backward: only the head's stage has one
    const FaultAt at = fault_parse("fault.nan", f.nan);
    const int stage = cfg.pp_v_shape() ? 0 : p.pp - 1, lo = stage * p.dp * p.cp * p.tp,
              hi = lo + p.dp * p.cp * p.tp - 1;
    LOOM_CHECK(at.rank >= lo && at.rank <= hi,
               "fault.nan = \"{}\": rank {} is not on the pipeline stage with the head (ranks {}..{}), whose loss "
               "seeds the NaN; pick one of those",
               f.nan, at.rank, lo, hi);
  }
  LOOM_CHECK(f.hang.empty() || p.timeout_s > 0,
             "fault.hang = \"{}\" with parallel.timeout_s = 0: the watchdog is off, so the hang would never be "
             "detected; set parallel.timeout_s above 0",
             f.hang);
  LOOM_CHECK(f.hang.empty() || world > 1,
             "fault.hang = \"{}\" at one rank: nothing would notice (a watchdog watches peers); launch 2 or more "
             "ranks",
             f.hang);
  LOOM_CHECK(f.spike_factor == 0 || f.spike_factor > 1, "fault.spike_factor = {}: 0 (off) or above 1", f.spike_factor);
  LOOM_CHECK(f.max_skips >= 0, "fault.max_skips = {} must be >= 0 (0: roll back at the first skip)", f.max_skips);
  LOOM_CHECK(f.sdc_every >= 0, "fault.sdc_every = {} must be >= 0 (0: off)", f.sdc_every);
}

// Checkpoints, logs and the export.
void checkpoint_log_validate(Config& cfg) {
  const CheckpointConfig& k = cfg.checkpoint;
  LOOM_CHECK(k.every >= 0, "checkpoint.every = {} must be >= 0 (0: never)", k.every);
  LOOM_CHECK(k.keep >= 1, "checkpoint.keep = {} must be at least 1", k.keep);
  LOOM_CHECK(!k.resume.empty(), "checkpoint.resume is empty; use \"none\", \"latest\" or a checkpoint directory");
  LOOM_CHECK(k.every == 0 || !k.dir.empty(), "checkpoint.every = {} needs checkpoint.dir (where they go)", k.every);
  LOOM_CHECK(k.resume != "latest" || !k.dir.empty(),
             "checkpoint.resume = \"latest\" needs checkpoint.dir (where to look)");
  // checkpoint.every = 0 given explicitly turns saving off over a config that sets a dir.
  LOOM_CHECK(k.dir.empty() || k.every > 0 || k.resume != "none" || cfg.set_keys.count("checkpoint.every"),
             "checkpoint.dir is set but nothing saves or resumes; set checkpoint.every and/or checkpoint.resume = "
             "\"latest\" (checkpoint.every = 0 says to save nothing)");
  LOOM_CHECK(cfg.log.every > 0, "log.every = {} must be positive", cfg.log.every);
  // Refused now, not after the run: a Hugging Face directory (a trailing '/') holds Mixtral only.
  LOOM_CHECK(cfg.export_final.empty() || cfg.export_final.back() != '/' || cfg.model.moe.num_experts == 0 ||
                 cfg.model.moe.every == 1,
             "export.final = \"{}\" asks for a Hugging Face directory, but model.moe.every = {} has no transformers "
             "form (Mixtral makes every block sparse); export one .safetensors file instead",
             cfg.export_final, cfg.model.moe.every);
  for (auto [key, on] :
       {std::pair{"trace", cfg.log.trace}, {"grad_norms", cfg.log.grad_norms}, {"tensorboard", cfg.log.tensorboard}})
    LOOM_CHECK(!on || !cfg.log.dir.empty(), "log.{} = true needs log.dir (where it goes)", key);
  LOOM_CHECK(
      cfg.log.cluster == "auto" || cfg.log.cluster == "none" || std::filesystem::is_regular_file(cfg.log.cluster),
      "log.cluster = '{}' does not exist; name a cluster file (examples/clusters/), or auto, or none", cfg.log.cluster);
  if (!cfg.log.trace_steps.empty()) {
    const auto [a, b] = trace_steps_parse(cfg.log.trace_steps);
    LOOM_CHECK(a <= cfg.train.steps, "log.trace_steps = \"{}\" starts after the run's last step ({})",
               cfg.log.trace_steps, cfg.train.steps);
    (void)b;
    LOOM_CHECK(!cfg.log.dir.empty(), "log.trace_steps needs log.dir (where the trace goes)");
  }
  if (!cfg.log.profile_steps.empty()) {
    const auto [a, b] = steps_range_parse("log.profile_steps", cfg.log.profile_steps);
    (void)b;
    LOOM_CHECK(a <= cfg.train.steps, "log.profile_steps = \"{}\" starts after the run's last step ({})",
               cfg.log.profile_steps, cfg.train.steps);
  }
}

}  // namespace

void config_validate(Config& cfg) {
  config_paths_check(cfg);
  model_validate(cfg);
  train_validate(cfg);
  data_validate(cfg);
  parallel_validate(cfg);
  fault_validate(cfg);
  checkpoint_log_validate(cfg);
}

}  // namespace loom
