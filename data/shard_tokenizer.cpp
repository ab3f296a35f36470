#include "data/shard_tokenizer.h"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "data/tokenizer.h"
#include "runtime/error.h"

namespace loom {

namespace {
namespace fs = std::filesystem;

// Every shard a run of `cfg` reads: its sources' (a directory's validation shards too) and
// data.val_path's.
std::vector<std::string> shards_of(const Config& cfg) {
  std::vector<std::string> paths;
  if (!cfg.data.path.empty()) paths.push_back(cfg.data.path);
  for (const DataSource& s : cfg.data.sources) paths.push_back(s.path);
  if (!cfg.data.val_path.empty()) paths.push_back(cfg.data.val_path);
  std::vector<std::string> out;
  for (const std::string& p : paths)
    for (bool val : {false, true})
      for (std::string& f : shard_files(p, val)) out.push_back(std::move(f));
  return out;
}

// The files a configured tokenizer reads, in the order `loom data` hashed them.
std::vector<std::string> config_files(const DataConfig& d) {
  if (d.tokenizer == "gpt2") return {d.tokenizer_dir + "/vocab.json", d.tokenizer_dir + "/merges.txt"};
  if (d.tokenizer == "llama3") return {d.tokenizer_dir + "/tokenizer.model"};
  if (d.tokenizer == "hf" || d.tokenizer == "spm") return {d.tokenizer_file};
  return {};
}

// data.tokenizer and its files from the record, where the recorded files are there unchanged
// and the config's keys can name them; else why not.
std::string tokenizer_from(const TokenizerRecord& r, DataConfig& d) {
  if (r.kind == "byte") {
    d.tokenizer = "byte";
    return "";
  }
  if (r.files.empty()) return "its files' paths were too long to record";
  for (const std::string& f : r.files)
    if (!fs::is_regular_file(f)) return fmt::format("'{}' is no longer there", f);
  if (files_hash(r.files) != r.hash)
    return fmt::format("'{}' changed since the shards were made",
                       r.files.size() == 1 ? r.files[0] : r.files[0] + " or another");
  const std::string dir = fs::path(r.files[0]).parent_path().string();
  auto named = [&](size_t i, const char* name) { return fs::path(r.files[i]).filename() == name; };
  if (r.kind == "gpt2") {
    if (r.files.size() != 2 || !named(0, "vocab.json") || !named(1, "merges.txt") ||
        fs::path(r.files[1]).parent_path() != fs::path(dir))
      return "data.tokenizer_dir names GPT-2's files only as DIR/vocab.json and DIR/merges.txt";
    d.tokenizer_dir = dir;
  } else if (r.kind == "llama3") {
    if (!named(0, "tokenizer.model")) return "data.tokenizer_dir names LLaMA-3's file only as DIR/tokenizer.model";
    d.tokenizer_dir = dir;
  } else if (r.kind == "hf" || r.kind == "spm") {
    d.tokenizer_file = r.files[0];
  } else {
    return fmt::format("loom does not know the kind '{}'", r.kind);
  }
  d.tokenizer = r.kind;
  return "";
}
}  // namespace

TokenizerRecord data_tokenizer_infer(Config& cfg, bool warn) {
  if (cfg.data.source != DataKind::tokens) return {};
  TokenizerRecord r;
  std::string from, unrecorded;  // the first shard with a record, and the first without one
  for (const std::string& shard : shards_of(cfg)) {
    TokenizerRecord here = shard_record_read(shard);
    if (here.kind.empty()) {
      if (unrecorded.empty()) unrecorded = shard;
      continue;
    }
    LOOM_CHECK(from.empty() || here == r,
               "token shards '{}' and '{}' were made by different tokenizers ({}; {}); one run trains on one "
               "tokenizer's ids: remake one of them with the other's tokenizer (`loom data`)",
               from, shard, r.describe(), here.describe());
    if (from.empty()) from = shard, r = std::move(here);
  }
  if (r.kind.empty()) return r;
  ModelConfig& m = cfg.model;
  DataConfig& d = cfg.data;
  // A shard without a record may hold any ids: with one in the run, nothing is taken from the
  // others' record (shards without one train as before, from the config).
  const bool takes = unrecorded.empty();
  const bool vocab_set = cfg.set_keys.count("model.vocab_size") > 0;
  // The byte tokenizer's 256 ids fit the default vocabulary, which runs on byte shards without a
  // record had (their checkpoints resume on shards made again).
  if (!vocab_set && takes && r.kind != "byte") {
    m.vocab_size = int(r.vocab_size);
  } else {
    const std::string advice =
        !takes      ? fmt::format(" ('{}' records no tokenizer, so the data does not give it)", unrecorded)
        : vocab_set ? ", or leave it out (the data gives it)"
                    : "";
    LOOM_CHECK(m.vocab_size >= r.vocab_size,
               "model.vocab_size = {}{} is smaller than the vocabulary of the tokenizer that made '{}': {}; set it to "
               "{} or more{}",
               m.vocab_size, vocab_set ? "" : " (the default)", from, r.describe(), r.vocab_size, advice);
  }
  if (!takes) {
    // A config's own data.tokenizer must still be the recorded shards' tokenizer.
    LOOM_CHECK(d.tokenizer.empty() || d.tokenizer == r.kind,
               "data.tokenizer = \"{}\", but token shard '{}' was made by {}; set data.tokenizer to the one that made "
               "it",
               d.tokenizer, from, r.describe());
    if (warn)
      spdlog::warn(
          "token shard '{}' records no tokenizer (llm.c's, or an earlier loom's), so this run takes nothing from the "
          "record of '{}' ({}): model.vocab_size, data.doc_token and data.tokenizer are the config's",
          unrecorded, from, r.describe());
    return r;
  }
  if (!cfg.set_keys.count("data.doc_token") && r.doc_token >= 0) d.doc_token = r.doc_token;
  if (!d.tokenizer.empty()) {
    LOOM_CHECK(d.tokenizer == r.kind,
               "data.tokenizer = \"{}\", but the token shards were made by {} ('{}'); set data.tokenizer to the one "
               "that made them, or leave it out (the shards record it)",
               d.tokenizer, r.describe(), from);
    const std::vector<std::string> files = config_files(d);
    bool there = !files.empty();
    for (const std::string& f : files) there = there && fs::is_regular_file(f);
    LOOM_CHECK(!there || files_hash(files) == r.hash,
               "data.tokenizer's files ('{}') differ from those that made the token shards ({}); name the files "
               "that made them, or leave data.tokenizer out (the shards record it)",
               files.empty() ? "" : files[0], r.describe());
  } else if (const std::string why = tokenizer_from(r, d); !why.empty() && warn) {
    spdlog::warn(
        "the token shards record their tokenizer, {}, but {}: exports will not carry it (set "
        "data.tokenizer and its files to record it)",
        r.describe(), why);
  }
  return r;
}

}  // namespace loom
