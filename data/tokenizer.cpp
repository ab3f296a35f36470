#include "data/tokenizer.h"

#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/hf_tokenizer.h"
#include "data/spm_tokenizer.h"
#include "data/token_text.h"
#include "runtime/error.h"
#include "runtime/file.h"
#include "runtime/json_read.h"
#include "runtime/utf8.h"

namespace loom {

std::vector<int32_t> tokenize_bytes(const std::string& text) {
  std::vector<int32_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = int32_t(uint8_t(text[i]));
  return out;
}

namespace {

// A text's code points, read where they are needed (not held: a document may be long). A byte
// that does not start well-formed UTF-8 stands alone as U+FFFD (punctuation to the
// pre-tokenizers: what a decoder reading the text would see).
struct Chars {
  std::string_view s;
  uint32_t at(size_t i) const {
    const Utf8Char c = utf8_char(s, i);
    return c.ok ? c.cp : 0xfffdu;
  }
  size_t next(size_t i) const {
    const Utf8Char c = utf8_char(s, i);
    return i + (c.ok ? c.len : 1);
  }
};

struct CpRange {
  uint32_t lo, hi;
};
#include "data/unicode_ranges.inc"

template <size_t N>
bool in_ranges(const CpRange (&r)[N], uint32_t cp) {
  const CpRange* it = std::upper_bound(r, r + N, cp, [](uint32_t c, const CpRange& x) { return c < x.lo; });
  return it != r && cp <= (it - 1)->hi;
}

// The classes of the pre-tokenizers' expressions: \s, \p{L}, \p{N}, and none of them.
// Bytes that are not UTF-8 decode to themselves (below 0x100, so never letters but Latin-1's).
enum Cls { SPACE, LETTER, NUMBER, OTHER };
Cls classify(uint32_t cp) {
  if (cp < 0x80) {  // ASCII first: most of any text
    if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return SPACE;
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return LETTER;
    if (cp >= '0' && cp <= '9') return NUMBER;
    return OTHER;
  }
  if (in_ranges(k_letter, cp)) return LETTER;
  if (in_ranges(k_number, cp)) return NUMBER;
  if (in_ranges(k_space, cp)) return SPACE;
  return OTHER;
}

// The length of the English contraction an apostrophe followed by a, b opens ('s 't 'm 'd: 2;
// 're 've 'll: 3), or 0: both tokenizers' patterns split these off first.
size_t contraction_length(uint32_t a, uint32_t b) {
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

}  // namespace

void gpt2_pretokenize(std::string_view text, const Pieces& emit) {
  const Chars t{text};
  const size_t n = text.size();
  auto run = [&](size_t i, Cls c) {
    while (i < n && classify(t.at(i)) == c) i = t.next(i);
    return i;
  };
  auto piece = [&](size_t a, size_t b) { emit(text.substr(a, b - a)); };
  size_t i = 0;
  while (i < n) {
    const uint32_t c = t.at(i);
    const size_t i1 = t.next(i);
    if (c == '\'' && i1 < n) {  // contractions, as written
      const size_t i2 = t.next(i1);
      if (const size_t len = contraction_length(t.at(i1), i2 < n ? t.at(i2) : 0)) {
        const size_t end = len == 2 ? i2 : t.next(i2);
        piece(i, end);
        i = end;
        continue;
      }
    }
    const Cls cls = classify(c);
    if (c == ' ' && i1 < n && classify(t.at(i1)) != SPACE) {  // " ?X+"
      const size_t j = run(i1, classify(t.at(i1)));
      piece(i, j);
      i = j;
    } else if (cls != SPACE) {
      const size_t j = run(i, cls);
      piece(i, j);
      i = j;
    } else {
      size_t j = i, last = i, count = 0;
      for (; j < n && classify(t.at(j)) == SPACE; j = t.next(j)) last = j, ++count;
      // "\s+(?!\S)": leave the last space for the word that follows it.
      if (j < n && count >= 2) j = last;
      piece(i, j);
      i = j;
    }
  }
}

std::vector<std::string> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string> out;
  gpt2_pretokenize(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

namespace {
constexpr size_t kCacheMax = size_t(1) << 18;  // words a thread's cache holds

// A missing tokenizer file: the error names the script that writes them (a file of the wrong
// kind is refused where it is read).
void tokenizer_file_check(const std::string& path, const char* what) {
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return;  // its kind: input_check's
  fail("{} '{}' does not exist (`tools/tokenizer_files.sh DIR [gpt2|llama3]` writes loom's tokenizer files into DIR)",
       what, path);
}
}  // namespace

Gpt2Bpe::Gpt2Bpe(const std::string& vocab_path, const std::string& merges_path)
    : files_{std::filesystem::absolute(vocab_path).string(), std::filesystem::absolute(merges_path).string()} {
  tokenizer_file_check(vocab_path, "GPT-2 vocab (Hugging Face vocab.json)");
  tokenizer_file_check(merges_path, "GPT-2 merges (Hugging Face merges.txt)");
  // GPT-2's files are about 1 MB and 0.5 MB: a limit far above, so that an endless or wrong
  // file is refused before it fills the memory.
  constexpr int64_t kMaxBytes = int64_t(256) << 20;
  constexpr int32_t kMaxId = 1 << 24;  // ids index a table: far above any GPT-2 style vocabulary
  const nlohmann::json j =
      json_parse(input_read_all(vocab_path, "GPT-2 vocab", kMaxBytes), fmt::format("'{}'", vocab_path));
  LOOM_CHECK(j.is_object(), "'{}' is not a GPT-2 vocab: Hugging Face's vocab.json is an object of token: id",
             vocab_path);
  for (auto& [tok, id] : j.items()) {
    LOOM_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < kMaxId,
               "'{}': token {} has id {}, not a whole number from 0 to {}; it is not a GPT-2 vocab", vocab_path,
               nlohmann::json(tok).dump(), id.dump(), kMaxId - 1);
    const auto i = size_t(id.get<int64_t>());
    vocab_[tok] = int32_t(i);
    if (i >= id_to_token_.size()) id_to_token_.resize(i + 1);
    LOOM_CHECK(id_to_token_[i].empty(), "'{}': id {} is given to both {} and {}; every token needs its own id",
               vocab_path, i, nlohmann::json(id_to_token_[i]).dump(), nlohmann::json(tok).dump());
    id_to_token_[i] = tok;
  }
  std::istringstream min(input_read_all(merges_path, "GPT-2 merges", kMaxBytes));
  std::string line;
  int rank = 0;
  int64_t lines = 0;
  while (std::getline(min, line)) {
    ++lines;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const auto sp = line.find(' ');
    LOOM_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() && line.find(' ', sp + 1) == std::string::npos,
               "'{}' line {}: '{}' is not one merge 'a b' (two symbols and one space); it is not a GPT-2 merges.txt",
               merges_path, lines, line.substr(0, 80));
    ranks_[{line.substr(0, sp), line.substr(sp + 1)}] = rank++;
  }
}

void Gpt2Bpe::encode_word(const std::string& word, std::vector<int32_t>& out) const {
  auto hit = cache_.find(word);
  if (hit != cache_.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<std::string> sym;
  for (unsigned char b : word) sym.push_back(byte_level_char(b));  // GPT-2's byte alphabet
  while (sym.size() > 1) {
    int best = INT32_MAX;
    size_t at = 0;
    for (size_t k = 0; k + 1 < sym.size(); ++k) {
      auto r = ranks_.find({sym[k], sym[k + 1]});
      if (r != ranks_.end() && r->second < best) best = r->second, at = k;
    }
    if (best == INT32_MAX) break;
    const std::string a = sym[at], b = sym[at + 1];
    std::vector<std::string> merged;
    for (size_t k = 0; k < sym.size(); ++k) {
      if (k + 1 < sym.size() && sym[k] == a && sym[k + 1] == b) {
        merged.push_back(a + b);
        ++k;
      } else {
        merged.push_back(sym[k]);
      }
    }
    sym.swap(merged);
  }
  std::vector<int32_t> ids;
  for (auto& s : sym) {
    auto it = vocab_.find(s);
    LOOM_CHECK(it != vocab_.end(), "GPT-2 vocab has no token for '{}'; vocab.json and merges.txt disagree", s);
    ids.push_back(it->second);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (cache_.size() >= kCacheMax) cache_.clear();  // bounded, however long the stream of documents
  cache_.emplace(word, std::move(ids));
}

std::vector<int32_t> Gpt2Bpe::encode(const std::string& text) const {
  std::vector<int32_t> out;
  gpt2_pretokenize(text, [&](std::string_view w) { encode_word(std::string(w), out); });
  return out;
}

std::string Gpt2Bpe::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t id : ids) {
    LOOM_CHECK(id >= 0 && size_t(id) < id_to_token_.size(), "token id {} is outside GPT-2's {} tokens", id,
               id_to_token_.size());
    const std::string& tok = id_to_token_[size_t(id)];
    if (!byte_level_decode(tok, s)) s += tok;  // a token of other characters stands for itself
  }
  return s;
}

void llama3_pretokenize(std::string_view text, const Pieces& emit) {
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
  // \s*[\r\n]+|\s+(?!\S)|\s+ : the first alternative that matches at each position.
  const Chars t{text};
  const size_t n = text.size();
  auto newline = [](uint32_t c) { return c == '\r' || c == '\n'; };
  auto lower = [&](size_t i) { return i < n && t.at(i) < 0x80 ? t.at(i) | 0x20 : 0u; };
  auto cls = [&](size_t i) { return classify(t.at(i)); };
  auto run = [&](size_t i, Cls c) {
    while (i < n && cls(i) == c) i = t.next(i);
    return i;
  };
  size_t i = 0;
  while (i < n) {
    const uint32_t c = t.at(i);
    const size_t i1 = t.next(i);
    if (c == '\'') {  // contractions, in any case
      const size_t i2 = i1 < n ? t.next(i1) : n;
      if (const size_t len = contraction_length(lower(i1), lower(i2))) {
        const size_t end = len == 2 ? i2 : t.next(i2);
        emit(text.substr(i, end - i));
        i = end;
        continue;
      }
    }
    const Cls ci = classify(c);
    size_t j;
    if (ci == LETTER) {
      j = run(i, LETTER);
    } else if (ci != NUMBER && !newline(c) && i1 < n && cls(i1) == LETTER) {
      j = run(i1, LETTER);  // one mark, space or tab before the letters
    } else if (ci == NUMBER) {
      j = i1;
      for (int count = 1; j < n && count < 3 && cls(j) == NUMBER; ++count) j = t.next(j);
    } else if (ci == OTHER || (c == ' ' && i1 < n && cls(i1) == OTHER)) {
      j = run(ci == OTHER ? i : i1, OTHER);
      while (j < n && newline(t.at(j))) j = t.next(j);
    } else {  // white space
      size_t end = i, last = i, count = 0, last_newline = n;
      for (; end < n && cls(end) == SPACE; end = t.next(end)) {
        if (newline(t.at(end))) last_newline = end;
        last = end, ++count;
      }
      if (last_newline != n)
        j = t.next(last_newline);  // \s*[\r\n]+
      else if (end < n && count >= 2)
        j = last;  // \s+(?!\S): the last one goes with what follows
      else
        j = end;
    }
    emit(text.substr(i, j - i));
    i = j;
  }
}

std::vector<std::string> llama3_pretokenize(std::string_view text) {
  std::vector<std::string> out;
  llama3_pretokenize(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

namespace {
int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}
bool base64_decode(const std::string& in, std::string& out) {
  out.clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    const int v = base64_value(c);
    if (v < 0) return false;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((acc >> bits) & 0xff);
    }
  }
  return !out.empty();
}
}  // namespace

