// Tokenizers for `loom data` and `loom generate`: byte-level (ids 0..255), GPT-2's byte-level
// BPE read from Hugging Face's vocab.json and merges.txt, and LLaMA-3's read from the
// tiktoken ranks file Meta ships (tokenizer.model). Both pre-tokenize as their regular
// expressions do, over Unicode's letter, number and white-space classes
// (data/unicode_ranges.inc). Special-token text in the input is ordinary text.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace loom {

std::vector<int32_t> tokenize_bytes(const std::string& text);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual size_t vocab_size() const = 0;
  // The token that opens each document in `loom data`'s shards, or -1 (llm.c's conventions:
  // GPT-2's <|endoftext|>, LLaMA-3's <|begin_of_text|>).
  virtual int32_t doc_token() const = 0;
  virtual std::string doc_token_text() const = 0;
  // A copy with its own caches, for another thread.
  virtual std::unique_ptr<Tokenizer> clone() const = 0;
  // What a shard records of it: its kind (gpt2, llama3, ...) and the files it was read from.
  virtual std::string kind() const = 0;
  virtual std::vector<std::string> files() const = 0;
  // Whether text cut after a lone '\n' between two ASCII non-blank characters (text_chunks)
  // tokenizes apart to the ids of the whole, so that one document spreads over threads.
  virtual bool cuts_at_lone_newlines() const { return true; }
};

class Gpt2Bpe : public Tokenizer {
 public:
  Gpt2Bpe(const std::string& vocab_json_path, const std::string& merges_path);
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  size_t vocab_size() const override { return vocab_.size(); }
  int32_t doc_token() const override { return id_of("<|endoftext|>"); }
  std::string doc_token_text() const override { return "<|endoftext|>"; }
  std::unique_ptr<Tokenizer> clone() const override { return std::make_unique<Gpt2Bpe>(*this); }
  std::string kind() const override { return "gpt2"; }
  std::vector<std::string> files() const override { return files_; }
  int32_t id_of(const std::string& token) const {  // -1 where the vocabulary lacks it
    auto it = vocab_.find(token);
    return it == vocab_.end() ? -1 : it->second;
  }

 private:
  void encode_word(const std::string& word, std::vector<int32_t>& out) const;
  std::vector<std::string> files_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::map<std::pair<std::string, std::string>, int> ranks_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// LLaMA-3: 128000 byte sequences ranked by merge priority (a line "base64 rank" each), then
// 256 special tokens (<|begin_of_text|> = 128000, <|end_of_text|> = 128001, ...).
class Llama3Bpe : public Tokenizer {
 public:
  explicit Llama3Bpe(const std::string& ranks_path);
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  size_t vocab_size() const override { return id_to_bytes_.size(); }
  int32_t doc_token() const override { return kRegular; }
  std::string doc_token_text() const override { return "<|begin_of_text|>"; }
  std::unique_ptr<Tokenizer> clone() const override { return std::make_unique<Llama3Bpe>(*this); }
  std::string kind() const override { return "llama3"; }
  std::vector<std::string> files() const override { return {file_}; }
  static constexpr int32_t kRegular = 128000, kSpecial = 256;

 private:
  void encode_piece(const std::string& piece, std::vector<int32_t>& out) const;
  std::string file_;
  std::unordered_map<std::string, int32_t> ranks_;
  std::vector<std::string> id_to_bytes_;  // regular tokens' bytes, then the special tokens' names
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// `name`: byte | gpt2 (vocab: vocab.json, merges: merges.txt) | llama3 (vocab: tokenizer.model)
// | hf (vocab: a tokenizer.json, data/hf_tokenizer.h) | spm (vocab: a SentencePiece model,
// data/spm_tokenizer.h). byte gives null: bytes are ids.
std::unique_ptr<Tokenizer> tokenizer_open(const std::string& name, const std::string& vocab, const std::string& merges);

// xxh64 of the files' bytes one after another: what a shard records of its tokenizer.
uint64_t files_hash(const std::vector<std::string>& files);

// Splits text the way GPT-2's and LLaMA-3's pre-tokenizer regular expressions do, handing each
// piece on as it is found (a long document's pieces are not held), or all of them.
using Pieces = std::function<void(std::string_view)>;
void gpt2_pretokenize(std::string_view text, const Pieces& emit);
void llama3_pretokenize(std::string_view text, const Pieces& emit);
std::vector<std::string> gpt2_pretokenize(std::string_view text);
std::vector<std::string> llama3_pretokenize(std::string_view text);

}  // namespace loom
