#include "launch/infer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "checkpoint/hf_export.h"
#include "data/batches.h"
#include "data/hf_tokenizer.h"
#include "data/line_reader.h"
#include "data/shard_tokenizer.h"
#include "data/shard_writer.h"
#include "data/tokenizer.h"
#include "model/cached_decoder.h"
#include "plan/memory.h"
#include "runtime/error.h"

namespace loom {

namespace {
// The config of a weights file: the shape the file carries (required without --config), then
// --config over it, then --set (for eval, with the data to read: `reads_data` takes data.source
// from the files when the config names data but no source).
Config config_for(const std::string& from, const std::string& config, std::vector<std::string> sets,
                  bool reads_data = false) {
  LOOM_CHECK(std::filesystem::exists(from), "--from '{}' does not exist", from);
  Config cfg = config_defaults();
  if (config.empty()) {
    cfg = model_config_find(from);
  } else {
    try {
      cfg = model_config_find(from);
    } catch (const Error&) {
      cfg = config_defaults();  // no shape in the file: the config's [model] gives it
    }
    config_load_file(cfg, config);
  }
  for (auto& s : sets) config_set(cfg, s);
  if (reads_data) {
    data_source_infer(cfg);
    data_tokenizer_infer(cfg, true);
  }
  config_validate(cfg);
  const bool model_sets = std::any_of(sets.begin(), sets.end(), [](auto& s) { return s.rfind("model.", 0) == 0; });
  model_config_check_file(
      cfg, from,
      config.empty() && !model_sets ? "loom.model metadata (or config.json)" : "description, --config and --set");
  return cfg;
}
}  // namespace

namespace {
// A directory of this process's own, removed with everything in it when the object goes.
struct TempDir {
  std::string path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "loom_eval_XXXXXX").string();
    LOOM_CHECK(::mkdtemp(pattern.data()) != nullptr, "cannot make a temporary directory in {}",
               std::filesystem::temp_directory_path().string());
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};
}  // namespace