Llama3Bpe::Llama3Bpe(const std::string& ranks_path) : file_(std::filesystem::absolute(ranks_path).string()) {
  tokenizer_file_check(ranks_path, "the LLaMA-3 tokenizer (Meta's tokenizer.model)");
  // Meta's file is about 2 MB.
  std::istringstream in(input_read_all(ranks_path, "the LLaMA-3 tokenizer", int64_t(256) << 20));
  id_to_bytes_.resize(kRegular);
  std::vector<bool> seen(kRegular, false);
  std::string line, bytes;
  int64_t lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    if (!line.empty() && line.back() == '\r') line.pop_back();  // a copy with Windows line ends
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    char* end = nullptr;
    const long rank = sp == std::string::npos ? -1 : std::strtol(line.c_str() + sp + 1, &end, 10);
    LOOM_CHECK(sp != std::string::npos && end && end != line.c_str() + sp + 1 && *end == 0 &&
                   base64_decode(line.substr(0, sp), bytes),
               "'{}' line {} is not 'base64 rank': it is not a tiktoken ranks file (LLaMA-3's tokenizer.model)",
               ranks_path, lines);
    LOOM_CHECK(rank >= 0 && rank < kRegular && !seen[size_t(rank)],
               "'{}' line {}: rank {} is out of 0..{} or repeated; LLaMA-3's tokenizer.model ranks 128000 tokens",
               ranks_path, lines, rank, kRegular - 1);
    seen[size_t(rank)] = true;
    ranks_[bytes] = int32_t(rank);
    id_to_bytes_[size_t(rank)] = bytes;
  }
  LOOM_CHECK(ranks_.size() == size_t(kRegular),
             "'{}' ranks {} tokens; LLaMA-3's tokenizer.model ranks {} (is it another tokenizer's file?)", ranks_path,
             ranks_.size(), kRegular);
  for (int b = 0; b < 256; ++b)
    LOOM_CHECK(ranks_.count(std::string(1, char(b))), "'{}' has no token for byte {}: it cannot encode every text",
               ranks_path, b);
  const char* named[] = {"<|begin_of_text|>",
                         "<|end_of_text|>",
                         "<|reserved_special_token_0|>",
                         "<|reserved_special_token_1|>",
                         "<|reserved_special_token_2|>",
                         "<|reserved_special_token_3|>",
                         "<|start_header_id|>",
                         "<|end_header_id|>",
                         "<|reserved_special_token_4|>",
                         "<|eot_id|>"};
  for (const char* s : named) id_to_bytes_.push_back(s);
  for (int i = 5; id_to_bytes_.size() < size_t(kRegular + kSpecial); ++i)
    id_to_bytes_.push_back(fmt::format("<|reserved_special_token_{}|>", i));
}

