// SentencePiece models (a .model file: Llama 2's and Gemma's tokenizer.model, T5's, any
// spm_train output) through the SentencePiece library itself, which libloom_spm.so (beside
// the loom binary; data/spm_shim.cpp) wraps. Documents open with the model's <s> where it has
// one; text that reads as a control token (<s>, </s>) is ordinary text, as the library
// encodes it; invalid UTF-8 is replaced by U+FFFD first.
#pragma once
#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace loom {

class SpmTokenizer : public Tokenizer {
 public:
  explicit SpmTokenizer(const std::string& path);
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  size_t vocab_size() const override;
  int32_t doc_token() const override;
  std::string doc_token_text() const override;
  // Encoding is const and thread-safe in the library: copies share the model.
  std::unique_ptr<Tokenizer> clone() const override { return std::make_unique<SpmTokenizer>(*this); }
  std::string kind() const override { return "spm"; }
  std::vector<std::string> files() const override { return {path_}; }
  // The model's own normalization puts "▁" before the text: a cut would add one.
  bool cuts_at_lone_newlines() const override { return false; }

 private:
  std::string path_;
  std::shared_ptr<const void> sp_;  // the library's processor, closed with the last copy
};

}  // namespace loom