EvalResult eval_run(const EvalOptions& given, const TrainOptions& topt) {
  // Text or JSON Lines scored by a model of another tokenizer than bytes: tokenized first, with
  // the tokenizer generate would use, into a shard of this process's own.
  EvalOptions opt = given;
  std::optional<TempDir> tokenized;
  std::string tokenized_with;
  if (!opt.data.empty() && data_source_of(opt.data, "--data") == DataKind::text) {
    GenerateOptions g;
    g.from = opt.from, g.tokenizer = opt.tokenizer, g.vocab = opt.vocab, g.merges = opt.merges;
    g.tokenizer_file = opt.tokenizer_file;
    const TokenizerChoice tc = tokenizer_choose(g);
    if (tc.name != "byte" || name_json(opt.data)) {
      // Each rank's own shard would name another data.path, which the ranks must agree on.
      LOOM_CHECK(topt.world_size == 1,
                 "loom eval tokenizes a text or JSON Lines --data in one process only; under mpirun or srun give it "
                 "token shards: `loom data {}{} OUT.bin` first",
                 name_json(opt.data) ? "--format jsonl " : "", opt.data);
      tokenized.emplace();
      DataOptions d;
      d.inputs = {opt.data};
      d.output = tokenized->path + "/data.bin";
      d.tokenizer = tc.name;
      (tc.name == "hf" || tc.name == "spm" ? d.tokenizer_file : d.vocab) = tc.vocab;
      d.merges = tc.merges;
      d.format = name_json(opt.data) ? "jsonl" : "text";
      d.threads = std::max(opt.threads, 0);
      d.quiet = true;
      data_run(d);
      opt.data = d.output;
      tokenized_with = fmt::format(" (tokenized with {}: {})", tc.name, tc.why);
    }
  }
  std::vector<std::string> sets = opt.sets;
  sets.insert(sets.end(), {"init.from=" + opt.from, "export.final=", "log.dir=", "log.trace=false",
                           "log.trace_steps=", "log.tensorboard=false", "log.grad_norms=false",
                           // eval reads init.from only: a config's checkpointing would load or save
                           "checkpoint.resume=none", "checkpoint.every=0", "checkpoint.dir="});
  if (opt.threads >= 0) sets.push_back(fmt::format("train.threads={}", opt.threads));
  std::string what = "the synthetic corpus (no --data, and no data in the config)";
  if (!opt.data.empty()) {
    // The training file of the config (with no val_path of its own) is scored on its held-out
    // part, as training validated on it; any other file whole.
    Config probe = config_for(opt.from, opt.config, opt.sets);
    std::error_code ec;
    const bool training_file = !probe.data.path.empty() && probe.data.val_path.empty() &&
                               std::filesystem::equivalent(probe.data.path, opt.data, ec);
    sets.push_back("data.path=" + opt.data);
    if (!training_file) sets.push_back("data.val_path=" + opt.data);
    what = training_file ? fmt::format("the held-out end of training file '{}', as training validated", opt.data)
                         : fmt::format("'{}' from its start{}", given.data, tokenized_with);
    // Data given to a config that had none: token shards or text, by the file's look.
    if (probe.data.source == DataKind::synthetic)
      sets.push_back(fmt::format("data.source={}", data_source_of(opt.data, "--data")));
  }
  const Config cfg = config_for(opt.from, opt.config, sets, true);
  if (opt.data.empty() && cfg.data.source != DataKind::synthetic)
    what = fmt::format("the config's validation data ({})",
                       cfg.data.val_path.empty() ? "the held-out end of data.path" : "data.val_path");
  TrainOptions t = topt;
  t.quiet = true;
  Trainer trainer(cfg, t);
  trainer.init();
  const int64_t have = trainer.val_batches_available();
  int64_t batches = opt.batches < 0 ? std::min<int64_t>(cfg.data.val_batches, have) : opt.batches;
  if (batches == 0) {
    LOOM_CHECK(cfg.data.source != DataKind::synthetic,
               "--batches 0 (every batch) needs finite data: synthetic data never ends");
    batches = have;
  }
  LOOM_CHECK(batches > 0 && batches <= have,
             "the validation data holds {} whole batches of {} sequences x {} tokens; asked for {} ({})", have,
             cfg.train.global_batch, cfg.model.seq_len, batches, trainer.data_describe());
  EvalResult r;
  r.loss = trainer.validate(batches);
  // Weights that overflow on the data give no loss to report (and exit 0 said all was well).
  LOOM_CHECK(std::isfinite(r.loss),
             "eval {}: the loss over {} is {}, not finite: these weights overflow on this data (a run that "
             "diverged, or one whose learning rate was too high, wrote them); evaluate an earlier checkpoint",
             opt.from, plural(batches, "batch"), r.loss);
  r.perplexity = std::exp(r.loss);
  r.batches = batches;
  r.tokens = batches * cfg.train.global_batch * cfg.model.seq_len;
  if (t.world_rank == 0)
    fmt::print("eval {}: loss {:.6f}, perplexity {:.4f} over {} ({} of {} x {}) of {}: {}\n", opt.from, r.loss,
               r.perplexity, plural(r.tokens, "token"), plural(batches, "batch"), cfg.train.global_batch,
               cfg.model.seq_len, what, trainer.data_describe());
  return r;
}

