// What a user meets on the first day, through the `loom` binary: the forms other trainers
// taught them, overrides that turn things off, one run per log.dir, what a run leaves behind
// (its config and facts, the prediction beside the measurement, a trace of chosen steps), a
// benchmark that saves nothing, and the Hugging Face directory export.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "cli_run.h"
#include "data/batches.h"
#include "data/shard_writer.h"
#include "data/tokenizer.h"
#include "plan/step_model.h"
#include "runtime/metrics.h"
#include "testing.h"

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string fresh(const std::string& name) {
  const std::string dir = tmp("day1_" + name);
  std::filesystem::remove_all(dir);
  return dir;
}

}  // namespace

// torchtitan's `--section.key=value` (and `--section.key value`) are `--set section.key=value`.
TEST(CliDayOne, SectionKeyFormsAreSet) {
  const std::string dir = fresh("dotted");
  CliRun r = loom_run(tiny() + "--train.steps=3 --log.dir " + dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(slurp(dir + "/metrics.jsonl"), "\"loss\":"), 3);
  expect_one_line_error(tiny() + "--train.stepz=3", "did you mean 'train.steps'");
  // A bare flag is a boolean set true, not a swallowed next option.
  const std::string flag = fresh("dotted_flag");
  CliRun f = loom_run(tiny() + "--log.tensorboard --train.steps=2 --log.dir " + flag);
  ASSERT_EQ(f.status, 0) << f.output;
  EXPECT_NE(f.output.find("TensorBoard: tensorboard --logdir"), std::string::npos) << f.output;
  expect_one_line_error(tiny() + "--frobnicate.x=1", "frobnicate.x");  // not a section: the parser's error
}

TEST(CliDayOne, SuggestionsKnowOtherTrainersIdeas) {
  expect_one_line_error("train --set train.max_norm=1", "did you mean 'train.grad_clip'");
  expect_one_line_error("train --set parallel.fsdp=true", "did you mean 'parallel.zero' = 3");
  expect_one_line_error("train --set train.epochs=3", "not epochs");
  expect_one_line_error("train --set model.dropout=0.1", "no dropout");
}

// Overriding a config to turn a feature off works; a checkpoint.dir nobody uses is still refused.
TEST(CliDayOne, OverridesTurnFeaturesOff) {
  const std::string ck = fresh("ck_off");
  std::ofstream(tmp("day1_saves.toml")) << "[checkpoint]\ndir = \"" << ck << "\"\nevery = 2\n";
  CliRun r = loom_run(tiny() + "--config " + tmp("day1_saves.toml") + " --set train.steps=2 --set checkpoint.every=0");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(ck + "/step-2"));
  expect_one_line_error("train --set checkpoint.dir=" + ck, "checkpoint.dir is set but nothing saves or resumes");
}

// A second run writing the same log.dir would interleave its steps with the first's.
TEST(CliDayOne, OneRunPerLogDir) {
  const std::string dir = fresh("locked");
  std::filesystem::create_directories(dir);
  const int fd = ::open((dir + "/.metrics.lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  ASSERT_EQ(::write(fd, "pid 1 on elsewhere\n", 19), 19);
  expect_one_line_error(tiny() + "--set train.steps=2 --set log.dir=" + dir,
                        "log.dir '" + dir + "' is in use by another run (pid 1 on elsewhere)");
  EXPECT_FALSE(std::filesystem::exists(dir + "/metrics.jsonl"));
  ::close(fd);  // the holder ends: the next run writes
  CliRun r = loom_run(tiny() + "--set train.steps=2 --set log.dir=" + dir);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("metrics: " + dir + "/metrics.jsonl"), std::string::npos) << r.output;
}

// A run refused after its log was opened leaves no header of a run that never ran.
TEST(CliDayOne, RefusedRunWritesNoHeader) {
  const std::string dir = fresh("refused"), ck = fresh("refused_ck");
  std::filesystem::create_directories(ck);
  CliRun r = loom_run(tiny() + "--set train.steps=2 --set log.dir=" + dir + " --set checkpoint.dir=" + ck +
                      " --set checkpoint.resume=" + ck + "/step-7");
  ASSERT_NE(r.status, 0) << r.output;
  EXPECT_EQ(slurp(dir + "/metrics.jsonl"), "");
}

// A benchmark measures; it writes nothing into the run's log.dir, checkpoints or exports.
TEST(CliDayOne, BenchTrainSavesNothing) {
  const std::string dir = fresh("bench_log"), ck = fresh("bench_ck"), out = fresh("bench_out") + ".safetensors";
  std::string args = tiny();
  args.replace(0, 5, "bench train");
  CliRun r = loom_run(args + "--set train.steps=3 --set log.dir=" + dir + " --set checkpoint.dir=" + ck +
                      " --set checkpoint.every=1 --set export.final=" + out +
                      " --set log.trace=true --set log.tensorboard=true --set log.trace_steps=1:2");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("tokens/s"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir)) << r.output;
  EXPECT_FALSE(std::filesystem::exists(ck));
  EXPECT_FALSE(std::filesystem::exists(out));
}

