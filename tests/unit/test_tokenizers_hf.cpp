// Hugging Face tokenizer.json files on small hand-made tokenizers: the BPE merge order, byte
// fallback and unknown tokens, Split's behaviours, added and special tokens, invalid UTF-8,
// NFC, when text may be cut for threads, the refusals that name what loom lacks, POSIX regex
// left to glibc, and what the run-time loader says of a missing library or symbol (the
// comparison with the reference library on real files is e2e.tokenizers_hf).
#include <dlfcn.h>
#include <regex.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "data/hf_pipeline.h"
#include "data/hf_tokenizer.h"
#include "data/shared_library.h"
#include "data/token_text.h"
#include "runtime/config.h"
#include "runtime/utf8.h"
#include "testing.h"

using namespace loom;
using loom::test::error_of;
using nlohmann::json;
using Words = std::vector<std::string>;
using Ids = std::vector<int32_t>;

namespace {

// A tokenizer.json with a character vocabulary (a..z, '-', ' ', '<', '>', '/' and '\n'), the
// given merges (their tokens added to the vocabulary), and `extra` merged over the file.
std::string hf_write(const std::string& name, const std::vector<std::pair<std::string, std::string>>& merges,
                     const json& extra = json::object()) {
  json vocab = json::object();
  int id = 0;
  for (char c = 'a'; c <= 'z'; ++c) vocab[std::string(1, c)] = id++;
  for (const char* c : {"-", " ", "<", ">", "/", "\n"}) vocab[c] = id++;
  json m = json::array();
  for (auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = id++;
    m.push_back(a + " " + b);
  }
  json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}},
            {"normalizer", nullptr},
            {"pre_tokenizer", nullptr},
            {"added_tokens", json::array()}};
  j.merge_patch(extra);
  const std::string path = ::testing::TempDir() + "hf_" + name + ".json";
  std::ofstream(path) << j.dump();
  return path;
}

json split(const std::string& behavior, bool invert = false) {
  return {{"pre_tokenizer",
           {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}}}};
}

}  // namespace

TEST(HfTokenizer, MergesTheLowestRankFirstNotTheLeftmost) {
  HfTokenizer t(hf_write("rank", {{"b", "c"}, {"a", "b"}, {"ab", "c"}}));
  const int32_t a = 0, c = 2, bc = 32, ab = 33, abc = 34;  // the merged tokens after the 32 characters
  EXPECT_EQ(t.encode("abc"), (Ids{a, bc}));                // b c ranks first: a + bc, which does not merge
  EXPECT_EQ(t.encode("abab"), (Ids{ab, ab}));
  EXPECT_EQ(t.encode("abbc"), (Ids{ab, bc}));
  EXPECT_EQ(t.encode("abcab"), (Ids{a, bc, ab}));
  EXPECT_EQ(t.encode("ccc"), (Ids{c, c, c}));
  EXPECT_NE(t.encode("abc"), (Ids{abc}));
  EXPECT_EQ(t.decode(t.encode("abbc")), "abbc");
}

TEST(HfTokenizer, UnknownCharactersFallBackToBytesOrTheUnknownToken) {
  json bytes = {{"model", {{"byte_fallback", true}, {"vocab", {{"<0xC3>", 40}, {"<0xA9>", 41}}}}}};
  HfTokenizer fb(hf_write("fallback", {}, bytes));
  EXPECT_EQ(fb.encode("a\u00e9"), (Ids{0, 40, 41}));  // é is not a token: its two bytes are
  EXPECT_EQ(fb.decode({0, 40, 41}), "a\u00e9");
  json unk = {{"model", {{"unk_token", "<unk>"}, {"fuse_unk", true}, {"vocab", {{"<unk>", 40}}}}}};
  HfTokenizer u(hf_write("unk", {}, unk));
  EXPECT_EQ(u.encode("a\u00e9\u00e9b"), (Ids{0, 40, 1}));  // two unknown characters, one fused token
}