TokenizerChoice tokenizer_choose(const GenerateOptions& opt) {
  namespace fs = std::filesystem;
  TokenizerChoice c{opt.tokenizer, opt.vocab, opt.merges, "--tokenizer"};
  if (c.name == "hf" || c.name == "spm") c.vocab = opt.tokenizer_file;
  LOOM_CHECK(opt.tokenizer_file.empty() || c.name == "hf" || c.name == "spm",
             "--tokenizer-file is for --tokenizer hf and spm");
  const fs::path dir = fs::is_directory(opt.from) ? fs::path(opt.from) : fs::path(opt.from).parent_path();
  // Tokenizer files count only in a Hugging Face directory (the weights are one, or config.json
  // is beside them), not in any folder that happens to hold a vocab.json.
  const bool hf_dir = fs::is_directory(opt.from) || fs::is_regular_file(dir / "config.json");
  auto beside = [&](const char* name) { return hf_dir && fs::is_regular_file(dir / name); };
  const bool gpt2_beside = beside("vocab.json") && beside("merges.txt");
  const auto meta = weights_metadata(opt.from);
  const auto recorded = meta.find("loom.tokenizer");
  if (c.name.empty() && recorded != meta.end()) c.name = recorded->second, c.why = "recorded with the weights";
  if (c.name.empty() && beside("tokenizer.json")) {
    // Read here: a tokenizer.json of a kind loom does not read (WordPiece, Unigram) leaves the
    // choice to the files looked at before loom read any tokenizer.json, as it was then.
    const std::string file = (dir / "tokenizer.json").string();
    try {
      c.opened = std::make_shared<HfTokenizer>(file);
      c.name = "hf", c.why = "tokenizer.json beside the weights";
    } catch (const Error& e) {
      fmt::print(stderr, "warning: '{}' beside the weights is not one loom reads ({}); not using it\n", file, e.what());
    }
  }
  if (c.name.empty()) {
    if (gpt2_beside)
      c.name = "gpt2", c.why = "vocab.json and merges.txt beside the weights";
    else if (beside("tokenizer.model"))
      c.name = "llama3", c.why = "tokenizer.model beside the weights";
    else
      c.name = "byte", c.why = "none recorded";
  }
  LOOM_CHECK(c.name == "byte" || c.name == "gpt2" || c.name == "llama3" || c.name == "hf" || c.name == "spm",
             "tokenizer '{}' ({}) is not byte, gpt2, llama3, hf or spm", c.name, c.why);
  // A file kind's file: given, else beside the weights, else where the weights record it.
  auto file_of = [&](const char* name, const char* meta_key, const std::string& what) {
    if (beside(name)) return (dir / name).string();
    const auto d = meta.find(meta_key);
    if (d == meta.end()) return std::string();
    const std::string f = std::string(meta_key) == "loom.tokenizer_dir" ? d->second + "/" + name : d->second;
    LOOM_CHECK(fs::is_regular_file(f), "the weights were trained with {} from '{}', which is no longer there; pass {}",
               what, f,
               c.name == "gpt2"     ? "--vocab and --merges"
               : c.name == "llama3" ? "--vocab"
                                    : "--tokenizer-file");
    return f;
  };
  if (c.vocab.empty()) {
    if (c.name == "llama3") c.vocab = file_of("tokenizer.model", "loom.tokenizer_dir", "LLaMA-3's tokenizer");
    if (c.name == "hf") c.vocab = file_of("tokenizer.json", "loom.tokenizer_file", "a Hugging Face tokenizer");
    if (c.name == "spm") c.vocab = file_of("tokenizer.model", "loom.tokenizer_file", "a SentencePiece model");
  }
  if (c.name == "gpt2" && c.vocab.empty() && c.merges.empty()) {
    c.vocab = file_of("vocab.json", "loom.tokenizer_dir", "GPT-2's tokenizer");
    c.merges = file_of("merges.txt", "loom.tokenizer_dir", "GPT-2's tokenizer");
  }
  LOOM_CHECK(c.name != "llama3" || !c.vocab.empty(), "the llama3 tokenizer ({}) needs --vocab tokenizer.model", c.why);
  LOOM_CHECK((c.name != "hf" && c.name != "spm") || !c.vocab.empty(), "the {} tokenizer ({}) needs --tokenizer-file",
             c.name, c.why);
  LOOM_CHECK(c.name != "gpt2" || (!c.vocab.empty() && !c.merges.empty()),
             "the gpt2 tokenizer ({}) needs --vocab vocab.json and --merges merges.txt", c.why);
  return c;
}