// log.dir holds the resolved config, the facts of the run and, at the end, the step-time
// model's split beside the measured one.
TEST(CliDayOne, RunLeavesItsConfigFactsAndPrediction) {
  const std::string dir = fresh("facts");
  // A cluster file named by the user is compared on any machine (log.cluster = auto only where
  // the shipped file was fitted).
  CliRun r = loom_run(tiny() + "--set train.steps=4 --set train.lr=0.002 --set log.dir=" + dir +
                      " --set log.cluster=" + LOOM_SOURCE_DIR + "/examples/clusters/this_machine.toml");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(slurp(dir + "/config.toml").find("lr = 0.002"), std::string::npos);
  const auto facts = nlohmann::json::parse(slurp(dir + "/run.json"));
  EXPECT_NE(facts["command"].get<std::string>().find("--set train.lr=0.002"), std::string::npos);
  EXPECT_EQ(facts["world"], 1);
  EXPECT_EQ(facts["threads"]["per_rank"], 1);
  EXPECT_FALSE(facts["loom"]["version"].get<std::string>().empty());
  EXPECT_GT(facts["peak_flops"].get<double>(), 0);
  const std::string metrics = slurp(dir + "/metrics.jsonl");
  const size_t at = metrics.find("{\"split_ms\":");
  ASSERT_NE(at, std::string::npos) << metrics;
  const auto split = nlohmann::json::parse(metrics.substr(at, metrics.find('\n', at) - at));
  EXPECT_EQ(split["cluster"], "this_machine");
  EXPECT_GT(split["split_ms"]["predicted"]["compute"].get<double>(), 0);
  EXPECT_GT(split["split_ms"]["measured"]["total"].get<double>(), 0);
  EXPECT_NE(r.output.find("predicted (cluster this_machine) vs measured"), std::string::npos) << r.output;
  CliRun none = loom_run(tiny() + "--set train.steps=2 --set log.cluster=none --set log.dir=" + fresh("facts_none"));
  EXPECT_EQ(none.output.find("predicted"), std::string::npos) << none.output;
  expect_one_line_error(tiny() + "--set log.cluster=/no/such.toml", "log.cluster = '/no/such.toml' does not exist");
}

TEST(CliDayOne, SplitGapNamesTheTermFurthestOff) {
  loom::StepSplit p{100, 80, 10, 0, 10}, m = p;
  EXPECT_EQ(loom::split_gap(p, m), "");
  m.comm = 21, m.optimizer = 12;  // 11 ms over against 2 ms over
  EXPECT_EQ(loom::split_gap(p, m), "communication 2.1x predicted");
  m.comm = 10.5;  // under 1 ms off: noise
  EXPECT_EQ(loom::split_gap(p, m), "optimizer 1.2x predicted");
  m.optimizer = 10, m.bubble = 5;
  EXPECT_EQ(loom::split_gap(p, m), "bubble 5 ms where none was predicted");
}