// The five behaviours as the tokenizers library joins matches ("-") and the text between.
TEST(HfTokenizer, SplitBehavioursJoinMatchesAsTheLibraryDoes) {
  const std::string text = "a-b--c";
  EXPECT_EQ(HfTokenizer(hf_write("iso", {}, split("Isolated"))).pieces(text), (Words{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(HfTokenizer(hf_write("rem", {}, split("Removed"))).pieces(text), (Words{"a", "b", "c"}));
  EXPECT_EQ(HfTokenizer(hf_write("prev", {}, split("MergedWithPrevious"))).pieces(text), (Words{"a-", "b-", "-", "c"}));
  EXPECT_EQ(HfTokenizer(hf_write("next", {}, split("MergedWithNext"))).pieces(text), (Words{"a", "-b", "-", "-c"}));
  EXPECT_EQ(HfTokenizer(hf_write("cont", {}, split("Contiguous"))).pieces(text), (Words{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(HfTokenizer(hf_write("inv", {}, split("Removed", true))).pieces(text), (Words{"-", "-", "-"}));
}

// Added tokens that are not special are split out; a special token's text is ordinary text.
TEST(HfTokenizer, SpecialTokenTextIsOrdinaryTextAddedTokensAreTheirOwn) {
  json added = {{"added_tokens",
                 {{{"id", 50}, {"content", "<s>"}, {"special", true}},
                  {{"id", 51}, {"content", "<a>"}, {"special", false}, {"normalized", false}}}}};
  HfTokenizer t(hf_write("added", {}, added));
  const int32_t lt = 28, gt = 29, s = 's' - 'a';
  EXPECT_EQ(t.encode("x<a>y<s>"), (Ids{'x' - 'a', 51, 'y' - 'a', lt, s, gt}));
  EXPECT_EQ(t.vocab_size(), 52u);
  EXPECT_EQ(t.doc_token(), 50);  // a special token with one of the usual names
  EXPECT_EQ(t.decode({51}), "<a>");
}

// Invalid UTF-8 is read as U+FFFD, one for each maximal ill-formed subsequence (Unicode's
// practice): the JavaScript reference cannot hold such text, so this is the rule's test.
TEST(HfTokenizer, InvalidUtf8IsReadAsReplacementCharacters) {
  EXPECT_EQ(utf8_replace_invalid("a\xff"
                                 "b"),
            "a\xef\xbf\xbd"
            "b");
  EXPECT_EQ(utf8_replace_invalid("\xe6\x97"), "\xef\xbf\xbd");              // a cut three-byte character: one
  EXPECT_EQ(utf8_replace_invalid("\xf0\x80"), "\xef\xbf\xbd\xef\xbf\xbd");  // an impossible second byte: two
  EXPECT_EQ(utf8_replace_invalid("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // a surrogate
  EXPECT_EQ(utf8_replace_invalid("\xe6\x97\xa5 ok"), "\xe6\x97\xa5 ok");
  json byte_level = {{"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}};
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_char(uint8_t(b))] = b;
  byte_level["model"] = {{"vocab", vocab}};
  HfTokenizer t(hf_write("bytes", {}, byte_level));
  EXPECT_EQ(t.encode("a\xff\xfe"
                     "b"),
            t.encode("a\xef\xbf\xbd\xef\xbf\xbd"
                     "b"));
  EXPECT_EQ(t.decode(t.encode("caf\xc3\xa9")), "caf\xc3\xa9");
}

// One strict reading of UTF-8 for settings, records and tokenizers (runtime/utf8.h): overlong
// forms, surrogates and code points past U+10FFFF are not UTF-8 anywhere.
TEST(Utf8, OneStrictReadingEverywhere) {
  for (const char* bad : {"\xc0\x80", "\xc1\x81", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe6\x97", "\x80"})
    EXPECT_EQ(utf8_invalid_at(std::string("ok") + bad), 2u) << bad;
  EXPECT_TRUE(utf8_valid("caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x99\x82 \xf4\x8f\xbf\xbf"));
  Config cfg = config_defaults();
  EXPECT_NE(error_of([&] { config_set(cfg, "log.dir=x\xc0\x80"); }).find("not UTF-8 text"), std::string::npos);
  // An overlong 'A' is two bytes that are not UTF-8 to the pre-tokenizers too, not a letter.
  EXPECT_EQ(gpt2_pretokenize("a\xc1\x81"
                             "b"),
            (Words{"a", "\xc1\x81", "b"}));
}

TEST(HfTokenizer, NfcComposesWhatItReads) {
  json nfc = {{"normalizer", {{"type", "NFC"}}}, {"model", {{"vocab", {{"\u00e9", 60}}}}}};
  HfTokenizer t(hf_write("nfc", {}, nfc));
  EXPECT_EQ(t.pieces("e\u0301"), (Words{"\u00e9"}));
  EXPECT_EQ(t.encode("e\u0301"), (Ids{60}));
}

// Text may be cut for threads where the pieces of the parts are the pieces of the whole: after
// a regular expression's split, not where a normalizer prepends or nothing splits at all.
TEST(HfTokenizer, TextIsCutForThreadsOnlyWhereThePiecesAgree) {
  json regex = {{"pre_tokenizer",
                 {{"type", "Split"},
                  {"pattern", {{"Regex", R"(\p{L}+|\s*[\r\n]+|\s+(?!\S)|\s+|[^\s\p{L}]+)"}}},
                  {"behavior", "Isolated"}}}};
  EXPECT_TRUE(HfTokenizer(hf_write("cut", {}, regex)).cuts_at_lone_newlines());
  json prepend = regex;
  prepend["normalizer"] = {{"type", "Prepend"}, {"prepend", "-"}};
  EXPECT_FALSE(HfTokenizer(hf_write("prepend", {}, prepend)).cuts_at_lone_newlines());
  EXPECT_FALSE(HfTokenizer(hf_write("whole", {})).cuts_at_lone_newlines());  // no pre-tokenizer
  json joins = {{"pre_tokenizer",                                            // a newline joined to the word after it
                 {{"type", "Split"}, {"pattern", {{"Regex", R"(\n?[a-z]+|.)"}}}, {"behavior", "Isolated"}}}};
  EXPECT_FALSE(HfTokenizer(hf_write("joins", {}, joins)).cuts_at_lone_newlines());
}

TEST(HfTokenizer, RefusesWhatItDoesNotImplementByName) {
  auto refused = [](const std::string& name, const json& extra) {
    const std::string path = hf_write(name, {}, extra);
    return error_of([&] { HfTokenizer t(path); });
  };
  EXPECT_NE(refused("wp", {{"model", {{"type", "WordPiece"}}}}).find("model is WordPiece; loom implements BPE"),
            std::string::npos);
  EXPECT_NE(refused("uni", {{"model", {{"type", "Unigram"}}}}).find("model is Unigram"), std::string::npos);
  EXPECT_NE(refused("lower", {{"normalizer", {{"type", "Lowercase"}}}}).find("normalizer Lowercase is not one loom"),
            std::string::npos);
  EXPECT_NE(refused("ws", {{"pre_tokenizer", {{"type", "Whitespace"}}}}).find("pre-tokenizer Whitespace is not one"),
            std::string::npos);
  EXPECT_NE(refused("drop", {{"model", {{"dropout", 0.1}}}}).find("dropout 0.1"), std::string::npos);
  EXPECT_NE(refused("lstrip", {{"added_tokens", {{{"id", 60}, {"content", "<m>"}, {"lstrip", true}}}}})
                .find("the added token \"<m>\" has lstrip set"),
            std::string::npos);
  EXPECT_NE(refused("badre", {{"pre_tokenizer",
                               {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}}}})
                .find("does not compile with Oniguruma"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              HfTokenizer t(::testing::TempDir() + "no_such_tokenizer.json");
            }).find("tools/tokenizer_files.sh DIR qwen3"),
            std::string::npos);
}

// A long text's pieces come from the first pre-tokenizer in batches; the others split each
// batch, and only the first batch opens the text (Metaspace's "first" scheme marks one piece).
TEST(HfTokenizer, PiecesInBatchesAreThePiecesOfTheWhole) {
  json seq = {{"pre_tokenizer",
               {{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Split"}, {"pattern", {{"Regex", "[a-z]+|-"}}}, {"behavior", "Isolated"}},
                  {{"type", "Metaspace"}, {"replacement", "-"}, {"prepend_scheme", "first"}, {"split", false}}}}}}};
  HfTokenizer t(hf_write("batches", {}, seq));
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "ab-";  // 6000 pieces: two batches
  const Words p = t.pieces(text);
  ASSERT_EQ(p.size(), 6000u);
  EXPECT_EQ(p[0], "-ab");
  EXPECT_EQ(std::count_if(p.begin(), p.end(), [](const std::string& w) { return w.size() == 3; }), 1);
}

// A word longer than 256 bytes (no pre-tokenizer: the whole text) is merged in the parts no
// token joins: the ids of the whole word, here [a-b] each time and never a, -, b.
TEST(HfTokenizer, ALongWordSplitsOnlyWhereNoTokenJoins) {
  HfTokenizer t(hf_write("long", {{"a", "-"}, {"a-", "b"}, {"b", "b"}}));
  const int32_t a_b = 33, bb = 34;  // "a-" is 32
  std::string word;
  for (int i = 0; i < 200; ++i) word += "a-b";
  EXPECT_EQ(t.encode(word), Ids(200, a_b));
  EXPECT_EQ(t.encode("bbbb" + word.substr(0, 297)), ([&] {
              Ids ids{bb, bb};
              ids.insert(ids.end(), 99, a_b);
              return ids;
            }()));
}

// Each thread's clone matches with regular expressions of its own (an Oniguruma region is
// scratch space written on every search): clones on four threads at once give the ids one
// tokenizer gives alone.
TEST(HfTokenizer, ClonesOnThreadsAtOnceGiveTheIdsOfOne) {
  json regex = {{"pre_tokenizer",
                 {{"type", "Split"},
                  {"pattern", {{"Regex", R"(\p{L}+|\s*[\r\n]+|\s+(?!\S)|\s+|[^\s\p{L}]+)"}}},
                  {"behavior", "Isolated"}}}};
  HfTokenizer t(hf_write("threads", {{"a", "b"}, {"c", "d"}, {"ab", "cd"}}, regex));
  std::vector<std::string> texts;
  for (int k = 0; k < 4; ++k) {
    std::string s;
    for (int i = 0; i < 20000; ++i)
      s += std::string(size_t(1 + (i * 7 + k) % 5), char('a' + (i + k) % 6)) + " -\n"[i % 3];
    texts.push_back(s);
  }
  std::vector<Ids> alone;
  for (const std::string& s : texts) alone.push_back(t.encode(s));
  std::vector<Ids> together(texts.size());
  std::vector<std::thread> threads;
  for (size_t k = 0; k < texts.size(); ++k)
    threads.emplace_back([&, k, clone = t.clone()] {
      for (int round = 0; round < 3; ++round) together[k] = clone->encode(texts[k]);
    });
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(together, alone);
}

// libonig (linked for the tokenizers' expressions) exports POSIX's regcomp and regexec too; a
// program's calls must reach glibc's, the pair that compiled the pattern (Oniguruma's regexec
// on glibc's pattern hung gtest's death tests). Fails when libonig comes first in the lookup.
TEST(Regex, PosixIsGlibcs) {
  const Regex words(" ?\\p{L}+");  // Oniguruma loaded
  int n = 0;
  words.each_match("two words", [&](size_t, size_t) { ++n; });
  EXPECT_EQ(n, 2);
  for (void* fn : {reinterpret_cast<void*>(&regcomp), reinterpret_cast<void*>(&regexec)}) {
    Dl_info info{};
    ASSERT_NE(dladdr(fn, &info), 0);
    EXPECT_NE(std::string(info.dli_fname).find("libc.so"), std::string::npos) << info.dli_fname;
  }
  regex_t re;
  ASSERT_EQ(regcomp(&re, "heap-buffer-(over|under)flow", REG_EXTENDED | REG_NOSUB), 0);
  EXPECT_EQ(regexec(&re, "==1==ERROR: heap-buffer-overflow on address", 0, nullptr, 0), 0);
  EXPECT_EQ(regexec(&re, "data race", 0, nullptr, 0), REG_NOMATCH);
  regfree(&re);
}

// Catches: a failed open without dlerror's words, or missing() naming a later missing symbol
// (the refusals of both loaders quote the first) or none.
TEST(SharedLibrary, SaysWhyItDidNotOpenAndTheFirstSymbolItLacks) {
  const SharedLibrary none = SharedLibrary::open("libloom_not_there.so");
  EXPECT_FALSE(none);
  EXPECT_NE(none.error().find("libloom_not_there.so"), std::string::npos) << none.error();
  SharedLibrary c = SharedLibrary::open("libc.so.6");
  ASSERT_TRUE(c) << c.error();
  size_t (*length)(const char*) = nullptr;
  int (*first)() = nullptr, (*second)() = nullptr;
  c.bind(length, "strlen");
  EXPECT_TRUE(c.missing().empty());
  c.bind(first, "loom_first_missing");
  c.bind(second, "loom_second_missing");
  ASSERT_NE(length, nullptr);
  EXPECT_EQ(length("four"), 4u);
  EXPECT_EQ(first, nullptr);
  EXPECT_EQ(second, nullptr);
  EXPECT_EQ(c.missing(), "loom_first_missing");
}