std::vector<int32_t> generate_run(const GenerateOptions& opt) {
  LOOM_CHECK(std::isfinite(opt.temperature) && opt.temperature >= 0,
             "--temperature {} must be a finite number >= 0 (0: greedy)", opt.temperature);
  const Config cfg = config_for(opt.from, opt.config, opt.sets);
  const TokenizerChoice tc = tokenizer_choose(opt);
  const std::shared_ptr<const Tokenizer> bpe = tc.opened ? tc.opened : tokenizer_open(tc.name, tc.vocab, tc.merges);
  const int tok_vocab = bpe ? int(bpe->vocab_size()) : 256;
  LOOM_CHECK(tok_vocab <= cfg.model.vocab_size,
             "the {} tokenizer ({}) has {} tokens but the model's vocabulary has {}; use the tokenizer it was trained "
             "with",
             tc.name, tc.why, tok_vocab, cfg.model.vocab_size);
  if (tc.why == "none recorded" && cfg.model.vocab_size > 512)
    fmt::print(stderr,
               "warning: no tokenizer is recorded with these weights and the model's vocabulary has {} tokens, so the "
               "byte tokenizer (256) is likely not the one it learned; pass --tokenizer (gpt2, llama3, hf, spm) and "
               "its files\n",
               cfg.model.vocab_size);
  LOOM_CHECK(!opt.prompt.empty(), "--prompt is empty; give the text to continue");
  std::vector<int32_t> ids = bpe ? bpe->encode(opt.prompt) : tokenize_bytes(opt.prompt);
  auto decode = [&](int32_t id) { return bpe ? bpe->decode({id}) : std::string(1, char(uint8_t(id))); };

  threads_set(opt.threads > 0 ? opt.threads : cfg.train.threads);
  memory_fit_rough(cfg, DType::f32, 1, memory_available(DeviceKind::cpu, 1));  // before the CachedDecoder allocates
  CachedDecoder dec(model_dims(cfg), [&](const ParamRegistry& reg, float* w) { return model_load(reg, w, opt.from); });
  if (!dec.unused().empty())
    fmt::print(stderr, "{} in {} unused (first: {})\n", plural(dec.unused().size(), "tensor"), opt.from,
               dec.unused().front());
  const int room = dec.context() - int(ids.size());
  LOOM_CHECK(room > 0, "the prompt is {}, and the model's context (model.seq_len) is {}; shorten it",
             plural(ids.size(), "token"), dec.context());
  const int max_new = opt.max_new < 0 ? std::min(64, room) : opt.max_new;
  LOOM_CHECK(max_new <= room,
             "--max-new {} does not fit: the prompt is {} of the model's {}-token context; use --max-new {} "
             "or less",
             max_new, plural(ids.size(), "token"), dec.context(), room);
  const SampleOptions so{opt.temperature, opt.top_k};
  std::mt19937_64 rng(opt.seed);
  std::fwrite(opt.prompt.data(), 1, opt.prompt.size(), stdout);
  std::fflush(stdout);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits = dec.forward(ids.data(), int(ids.size()));
  std::vector<int32_t> out;
  for (int i = 0; i < max_new; ++i) {
    // Sampled from the tokenizer's ids only: a padded or unused id has no text.
    const int32_t next = token_sample(logits.data(), tok_vocab, so, rng);
    out.push_back(next);
    const std::string text = decode(next);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    if (i + 1 < max_new) logits = dec.forward(&next, 1);
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);  // before the summary on stderr, where both go to one pipe
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print(stderr, "{} prompt + {} new tokens in {:.2f} s ({:.1f} tokens/s; tokenizer {}, {}; {}, seed {})\n",
             ids.size(), out.size(), s, double(out.size()) / s, tc.name, tc.why,
             opt.temperature > 0 ? fmt::format("temperature {}, top-k {}", opt.temperature, opt.top_k) : "greedy",
             opt.seed);
  return out;
}

}  // namespace loom
