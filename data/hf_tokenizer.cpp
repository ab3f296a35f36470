#include "data/hf_tokenizer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <string_view>

#include "data/hf_pipeline.h"
#include "data/token_text.h"
#include "runtime/error.h"
#include "runtime/file.h"
#include "runtime/utf8.h"

namespace loom {

using nlohmann::json;

namespace {
constexpr size_t kWordWhole = 256;            // a word up to this many bytes is merged whole (and cached)
constexpr size_t kWordCut = size_t(1) << 20;  // no part of a longer one is longer than this
struct ViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, ViewHash, std::equal_to<>>;

// Leftmost-longest matching of the added tokens (as the tokenizers library's Aho-Corasick
// does): a byte trie walked from each position that can start one.
struct AddedMatcher {
  std::vector<int32_t> id{-1};  // per node: the token ending there, or -1
  std::unordered_map<uint64_t, int32_t> next;
  bool starts[256] = {};
  size_t count = 0;
  void add(const std::string& s, int32_t token) {
    if (s.empty()) return;
    int32_t node = 0;
    for (unsigned char c : s) {
      const uint64_t key = uint64_t(node) << 8 | c;
      auto it = next.find(key);
      if (it == next.end()) {
        it = next.emplace(key, int32_t(id.size())).first;
        id.push_back(-1);
      }
      node = it->second;
    }
    id[size_t(node)] = token;
    starts[uint8_t(s[0])] = true;
    ++count;
  }
  // Calls each(offset, text, token) for the text between tokens (token -1) and each token.
  void split(std::string_view s, const std::function<void(size_t, std::string_view, int32_t)>& each) const {
    size_t clean = 0, i = 0;
    while (count > 0 && i < s.size()) {
      if (!starts[uint8_t(s[i])]) {
        ++i;
        continue;
      }
      int32_t node = 0, best = -1;
      size_t best_len = 0;
      for (size_t k = i; k < s.size(); ++k) {
        auto it = next.find(uint64_t(node) << 8 | uint8_t(s[k]));
        if (it == next.end()) break;
        node = it->second;
        if (id[size_t(node)] >= 0) best = id[size_t(node)], best_len = k - i + 1;
      }
      if (best < 0) {
        ++i;
        continue;
      }
      if (i > clean) each(clean, s.substr(clean, i - clean), -1);
      each(i, s.substr(i, best_len), best);
      i += best_len;
      clean = i;
    }
    if (clean < s.size()) each(clean, s.substr(clean), -1);
  }
};
}  // namespace

struct HfTokenizer::Tables {
  std::string path;
  json normalizer, pre_tokenizer;
  Vocab vocab;
  std::vector<std::string> id_to_token;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a, b) -> (rank, merged)
  int32_t unk = -1;
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false, byte_level = false;
  int32_t byte_ids[256];  // <0xAB> tokens, for byte fallback
  AddedMatcher raw_added, normalized_added;
  bool added_newline = false;  // an added token holds '\n' (text cut there would split it)
  int32_t doc = -1;
  // Adjacent characters (code points a << 32 | b, sorted) that some token holds: a long word
  // splits exactly between any other two, since no merge can join across them. Empty with
  // `joins_all` where merges join byte-fallback tokens (whose text is not the word's).
  std::vector<uint64_t> joined;
  bool joins_all = false;
  mutable std::atomic<bool> warned_cut{false};  // a long word with no such place was cut
};

namespace {

// The document token: the one the post-processor puts first, else tokenizer_config.json's
// bos_token beside the file, else a special token with one of the usual names.
int32_t doc_token_find(const json& j, const std::string& path, const Vocab& specials) {
  auto id_of = [&](const std::string& text) {
    auto it = specials.find(text);
    return it == specials.end() ? -1 : it->second;
  };
  const json& post = j.contains("post_processor") ? j["post_processor"] : json();
  if (post.is_object() && post.value("type", "") == "TemplateProcessing" && post.contains("single") &&
      !post["single"].empty() && post["single"][0].contains("SpecialToken"))
    if (const int32_t id = id_of(post["single"][0]["SpecialToken"].value("id", "")); id >= 0) return id;
  const auto config = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::is_regular_file(config)) {
    try {
      const json c = json::parse(input_read_all(config.string(), "tokenizer_config.json", int64_t(64) << 20));
      if (c.contains("bos_token")) {
        const json& b = c["bos_token"];
        const std::string text = b.is_string() ? b.get<std::string>() : b.is_object() ? b.value("content", "") : "";
        if (const int32_t id = id_of(text); id >= 0) return id;
      }
    } catch (const json::exception&) {  // not ours to refuse: the tokenizer is tokenizer.json
    }
  }
  for (const char* name : {"<|begin_of_text|>", "<|endoftext|>", "<s>", "<bos>",
                           "<\xef\xbd\x9c"
                           "begin\xe2\x96\x81of"
                           "\xe2\x96\x81sentence\xef\xbd\x9c>"})
    if (const int32_t id = id_of(name); id >= 0) return id;
  return -1;
}

