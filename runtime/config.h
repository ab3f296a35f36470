// Typed configuration: one struct per TOML section, loaded from a file and overridden by
// `--set section.key=value`. Unknown keys and wrong types are errors that name the nearest
// valid key; validate() checks the relations between keys before anything is allocated.
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

// The keys whose value is one of a few names: each an enum class, parsed once when the config is
// read (an unknown name is refused there, naming the choices), so code compares enums, and a typo
// in a comparison does not compile. Choices<E>::names are the values as a config writes them, in
// the enum's order; fmt prints an enum by its name.
enum class Arch { gpt2, llama };
enum class DeviceChoice { automatic, cpu, cuda, cuda_emulated };  // train.device
enum class DTypeChoice { automatic, f32, bf16 };                  // train.dtype
enum class Recompute { none, selective, full };                   // train.recompute
enum class GeluEpilogue { fused, separate };                      // train.gelu_epilogue
enum class LrSchedule { constant, cosine, linear, wsd };          // train.schedule
enum class DataKind { synthetic, text, tokens };                  // data.source
enum class CpAttentionKind { ring, allgather };                   // parallel.cp_attention
enum class Zero3Reshard { after_forward, after_step };            // parallel.zero3_reshard
enum class PpSchedule { gpipe, f1b1, interleaved, zb, zbv, dualpipev };
enum class GradReduce { f32, bf16 };                            // parallel.grad_reduce_dtype
enum class CommChoice { automatic, nccl, mpi, nccl_emulated };  // parallel.comm

template <class E>
struct Choices;
#define LOOM_CHOICES(E, ...)                                   \
  template <>                                                  \
  struct Choices<E> {                                          \
    static constexpr std::string_view names[] = {__VA_ARGS__}; \
  }
LOOM_CHOICES(Arch, "gpt2", "llama");
LOOM_CHOICES(DeviceChoice, "auto", "cpu", "cuda", "cuda-emulated");
LOOM_CHOICES(DTypeChoice, "auto", "f32", "bf16");
LOOM_CHOICES(Recompute, "none", "selective", "full");
LOOM_CHOICES(GeluEpilogue, "fused", "separate");
LOOM_CHOICES(LrSchedule, "constant", "cosine", "linear", "wsd");
LOOM_CHOICES(DataKind, "synthetic", "text", "tokens");
LOOM_CHOICES(CpAttentionKind, "ring", "allgather");
LOOM_CHOICES(Zero3Reshard, "after_forward", "after_step");
LOOM_CHOICES(PpSchedule, "gpipe", "1f1b", "interleaved", "zb", "zbv", "dualpipev");
LOOM_CHOICES(GradReduce, "f32", "bf16");
LOOM_CHOICES(CommChoice, "auto", "nccl", "mpi", "nccl-emulated");
#undef LOOM_CHOICES

template <class E>
concept Choice = requires {
  Choices<E>::names;
};
template <Choice E>
constexpr std::string_view choice_name(E e) {
  return Choices<E>::names[size_t(e)];
}
// The choice named `name`, or none.
template <Choice E>
constexpr std::optional<E> choice_parse(std::string_view name) {
  for (size_t i = 0; i < std::size(Choices<E>::names); ++i)
    if (Choices<E>::names[i] == name) return E(i);
  return std::nullopt;
}
template <Choice E>
std::ostream& operator<<(std::ostream& os, E e) {
  return os << choice_name(e);
}
// The names as a config's help lists them: "a | b | c".
template <Choice E>
std::string choice_list(std::string_view sep = " | ") {
  std::string out;
  for (std::string_view n : Choices<E>::names) out += (out.empty() ? "" : std::string(sep)) + std::string(n);
  return out;
}

struct MoeConfig {
  int num_experts = 0;  // 0: dense
  int top_k = 2;
  double capacity_factor = 0.0;
  double aux_loss_coef = 0.01;
  int every = 1;
};

struct ModelConfig {
  Arch arch = Arch::gpt2;
  int n_layer = 4;
  int d_model = 128;
  int n_head = 4;
  int n_kv_head = 0;  // 0: same as n_head
  int d_ff = 0;       // 0: 4*d_model for gpt2, 8/3*d_model rounded up to 64 for llama
  int vocab_size = 512;
  int seq_len = 128;
  bool tie_embeddings = true;  // default true for gpt2, false for llama
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  MoeConfig moe;
};

