// Token shards that say what made them, through the binary: a run takes model.vocab_size,
// data.doc_token and data.tokenizer from the shards' record, refuses a smaller vocabulary, a
// mismatched data.tokenizer and a mixture of tokenizers, and records the tokenizer in its
// checkpoints and exports (generate and `ckpt export` need no tokenizer options); shards
// without a record train as before.
#include <filesystem>
#include <fstream>

#include "cli_run.h"
#include "data/shards.h"
#include "data/tokenizer.h"

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

// A mixture of shards with and without a record: the unrecorded one may hold any ids, so the
// run takes nothing from the record (the config's vocabulary, as before) and says so once.
TEST(CliData, ShardsWithAndWithoutARecordTrainFromTheConfig) {
  const std::string dir = fresh("mixed");
  std::vector<int32_t> ids;
  for (int i = 0; i < 400; ++i) ids.push_back(256 + i % 45);  // ids up to 300: more than bytes
  loom::shard_write(dir + "/old.bin", ids);                   // no record
  std::string text;
  for (int i = 0; i < 200; ++i) text += "some bytes " + std::to_string(i) + "\n";
  std::ofstream(dir + "/t.txt") << text;
  ASSERT_EQ(loom_run("data " + dir + "/t.txt " + dir + "/bytes.bin").status, 0);
  const std::string sources = "--set 'data.sources=[{path = \"" + dir + "/old.bin\", weight = 1}, {path = \"" + dir +
                              "/bytes.bin\", weight = 1}]' --set train.steps=4 ";
  CliRun t = loom_run(run("mixed") + sources);
  ASSERT_EQ(t.status, 0) << t.output;
  const std::string say = "old.bin' records no tokenizer (llm.c's, or an earlier loom's), so this run takes nothing";
  const size_t at = t.output.find(say);
  EXPECT_NE(at, std::string::npos) << t.output;
  EXPECT_EQ(t.output.find(say, at + 1), std::string::npos) << t.output;  // once
  // A recorded vocabulary the config's cannot hold is refused before the run, naming both.
  expect_one_line_error(run("mixed_small") + sources + "--set model.vocab_size=200",
                        "model.vocab_size = 200 is smaller than the vocabulary of the tokenizer that made");
}

// Byte shards made again by this loom record 256 tokens, but a run on byte shards keeps the
// config's vocabulary (the default 512, as before): a checkpoint from before resumes on them.
TEST(CliData, ByteShardsMadeAgainResumeACheckpointFromBefore) {
  const std::string dir = fresh("byte_resume");
  std::string text;
  for (int i = 0; i < 300; ++i) text += "byte text " + std::to_string(i) + "\n";
  std::ofstream(dir + "/t.txt") << text;
  loom::shard_write(dir + "/d.bin", loom::tokenize_bytes(text));  // as an earlier loom wrote it: no record
  const std::string ck = dir + "/ck", keys = "--set data.path=" + dir + "/d.bin --set checkpoint.dir=" + ck + " ";
  CliRun first = loom_run(run("byte_resume") + keys + "--set checkpoint.every=1");
  ASSERT_EQ(first.status, 0) << first.output;
  ASSERT_EQ(loom_run("data " + dir + "/t.txt " + dir + "/d.bin").status, 0);  // made again: a byte record
  EXPECT_EQ(loom::shard_record_read(dir + "/d.bin").describe(), "byte (256 tokens, no files)");
  CliRun resumed = loom_run(run("byte_resume2") + keys + "--set train.steps=2 --set checkpoint.resume=latest");
  EXPECT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_EQ(resumed.output.find("whose vocabulary model.vocab_size takes"), std::string::npos) << resumed.output;
}

// Two shards of one kind whose files differ (another merges.txt) are two tokenizers.
TEST(CliData, ShardsOfOneKindFromOtherFilesAreRefused) {
  const std::string dir = fresh("hash"), other = dir + "/other";
  std::filesystem::create_directories(other);
  tiny_gpt2_write(dir);
  tiny_gpt2_write(other);
  std::ofstream(other + "/merges.txt") << "#version: 0.2\nt h\nth e\n";  // one merge fewer
  std::ofstream(dir + "/c.txt") << "the cat and the dog\n";
  for (const std::string& d : {dir, other})
    ASSERT_EQ(loom_run("data " + dir + "/c.txt " + d + "/s.bin --tokenizer gpt2 --vocab " + d +
                       "/vocab.json --merges " + d + "/merges.txt")
                  .status,
              0);
  expect_one_line_error(run("hash") + "--set 'data.sources=[{path = \"" + dir + "/s.bin\", weight = 1}, {path = \"" +
                            other + "/s.bin\", weight = 1}]'",
                        "other/s.bin' were made by different tokenizers (gpt2 (260 tokens, files xxh64");
}

// Weights with no recorded tokenizer and a tokenizer.json loom does not read beside them
// (WordPiece): generate runs as it did before loom read tokenizer.json files, with a warning.
TEST(CliData, ATokenizerJsonLoomRefusesIsPassedOverAsBefore) {
  const std::string dir = fresh("wordpiece"), hf = dir + "/hf/";
  CliRun t = loom_run(run("wordpiece") + "--set export.final=" + hf);  // synthetic: nothing recorded
  ASSERT_EQ(t.status, 0) << t.output;
  std::ofstream(hf + "tokenizer.json") << R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})";
  CliRun g = loom_run("generate --from " + hf + " --prompt ab --max-new 2");
  ASSERT_EQ(g.status, 0) << g.output;
  EXPECT_NE(g.output.find("tokenizer.json' beside the weights is not one loom reads"), std::string::npos) << g.output;
  EXPECT_NE(g.output.find("model is WordPiece"), std::string::npos) << g.output;
  EXPECT_NE(g.output.find("tokenizer byte, none recorded"), std::string::npos) << g.output;
}
