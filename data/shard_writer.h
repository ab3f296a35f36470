// `loom data`: text files, or JSON Lines files (plain, gzip or zstd), or directories of them,
// to llm.c token shards: one document per text file or per record, each opened by the
// tokenizer's document token where it has one (llm.c's convention), tokenized on every thread
// and streamed to the shard (memory holds a batch of documents, not the corpus), with an
// optional validation split into a shard of its own, each rolled over into numbered shards past
// 2^31 - 1 tokens (data/shard_set.h). The shard records the tokenizer that made it
// (data/shards.h). On an error no output is replaced; on success all are, together.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

struct DataOptions {
  std::vector<std::string> inputs;  // files and directories (their files, recursively, sorted)
  std::string output;               // the training shard; the split's is OUTPUT's stem + "_val"
  std::string tokenizer = "byte", vocab, merges;
  std::string tokenizer_file;   // hf: a tokenizer.json; spm: a SentencePiece model
  std::string format = "text";  // text: a file is a document; jsonl: a record is one
  std::string text_key = "text";
  bool skip_bad = false;     // jsonl: skip (and count) records that cannot be read, else refuse
  int max_record_mb = 0;     // jsonl: the longest record, in MB (0: the default)
  int64_t shard_tokens = 0;  // a shard's most tokens, then OUT_000001.bin, ... (0: 2^31 - 1)
  double val_fraction = 0;   // 0: no split; else this share of the documents (of the tokens, for one)
  int threads = 0;           // 0: every core
  bool quiet = false;        // no summary (a caller's own shard)
  // The memory a text file may take (it is read whole, with its tokens beside it): -1 for
  // unknown; `memory_from` says where the number came from.
  int64_t memory_bytes = -1;
  std::string memory_from;
};

// The pieces of `text` that tokenize alike apart or together, cut only where the pre-tokenizer
// ends a piece anyway, each about `target` bytes: after a lone '\n' between two ASCII non-blank
// characters, and with `word_cuts` (GPT-2's and LLaMA-3's pre-tokenizers, the byte tokenizer)
// also before a space between an ASCII word or number and an ASCII word. ASCII on both sides: a
// byte of a multi-byte character may be white space's.
std::vector<std::string> text_chunks(const std::string& text, size_t target, bool word_cuts = false);
// Whether text_chunks may cut `text` before byte i (0 < i < size).
bool text_cut_ok(const std::string& text, size_t i, bool word_cuts);

void data_run(const DataOptions& opt);

}  // namespace loom
