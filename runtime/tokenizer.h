// Tokenizers for `loom data`: byte-level (ids 0..255) and GPT-2's byte-level BPE read from
// Hugging Face's vocab.json and merges.txt. The GPT-2 pre-tokenizer splits like its regex,
// with one simplification: every non-ASCII code point counts as a letter (the regex asks
// Unicode for letters and numbers), so rare scripts' punctuation may split differently.
#pragma once
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace loom {

std::vector<int32_t> tokenize_bytes(const std::string& text);

class Gpt2Bpe {
 public:
  Gpt2Bpe(const std::string& vocab_json_path, const std::string& merges_path);
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  size_t vocab_size() const { return vocab_.size(); }
  int32_t id_of(const std::string& token) const {  // -1 where the vocabulary lacks it
    auto it = vocab_.find(token);
    return it == vocab_.end() ? -1 : it->second;
  }

 private:
  void encode_word(const std::string& word, std::vector<int32_t>& out) const;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::map<std::pair<std::string, std::string>, int> ranks_;
  std::string byte_to_unicode_[256];
  std::unordered_map<std::string, uint8_t> unicode_to_byte_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// Splits text the way GPT-2's pre-tokenizer regex does (see the note above).
std::vector<std::string> gpt2_pretokenize(const std::string& text);

}  // namespace loom