// tiktoken's merge: from single bytes, merge the adjacent pair whose bytes rank lowest (the
// leftmost on a tie) until no pair is a token.
void Llama3Bpe::encode_piece(const std::string& piece, std::vector<int32_t>& out) const {
  if (auto whole = ranks_.find(piece); whole != ranks_.end()) {
    out.push_back(whole->second);
    return;
  }
  if (auto hit = cache_.find(piece); hit != cache_.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<size_t> cut(piece.size() + 1);  // part k is piece[cut[k], cut[k+1])
  for (size_t k = 0; k <= piece.size(); ++k) cut[k] = k;
  auto rank_of = [&](size_t k) {  // of parts k and k+1 merged
    if (k + 2 >= cut.size()) return INT32_MAX;
    auto it = ranks_.find(piece.substr(cut[k], cut[k + 2] - cut[k]));
    return it == ranks_.end() ? INT32_MAX : it->second;
  };
  std::vector<int32_t> rank(cut.size());
  for (size_t k = 0; k < cut.size(); ++k) rank[k] = rank_of(k);
  while (cut.size() > 2) {
    const size_t k = size_t(std::min_element(rank.begin(), rank.end() - 2) - rank.begin());
    if (rank[k] == INT32_MAX) break;
    cut.erase(cut.begin() + long(k) + 1);
    rank.erase(rank.begin() + long(k) + 1);
    rank[k] = rank_of(k);
    if (k > 0) rank[k - 1] = rank_of(k - 1);
  }
  std::vector<int32_t> ids;
  for (size_t k = 0; k + 1 < cut.size(); ++k) ids.push_back(ranks_.at(piece.substr(cut[k], cut[k + 1] - cut[k])));
  out.insert(out.end(), ids.begin(), ids.end());
  if (cache_.size() >= kCacheMax) cache_.clear();
  cache_.emplace(piece, std::move(ids));
}

std::vector<int32_t> Llama3Bpe::encode(const std::string& text) const {
  std::vector<int32_t> out;
  llama3_pretokenize(text, [&](std::string_view piece) { encode_piece(std::string(piece), out); });
  return out;
}

std::string Llama3Bpe::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t id : ids) {
    LOOM_CHECK(id >= 0 && size_t(id) < id_to_bytes_.size(), "token id {} is outside LLaMA-3's {} tokens", id,
               id_to_bytes_.size());
    s += id_to_bytes_[size_t(id)];
  }
  return s;
}

