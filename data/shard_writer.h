// `loom data`: text files (or directories of them) to llm.c token shards, one document per
// file, each opened by the tokenizer's end-of-text token where it has one (llm.c's
// convention), tokenized on every thread a window at a time and streamed to the shard (memory
// bounded whatever the inputs' size), with an optional validation split into a shard of its own.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

struct DataOptions {
  std::vector<std::string> inputs;  // files and directories (their files, recursively, sorted)
  std::string output;               // the training shard; the split's is OUTPUT's stem + "_val"
  std::string tokenizer = "byte", vocab, merges;
  double val_fraction = 0;  // 0: no split; else this share of the documents (of the tokens, for one)
  int threads = 0;          // 0: every core
};

// The pieces of `text` that tokenize alike apart or together, cut only where the GPT-2 and
// LLaMA-3 pre-tokenizers end a piece anyway (after a lone '\n' between two ASCII non-blank
// characters, or before a space between an ASCII word and the next), each about `target` bytes.
std::vector<std::string> text_chunks(const std::string& text, size_t target);

void data_run(const DataOptions& opt);

}  // namespace loom
