#include "runtime/tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace loom {

std::vector<int32_t> tokenize_bytes(const std::string& text) {
  std::vector<int32_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = int32_t(uint8_t(text[i]));
  return out;
}

namespace {

std::string utf8_encode(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xc0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    s += char(0xe0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3f));
    s += char(0x80 | (cp & 0x3f));
  } else {
    s += char(0xf0 | (cp >> 18));
    s += char(0x80 | ((cp >> 12) & 0x3f));
    s += char(0x80 | ((cp >> 6) & 0x3f));
    s += char(0x80 | (cp & 0x3f));
  }
  return s;
}

// Code points with their byte spans; invalid UTF-8 bytes stand alone as "letters".
struct Cp {
  uint32_t cp;
  size_t begin, end;
};
std::vector<Cp> utf8_decode(const std::string& s) {
  std::vector<Cp> out;
  for (size_t i = 0; i < s.size();) {
    uint8_t c = uint8_t(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + size_t(len) > s.size()) len = 1;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (uint8_t(s[i + size_t(k)]) & 0x3f);
    out.push_back({cp, i, i + size_t(len)});
    i += size_t(len);
  }
  return out;
}

enum Cls { SPACE, LETTER, NUMBER, OTHER };
Cls classify(uint32_t cp) {
  if (cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r' || cp == '\v' || cp == '\f') return SPACE;
  if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp >= 0x80) return LETTER;
  if (cp >= '0' && cp <= '9') return NUMBER;
  return OTHER;
}

}  // namespace

std::vector<std::string> gpt2_pretokenize(const std::string& text) {
  auto cps = utf8_decode(text);
  const size_t n = cps.size();
  std::vector<std::string> out;
  auto emit = [&](size_t a, size_t b) { out.push_back(text.substr(cps[a].begin, cps[b - 1].end - cps[a].begin)); };
  auto run = [&](size_t i, Cls c) {
    while (i < n && classify(cps[i].cp) == c) ++i;
    return i;
  };
  size_t i = 0;
  while (i < n) {
    uint32_t c = cps[i].cp;
    if (c == '\'' && i + 1 < n) {  // contractions: 's 't 'm 'd 're 've 'll
      uint32_t a = cps[i + 1].cp, b = i + 2 < n ? cps[i + 2].cp : 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        emit(i, i + 2);
        i += 2;
        continue;
      }
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        emit(i, i + 3);
        i += 3;
        continue;
      }
    }
    Cls cls = classify(c);
    if (c == ' ' && i + 1 < n && classify(cps[i + 1].cp) != SPACE) {  // " ?X+"
      size_t j = run(i + 1, classify(cps[i + 1].cp));
      emit(i, j);
      i = j;
    } else if (cls != SPACE) {
      size_t j = run(i, cls);
      emit(i, j);
      i = j;
    } else {
      size_t j = run(i, SPACE);
      // "\s+(?!\S)": leave the last space for the word that follows it.
      if (j < n && j - i >= 2) j -= 1;
      emit(i, j);
      i = j;
    }
  }
  return out;
}

Gpt2Bpe::Gpt2Bpe(const std::string& vocab_path, const std::string& merges_path) {
  // GPT-2's byte-to-unicode table: printable bytes map to themselves, the rest to 256+n.
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    byte_to_unicode_[b] = utf8_encode(printable ? uint32_t(b) : uint32_t(256 + extra++));
    unicode_to_byte_[byte_to_unicode_[b]] = uint8_t(b);
  }
  std::ifstream vin(vocab_path);
  LOOM_CHECK(vin, "cannot open GPT-2 vocab '{}' (Hugging Face vocab.json)", vocab_path);
  nlohmann::json j;
  try {
    vin >> j;
  } catch (const std::exception& e) {
    fail("'{}' is not valid JSON: {}", vocab_path, e.what());
  }
  for (auto& [tok, id] : j.items()) {
    int32_t i = id.get<int32_t>();
    vocab_[tok] = i;
    if (size_t(i) >= id_to_token_.size()) id_to_token_.resize(size_t(i) + 1);
    id_to_token_[size_t(i)] = tok;
  }
  std::ifstream min(merges_path);
  LOOM_CHECK(min, "cannot open GPT-2 merges '{}' (Hugging Face merges.txt)", merges_path);
  std::string line;
  int rank = 0;
  while (std::getline(min, line)) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    auto sp = line.find(' ');
    LOOM_CHECK(sp != std::string::npos, "'{}': merge line '{}' is not 'a b'", merges_path, line);
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
  for (unsigned char b : word) sym.push_back(byte_to_unicode_[b]);
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
  cache_.emplace(word, std::move(ids));
}

std::vector<int32_t> Gpt2Bpe::encode(const std::string& text) const {
  std::vector<int32_t> out;
  for (auto& w : gpt2_pretokenize(text)) encode_word(w, out);
  return out;
}

std::string Gpt2Bpe::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t id : ids) {
    for (auto& cp : utf8_decode(id_to_token_.at(size_t(id)))) {
      auto it = unicode_to_byte_.find(id_to_token_[size_t(id)].substr(cp.begin, cp.end - cp.begin));
      if (it != unicode_to_byte_.end()) s += char(it->second);
    }
  }
  return s;
}

}  // namespace loom