struct TrainConfig {
  int micro_batch = 8;
  int global_batch = 16;  // sequences per optimizer step, over all dp ranks and micro-batches
  int steps = 400;
  double lr = 3e-3;
  double min_lr = 3e-4;
  int warmup_steps = 20;
  LrSchedule schedule = LrSchedule::cosine;
  double decay_frac = 0.2;  // wsd: the fraction of all steps that decays to min_lr
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // 0: off
  int64_t seed = 1234;
  DeviceChoice device = DeviceChoice::automatic;
  DTypeChoice dtype = DTypeChoice::automatic;  // auto: f32 on cpu, bf16 on cuda; bf16 on cpu: bf16 storage
  Recompute recompute = Recompute::none;
  // CUDA, gpt2: GELU's backward in the epilogue of the GEMM that makes its input (fused) or a
  // kernel of its own (separate); `loom bench kernels` times both.
  GeluEpilogue gelu_epilogue = GeluEpilogue::fused;
  // Not a key: the CUDA backend plans the flash backward's stored dS (kernels/flash_ds.h); the
  // trainer and `loom plan memory` clear it where the device's memory has no room for it
  // (plan/memory.h, attention_ds_fit), and dQ recomputes.
  bool attention_ds = true;
  int threads = 0;  // 0: OMP_NUM_THREADS if set, else the node's cores shared among its ranks
};

// One source of a mixture: its data (as data.path) and its share of the sequences.
struct DataSource {
  std::string path;
  double weight = 1.0;
  bool operator==(const DataSource& o) const { return path == o.path && weight == o.weight; }
};

struct DataConfig {
  DataKind source = DataKind::synthetic;
  std::string path;
  std::vector<DataSource> sources;  // [[data.sources]]: a weighted mixture in place of path
  bool doc_mask = false;            // attention and positions stay inside each document
  int doc_token = -1;               // the token opening a document (-1: data.tokenizer's)
  std::string val_path;
  int val_every = 100;  // 0: only at the end
  int val_batches = 4;
  bool shuffle = false;
  // The tokenizer the data was made with, recorded in exports for `loom generate`: "" (text:
  // byte; tokens: what the shards record, else none), byte, gpt2 or llama3 with tokenizer_dir
  // holding their files, or hf (tokenizer.json) and spm (a SentencePiece model) in
  // tokenizer_file.
  std::string tokenizer;
  std::string tokenizer_dir;
  std::string tokenizer_file;
};

struct ParallelConfig {
  int dp = 1, tp = 1, pp = 1, ep = 1;
  // Context parallel: each sequence split over cp ranks in 2 x cp load-balanced chunks;
  // attention over the other ranks' keys by a ring of sends (its transfers overlapped with
  // the attention of the block held, unless cp_overlap is false) or one all-gather.
  int cp = 1;
  CpAttentionKind cp_attention = CpAttentionKind::ring;
  bool cp_overlap = true;
  bool sp = false;
  int zero = 0;
  // ZeRO-3: after_forward gathers a unit's weights again for its backward; after_step keeps
  // them gathered until the optimizer step (the stage's weights whole, one gather per step)
  Zero3Reshard zero3_reshard = Zero3Reshard::after_forward;
  double bucket_mb = 25.0;
  PpSchedule pp_schedule = PpSchedule::f1b1;
  int pp_virtual = 1;
  std::string pp_layers;                           // blocks per stage, "5,6,6,5"; empty: n_layer / pp each
  double timeout_s = 600;                          // watchdog: a collective pending this long aborts the job (0: never)
  GradReduce grad_reduce_dtype = GradReduce::f32;  // the dtype gradients are reduced in
  // auto | nccl | mpi: what carries CUDA buffers (mpi: staged through the host); nccl-emulated:
  // host buffers under NCCL's ordering rules, to check a layout on the CPU
  CommChoice comm = CommChoice::automatic;
  bool invariant = false;  // gradients summed in one canonical tree: the same bits at any dp and pp
};