std::shared_ptr<HfTokenizer::Tables> tables_read(const std::string& path) {
  LOOM_CHECK(std::filesystem::exists(path),
             "tokenizer file '{}' does not exist (`tools/tokenizer_files.sh DIR qwen3` writes Qwen3's tokenizer.json "
             "into DIR, and likewise for the others it names)",
             path);
  json j;
  try {
    j = json::parse(input_read_all(path, "tokenizer.json", int64_t(1) << 30));
  } catch (const json::exception& e) {
    fail("'{}' is not valid JSON: {}", path, std::string(e.what()).substr(0, 200));
  }
  LOOM_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(),
             "'{}' has no \"model\": it is not a Hugging Face tokenizer.json", path);
  auto t = std::make_shared<HfTokenizer::Tables>();
  t->path = std::filesystem::absolute(path).string();
  const json& m = j["model"];
  const std::string type = m.value("type", m.contains("merges") ? "BPE" : "");
  LOOM_CHECK(type == "BPE",
             "'{}': the tokenizer's model is {}; loom implements BPE (not WordPiece, Unigram or WordLevel)", path,
             type.empty() ? "of no type" : type);
  LOOM_CHECK(!m.contains("dropout") || m["dropout"].is_null() || m["dropout"].get<double>() == 0.0,
             "'{}': BPE dropout {} samples its merges; loom tokenizes without dropout", path, m["dropout"].dump());
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    LOOM_CHECK(!m.contains(k) || m[k].is_null() || m[k].get<std::string>().empty(),
               "'{}': the BPE {} {} is not implemented", path, k, m[k].dump());
  t->byte_fallback = m.value("byte_fallback", false);
  t->fuse_unk = m.value("fuse_unk", false);
  t->ignore_merges = m.value("ignore_merges", false);
  constexpr int64_t kMaxId = int64_t(1) << 24;
  for (auto& [tok, id] : m.at("vocab").items()) {
    LOOM_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < kMaxId,
               "'{}': token {} has id {}, not a whole number from 0 to {}", path, json(tok).dump(), id.dump(),
               kMaxId - 1);
    t->vocab.emplace(tok, int32_t(id.get<int64_t>()));
  }
  // Added tokens: ids beyond the model's, or the same; special ones are ordinary text.
  Vocab specials;
  std::vector<std::pair<std::string, int32_t>> added;
  for (const json& a : j.value("added_tokens", json::array())) {
    const std::string content = a.at("content").get<std::string>();
    const int32_t id = int32_t(a.at("id").get<int64_t>());
    LOOM_CHECK(id >= 0 && id < kMaxId, "'{}': added token {} has id {}", path, json(content).dump(), id);
    added.push_back({content, id});
    if (a.value("special", false)) {
      specials.emplace(content, id);
      continue;
    }
    for (const char* k : {"lstrip", "rstrip", "single_word"})
      LOOM_CHECK(!a.value(k, false), "'{}': the added token {} has {} set, which loom does not implement", path,
                 json(content).dump(), k);
    t->added_newline = t->added_newline || content.find('\n') != std::string::npos;
    (a.value("normalized", true) ? t->normalized_added : t->raw_added).add(content, id);
  }
  size_t size = 0;
  for (auto& [tok, id] : t->vocab) size = std::max(size, size_t(id) + 1);
  for (auto& [tok, id] : added) size = std::max(size, size_t(id) + 1);
  t->id_to_token.resize(size);
  for (auto& [tok, id] : t->vocab) t->id_to_token[size_t(id)] = tok;
  for (auto& [tok, id] : added) t->id_to_token[size_t(id)] = tok;
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    auto it = t->vocab.find(m["unk_token"].get<std::string>());
    LOOM_CHECK(it != t->vocab.end(), "'{}': the unk_token {} is not in the vocabulary", path, m["unk_token"].dump());
    t->unk = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = t->vocab.find(fmt::format("<0x{:02X}>", b));
    t->byte_ids[b] = it == t->vocab.end() ? -1 : it->second;
  }
  int32_t rank = 0;
  for (const json& mg : m.at("merges")) {
    std::string a, b;
    if (mg.is_string()) {
      const std::string s = mg.get<std::string>();
      const size_t sp = s.find(' ');
      LOOM_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                 "'{}': merge {} is not two symbols and one space", path, json(s).dump());
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else {
      LOOM_CHECK(mg.is_array() && mg.size() == 2, "'{}': merge {} is not a pair", path, mg.dump());
      a = mg[0].get<std::string>(), b = mg[1].get<std::string>();
    }
    auto ia = t->vocab.find(a), ib = t->vocab.find(b), iab = t->vocab.find(a + b);
    LOOM_CHECK(ia != t->vocab.end() && ib != t->vocab.end() && iab != t->vocab.end(),
               "'{}': merge {} {} names a token the vocabulary lacks", path, json(a).dump(), json(b).dump());
    t->merges.emplace(uint64_t(uint32_t(ia->second)) << 32 | uint32_t(ib->second), std::pair{rank++, iab->second});
  }
  for (const auto& [tok, id] : t->vocab) {
    uint32_t prev = 0;
    for (size_t i = 0; i < tok.size();) {
      const Utf8Char c = utf8_char(tok, i);
      if (i > 0) t->joined.push_back(uint64_t(prev) << 32 | (c.ok ? c.cp : 0xfffdu));
      prev = c.ok ? c.cp : 0xfffdu;
      i += c.len;
    }
  }
  std::sort(t->joined.begin(), t->joined.end());
  t->joined.erase(std::unique(t->joined.begin(), t->joined.end()), t->joined.end());
  t->joined.shrink_to_fit();
  for (const auto& [pair, merge] : t->merges)
    for (const int32_t part : {int32_t(pair >> 32), int32_t(uint32_t(pair))})
      t->joins_all =
          t->joins_all || std::find(std::begin(t->byte_ids), std::end(t->byte_ids), part) != std::end(t->byte_ids);
  t->normalizer = j.contains("normalizer") ? j["normalizer"] : json();
  t->pre_tokenizer = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
  // Built once here so that a component loom lacks is refused at open, not on the first text.
  auto norm = normalizer_from(t->normalizer);
  auto pre = pre_tokenizer_from(t->pre_tokenizer);
  const json& dec = j.contains("decoder") ? j["decoder"] : json();
  t->byte_level = (pre && pre->byte_level()) || (dec.is_object() && dec.value("type", "") == "ByteLevel");
  // Normalized added tokens are matched as the normalizer leaves them.
  if (norm) {
    AddedMatcher normalized;
    for (const json& a : j.value("added_tokens", json::array()))
      if (!a.value("special", false) && a.value("normalized", true)) {
        std::string c = a.at("content").get<std::string>();
        norm->apply(c);
        normalized.add(c, int32_t(a.at("id").get<int64_t>()));
      }
    t->normalized_added = std::move(normalized);
  }
  t->doc = doc_token_find(j, path, specials);
  return t;
}

}  // namespace

