#include "data/hf_pipeline.h"

#include <oniguruma.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>

#include "data/shared_library.h"
#include "data/token_text.h"
#include "runtime/error.h"

namespace loom {

using nlohmann::json;

// ---- Oniguruma ----

namespace {
// libonig opened with RTLD_LOCAL, its functions looked up by name: the library also exports
// POSIX's regcomp and regexec, which, linked, would take the place of glibc's for the whole
// program (gtest's death tests hung on them; Regex.PosixIsGlibcs).
struct Onig {
  decltype(&onig_initialize) initialize;
  decltype(&onig_new) compile;
  decltype(&onig_error_code_to_str) error_text;
  decltype(&onig_region_new) region_new;
  decltype(&onig_region_free) region_free;
  decltype(&onig_region_clear) region_clear;
  decltype(&onig_free) free;
  decltype(&onig_search) search;
  OnigEncoding utf8;
  OnigSyntaxType* syntax;
};

const Onig& onig() {
  static const Onig api = [] {
    SharedLibrary lib = SharedLibrary::open("libonig.so.5");
    if (!lib)
      fail("Hugging Face tokenizers match with Oniguruma, and it did not load ({}); run ./setup.sh (Debian: libonig5)",
           lib.error());
    Onig o;
    OnigSyntaxType** syntax = nullptr;
    lib.bind(o.initialize, "onig_initialize");
    lib.bind(o.compile, "onig_new");
    lib.bind(o.error_text, "onig_error_code_to_str");
    lib.bind(o.region_new, "onig_region_new");
    lib.bind(o.region_free, "onig_region_free");
    lib.bind(o.region_clear, "onig_region_clear");
    lib.bind(o.free, "onig_free");
    lib.bind(o.search, "onig_search");
    lib.bind(o.utf8, "OnigEncodingUTF8");
    lib.bind(syntax, "OnigDefaultSyntax");
    if (!lib.missing().empty())
      fail("Oniguruma (libonig.so.5) lacks {}: loom needs version 6.9 or later", lib.missing());
    o.syntax = *syntax;
    OnigEncoding encodings[] = {o.utf8};
    o.initialize(encodings, 1);
    return o;
  }();
  return api;
}
}  // namespace

Regex::Regex(const std::string& pattern) {
  const Onig& on = onig();
  OnigErrorInfo info;
  regex_t* reg = nullptr;
  const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int rc = on.compile(&reg, p, p + pattern.size(), ONIG_OPTION_NONE, on.utf8, on.syntax, &info);
  if (rc != ONIG_NORMAL) {
    OnigUChar why[ONIG_MAX_ERROR_MESSAGE_LEN];
    on.error_text(why, rc, &info);
    fail("the tokenizer's regular expression {} does not compile with Oniguruma: {}", json(pattern).dump(),
         reinterpret_cast<const char*>(why));
  }
  reg_ = reg;
  region_ = on.region_new();
}

Regex::~Regex() {
  if (region_) onig().region_free(static_cast<OnigRegion*>(region_), 1);
  if (reg_) onig().free(static_cast<regex_t*>(reg_));
}

void Regex::each_match(std::string_view s, const std::function<void(size_t, size_t)>& found) const {
  auto* region = static_cast<OnigRegion*>(region_);
  const auto* str = reinterpret_cast<const OnigUChar*>(s.data());
  const OnigUChar* end = str + s.size();
  size_t from = 0;
  bool matched = false;
  size_t last_end = 0;
  while (from <= s.size()) {
    onig().region_clear(region);
    const int r = onig().search(static_cast<regex_t*>(reg_), str, end, str + from, end, region, ONIG_OPTION_NONE);
    if (r == ONIG_MISMATCH) break;
    LOOM_CHECK(r >= 0, "Oniguruma failed to match (error {})", r);
    const size_t b = size_t(region->beg[0]), e = size_t(region->end[0]);
    if (b == e && matched && last_end == e) {  // no empty match right after a match: one character on
      if (from >= s.size()) break;
      size_t step = 1;
      while (from + step < s.size() && (uint8_t(s[from + step]) & 0xc0) == 0x80) ++step;
      from += step;
      continue;
    }
    found(b, e);
    from = e;
    matched = true;
    last_end = e;
  }
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view s) const {
  std::vector<std::pair<size_t, size_t>> out;
  each_match(s, [&](size_t b, size_t e) { out.push_back({b, e}); });
  return out;
}

namespace {

std::string type_of(const json& j, const char* what) {
  LOOM_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
             "the tokenizer's {} {} has no \"type\"; it is not a tokenizer.json loom reads", what,
             j.dump().substr(0, 80));
  return j["type"].get<std::string>();
}

// A Split's or Replace's pattern: {"String": s} or {"Regex": r}.
struct Pattern {
  std::string literal;
  std::unique_ptr<Regex> regex;
  explicit Pattern(const json& j) {
    if (j.contains("Regex")) {
      regex = std::make_unique<Regex>(j["Regex"].get<std::string>());
    } else {
      LOOM_CHECK(j.contains("String") && j["String"].is_string() && !j["String"].get<std::string>().empty(),
                 "the tokenizer's pattern {} is neither a non-empty String nor a Regex", j.dump().substr(0, 80));
      literal = j["String"].get<std::string>();
    }
  }
  void each_match(std::string_view s, const std::function<void(size_t, size_t)>& found) const {
    if (regex) return regex->each_match(s, found);
    for (size_t at = s.find(literal); at != std::string_view::npos; at = s.find(literal, at + literal.size()))
      found(at, at + literal.size());
  }
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    each_match(s, [&](size_t b, size_t e) { out.push_back({b, e}); });
    return out;
  }
};