struct CheckpointConfig {
  std::string dir;
  int every = 0;
  int keep = 2;
  bool async = true;
  std::string resume = "none";  // none | latest | PATH
};

// Fault drills (each fires once per job; a restarted run is told not to fire them again) and
// the handling of numerical faults and preemption.
struct FaultConfig {
  std::string kill;          // RANK:STEP[:PHASE]: SIGKILL (PHASE: forward|backward|optimizer|checkpoint)
  std::string exit;          // RANK:STEP[:PHASE]: exit status 3
  std::string hang;          // RANK:STEP: stop inside that step's next collective
  std::string slow;          // RANK:MS: MS extra milliseconds every step (a straggler)
  std::string nan;           // RANK:STEP: a non-finite value in that rank's gradients
  std::string bitflip;       // RANK:STEP: one bit of one weight (silent data corruption)
  std::string ckpt_corrupt;  // STEP: damage one shard of that step's checkpoint after it commits
  std::string enospc;        // STEP: that step's checkpoint write fails as on a full disk
  double grace_s = 60;       // preemption: how long SIGTERM leaves for the checkpoint
  double spike_factor = 0;   // skip an update whose gradient norm exceeds this x the running median (0: off)
  int max_skips = 3;         // more skipped updates in a row than this: roll back to the last checkpoint
  int sdc_every = 0;         // every k steps, recompute the gradients and compare bitwise (0: off)
};
// A parsed drill: rank and step (1-based), and the phase where it fires ("" where none).
struct FaultAt {
  int rank = -1;
  int64_t step = -1;
  std::string phase;
  bool set() const { return step >= 0; }
};
// "RANK:STEP[:PHASE]" (phase only where `phases`), or "STEP" when `rank` is false; "" is unset.
// An Error names `key` and the form it takes.
FaultAt fault_parse(const std::string& key, const std::string& value, bool rank = true, bool phases = false);

struct LogConfig {
  std::string dir = "runs/default";
  int every = 10;  // console progress line every N steps (metrics.jsonl gets every step)
  bool trace = false;
  bool grad_norms = false;   // each tensor's step-1 gradient norm into <dir>/grad_norms.json (one rank)
  bool tensorboard = false;  // TensorBoard event files in <dir>
  std::string trace_steps;   // "A:B": trace steps A to B (1-based, inclusive) only; turns tracing on
  // "A:B": time every op of steps A to B on the device and print the roofline table at the end
  // (model/backend_profile.h); "" is off.
  std::string profile_steps;
  // The cluster file whose step-time prediction the run prints beside its measured split:
  // auto (on the CPU, loom's examples/clusters/this_machine.toml), none, or a path.
  std::string cluster = "auto";
};

struct Config {
  ModelConfig model;
  TrainConfig train;
  DataConfig data;
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  FaultConfig fault;
  std::string init_from;     // init.from
  std::string export_final;  // export.final
  LogConfig log;
  std::set<std::string> set_keys;  // keys given explicitly, by file or --set

  // Derived after validate().
  int head_dim() const { return model.d_model / model.n_head; }
  // Whether block l (0-based) is a mixture of experts: blocks every-1, 2 every-1, ...
  bool moe_block(int l) const { return model.moe.num_experts > 0 && (l + 1) % model.moe.every == 0; }
  int moe_layers() const { return model.moe.num_experts > 0 ? model.n_layer / model.moe.every : 0; }
  int kv_heads() const { return model.n_kv_head ? model.n_kv_head : model.n_head; }
  // The token opening each document (data.doc_mask): data.doc_token, else data.tokenizer's
  // (llm.c's conventions), else -1.
  int doc_token() const {
    if (data.doc_token >= 0) return data.doc_token;
    if (data.tokenizer == "gpt2") return 50256;
    if (data.tokenizer == "llama3") return 128000;
    return -1;
  }
  int world() const { return parallel.pp * parallel.dp * parallel.cp * parallel.tp; }
  // The tokens of a sequence one rank holds: model.seq_len, or its share under context parallel.
  int local_seq() const { return model.seq_len / parallel.cp; }
  int accum_steps() const { return train.global_batch / (train.micro_batch * parallel.dp); }
  // The pipeline schedules whose backward is split into B (input gradient) and W (weights):
  // zb, and the V-shaped zbv and dualpipev (two chunks a stage, folded back: see
  // parallel/pipeline_schedule.h).
  bool pp_v_shape() const {
    return parallel.pp_schedule == PpSchedule::zbv || parallel.pp_schedule == PpSchedule::dualpipev;
  }
  bool pp_split_backward() const { return parallel.pp > 1 && (parallel.pp_schedule == PpSchedule::zb || pp_v_shape()); }
  // A tied embedding whose two copies live on different stages (the first and the last; a V
  // keeps both ends on stage 0).
  bool pp_tied_across() const { return parallel.pp > 1 && model.tie_embeddings && !pp_v_shape(); }
  // The vocabulary as loom holds it: padded to a multiple of tp x 64 (Megatron's
  // make-vocab-size-divisible-by), so it splits over tp and every shard's rows align.
  int64_t vocab_padded() const {
    const int64_t m = 64 * int64_t(parallel.tp);
    return (int64_t(model.vocab_size) + m - 1) / m * m;
  }
};

