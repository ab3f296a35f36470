// `loom data`: text files (or directories of them) to llm.c token shards, one document per
// file, each opened by the tokenizer's end-of-text token where it has one (llm.c's
// convention), tokenized on every thread, with an optional validation split into a shard of
// its own.
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
  // The memory the inputs may take (they are read whole, with their tokens beside them): -1 for
  // unknown; `memory_from` says where the number came from.
  int64_t memory_bytes = -1;
  std::string memory_from;
};

// The pieces of `text` that tokenize alike apart or together, cut only where the GPT-2
// pre-tokenizer ends a piece anyway (after a lone '\n' between two non-blank characters), each
// about `target` bytes.
std::vector<std::string> text_chunks(const std::string& text, size_t target);

void data_run(const DataOptions& opt);

}  // namespace loom