// ---- normalizers ----

struct Sequence : Normalizer {
  std::vector<std::unique_ptr<Normalizer>> parts;
  void apply(std::string& s) const override {
    for (auto& p : parts) p->apply(s);
  }
  bool prepends() const override {
    for (auto& p : parts)
      if (p->prepends()) return true;
    return false;
  }
};

struct UnicodeForm : Normalizer {
  int options;
  explicit UnicodeForm(int o) : options(o) {}
  void apply(std::string& s) const override {
    bool ascii = true;
    for (char c : s) ascii = ascii && uint8_t(c) < 0x80;
    if (ascii) return;  // every form leaves ASCII as it is
    utf8proc_uint8_t* out = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                            utf8proc_ssize_t(s.size()), &out, utf8proc_option_t(options));
    LOOM_CHECK(n >= 0, "utf8proc cannot normalize the text: {}", utf8proc_errmsg(n));
    s.assign(reinterpret_cast<const char*>(out), size_t(n));
    std::free(out);
  }
};

struct Replace : Normalizer {
  Pattern pattern;
  std::string content;
  Replace(const json& p, std::string c) : pattern(p), content(std::move(c)) {}
  void apply(std::string& s) const override {
    std::string out;
    size_t at = 0;
    pattern.each_match(s, [&](size_t b, size_t e) {
      if (at == 0 && out.empty()) out.reserve(s.size() + s.size() / 8);
      out.append(s, at, b - at);
      out += content;
      at = e;
    });
    if (at == 0 && out.empty()) return;  // nothing matched
    out.append(s, at, std::string::npos);
    s.swap(out);
  }
};

struct Prepend : Normalizer {
  std::string text;
  void apply(std::string& s) const override {
    if (!s.empty()) s.insert(0, text);
  }
  bool prepends() const override { return true; }
};

// ---- pre-tokenizers ----

constexpr size_t kBatchPieces = 4096;  // pieces handed on at a time by a streaming split

// Isolating spans one by one (each match and the text between, as split_by's isolated and
// removed behaviours keep them), handed to `each` in batches: `map` turns a span into its piece.
struct SpanBatcher {
  const PreTokenizer::Batch& each;
  std::vector<std::string> batch;
  explicit SpanBatcher(const PreTokenizer::Batch& e) : each(e) {}
  void add(std::string piece) {
    if (piece.empty()) return;
    batch.push_back(std::move(piece));
    if (batch.size() >= kBatchPieces) flush();
  }
  void flush() {
    if (!batch.empty()) each(batch);
    batch.clear();
  }
};

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

