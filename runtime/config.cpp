#include "runtime/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>
#include <variant>

#include "runtime/error.h"
#include "runtime/file.h"
#include "runtime/utf8.h"

namespace loom {
namespace {

// A key whose value is one of a few names (an enum class with Choices): read and written by name.
struct ChoiceRef {
  void* value;
  size_t (*get)(const void*);
  void (*set)(void*, size_t);
  std::span<const std::string_view> names;
  std::string name() const { return std::string(names[get(value)]); }
  std::string list() const {
    std::string out;
    for (std::string_view n : names) out += (out.empty() ? "" : "|") + std::string(n);
    return out;
  }
};
template <Choice E>
ChoiceRef choice(E* e) {
  return {e, [](const void* v) { return size_t(*static_cast<const E*>(v)); },
          [](void* v, size_t i) { *static_cast<E*>(v) = E(i); }, std::span(Choices<E>::names)};
}
using FieldPtr = std::variant<int*, int64_t*, double*, bool*, std::string*, std::vector<DataSource>*, ChoiceRef>;
struct Field {
  std::string key;
  FieldPtr ptr;
  const char* help;
};

std::vector<Field> fields_of(Config& c) {
  auto& m = c.model;
  auto& t = c.train;
  auto& d = c.data;
  auto& p = c.parallel;
  auto& k = c.checkpoint;
  return {
      {"model.arch", choice(&m.arch), "gpt2 | llama"},
      {"model.n_layer", &m.n_layer, "transformer blocks (L)"},
      {"model.d_model", &m.d_model, "width of the residual stream (C)"},
      {"model.n_head", &m.n_head, "query heads (H); d_model / n_head is the head dim"},
      {"model.n_kv_head", &m.n_kv_head, "key/value heads (KV; 0: n_head; fewer: grouped-query attention, llama)"},
      {"model.d_ff", &m.d_ff, "MLP width (F; 0: 4C for gpt2, 8C/3 rounded up to 64 for llama)"},
      {"model.vocab_size", &m.vocab_size, "vocabulary (V; padded inside loom to a multiple of 64 x tp)"},
      {"model.seq_len", &m.seq_len, "tokens per sequence (T)"},
      {"model.tie_embeddings", &m.tie_embeddings, "lm_head shares the token embedding (default: gpt2 yes, llama no)"},
      {"model.norm_eps", &m.norm_eps, "epsilon of LayerNorm / RMSNorm"},
      {"model.rope_theta", &m.rope_theta, "RoPE base (llama)"},
      {"model.moe.num_experts", &m.moe.num_experts, "experts per MoE layer (0: dense; llama blocks, Mixtral's)"},
      {"model.moe.top_k", &m.moe.top_k, "experts per token"},
      {"model.moe.capacity_factor", &m.moe.capacity_factor,
       "expert capacity: ceil(cf * N * top_k / E) assignments per micro-batch (<= 0: dropless)"},
      {"model.moe.aux_loss_coef", &m.moe.aux_loss_coef, "load-balancing loss weight"},
      {"model.moe.every", &m.moe.every, "every k-th block is MoE (blocks k-1, 2k-1, ...; 1: all)"},
      {"train.micro_batch", &t.micro_batch, "sequences per forward/backward on each dp rank"},
      {"train.global_batch", &t.global_batch, "sequences per optimizer step (micro_batch x accumulation x dp)"},
      {"train.steps", &t.steps, "optimizer steps"},
      {"train.lr", &t.lr, "peak learning rate"},
      {"train.min_lr", &t.min_lr, "learning rate at the end of the decay"},
      {"train.warmup_steps", &t.warmup_steps, "linear warmup steps"},
      {"train.schedule", choice(&t.schedule), "constant | cosine | linear | wsd"},
      {"train.decay_frac", &t.decay_frac, "wsd: the fraction of all steps that decays linearly to min_lr"},
      {"train.weight_decay", &t.weight_decay, "AdamW decay (tensors of two or more dims)"},
      {"train.beta1", &t.beta1, "AdamW beta1"},
      {"train.beta2", &t.beta2, "AdamW beta2"},
      {"train.eps", &t.eps, "AdamW epsilon"},
      {"train.grad_clip", &t.grad_clip, "clip the global gradient norm to this (0: off)"},
      {"train.seed", &t.seed, "weights' seed"},
      {"train.device", choice(&t.device), "auto | cpu | cuda | cuda-emulated (the CUDA backend on the CPU emulation)"},
      {"train.dtype", choice(&t.dtype), "auto | f32 | bf16 (auto: f32 on the CPU, bf16 on CUDA)"},
      {"train.recompute", choice(&t.recompute), "none | selective | full (activation recompute)"},
      {"train.gelu_epilogue", choice(&t.gelu_epilogue),
       "fused | separate (CUDA gpt2: GELU's backward in the GEMM epilogue or not)"},
      {"train.threads", &t.threads, "threads per rank (0: OMP_NUM_THREADS, SLURM_CPUS_PER_TASK, or cores / ranks)"},
      {"data.source", choice(&d.source), "synthetic | text | tokens (unset with a data path: read from the files)"},
      {"data.path", &d.path, "a text file, or llm.c token shards (a file or a directory)"},
      {"data.sources", &d.sources,
       "a mixture in place of data.path: [[data.sources]] tables with path and weight (blended per sequence)"},
      {"data.doc_mask", &d.doc_mask,
       "attention and positions stay inside each document of a packed sequence (documents opened by "
       "data.doc_token)"},
      {"data.doc_token", &d.doc_token,
       "the token that opens a document (-1: what the token shards record, else data.tokenizer's: gpt2 "
       "<|endoftext|> 50256, llama3 <|begin_of_text|> 128000)"},
      {"data.val_path", &d.val_path, "validation data (empty: the last 10% of data.path)"},
      {"data.val_every", &d.val_every, "validate every N steps (0: only at the end)"},
      {"data.val_batches", &d.val_batches, "global batches per validation (0: none)"},
      {"data.shuffle", &d.shuffle, "a seeded order per epoch"},
      {"data.tokenizer", &d.tokenizer,
       "the data's tokenizer, recorded in exports: byte | gpt2 | llama3 | hf | spm (\"\": byte for text, what "
       "token shards record)"},
      {"data.tokenizer_dir", &d.tokenizer_dir,
       "gpt2: the directory with vocab.json and merges.txt; llama3: with tokenizer.model"},
      {"data.tokenizer_file", &d.tokenizer_file, "hf: a tokenizer.json; spm: a SentencePiece model"},
      {"parallel.dp", &p.dp, "data-parallel ranks"},
      {"parallel.tp", &p.tp, "tensor-parallel ranks"},
      {"parallel.pp", &p.pp, "pipeline stages"},
      {"parallel.cp", &p.cp, "context-parallel ranks: each sequence split over them (2 x cp chunks, balanced)"},
      {"parallel.cp_attention", choice(&p.cp_attention),
       "ring | allgather: keys and values passed around the cp ring, or gathered at once"},
      {"parallel.cp_overlap", &p.cp_overlap, "ring: each block's transfer overlapped with the attention of the last"},
      {"parallel.ep", &p.ep, "expert-parallel ranks, carved from dp x cp (each holds num_experts / ep experts)"},
      {"parallel.sp", &p.sp, "sequence parallel (needs tp > 1)"},
      {"parallel.zero", &p.zero, "ZeRO stage 0 | 1 | 2 | 3"},
      {"parallel.zero3_reshard", choice(&p.zero3_reshard),
       "after_forward | after_step: ZeRO-3 gathers weights again for the backward, or keeps them until the step"},
      {"parallel.bucket_mb", &p.bucket_mb, "DDP gradient bucket size"},
      {"parallel.pp_schedule", choice(&p.pp_schedule),
       "gpipe | 1f1b | interleaved | zb | zbv | dualpipev (loom plan pipeline shows them)"},
      {"parallel.pp_virtual", &p.pp_virtual, "model chunks per stage (interleaved)"},
      {"parallel.pp_layers", &p.pp_layers,
       "blocks per stage, e.g. \"5,6,6,5\" (empty: n_layer / pp each; auto: balanced by FLOPs, head included)"},
      {"parallel.timeout_s", &p.timeout_s, "a collective pending this long ends the job (0: never)"},
      {"parallel.grad_reduce_dtype", choice(&p.grad_reduce_dtype), "f32 | bf16: what gradients are reduced in"},
      {"parallel.invariant", &p.invariant,
       "sum gradients in one canonical tree over the micro-batches: the same bits at any dp and pp"},
      {"parallel.comm", choice(&p.comm),
       "auto | nccl | mpi | nccl-emulated: what carries CUDA buffers (mpi: staged through the host; "
       "nccl-emulated: NCCL's rules over MPI, host buffers)"},
      {"checkpoint.dir", &k.dir, "where checkpoints go: DIR/step-N/, one HDF5 file per rank + manifest.json"},
      {"checkpoint.every", &k.every, "save every N steps and at the last (0: never)"},
      {"checkpoint.keep", &k.keep, "complete checkpoints kept; older ones go once a newer one commits"},
      {"checkpoint.async", &k.async, "write on a thread while training goes on (false: the step waits)"},
      {"checkpoint.resume", &k.resume, "none | latest (newest that verifies, under checkpoint.dir) | PATH"},
      {"fault.kill", &c.fault.kill,
       "drill: RANK:STEP[:PHASE] SIGKILLs that rank (PHASE: forward|backward|optimizer|checkpoint)"},
      {"fault.exit", &c.fault.exit, "drill: RANK:STEP[:PHASE] exits that rank with status 3"},
      {"fault.hang", &c.fault.hang, "drill: RANK:STEP stops that rank inside the step's next collective"},
      {"fault.slow", &c.fault.slow, "drill: RANK:MS makes that rank MS ms slower every step"},
      {"fault.nan", &c.fault.nan, "drill: RANK:STEP puts a NaN into that rank's gradients"},
      {"fault.bitflip", &c.fault.bitflip, "drill: RANK:STEP flips one bit of one of that rank's weights"},
      {"fault.ckpt_corrupt", &c.fault.ckpt_corrupt, "drill: STEP damages a shard of that checkpoint once committed"},
      {"fault.enospc", &c.fault.enospc, "drill: STEP makes that checkpoint's write fail as on a full disk"},
      {"fault.grace_s", &c.fault.grace_s, "SIGTERM: seconds left for the checkpoint before exiting"},
      {"fault.spike_factor", &c.fault.spike_factor,
       "skip updates whose gradient norm tops this x its running median (0: off)"},
      {"fault.max_skips", &c.fault.max_skips, "skipped updates in a row before rolling back to the last checkpoint"},
      {"fault.sdc_every", &c.fault.sdc_every, "every k steps recompute the gradients and compare bitwise (0: off)"},
      {"init.from", &c.init_from, "start from these weights (safetensors, Hugging Face names)"},
      {"export.final", &c.export_final, "write the final weights here (safetensors)"},
      {"log.dir", &c.log.dir, "where metrics.jsonl and traces go (one run a directory: DIR-2, ... for the next)"},
      {"log.every", &c.log.every, "console progress line every N steps"},
      {"log.trace", &c.log.trace, "write a Chrome trace per rank"},
      {"log.tensorboard", &c.log.tensorboard, "write TensorBoard event files (every step's scalars) into log.dir"},
      {"log.trace_steps", &c.log.trace_steps, "A:B: trace only steps A to B (1-based; turns log.trace on)"},
      {"log.profile_steps", &c.log.profile_steps,
       "A:B: time every op of steps A to B on the device; print the roofline table (the trace gets a gpu track)"},
      {"log.cluster", &c.log.cluster,
       "cluster file predicting the step split printed beside the measured one: auto (CPU: "
       "examples/clusters/this_machine.toml), none, or a path"},
      {"log.grad_norms", &c.log.grad_norms,
       "write each tensor's step-1 gradient norm (before clipping) to grad_norms.json; one rank"},
  };
}

// Names users bring from other trainers, by their last part: the key they mean, or "" with what
// to say instead (an idea loom does not have), and a note on the value.
struct Synonym {
  const char* alias;
  const char* to;
  const char* note = "";
};
const std::vector<Synonym>& synonyms() {
  static const std::vector<Synonym> s = {
      {"learning_rate", "train.lr"},
      {"max_lr", "train.lr"},
      {"batch_size", "train.micro_batch"},
      {"micro_batch_size", "train.micro_batch"},
      {"global_batch_size", "train.global_batch"},
      {"max_steps", "train.steps"},
      {"num_steps", "train.steps"},
      {"iters", "train.steps"},
      {"max_iters", "train.steps"},
      {"warmup", "train.warmup_steps"},
      {"warmup_iters", "train.warmup_steps"},
      {"max_grad_norm", "train.grad_clip"},
      {"max_norm", "train.grad_clip"},
      {"gradient_clipping", "train.grad_clip"},
      {"fsdp", "parallel.zero", " = 3 (FSDP's full sharding is ZeRO-3)"},
      {"data_parallel_shard_degree", "parallel.zero", " = 3 with parallel.dp (FSDP's full sharding is ZeRO-3)"},
      {"epochs", "train.steps", " (loom counts optimizer steps, not epochs)"},
      {"num_epochs", "train.steps", " (loom counts optimizer steps, not epochs)"},
      {"dropout", "", "loom's models have no dropout (pretraining runs without it); drop the key"},
      {"attention_dropout", "", "loom's models have no dropout (pretraining runs without it); drop the key"},
      {"clip_grad", "train.grad_clip"},
      {"n_embd", "model.d_model"},
      {"hidden_size", "model.d_model"},
      {"dim", "model.d_model"},
      {"n_heads", "model.n_head"},
      {"num_heads", "model.n_head"},
      {"num_attention_heads", "model.n_head"},
      {"n_layers", "model.n_layer"},
      {"num_layers", "model.n_layer"},
      {"num_hidden_layers", "model.n_layer"},
      {"n_kv_heads", "model.n_kv_head"},
      {"num_key_value_heads", "model.n_kv_head"},
      {"intermediate_size", "model.d_ff"},
      {"ffn_dim", "model.d_ff"},
      {"block_size", "model.seq_len"},
      {"max_seq_len", "model.seq_len"},
      {"context_length", "model.seq_len"},
      {"max_position_embeddings", "model.seq_len"},
      {"tensor_parallel", "parallel.tp"},
      {"context_parallel", "parallel.cp"},
      {"context_parallel_degree", "parallel.cp"},
      {"cp_size", "parallel.cp"},
      {"tp_size", "parallel.tp"},
      {"data_parallel", "parallel.dp"},
      {"dp_size", "parallel.dp"},
      {"zero_stage", "parallel.zero"},
      {"reshard_after_forward", "parallel.zero3_reshard"},
      {"out_dir", "log.dir"},
      {"gradient_accumulation_steps", "train.global_batch",
       " (sequences per step; accumulation = global_batch / (micro_batch x dp))"},
  };
  return s;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min<size_t>({row[j] + 1, row[j - 1] + 1, diag + size_t(a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

// What a user most likely meant, as "did you mean 'KEY'?": the same name in another section; a
// synonym from another trainer (or what to do where loom has no such thing); else the nearest
// key by edit distance within the key's own section (or overall, when the section does not exist).
std::string key_suggest(const std::vector<Field>& fields, const std::string& key) {
  auto last = [](const std::string& k) { return k.substr(k.rfind('.') + 1); };
  auto section = [](const std::string& k) { return k.substr(0, k.find('.')); };
  auto mean = [](const std::string& k, const char* note = "") { return fmt::format("did you mean '{}'{}?", k, note); };
  for (auto& f : fields)
    if (last(key) == last(f.key)) return mean(f.key);
  for (auto& syn : synonyms())
    if (last(key) == syn.alias) return *syn.to ? mean(syn.to, syn.note) : std::string(syn.note);
  bool known_section = false;
  for (auto& f : fields) known_section |= section(f.key) == section(key);
  std::string best = fields.front().key;
  size_t best_d = SIZE_MAX;
  for (auto& f : fields) {
    if (known_section && section(f.key) != section(key)) continue;
    const size_t d = edit_distance(key, f.key);
    if (d < best_d) best_d = d, best = f.key;
  }
  return mean(best);
}

Field& find_field(std::vector<Field>& fields, const std::string& key, const std::string& origin) {
  for (auto& f : fields)
    if (f.key == key) return f;
  fail("{}: unknown config key '{}'; {} (`loom train --list-keys` lists all)", origin, key, key_suggest(fields, key));
}

const char* short_type(const FieldPtr& p) {
  if (std::holds_alternative<ChoiceRef>(p)) return "choice";
  return std::visit(
      [](auto v) -> const char* {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int> || std::is_same_v<T, int64_t>) return "int";
        if constexpr (std::is_same_v<T, double>) return "float";
        if constexpr (std::is_same_v<T, bool>) return "bool";
        if constexpr (std::is_same_v<T, std::vector<DataSource>>) return "tables";
        return "string";
      },
      p);
}

const char* type_name(const FieldPtr& p) {
  if (std::holds_alternative<ChoiceRef>(p)) return "one of its names, a string";
  return std::visit(
      [](auto v) -> const char* {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int> || std::is_same_v<T, int64_t>) return "an integer";
        if constexpr (std::is_same_v<T, double>) return "a number";
        if constexpr (std::is_same_v<T, bool>) return "true or false";
        if constexpr (std::is_same_v<T, std::vector<DataSource>>)
          return "an array of tables with path and weight ([[data.sources]])";
        return "a string";
      },
      p);
}

// [[data.sources]]: each table exactly {path = "...", weight = number}.
std::vector<DataSource> sources_from_node(const toml::node& node, const std::string& key, const std::string& origin) {
  const toml::array* arr = node.as_array();
  LOOM_CHECK(arr, "{}: {} must be an array of tables ([[data.sources]] with path and weight)", origin, key);
  std::vector<DataSource> out;
  for (const toml::node& el : *arr) {
    const toml::table* t = el.as_table();
    LOOM_CHECK(t, "{}: each entry of {} must be a table with path and weight", origin, key);
    DataSource s;
    bool has_path = false;
    for (auto&& [k, v] : *t) {
      if (k.str() == "path" && v.is_string()) {
        s.path = *v.value<std::string>();
        has_path = true;
      } else if (k.str() == "weight" && v.is_number()) {
        s.weight = *v.value<double>();
      } else {
        fail(
            "{}: {} entry {}: '{}' is not a source's key or has the wrong type; a source is path = \"...\" and "
            "weight = a number",
            origin, key, out.size() + 1, std::string(k.str()));
      }
    }
    LOOM_CHECK(has_path, "{}: {} entry {} has no path", origin, key, out.size() + 1);
    out.push_back(std::move(s));
  }
  return out;
}

// A choice by its name; another name is refused, listing them (and the nearest, for a typo).
void choice_set(const ChoiceRef& c, const std::string& key, const std::string& value, const std::string& origin) {
  for (size_t i = 0; i < c.names.size(); ++i)
    if (c.names[i] == value) return c.set(c.value, i);
  std::string near;
  for (std::string_view n : c.names)
    if (edit_distance(value, std::string(n)) <= 2) near = fmt::format("; did you mean '{}'?", n);
  fail("{}: {} = '{}' is not one of {}{}", origin, key, value, c.list(), near);
}

void set_from_node(Field& f, const toml::node& node, const std::string& origin) {
  auto wrong = [&] {
    std::ostringstream got;
    got << node.type();
    fail("{}: {} must be {}, got a {}", origin, f.key, type_name(f.ptr), got.str());
  };
  std::visit(
      [&](auto v) {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (std::is_same_v<T, ChoiceRef>) {
          if (!node.is_string()) wrong();
          choice_set(v, f.key, *node.value<std::string>(), origin);
        } else if constexpr (std::is_same_v<T, int> || std::is_same_v<T, int64_t>) {
          auto x = node.value_exact<int64_t>();
          if (!x) wrong();
          if constexpr (std::is_same_v<T, int>)
            if (*x < INT32_MIN || *x > INT32_MAX) fail("{}: {} = {} is out of range", origin, f.key, *x);
          *v = T(*x);
        } else if constexpr (std::is_same_v<T, double>) {
          if (!node.is_number()) wrong();
          *v = *node.value<double>();
          // One rule for every float key: a finite number (inf and nan are TOML floats).
          if (!std::isfinite(*v))
            fail("{}: {} = {} is not a finite number; every float key must be one", origin, f.key, *v);
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!node.is_boolean()) wrong();
          *v = *node.value<bool>();
        } else if constexpr (std::is_same_v<T, std::vector<DataSource>>) {
          *v = sources_from_node(node, f.key, origin);
        } else {
          if (!node.is_string()) wrong();
          *v = *node.value<std::string>();
        }
      },
      f.ptr);
}

void load_table(Config& cfg, std::vector<Field>& fields, const toml::table& t, const std::string& prefix,
                const std::string& origin) {
  for (auto&& [k, node] : t) {
    std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (auto* sub = node.as_table()) {
      load_table(cfg, fields, *sub, key, origin);
      continue;
    }
    Field& f = find_field(fields, key, origin);
    set_from_node(f, node, origin);
    cfg.set_keys.insert(key);
  }
}

}  // namespace

Config config_defaults() {
  return Config{};
}

std::vector<std::string> config_keys() {
  Config c;
  std::vector<std::string> keys;
  for (auto& f : fields_of(c)) keys.push_back(f.key);
  return keys;
}

namespace {
std::string toml_quote(const std::string& v) {
  std::string out = "\"";
  for (char ch : v) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (uint8_t(ch) < 0x20 || ch == 0x7f) {  // a newline would end the line: TOML's escape keeps it one
      out += fmt::format("\\u{:04X}", uint8_t(ch));
      continue;
    }
    out += ch;
  }
  return out + "\"";
}
// A value as TOML writes it: numbers in their shortest round-trip form (0.003, not
// 0.0030000000000000001), strings quoted and escaped.
std::string toml_value(const FieldPtr& p) {
  return std::visit(
      [](auto v) -> std::string {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (std::is_same_v<T, ChoiceRef>) {
          return toml_quote(v.name());
        } else if constexpr (std::is_same_v<T, bool>) {
          return *v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, double>) {
          std::string s = fmt::format("{}", *v);
          if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // a float stays a float
          return s;
        } else if constexpr (std::is_same_v<T, std::string>) {
          return toml_quote(*v);
        } else if constexpr (std::is_same_v<T, std::vector<DataSource>>) {
          std::string out;
          for (const DataSource& s : *v) {
            std::string w = fmt::format("{}", s.weight);
            if (w.find_first_of(".eEn") == std::string::npos) w += ".0";
            out += fmt::format("{}{{path = {}, weight = {}}}", out.empty() ? "" : ", ", toml_quote(s.path), w);
          }
          return "[" + out + "]";
        } else {
          return std::to_string(*v);
        }
      },
      p);
}
}  // namespace

std::string config_keys_table() {
  Config c = config_defaults();
  auto fields = fields_of(c);
  std::string out;
  for (auto& f : fields)
    out += fmt::format("{:<28} {:<7} {:<14} {}\n", f.key, short_type(f.ptr), toml_value(f.ptr), f.help);
  return out;
}

void config_load_string(Config& cfg, const std::string& text, const std::string& origin) {
  toml::table t;
  try {
    t = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    fail("{}:{}:{}: {}", origin, e.source().begin.line, e.source().begin.column, e.description());
  }
  auto fields = fields_of(cfg);
  load_table(cfg, fields, t, "", origin);
}

void config_load_file(Config& cfg, const std::string& path) {
  std::error_code ec;
  LOOM_CHECK(std::filesystem::exists(path, ec) || ec, "cannot open config file '{}'; check the path given to --config",
             path);
  // A regular file of bounded size: a directory, FIFO or device (/dev/zero) is refused, not
  // read as an empty config or read forever.
  config_load_string(cfg, input_read_all(path, "--config", kConfigMaxBytes), path);
}

void config_set(Config& cfg, const std::string& assignment) {
  // Settings are text (written to config.toml and JSON records): a path of other bytes would
  // fail there, late and in a library's words.
  LOOM_CHECK(utf8_valid(assignment), "--set {}: not UTF-8 text; loom's settings, paths among them, must be UTF-8",
             assignment.substr(0, assignment.find('=')));
  auto eq = assignment.find('=');
  LOOM_CHECK(eq != std::string::npos && eq > 0, "--set '{}': expected section.key=value", assignment);
  std::string key = assignment.substr(0, eq), value = assignment.substr(eq + 1);
  auto fields = fields_of(cfg);
  Field& f = find_field(fields, key, "--set");
  auto wrong = [&] { fail("--set {}: {} must be {}, got '{}'", key, key, type_name(f.ptr), value); };
  std::visit(
      [&](auto v) {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (std::is_same_v<T, ChoiceRef>) {
          std::string s = value;
          if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front())
            s = s.substr(1, s.size() - 2);
          choice_set(v, key, s, "--set");
        } else if constexpr (std::is_same_v<T, int> || std::is_same_v<T, int64_t>) {
          int64_t x;
          auto r = std::from_chars(value.data(), value.data() + value.size(), x);
          if (r.ec != std::errc() || r.ptr != value.data() + value.size()) wrong();
          if constexpr (std::is_same_v<T, int>)
            if (x < INT32_MIN || x > INT32_MAX) fail("--set {}: {} is out of range", key, value);
          *v = T(x);
        } else if constexpr (std::is_same_v<T, double>) {
          char* end = nullptr;
          double x = std::strtod(value.c_str(), &end);
          if (value.empty() || *end) wrong();
          if (!std::isfinite(x)) fail("--set {}: {} is not a finite number; every float key must be one", key, value);
          *v = x;
        } else if constexpr (std::is_same_v<T, bool>) {
          if (value != "true" && value != "false") wrong();
          *v = value == "true";
        } else if constexpr (std::is_same_v<T, std::vector<DataSource>>) {
          toml::table t;
          try {
            t = toml::parse("v = " + value, "--set " + key);
          } catch (const toml::parse_error&) {
            wrong();
          }
          *v = sources_from_node(*t.get("v"), key, "--set");
        } else {
          std::string s = value;
          if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front())
            s = s.substr(1, s.size() - 2);
          *v = s;
        }
      },
      f.ptr);
  cfg.set_keys.insert(key);
}