// log.trace_steps "A:B" as (A, B), 1 <= A <= B; an Error says the form.
std::pair<int64_t, int64_t> trace_steps_parse(const std::string& spec);
// A key's "A:B" steps (1-based, 1 <= A <= B) as (A, B); an Error names the key and the form.
std::pair<int64_t, int64_t> steps_range_parse(const char* key, const std::string& spec);

// Where pipeline model chunk g of p x v lives: stage g % p (interleaving), or under a V-shaped
// schedule (v = 2) stage g for g < p and 2p-1-g after.
inline int pipe_stage_of(int chunk, int stages, bool v_shape) {
  return v_shape && chunk >= stages ? 2 * stages - 1 - chunk : chunk % stages;
}

// parallel.pp_layers as given: the counts listed, or n_layer / chunks each when empty; {} for
// "auto" (parallel/pipeline_split.h balances it). An Error says what does not fit.
std::vector<int> pipeline_layers_given(const Config& cfg);

Config config_defaults();
// The most threads a rank may ask for (train.threads, --threads): far past any machine's cores,
// where OpenMP would try to start them all and the run never would.
inline constexpr int kThreadsMax = 4096;
// The most loom reads of a config or cluster file: a regular file of at most this size.
inline constexpr int64_t kConfigMaxBytes = int64_t(4) << 20;
// Reads a TOML file into `cfg` (keys absent from the file keep their values); a path that is not
// a regular file of at most kConfigMaxBytes is refused.
void config_load_file(Config& cfg, const std::string& path);
void config_load_string(Config& cfg, const std::string& toml_text, const std::string& origin);
// `key=value`, value parsed by the key's type.
void config_set(Config& cfg, const std::string& assignment);
// Fills arch-dependent defaults and checks every relation; throws loom::Error.
void config_validate(Config& cfg);
// Fails, naming `key` and the choices, unless v is one of `ok`.
void config_one_of(const std::string& key, const std::string& v, std::initializer_list<const char*> ok);
// The resolved config as TOML, numbers as written (0.003); `only`: just that section.
std::string config_to_toml(const Config& cfg, const std::string& only = "");
std::vector<std::string> config_keys();
// config_to_toml's text as "section.key" -> value (as written).
std::map<std::string, std::string> config_flat(const std::string& toml_text);
// A key whose values differ between two config_flat maps ("(absent)" where one lacks it).
struct ConfigDiff {
  std::string key, a, b;
};
// The keys of `keys` (empty: of either map), in order, whose values differ between a and b.
std::vector<ConfigDiff> config_diff(const std::map<std::string, std::string>& a,
                                    const std::map<std::string, std::string>& b,
                                    const std::vector<std::string>& keys = {});
// "" when every rank's text (config_to_toml of its resolved config, with whatever else must
// agree) is rank 0's; else which ranks differ, in which keys, and what to do.
std::string config_disagreement(const std::vector<std::string>& texts);
// Every key with its type, default and meaning, one per line (`loom train --list-keys`).
std::string config_keys_table();

}  // namespace loom

template <loom::Choice E>
struct fmt::formatter<E> : fmt::formatter<std::string_view> {
  auto format(E e, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(loom::choice_name(e), ctx);
  }
};