HfTokenizer::HfTokenizer(const std::string& path) : t_(tables_read(path)) {
  norm_ = normalizer_from(t_->normalizer);
  pre_ = pre_tokenizer_from(t_->pre_tokenizer);
}

HfTokenizer::HfTokenizer(const HfTokenizer& o) : Tokenizer(o), t_(o.t_), cuts_(o.cuts_) {
  norm_ = normalizer_from(t_->normalizer);
  pre_ = pre_tokenizer_from(t_->pre_tokenizer);
}

HfTokenizer::~HfTokenizer() = default;

size_t HfTokenizer::vocab_size() const {
  return t_->id_to_token.size();
}
int32_t HfTokenizer::doc_token() const {
  return t_->doc;
}
std::string HfTokenizer::doc_token_text() const {
  return t_->doc >= 0 ? t_->id_to_token[size_t(t_->doc)] : "document";
}
std::vector<std::string> HfTokenizer::files() const {
  return {t_->path};
}

// The tokenizers library's BPE: from the word's characters (byte fallback, or the unknown
// token, for one the vocabulary lacks), merge the pair of lowest rank, leftmost first, until
// no pair merges.
void HfTokenizer::bpe(std::string_view word, std::vector<int32_t>& out) const {
  const Tables& t = *t_;
  if (t.ignore_merges)
    if (auto whole = t.vocab.find(word); whole != t.vocab.end()) {
      out.push_back(whole->second);
      return;
    }
  if (word.size() <= kWordWhole || t.joins_all) return bpe_merge(word, out);
  // A long word (a document, where no pre-tokenizer splits: Llama 2, Gemma 3) in the parts no
  // token joins: the same ids, in the memory and the word cache of its parts.
  size_t begin = 0;
  uint32_t prev = 0;
  size_t prev_at = 0;
  for (size_t i = 0; i < word.size();) {
    const Utf8Char c = utf8_char(word, i);
    const uint32_t cp = c.ok ? c.cp : 0xfffdu;
    if (i > begin) {
      const uint64_t pair = uint64_t(prev) << 32 | cp;
      const bool joins = std::binary_search(t.joined.begin(), t.joined.end(), pair) ||
                         (t.fuse_unk && t.vocab.find(word.substr(prev_at, i - prev_at)) == t.vocab.end() &&
                          t.vocab.find(word.substr(i, c.len)) == t.vocab.end());
      if (!joins || i - begin >= kWordCut) {
        if (joins && !t.warned_cut.exchange(true))
          spdlog::warn(
              "a word of more than {} MB that the tokenizer's merges could join throughout was cut there (its ids at "
              "the cut may differ from the tokenizers library's, which merges it whole)",
              kWordCut >> 20);
        bpe_merge(word.substr(begin, i - begin), out);
        begin = i;
      }
    }
    prev = cp, prev_at = i;
    i += c.len;
  }
  bpe_merge(word.substr(begin), out);
}