// metrics.jsonl's numbers read back as the doubles loom held, so what a reader derives from them
// is what loom derived: the loss an Intel machine printed as 6.22185159 (%.9g) rounds to the float
// 6.221851825714111 where loom's own float32 (TensorBoard's) is 6.221851348876953.
TEST(CliDayOne, MetricsNumbersReadBackExactly) {
  const double loss = 6.2218515872;  // just under the midpoint of the two floats
  ASSERT_EQ(double(float(loss)), 6.221851348876953);
  ASSERT_EQ(double(float(std::stod(fmt::format("{:.9g}", loss)))), 6.221851825714111);  // what %.9g did
  EXPECT_EQ(double(float(std::stod(loom::json_number(loss)))), 6.221851348876953);
  for (double v : {loss, 0.1, 1.0 / 3.0, 6.02214076e23, 2.2250738585072014e-308, -2.5, 0.0, 1e-5, 12345678901234567.0})
    EXPECT_EQ(std::stod(loom::json_number(v)), v) << loom::json_number(v);
  EXPECT_EQ(loom::json_number(std::nan("")), "null");
  EXPECT_EQ(loom::json_number(-INFINITY), "null");
  EXPECT_EQ(nlohmann::json::parse(loom::json_number(1e-5)).get<double>(), 1e-5);  // valid JSON
}

TEST(CliDayOne, EtaCountsTheStepsThisProcessRan) {
  // Resumed at step 15 of 20: 5 steps in 10 s leave 5 steps, 10 s (not 10 / 20 x 5).
  EXPECT_DOUBLE_EQ(loom::eta_seconds(10.0, 5, 5), 10.0);
  EXPECT_DOUBLE_EQ(loom::eta_seconds(10.0, 0, 5), 0.0);
}

// bench train --profile prints the roofline table and writes the rates it measured into a
// cluster file that the step model reads; --write-cluster alone is refused.
TEST(CliDayOne, BenchTrainProfilePrintsTheTableAndWritesACluster) {
  const std::string file = fresh("profile") + ".toml";
  std::filesystem::remove(file);
  CliRun r = loom_run("bench " + tiny() + "--set train.steps=3 --profile --write-cluster " + file);
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* s : {"roofline profile, steps 2 to 3", "op family", "linear fwd", "layernorm bwd", "idle",
                        "roofline: copy", "wrote the measured rates into"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << " in\n" << r.output;
  const loom::Cluster c = loom::cluster_load(file);
  EXPECT_GT(c.attention_flops, 0);
  EXPECT_GT(c.optimizer_bw, 0);
  // Written again: the rates replaced in place, the file's other lines and comments kept.
  // ... with each term the file predicts beside the measured one.
  const CliRun again = loom_run("bench " + tiny() + "--set train.steps=3 --profile --set log.cluster=" + file +
                                " --write-cluster " + file);
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("against measured, ms per step: matmuls "), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("rates assumed: "), std::string::npos) << again.output;
  const std::string text = slurp(file);
  EXPECT_EQ(count(text, "\ngemm_efficiency = "), 1) << text;
  EXPECT_EQ(count(text, "\nattention_tflops = "), 1) << text;
  EXPECT_NE(text.find("[intra]  # a placeholder"), std::string::npos) << text;
  expect_one_line_error("bench " + tiny() + "--write-cluster " + file, "--write-cluster needs --profile");
}

// log.trace_steps traces a range of steps only.
TEST(CliDayOne, TraceStepsKeepsOnlyThoseSteps) {
  const std::string all = fresh("trace_all"), some = fresh("trace_some");
  ASSERT_EQ(loom_run(tiny() + "--set train.steps=4 --set log.trace=true --set log.dir=" + all).status, 0);
  CliRun r = loom_run(tiny() + "--set train.steps=4 --set log.trace_steps=2:3 --set log.dir=" + some);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(slurp(all + "/trace.json"), "\"name\":\"optimizer\""), 4);
  EXPECT_EQ(count(slurp(some + "/trace.json"), "\"name\":\"optimizer\""), 2);
  expect_one_line_error(tiny() + "--set log.trace_steps=3", "expected \"A:B\"");
  expect_one_line_error(tiny() + "--set train.steps=4 --set log.trace_steps=5:6", "starts after the run's last step");
  expect_one_line_error(tiny() + "--set log.profile_steps=2", "log.profile_steps = \"2\": expected \"A:B\"");
  expect_one_line_error(tiny() + "--set train.steps=4 --set log.profile_steps=5:6", "starts after the run's last step");
}