std::string config_to_toml(const Config& cfg, const std::string& only) {
  Config copy = cfg;
  std::string out, section;
  for (auto& f : fields_of(copy)) {
    if (!only.empty() && f.key.rfind(only + ".", 0) != 0) continue;
    const size_t dot = f.key.rfind('.');
    const std::string sec = f.key.substr(0, dot), name = f.key.substr(dot + 1);
    if (sec != section) {
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", sec);
      section = sec;
    }
    out += fmt::format("{} = {}\n", name, toml_value(f.ptr));
  }
  return out;
}

std::map<std::string, std::string> config_flat(const std::string& text) {
  std::map<std::string, std::string> out;
  std::string section;
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(at, nl - at);
    at = nl + 1;
    if (line.size() > 2 && line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos) out[section + "." + line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

std::vector<ConfigDiff> config_diff(const std::map<std::string, std::string>& a,
                                    const std::map<std::string, std::string>& b, const std::vector<std::string>& keys) {
  std::vector<std::string> all = keys;
  if (all.empty()) {
    std::set<std::string> both;
    for (const auto& [k, v] : a) both.insert(k);
    for (const auto& [k, v] : b) both.insert(k);
    all.assign(both.begin(), both.end());
  }
  std::vector<ConfigDiff> out;
  for (const std::string& k : all) {
    auto x = a.find(k), y = b.find(k);
    ConfigDiff d{k, x == a.end() ? "(absent)" : x->second, y == b.end() ? "(absent)" : y->second};
    if (d.a != d.b) out.push_back(std::move(d));
  }
  return out;
}

std::string config_disagreement(const std::vector<std::string>& texts) {
  std::string out;
  int differ = 0;
  const auto first = config_flat(texts.empty() ? "" : texts[0]);
  for (size_t r = 1; r < texts.size(); ++r) {
    if (texts[r] == texts[0]) continue;
    if (++differ > 4) continue;  // the first few name the problem
    std::string keys;
    for (const ConfigDiff& d : config_diff(first, config_flat(texts[r])))
      keys += fmt::format("{}{} = {} (rank 0: {})", keys.empty() ? "" : ", ", d.key, d.b, d.a);
    out += fmt::format("{}rank {}: {}", out.empty() ? "" : "; ", r, keys.empty() ? "its config text differs" : keys);
  }
  if (!differ) return "";
  return fmt::format(
      "the ranks of this job were launched with different configs or binaries: {}{}; launch every rank with the same "
      "config file, --set flags and loom binary",
      out, differ > 4 ? fmt::format(" (and {} more ranks)", differ - 4) : "");
}

}  // namespace loom