// The pieces of `s` that `matches` (sorted, not overlapping) make under `b`, as the tokenizers
// library splits: every span is a match or the text between, then joined by the behaviour.
void split_by(const std::string& s, const std::vector<std::pair<size_t, size_t>>& matches, Behavior b, bool invert,
              std::vector<std::string>& out) {
  struct Span {
    size_t begin, end;
    bool match;
  };
  std::vector<Span> spans;
  size_t prev = 0;
  for (auto [mb, me] : matches) {
    if (mb != prev) spans.push_back({prev, mb, false});
    spans.push_back({mb, me, true});
    prev = me;
  }
  if (prev != s.size() || spans.empty()) spans.push_back({prev, s.size(), false});
  if (invert)
    for (Span& sp : spans) sp.match = !sp.match;
  std::vector<std::pair<size_t, size_t>> kept;
  bool previous_match = false;
  switch (b) {
    case Behavior::removed:
      for (const Span& sp : spans)
        if (!sp.match) kept.push_back({sp.begin, sp.end});
      break;
    case Behavior::isolated:
      for (const Span& sp : spans) kept.push_back({sp.begin, sp.end});
      break;
    case Behavior::merged_with_previous:
      for (const Span& sp : spans) {
        if (sp.match && !previous_match && !kept.empty())
          kept.back().second = sp.end;
        else
          kept.push_back({sp.begin, sp.end});
        previous_match = sp.match;
      }
      break;
    case Behavior::merged_with_next:
      for (size_t i = spans.size(); i-- > 0;) {
        const Span& sp = spans[i];
        if (sp.match && !previous_match && !kept.empty())
          kept.back().first = sp.begin;
        else
          kept.push_back({sp.begin, sp.end});
        previous_match = sp.match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    case Behavior::contiguous:
      for (size_t i = 0; i < spans.size(); ++i) {
        const Span& sp = spans[i];
        if (i > 0 && sp.match == previous_match)
          kept.back().second = sp.end;
        else
          kept.push_back({sp.begin, sp.end});
        previous_match = sp.match;
      }
      break;
  }
  for (auto [kb, ke] : kept)
    if (ke > kb) out.push_back(s.substr(kb, ke - kb));
}

Behavior behavior_of(const std::string& name) {
  if (name == "Removed") return Behavior::removed;
  if (name == "Isolated") return Behavior::isolated;
  if (name == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (name == "MergedWithNext") return Behavior::merged_with_next;
  if (name == "Contiguous") return Behavior::contiguous;
  fail(
      "the tokenizer's Split behavior '{}' is not one loom knows (Removed, Isolated, MergedWithPrevious, "
      "MergedWithNext, Contiguous)",
      name);
}

struct PreSequence : PreTokenizer {
  std::vector<std::unique_ptr<PreTokenizer>> parts;
  void split(std::vector<std::string>& pieces, bool first) const override {
    for (auto& p : parts) p->split(pieces, first);
  }
  // The first part's pieces a batch at a time through the others: each part splits every piece
  // on its own, so batches give the pieces of the whole (only the first batch opens the text).
  void split_stream(std::string_view s, bool first, const Batch& each) const override {
    if (parts.empty()) return PreTokenizer::split_stream(s, first, each);
    bool opening = first;
    parts[0]->split_stream(s, first, [&](std::vector<std::string>& batch) {
      for (size_t k = 1; k < parts.size(); ++k) parts[k]->split(batch, opening);
      opening = false;
      each(batch);
    });
  }
  bool byte_level() const override {
    for (auto& p : parts)
      if (p->byte_level()) return true;
    return false;
  }
};

struct Split : PreTokenizer {
  Pattern pattern;
  Behavior behavior;
  bool invert;
  Split(const json& j)
      : pattern(j.at("pattern")),
        behavior(behavior_of(j.at("behavior").get<std::string>())),
        invert(j.value("invert", false)) {}
  void split(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string> out;
    for (const std::string& p : pieces) split_by(p, pattern.find_all(p), behavior, invert, out);
    pieces.swap(out);
  }
  // Isolated and Removed keep or drop each span alone: their pieces come match by match.
  void split_stream(std::string_view s, bool first, const Batch& each) const override {
    if (behavior != Behavior::isolated && behavior != Behavior::removed)
      return PreTokenizer::split_stream(s, first, each);
    SpanBatcher out(each);
    auto span = [&](size_t b, size_t e, bool match) {
      if (behavior == Behavior::isolated || match == invert) out.add(std::string(s.substr(b, e - b)));
    };
    size_t prev = 0;
    pattern.each_match(s, [&](size_t b, size_t e) {
      if (b != prev) span(prev, b, false);
      span(b, e, true);
      prev = e;
    });
    if (prev != s.size()) span(prev, s.size(), false);
    out.flush();
  }
};

struct ByteLevel : PreTokenizer {
  bool add_prefix_space, use_regex;
  std::unique_ptr<Regex> gpt2;
  explicit ByteLevel(const json& j)
      : add_prefix_space(j.value("add_prefix_space", true)), use_regex(j.value("use_regex", true)) {
    if (use_regex)
      gpt2 = std::make_unique<Regex>(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
  }
  void split(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string> out;
    for (std::string& p : pieces) {
      if (add_prefix_space && (p.empty() || p[0] != ' ')) p.insert(0, " ");
      if (gpt2)
        split_by(p, gpt2->find_all(p), Behavior::isolated, false, out);
      else if (!p.empty())
        out.push_back(std::move(p));
    }
    for (std::string& p : out) p = mapped(p);
    pieces.swap(out);
  }
  static std::string mapped(std::string_view p) {  // each byte as its stand-in character
    std::string m;
    m.reserve(p.size() * 2);
    for (char c : p) m += byte_level_char(uint8_t(c));
    return m;
  }
  void split_stream(std::string_view s, bool first, const Batch& each) const override {
    if (!gpt2) return PreTokenizer::split_stream(s, first, each);
    std::string spaced;
    if (add_prefix_space && (s.empty() || s[0] != ' ')) spaced = " " + std::string(s), s = spaced;
    SpanBatcher out(each);
    size_t prev = 0;
    gpt2->each_match(s, [&](size_t b, size_t e) {
      if (b != prev) out.add(mapped(s.substr(prev, b - prev)));
      out.add(mapped(s.substr(b, e - b)));
      prev = e;
    });
    if (prev != s.size()) out.add(mapped(s.substr(prev)));
    out.flush();
  }
  bool byte_level() const override { return true; }
};

struct Metaspace : PreTokenizer {
  std::string replacement;
  std::string scheme;  // always | first | never
  bool split_words;
  Pattern mark;
  explicit Metaspace(const json& j)
      : replacement(j.value("replacement", std::string("\u2581"))),
        scheme(j.contains("prepend_scheme") ? j["prepend_scheme"].get<std::string>()
                                            : (j.value("add_prefix_space", true) ? "always" : "never")),
        split_words(j.value("split", true)),
        mark(json{{"String", replacement}}) {
    LOOM_CHECK(scheme == "always" || scheme == "first" || scheme == "never",
               "the tokenizer's Metaspace prepend_scheme '{}' is not always, first or never", scheme);
  }
  void split(std::vector<std::string>& pieces, bool first) const override {
    std::vector<std::string> out;
    for (size_t i = 0; i < pieces.size(); ++i) {
      std::string p;
      for (char c : pieces[i]) c == ' ' ? p += replacement : p += c;
      const bool opens = p.compare(0, replacement.size(), replacement) == 0;
      if (!opens && (scheme == "always" || (scheme == "first" && first && i == 0))) p.insert(0, replacement);
      if (split_words)
        split_by(p, mark.find_all(p), Behavior::merged_with_next, false, out);
      else if (!p.empty())
        out.push_back(std::move(p));
    }
    pieces.swap(out);
  }
};

struct Digits : PreTokenizer {
  bool individual;
  explicit Digits(const json& j) : individual(j.value("individual_digits", false)) {}
  void split(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string> out;
    for (const std::string& p : pieces) {
      std::vector<std::pair<size_t, size_t>> digits;
      for (size_t i = 0; i < p.size(); ++i)
        if (p[i] >= '0' && p[i] <= '9') digits.push_back({i, i + 1});
      split_by(p, digits, individual ? Behavior::isolated : Behavior::contiguous, false, out);
    }
    pieces.swap(out);
  }
};

}  // namespace

void PreTokenizer::split_stream(std::string_view s, bool first, const Batch& each) const {
  std::vector<std::string> pieces{std::string(s)};
  split(pieces, first);
  each(pieces);
}

std::unique_ptr<Normalizer> normalizer_from(const json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, "normalizer");
  if (type == "Sequence") {
    auto s = std::make_unique<Sequence>();
    for (const json& part : j.at("normalizers"))
      if (auto n = normalizer_from(part)) s->parts.push_back(std::move(n));
    return s;
  }
  if (type == "NFC") return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  if (type == "NFD") return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  if (type == "Replace") return std::make_unique<Replace>(j.at("pattern"), j.at("content").get<std::string>());
  if (type == "Prepend") {
    auto p = std::make_unique<Prepend>();
    p->text = j.at("prepend").get<std::string>();
    return p;
  }
  fail(
      "the tokenizer's normalizer {} is not one loom implements (it has Sequence, NFC, NFD, NFKC, NFKD, Replace and "
      "Prepend)",
      type);
}

std::unique_ptr<PreTokenizer> pre_tokenizer_from(const json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, "pre-tokenizer");
  if (type == "Sequence") {
    auto s = std::make_unique<PreSequence>();
    for (const json& part : j.at("pretokenizers"))
      if (auto p = pre_tokenizer_from(part)) s->parts.push_back(std::move(p));
    return s;
  }
  if (type == "Split") return std::make_unique<Split>(j);
  if (type == "ByteLevel") return std::make_unique<ByteLevel>(j);
  if (type == "Metaspace") return std::make_unique<Metaspace>(j);
  if (type == "Digits") return std::make_unique<Digits>(j);
  fail(
      "the tokenizer's pre-tokenizer {} is not one loom implements (it has Sequence, Split, ByteLevel, Metaspace and "
      "Digits)",
      type);
}

}  // namespace loom