// export.final = "DIR/" writes what transformers loads: config.json and model.safetensors with
// format "pt". (tests/e2e/hf_export.sh computes the exported model's loss from those files alone.)
TEST(CliDayOne, HuggingFaceDirectoryExport) {
  const std::string dir = fresh("hf") + "/";
  CliRun r = loom_run(tiny() + "--set train.steps=1 --set model.vocab_size=256 --set export.final=" + dir);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto cfg = nlohmann::json::parse(slurp(dir + "config.json"));
  EXPECT_EQ(cfg["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(cfg["n_embd"], 16);
  EXPECT_EQ(cfg["vocab_size"], 256);
  EXPECT_EQ(loom::weights_metadata(dir + "model.safetensors").at("format"), "pt");
  EXPECT_TRUE(loom::safetensors_read(dir + "model.safetensors").count("transformer.h.0.attn.c_attn.weight"));
  // Read back by loom as a Hugging Face directory: the shape from config.json.
  CliRun g = loom_run("generate --from " + dir + " --prompt ab --max-new 2");
  EXPECT_EQ(g.status, 0) << g.output;
  expect_one_line_error(tiny() +
                            "--set model.arch=llama --set model.moe.num_experts=2 --set model.moe.every=2 "
                            "--set model.n_layer=2 --set export.final=" +
                            dir,
                        "no transformers form");
}

// loom data: several files and directories, a document per file opened by GPT-2's end-of-text
// token, a validation split into a shard of its own.
TEST(CliDayOne, DataTakesFilesDirectoriesDocumentsAndASplit) {
  const std::string dir = fresh("data_in");
  std::filesystem::create_directories(dir + "/more");
  std::ofstream(dir + "/a.txt") << "hello hello";
  std::ofstream(dir + "/more/b.txt") << "hel";
  std::ofstream(tmp("day1_c.txt")) << "hello";
  std::ofstream(tmp("day1_vocab.json")) << R"({"h":0,"e":1,"l":2,"o":3,"\u0120":4,"he":5,"hel":6,"hell":7,"hello":8,)"
                                        << R"("\u0120hello":9,"<|endoftext|>":10})";
  std::ofstream(tmp("day1_merges.txt")) << "#version: 0.2\nh e\nhe l\nhel l\nhell o\n\u0120 hello\n";
  const std::string out = tmp("day1_data.bin");
  CliRun r = loom_run("data " + dir + " " + tmp("day1_c.txt") + " " + out + " --tokenizer gpt2 --vocab " +
                      tmp("day1_vocab.json") + " --merges " + tmp("day1_merges.txt") + " --val-fraction 0.3");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("from 3 documents"), std::string::npos) << r.output;
  EXPECT_EQ(loom::shard_read(out, 65536), (std::vector<int32_t>{10, 8, 9, 10, 6}));             // a.txt, more/b.txt
  EXPECT_EQ(loom::shard_read(tmp("day1_data_val.bin"), 65536), (std::vector<int32_t>{10, 8}));  // c.txt
  // Written into an input directory, the shards are not read back as documents next time.
  for (int run = 0; run < 2; ++run) {
    CliRun again = loom_run("data " + dir + " " + dir + "/out.bin --tokenizer gpt2 --vocab " + tmp("day1_vocab.json") +
                            " --merges " + tmp("day1_merges.txt"));
    ASSERT_EQ(again.status, 0) << again.output;
    EXPECT_NE(again.output.find("from 2 documents"), std::string::npos) << again.output;
  }
  // Bytes: no end-of-text token; one document splits by tokens.
  ASSERT_EQ(loom_run("data " + tmp("day1_c.txt") + " " + out + " --val-fraction 0.4").status, 0);
  EXPECT_EQ(loom::shard_read(out, 256), (std::vector<int32_t>{'h', 'e', 'l'}));
  EXPECT_EQ(loom::shard_read(tmp("day1_data_val.bin"), 256), (std::vector<int32_t>{'l', 'o'}));
  expect_one_line_error("data " + out, "needs INPUT... OUTPUT");
  expect_one_line_error("data /no/such.txt " + out, "'/no/such.txt' does not exist");
}

// Chunks cut where GPT-2's pre-tokenizer ends a piece anyway: tokenizing them apart (on
// several threads) gives the ids of the whole, on real text.
TEST(CliDayOne, TextChunksPretokenizeLikeTheWhole) {
  std::string text;
  for (const char* p : {"/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0",
                        "/usr/share/common-licenses/Artistic"}) {
    std::ifstream in(p);
    text += std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  ASSERT_GT(text.size(), 50000u);
  const auto chunks = loom::text_chunks(text, 1024);
  ASSERT_GT(chunks.size(), 20u);
  std::string joined;
  std::vector<std::string> apart;
  for (auto& c : chunks) {
    joined += c;
    for (auto& w : loom::gpt2_pretokenize(c)) apart.push_back(w);
  }
  EXPECT_EQ(joined, text);
  EXPECT_EQ(apart, loom::gpt2_pretokenize(text));
  // Cut every 1024 bytes instead, the pieces differ: the check has teeth on this text.
  std::vector<std::string> naive;
  for (size_t at = 0; at < text.size(); at += 1024)
    for (auto& w : loom::gpt2_pretokenize(text.substr(at, 1024))) naive.push_back(w);
  EXPECT_NE(naive, apart);
  // One line (a long document with no line break): cut before a space between two words, the
  // pieces of GPT-2's and LLaMA-3's pre-tokenizers are the whole's.
  std::string line = text;
  std::replace(line.begin(), line.end(), '\n', ' ');
  const auto cut = loom::text_chunks(line, 1024, /*word_cuts=*/true);
  ASSERT_GT(cut.size(), 20u);
  std::vector<std::string> gpt2, llama3;
  for (auto& c : cut) {
    for (auto& w : loom::gpt2_pretokenize(c)) gpt2.push_back(w);
    for (auto& w : loom::llama3_pretokenize(c)) llama3.push_back(w);
  }
  EXPECT_EQ(gpt2, loom::gpt2_pretokenize(line));
  EXPECT_EQ(llama3, loom::llama3_pretokenize(line));
}

// OpenMP threads wait without spinning unless the user says otherwise: loom runs itself again
// with OMP_WAIT_POLICY=passive before the OpenMP runtime reads it.
TEST(CliDayOne, ThreadsWaitPassivelyUnlessTold) {
  // OMP_DISPLAY_ENV: the OpenMP runtime prints the policy it read when it loaded.
  CliRun plain = loom_run("info", "OMP_DISPLAY_ENV=true");
  EXPECT_NE(plain.output.find("OMP_WAIT_POLICY = 'PASSIVE'"), std::string::npos) << plain.output;
  EXPECT_NE(plain.output.find("wait policy passive)"), std::string::npos) << plain.output;
  CliRun told = loom_run("info", "OMP_DISPLAY_ENV=true OMP_WAIT_POLICY=active");
  EXPECT_NE(told.output.find("OMP_WAIT_POLICY = 'ACTIVE'"), std::string::npos) << told.output;
}

// An export records the tokenizer the data was made with, and generate uses it without being
// told; weights that record none get a warning where bytes are unlikely to be right.
TEST(CliDayOne, ExportsRecordTheTokenizerGenerateUsesIt) {
  const std::string tok = fresh("tok");
  std::filesystem::create_directories(tok);
  std::ofstream(tok + "/vocab.json")
      << R"({"h":0,"e":1,"l":2,"o":3,"\u0120":4,"he":5,"hel":6,"hell":7,"hello":8,"\u0120hello":9})";
  std::ofstream(tok + "/merges.txt") << "#version: 0.2\nh e\nhe l\nhel l\nhell o\n\u0120 hello\n";
  std::vector<int32_t> ids;
  for (int i = 0; i < 400; ++i) ids.push_back(i % 3 ? 9 : 8);
  loom::shard_write(tmp("day1_tok.bin"), ids);
  const std::string file = fresh("tok_w") + ".safetensors", dir = fresh("tok_hf") + "/";
  for (const std::string& out : {file, dir}) {
    CliRun r = loom_run(tiny() + "--set train.steps=2 --set data.source=tokens --set data.path=" + tmp("day1_tok.bin") +
                        " --set data.tokenizer=gpt2 --set data.tokenizer_dir=" + tok + " --set export.final=" + out);
    ASSERT_EQ(r.status, 0) << r.output;
    CliRun g = loom_run("generate --from " + out + " --prompt hello --max-new 2");
    ASSERT_EQ(g.status, 0) << g.output;
    EXPECT_NE(g.output.find("tokenizer gpt2, recorded with the weights"), std::string::npos) << g.output;
  }
  EXPECT_TRUE(std::filesystem::exists(dir + "vocab.json"));  // what transformers' tokenizer reads
  // LLaMA-3's: tokenizer.model recorded, copied into a Hugging Face directory, and used.
  const std::string l3 = fresh("tok_l3");
  std::filesystem::create_directories(l3);
  loom::test::ranks_write(l3 + "/tokenizer.model");
  const std::string l3dir = fresh("tok_l3_hf") + "/";
  CliRun trained =
      loom_run(tiny() + "--set model.arch=llama --set model.vocab_size=128256 --set train.steps=1 " +
               "--set data.tokenizer=llama3 --set data.tokenizer_dir=" + l3 + " --set export.final=" + l3dir);
  ASSERT_EQ(trained.status, 0) << trained.output;
  EXPECT_TRUE(std::filesystem::exists(l3dir + "tokenizer.model"));
  CliRun l3g = loom_run("generate --from " + l3dir + " --prompt hello --max-new 2");
  ASSERT_EQ(l3g.status, 0) << l3g.output;
  EXPECT_NE(l3g.output.find("tokenizer llama3, recorded with the weights"), std::string::npos) << l3g.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "merges.txt"));
  expect_one_line_error(tiny() + "--set data.tokenizer=gpt2", "needs data.tokenizer_dir");
  // No tokenizer recorded, a vocabulary far beyond bytes: said.
  const std::string big = fresh("big_w") + "/w.safetensors";
  std::filesystem::create_directories(fresh("big_w"));
  ASSERT_EQ(loom_run(tiny() + "--set train.steps=0 --set model.vocab_size=1024 --set export.final=" + big).status, 0);
  CliRun g = loom_run("generate --from " + big + " --prompt ab --max-new 1");
  EXPECT_NE(g.output.find("warning: no tokenizer is recorded"), std::string::npos) << g.output;
}

