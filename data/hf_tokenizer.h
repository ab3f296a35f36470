// Hugging Face tokenizer.json files of the BPE model, as the tokenizers library reads them:
// byte-level ones (GPT-2, LLaMA-3, Qwen, DeepSeek, GPT-4o) and SentencePiece-style ones ("▁"
// for spaces from a normalizer or Metaspace, byte fallback: Llama 2, Mistral, Gemma) alike.
// Normalizers and pre-tokenizers come from data/hf_pipeline.h; added tokens that are not
// special are split out as the file says (their text in a document becomes their ids: Qwen3's
// <tool_call>, DeepSeek-V3's <｜User｜>), while special tokens' text is tokenized as ordinary
// text (a document cannot put a special token in the data); invalid UTF-8 is replaced by
// U+FFFD first. A long text's pieces are made a batch at a time, and a long word is merged in
// the parts no token joins across (the same ids). Other models (WordPiece, Unigram, WordLevel)
// and components loom does not implement are refused by name. SentencePiece's own .model
// files are data/spm_tokenizer.h's.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace loom {

struct Normalizer;
struct PreTokenizer;

class HfTokenizer : public Tokenizer {
 public:
  explicit HfTokenizer(const std::string& path);
  HfTokenizer(const HfTokenizer& o);  // shares the tables, builds its own regular expressions
  ~HfTokenizer() override;
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  size_t vocab_size() const override;
  int32_t doc_token() const override;
  std::string doc_token_text() const override;
  std::unique_ptr<Tokenizer> clone() const override { return std::make_unique<HfTokenizer>(*this); }
  std::string kind() const override { return "hf"; }
  std::vector<std::string> files() const override;
  bool cuts_at_lone_newlines() const override;
  // The pieces the model sees (after added tokens, normalizer and pre-tokenizer), for tests.
  std::vector<std::string> pieces(const std::string& text) const;

  struct Tables;

 private:
  void encode_into(const std::string& text, std::vector<int32_t>& out, std::vector<std::string>* pieces) const;
  void bpe(std::string_view word, std::vector<int32_t>& out) const;        // splits a long word where it may
  void bpe_merge(std::string_view word, std::vector<int32_t>& out) const;  // merges it whole
  std::shared_ptr<const Tables> t_;
  std::unique_ptr<Normalizer> norm_;
  std::unique_ptr<PreTokenizer> pre_;
  struct WordHash {  // looked up by views, without a copy of the word
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  mutable std::unordered_map<std::string, std::vector<int32_t>, WordHash, std::equal_to<>> cache_;
  mutable int cuts_ = -1;  // cuts_at_lone_newlines, found on first use
};

}  // namespace loom
