// The commands people reach for after training: `loom eval` (loss and perplexity of a weights
// file on a data set, in any layout) and `loom generate` (text from a prompt, KV-cached).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "train/trainer.h"

namespace loom {

struct EvalOptions {
  std::string from;    // weights, as init.from takes them
  std::string config;  // empty: the shape from the weights (model_config_find), synthetic data
  std::vector<std::string> sets;
  std::string data;  // a token shard, directory of shards, or text file: data.path and data.val_path
  // A text or JSON Lines --data is tokenized first with this tokenizer (as generate chooses it:
  // given, else what the weights record); bytes read a text file as they always have.
  std::string tokenizer, vocab, merges, tokenizer_file;
  int64_t batches = -1;  // -1: data.val_batches; 0: every whole batch the validation data holds
  int threads = -1;      // per rank; -1: the config's train.threads
};
struct EvalResult {
  double loss = 0, perplexity = 0;
  int64_t tokens = 0, batches = 0;
};
// Collective under mpirun/srun; rank 0 prints the result.
EvalResult eval_run(const EvalOptions& opt, const TrainOptions& topt);

struct GenerateOptions {
  std::string from, config;
  std::vector<std::string> sets;
  std::string prompt;
  // byte | gpt2 (with vocab.json and merges.txt) | llama3 | hf | spm (with tokenizer_file); "":
  // what the weights record, else a tokenizer's files beside them, else byte
  std::string tokenizer, vocab, merges, tokenizer_file;
  int max_new = -1;          // -1: 64, or what the context leaves
  double temperature = 0.0;  // 0: greedy
  int top_k = 0;
  uint64_t seed = 1;
  // Decoding one token is a few small GEMVs: more threads only wait on each other (and spin
  // against other processes on a busy machine). 0: the config's train.threads.
  int threads = 1;
};
// Writes the prompt and its continuation to stdout as they come, the rate to stderr; returns
// the generated token ids.
std::vector<int32_t> generate_run(const GenerateOptions& opt);
struct TokenizerChoice {
  std::string name, vocab, merges, why;
  std::shared_ptr<const Tokenizer> opened;  // the tokenizer, where choosing it read it already
};
// generate's tokenizer: --tokenizer; else loom.tokenizer in the weights' metadata (its files
// from loom.tokenizer_dir or loom.tokenizer_file, or beside the weights); else tokenizer.json
// beside the weights where loom reads it (one it refuses is passed over with a warning), else
// vocab.json and merges.txt, or tokenizer.model beside them; else bytes. For hf and spm,
// `vocab` is the tokenizer's file.
TokenizerChoice tokenizer_choose(const GenerateOptions& opt);

}  // namespace loom
