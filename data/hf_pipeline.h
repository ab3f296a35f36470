// The text side of a Hugging Face tokenizer.json, before its model: normalizers (NFC, NFD,
// NFKC and NFKD through utf8proc; Replace; Prepend; Sequence) and pre-tokenizers (Split by a
// string or an Oniguruma regular expression, as the tokenizers library compiles them, with
// its five behaviours; ByteLevel; Metaspace; Digits; Sequence), each read from the file and
// refused by name where loom does not implement it. Text reaching them is valid UTF-8.
// Not here: added tokens and the BPE model (data/hf_tokenizer.h).
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

// An Oniguruma expression over UTF-8 in Oniguruma's default syntax (ONIG_SYNTAX_DEFAULT, its
// own, Ruby's with more), as the tokenizers library's onig crate compiles it.
class Regex {
 public:
  explicit Regex(const std::string& pattern);  // an Error naming the pattern where it does not compile
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // [begin, end) of each match, left to right, as an iterator over matches finds them (an
  // empty match right after a match is skipped; after an empty match the search moves one
  // character on).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const;
  void each_match(std::string_view s, const std::function<void(size_t, size_t)>& found) const;  // the same, one by one

 private:
  void* reg_ = nullptr;  // regex_t*
  void* region_ = nullptr;
};

struct Normalizer {
  virtual ~Normalizer() = default;
  virtual void apply(std::string& s) const = 0;
  virtual bool prepends() const { return false; }  // adds text at the start (Prepend)
};
// Null JSON: no normalizer (nullptr).
std::unique_ptr<Normalizer> normalizer_from(const nlohmann::json& j);

struct PreTokenizer {
  using Batch = std::function<void(std::vector<std::string>&)>;
  virtual ~PreTokenizer() = default;
  // Splits every piece further; `first`: the pieces open the text (Metaspace's "first").
  virtual void split(std::vector<std::string>& pieces, bool first) const = 0;
  // The pieces split({s}, first) gives, handed to `each` in order, a batch at a time where they
  // come match by match (a regular expression that isolates), else all at once: a long text's
  // pieces are not all held together.
  virtual void split_stream(std::string_view s, bool first, const Batch& each) const;
  virtual bool byte_level() const { return false; }
};
std::unique_ptr<PreTokenizer> pre_tokenizer_from(const nlohmann::json& j);

}  // namespace loom
