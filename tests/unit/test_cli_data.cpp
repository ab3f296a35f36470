// Token shards that say what made them, through the binary: a run takes model.vocab_size,
// data.doc_token and data.tokenizer from the shards' record, refuses a smaller vocabulary, a
// mismatched data.tokenizer and a mixture of tokenizers, and records the tokenizer in its
// checkpoints and exports (generate and `ckpt export` need no tokenizer options); shards
// without a record train as before.
#include <filesystem>
#include <fstream>

#include "cli_run.h"
#include "data/shards.h"

namespace {

std::string fresh(const std::string& name) {
  const std::string dir = tmp(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A GPT-2 style vocabulary of the 256 byte symbols, three merges and <|endoftext|> (id 259).
void tiny_gpt2_write(const std::string& dir) {
  std::string vocab = "{";
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + extra++);
    std::string s;
    if (cp < 0x80) {
      s = cp == '"' ? "\\\"" : cp == '\\' ? "\\\\" : std::string(1, char(cp));
    } else {
      s += char(0xc0 | (cp >> 6));
      s += char(0x80 | (cp & 0x3f));
    }
    vocab += "\"" + s + "\":" + std::to_string(b) + ",";
  }
  vocab += R"("th":256,"the":257,"\u0120the":258,"<|endoftext|>":259})";
  std::ofstream(dir + "/vocab.json") << vocab;
  std::ofstream(dir + "/merges.txt") << "#version: 0.2\nt h\nth e\n\u0120 the\n";
}

// A small model whose vocabulary the data gives.
std::string run(const std::string& name) {
  return "train --set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 --set model.seq_len=8 "
         "--set train.micro_batch=2 --set train.global_batch=2 --set train.threads=1 --set data.val_batches=0 "
         "--set train.steps=1 --set log.dir=" +
         tmp("log_" + name) + " ";
}

}  // namespace

TEST(CliData, RunsTakeTheVocabularyAndTokenizerTheShardsRecord) {
  const std::string dir = fresh("rec");
  tiny_gpt2_write(dir);
  std::string text;
  for (int i = 0; i < 300; ++i) text += "the cat and the dog " + std::to_string(i) + "\n";
  std::ofstream(dir + "/c.txt") << text;
  const std::string tok = " --tokenizer gpt2 --vocab " + dir + "/vocab.json --merges " + dir + "/merges.txt";
  ASSERT_EQ(loom_run("data " + dir + "/c.txt " + dir + "/a.bin" + tok).status, 0);
  const loom::TokenizerRecord r = loom::shard_record_read(dir + "/a.bin");
  EXPECT_EQ(r.kind, "gpt2");
  EXPECT_EQ(r.vocab_size, 260);
  EXPECT_EQ(r.doc_token, 259);

  // No vocabulary, no tokenizer in the config: the shard's, into the checkpoint and the export.
  const std::string hf = dir + "/hf/", ck = dir + "/ck";
  CliRun t = loom_run(run("a") + "--set data.path=" + dir + "/a.bin --set data.doc_mask=true --set export.final=" + hf +
                      " --set checkpoint.every=1 --set checkpoint.dir=" + ck);
  ASSERT_EQ(t.status, 0) << t.output;
  EXPECT_NE(t.output.find("made by tokenizer gpt2 (260 tokens, files xxh64"), std::string::npos) << t.output;
  EXPECT_NE(t.output.find("whose vocabulary model.vocab_size takes"), std::string::npos) << t.output;
  EXPECT_NE(t.output.find("opened by token 259"), std::string::npos) << t.output;  // data.doc_token from it
  EXPECT_NE(slurp(hf + "config.json").find("\"vocab_size\": 260"), std::string::npos);
  for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json"})
    EXPECT_TRUE(std::filesystem::exists(hf + f)) << f;
  EXPECT_NE(slurp(hf + "tokenizer_config.json").find("GPT2Tokenizer"), std::string::npos);
  CliRun g = loom_run("generate --from " + hf + " --prompt 'the cat' --max-new 2");
  ASSERT_EQ(g.status, 0) << g.output;
  EXPECT_NE(g.output.find("tokenizer gpt2, recorded with the weights"), std::string::npos) << g.output;
  const std::string ck_hf = dir + "/ck_hf/";
  CliRun e = loom_run("ckpt export " + ck + "/step-00000001 " + ck_hf);
  ASSERT_EQ(e.status, 0) << e.output;
  EXPECT_TRUE(std::filesystem::exists(ck_hf + "merges.txt"));

  // Refused: a smaller vocabulary, another data.tokenizer, two tokenizers' shards in one run.
  expect_one_line_error(run("b") + "--set data.path=" + dir + "/a.bin --set model.vocab_size=200",
                        "model.vocab_size = 200 is smaller than the vocabulary of the tokenizer that made");
  expect_one_line_error(run("c") + "--set data.path=" + dir + "/a.bin --set data.tokenizer=byte",
                        "data.tokenizer = \"byte\", but the token shards were made by gpt2 (260 tokens");
  ASSERT_EQ(loom_run("data " + dir + "/c.txt " + dir + "/b.bin").status, 0);  // bytes
  expect_one_line_error(run("d") + "--set 'data.sources=[{path = \"" + dir + "/a.bin\", weight = 1}, {path = \"" + dir +
                            "/b.bin\", weight = 1}]'",
                        "/b.bin' were made by different tokenizers (gpt2 (260 tokens");
  // A larger vocabulary is the config's to choose.
  CliRun big = loom_run(run("e") + "--set data.path=" + dir + "/a.bin --set model.vocab_size=320");
  EXPECT_EQ(big.status, 0) << big.output;
  EXPECT_EQ(big.output.find("whose vocabulary model.vocab_size takes"), std::string::npos) << big.output;

  // The tokenizer's files moved: the run still takes the vocabulary, and says the export will
  // not carry the tokenizer.
  std::filesystem::rename(dir + "/merges.txt", dir + "/merges.moved");
  CliRun moved = loom_run(run("f") + "--set data.path=" + dir + "/a.bin");
  EXPECT_EQ(moved.status, 0) << moved.output;
  EXPECT_NE(moved.output.find("merges.txt' is no longer there: exports will not carry it"), std::string::npos)
      << moved.output;
}

TEST(CliData, ShardsWithoutARecordTrainAsBefore) {
  const std::string dir = fresh("norec");
  std::vector<int32_t> ids;
  for (int i = 0; i < 400; ++i) ids.push_back(i % 50);
  loom::shard_write(dir + "/old.bin", ids);  // llm.c's header, no record
  EXPECT_TRUE(loom::shard_record_read(dir + "/old.bin").kind.empty());
  CliRun t = loom_run(run("g") + "--set data.path=" + dir + "/old.bin --set model.vocab_size=64");
  ASSERT_EQ(t.status, 0) << t.output;
  EXPECT_EQ(t.output.find("made by tokenizer"), std::string::npos) << t.output;
  // Without model.vocab_size: the default, as before.
  CliRun d = loom_run(run("h") + "--set data.path=" + dir + "/old.bin --set export.final=" + dir + "/hf/");
  ASSERT_EQ(d.status, 0) << d.output;
  EXPECT_NE(slurp(dir + "/hf/config.json").find("\"vocab_size\": 512"), std::string::npos);
}