// plan memory --dp on a config sized for one GPU: the global batch grows with the ranks (its
// micro-batches per rank kept) and the plan says so, where the batch alone would be refused.
TEST(CliDayOne, PlanMemoryDpScalesTheGlobalBatch) {
  CliRun r =
      loom_run(std::string("plan memory --dp 8 --config ") + LOOM_SOURCE_DIR + "/examples/configs/gpt2_124m_gpu.toml");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(
      r.output.find("global batch scaled with --dp: the config's 1 micro-batch of 16 a step on each rank of --dp 8"),
      std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("global batch 128 sequences (1 micro-batch a step on each dp rank)"), std::string::npos)
      << r.output;
  expect_one_line_error(std::string("plan memory --dp 8 --set train.global_batch=16 --config ") + LOOM_SOURCE_DIR +
                            "/examples/configs/gpt2_124m_gpu.toml",
                        "make global_batch a multiple of 128");
}

// loom plan layout on a small machine: rates and sizes in units that show them, shared devices
// said, and why micro-batch sizes predict alike.
TEST(CliDayOne, PlanLayoutReadsOnASmallMachine) {
  CliRun r = loom_run(std::string("plan layout --top 2 --cluster ") + LOOM_SOURCE_DIR +
                      "/examples/clusters/this_machine.toml");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* want : {"4 cpu rank slots sharing 2 physical devices", "peak 138 GFLOP/s each", "memory not checked",
                           " MB\n", "predicted alike in compute"})
    EXPECT_NE(r.output.find(want), std::string::npos) << want << " in:\n" << r.output;
  EXPECT_EQ(r.output.find("0 TFLOP/s"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(" 0.0 GB"), std::string::npos) << r.output;
  // Not on a terminal (a pipe here), the search still says what it does and what it took.
  EXPECT_NE(r.output.find("plan layout: judging "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" layouts judged in "), std::string::npos) << r.output;
}