void HfTokenizer::bpe_merge(std::string_view word, std::vector<int32_t>& out) const {
  const Tables& t = *t_;
  const bool cached = word.size() <= kWordWhole;
  if (cached)
    if (auto hit = cache_.find(word); hit != cache_.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
  struct Sym {
    int32_t id, prev, next;
    bool alive;
  };
  std::vector<Sym> sym;
  sym.reserve(word.size());
  bool last_unk = false;
  auto push = [&](int32_t id) { sym.push_back({id, int32_t(sym.size()) - 1, int32_t(sym.size()) + 1, true}); };
  for (size_t i = 0; i < word.size();) {
    size_t len = 1;
    while (i + len < word.size() && (uint8_t(word[i + len]) & 0xc0) == 0x80) ++len;
    const std::string_view ch(word.data() + i, len);
    i += len;
    if (auto it = t.vocab.find(ch); it != t.vocab.end()) {
      push(it->second);
      last_unk = false;
      continue;
    }
    if (t.byte_fallback) {
      bool all = true;
      for (char c : ch) all = all && t.byte_ids[uint8_t(c)] >= 0;
      if (all) {
        for (char c : ch) push(t.byte_ids[uint8_t(c)]);
        last_unk = false;
        continue;
      }
    }
    if (t.unk >= 0 && !(t.fuse_unk && last_unk)) push(t.unk);
    last_unk = t.unk >= 0;  // without an unknown token the character is dropped, as the library does
  }
  if (!sym.empty()) sym.back().next = -1;
  struct Merge {
    int32_t rank, pos, id;
    bool operator>(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Merge, std::vector<Merge>, std::greater<>> q;
  auto consider = [&](int32_t pos) {
    if (pos < 0 || sym[size_t(pos)].next < 0) return;
    auto it =
        t.merges.find(uint64_t(uint32_t(sym[size_t(pos)].id)) << 32 | uint32_t(sym[size_t(sym[size_t(pos)].next)].id));
    if (it != t.merges.end()) q.push({it->second.first, pos, it->second.second});
  };
  for (int32_t p = 0; p + 1 < int32_t(sym.size()); ++p) consider(p);
  while (!q.empty()) {
    const Merge top = q.top();
    q.pop();
    Sym& left = sym[size_t(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Sym& right = sym[size_t(left.next)];
    auto it = t.merges.find(uint64_t(uint32_t(left.id)) << 32 | uint32_t(right.id));
    if (it == t.merges.end() || it->second.second != top.id) continue;  // an entry gone stale
    left.id = top.id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[size_t(right.next)].prev = top.pos;
    consider(left.prev);
    consider(top.pos);
  }
  std::vector<int32_t> ids;
  for (const Sym& s : sym)
    if (s.alive) ids.push_back(s.id);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cached) {
    if (cache_.size() >= (size_t(1) << 18)) cache_.clear();  // bounded, whatever the corpus
    cache_.emplace(std::string(word), std::move(ids));
  }
}

void HfTokenizer::encode_into(const std::string& text, std::vector<int32_t>& out,
                              std::vector<std::string>* pieces) const {
  // Copies of a long text only where something changes it: invalid UTF-8, a normalizer.
  std::string replaced;
  const bool valid = utf8_valid(text);
  if (!valid) replaced = utf8_replace_invalid(text);
  const std::string_view s = valid ? std::string_view(text) : std::string_view(replaced);
  auto words = [&](std::vector<std::string>& batch) {
    for (const std::string& w : batch) {
      if (pieces) pieces->push_back(w);
      bpe(w, out);
    }
  };
  t_->raw_added.split(s, [&](size_t at, std::string_view section, int32_t token) {
    if (token >= 0) {
      out.push_back(token);
      if (pieces) pieces->emplace_back(section);
      return;
    }
    std::string normalized;
    if (norm_) {
      normalized.assign(section);
      norm_->apply(normalized);
      section = normalized;
    }
    t_->normalized_added.split(section, [&](size_t sub_at, std::string_view sub, int32_t id) {
      if (id >= 0) {
        out.push_back(id);
        if (pieces) pieces->emplace_back(sub);
        return;
      }
      if (pre_) {
        pre_->split_stream(sub, at == 0 && sub_at == 0, words);
      } else {  // the text is one word
        if (pieces) pieces->emplace_back(sub);
        bpe(sub, out);
      }
    });
  });
}

std::vector<int32_t> HfTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> out;
  encode_into(text, out, nullptr);
  return out;
}

std::vector<std::string> HfTokenizer::pieces(const std::string& text) const {
  std::vector<int32_t> ids;
  std::vector<std::string> out;
  encode_into(text, ids, &out);
  return out;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t id : ids) {
    LOOM_CHECK(id >= 0 && size_t(id) < t_->id_to_token.size(), "token id {} is outside the tokenizer's {} tokens", id,
               t_->id_to_token.size());
    const std::string& tok = t_->id_to_token[size_t(id)];
    if (t_->byte_level) {
      if (!byte_level_decode(tok, s)) s += tok;  // an added token's own text
      continue;
    }
    if (t_->byte_fallback && byte_piece_decode(tok, s)) continue;
    metaspace_decode(tok, s);
  }
  return s;
}

// Whether text cut after a lone '\n' between two ASCII non-blank characters gives the model the
// pieces of the whole, tried on every such pair of characters with and without one before.
bool HfTokenizer::cuts_at_lone_newlines() const {
  if (cuts_ >= 0) return cuts_ == 1;
  bool ok = pre_ != nullptr && !t_->added_newline && !(norm_ && norm_->prepends());
  for (int x = '!'; ok && x <= '~'; ++x)
    for (int y = '!'; ok && y <= '~'; ++y)
      for (const char* before : {"", "a", " ", "1", "."}) {
        const std::string left = before + std::string(1, char(x)) + "\n", right(1, char(y));
        std::vector<std::string> apart = pieces(left);
        for (std::string& p : pieces(right)) apart.push_back(std::move(p));
        if (apart != pieces(left + right)) {
          ok = false;
          break;
        }
      }
  cuts_ = ok ? 1 : 0;
  return ok;
}

}  // namespace loom