uint64_t files_hash(const std::vector<std::string>& files) {
  XXH64_state_t* s = XXH64_createState();
  XXH64_reset(s, 0);
  std::vector<char> buf(size_t(1) << 20);
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    LOOM_CHECK(in, "cannot read tokenizer file '{}'", f);
    while (in.read(buf.data(), std::streamsize(buf.size())) || in.gcount() > 0)
      XXH64_update(s, buf.data(), size_t(in.gcount()));
  }
  const uint64_t h = XXH64_digest(s);
  XXH64_freeState(s);
  return h;
}

std::unique_ptr<Tokenizer> tokenizer_open(const std::string& name, const std::string& vocab,
                                          const std::string& merges) {
  if (name == "byte") return nullptr;
  if (name == "gpt2") {
    LOOM_CHECK(!vocab.empty() && !merges.empty(), "the gpt2 tokenizer needs vocab.json and merges.txt");
    return std::make_unique<Gpt2Bpe>(vocab, merges);
  }
  if (name == "llama3") {
    LOOM_CHECK(!vocab.empty(), "the llama3 tokenizer needs its tokenizer.model (--vocab)");
    return std::make_unique<Llama3Bpe>(vocab);
  }
  if (name == "hf") {
    LOOM_CHECK(!vocab.empty(), "the hf tokenizer needs its tokenizer.json (--tokenizer-file)");
    return std::make_unique<HfTokenizer>(vocab);
  }
  if (name == "spm") {
    LOOM_CHECK(!vocab.empty(), "the spm tokenizer needs its SentencePiece model (--tokenizer-file)");
    return std::make_unique<SpmTokenizer>(vocab);
  }
  fail("unknown tokenizer '{}'; loom has byte, gpt2, llama3, hf and spm", name);
}

}  // namespace loom
