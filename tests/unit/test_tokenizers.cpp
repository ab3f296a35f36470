// The pre-tokenizers' expressions on the cases that tell them apart (the reference comparison
// in e2e.tokenizers_reference covers real text), and tokenizer files that do not parse.
#include <fstream>

#include "data/shard_writer.h"
#include "data/tokenizer.h"
#include "runtime/error.h"
#include "testing.h"

using namespace loom;
using loom::test::b64;
using loom::test::error_of;
using loom::test::ranks_write;
using Words = std::vector<std::string>;

TEST(Tokenizer, PretokenizersSplitNumbersAndContractionsTheirOwnWay) {
  EXPECT_EQ(gpt2_pretokenize("12345 IT'S"), (Words{"12345", " IT", "'", "S"}));
  EXPECT_EQ(llama3_pretokenize("12345 IT'S"), (Words{"123", "45", " IT", "'S"}));
  EXPECT_EQ(llama3_pretokenize("\n\n  hello"), (Words{"\n\n", " ", " hello"}));
  EXPECT_EQ(llama3_pretokenize("$hello!!\n\nx"), (Words{"$hello", "!!\n\n", "x"}));
  // Unicode's classes, not ASCII's: superscripts and other scripts' digits are numbers.
  EXPECT_EQ(gpt2_pretokenize("x\u00b2 \u0661\u0662"), (Words{"x", "\u00b2", " \u0661\u0662"}));
  EXPECT_EQ(gpt2_pretokenize("caf\u00e9 \u65e5\u672c"), (Words{"caf\u00e9", " \u65e5\u672c"}));
}

// U+0085 is Unicode white space (as tiktoken and Hugging Face's tokenizers see it); U+FEFF is not.
TEST(Tokenizer, WhiteSpaceIsUnicodesClass) {
  EXPECT_EQ(gpt2_pretokenize("x\u0085\u0085y"), (Words{"x", "\u0085", "\u0085", "y"}));
  EXPECT_EQ(gpt2_pretokenize("x\ufeff\ufeffy"), (Words{"x", "\ufeff\ufeff", "y"}));
  EXPECT_EQ(llama3_pretokenize("a\u0085b"), (Words{"a", "\u0085b"}));
  // A byte that is not UTF-8 stands alone as punctuation.
  EXPECT_EQ(gpt2_pretokenize("a\xff\xfe b"), (Words{"a", "\xff\xfe", " b"}));
}

namespace {
std::string tmp(const std::string& name) {
  return ::testing::TempDir() + name;
}
}  // namespace

TEST(Tokenizer, Llama3MergesByRankAndDecodesSpecialTokens) {
  ranks_write(tmp("ranks.model"));
  Llama3Bpe bpe(tmp("ranks.model"));
  EXPECT_EQ(bpe.vocab_size(), 128256u);
  // "hello" is a token; "helloo" merges he + ll first (ranks 0, 1), then hell, then hello.
  EXPECT_EQ(bpe.encode("hello"), (std::vector<int32_t>{3}));
  EXPECT_EQ(bpe.encode("helloo"), (std::vector<int32_t>{3, 4 + 'o'}));
  EXPECT_EQ(bpe.encode("ehll"), (std::vector<int32_t>{4 + 'e', 4 + 'h', 1}));
  EXPECT_EQ(bpe.decode(bpe.encode("hello world")), "hello world");
  EXPECT_EQ(bpe.decode({128000, 128009}), "<|begin_of_text|><|eot_id|>");
  EXPECT_EQ(bpe.doc_token(), 128000);
}

TEST(Tokenizer, FilesThatDoNotParseAreRefusedWithWhatTheyShouldBe) {
  ranks_write(tmp("bad.model"), "not base64! 7");
  EXPECT_NE(error_of([&] { Llama3Bpe b(tmp("bad.model")); }).find("is not 'base64 rank'"), std::string::npos);
  std::ofstream(tmp("short.model")) << b64("a") << " 0\n";
  EXPECT_NE(error_of([&] { Llama3Bpe b(tmp("short.model")); }).find("ranks 1 tokens; LLaMA-3's tokenizer.model ranks"),
            std::string::npos);
  std::ofstream(tmp("vocab_bad.json")) << "{\"a\": 0,";
  std::ofstream(tmp("merges_ok.txt")) << "#version: 0.2\n";
  EXPECT_NE(error_of([&] { Gpt2Bpe b(tmp("vocab_bad.json"), tmp("merges_ok.txt")); }).find("is not valid JSON"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tokenizer_open("sentencepiece", "", ""); }).find("loom has byte, gpt2, llama3, hf and spm"),
            std::string::npos);
}

TEST(Tokenizer, ThreadsCutTextOnlyBetweenAsciiLines) {
  // After "\n" only between two ASCII non-blank characters: not after U+00A0 (white space whose
  // last byte is not blank), which the pre-tokenizers join differently.
  EXPECT_EQ(text_chunks("ab\xc2\xa0\nYZ\nQR", 1), (Words{"ab\xc2\xa0\nYZ\n", "QR"}));
}

TEST(Tokenizer, RanksFilesWithWindowsLineEndsReadAndARanklessLineDoesNot) {
  ranks_write(tmp("crlf.model"));
  {
    std::ifstream in(tmp("crlf.model"));
    std::string line, all;
    while (std::getline(in, line)) all += line + "\r\n";
    std::ofstream(tmp("crlf.model")) << all;
  }
  EXPECT_EQ(Llama3Bpe(tmp("crlf.model")).encode("hello"), (std::vector<int32_t>{3}));
  ranks_write(tmp("rankless.model"), "IQ== ");
  EXPECT_NE(error_of([&] { Llama3Bpe b(tmp("rankless.model")); }).find("is not 'base64 rank'"), std::string::npos);
}
