// What a user meets on the first day, through the `loom` binary: the forms other trainers
// taught them, overrides that turn things off, one run per log.dir, what a run leaves behind
// (its config and facts, the prediction beside the measurement, a trace of chosen steps), a
// benchmark that saves nothing, and the Hugging Face directory export.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "cli_run.h"
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
                      " --set checkpoint.every=1 --set export.final=" + out + " --set log.trace=true");
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
  CliRun r = loom_run(tiny() + "--set train.steps=4 --set train.lr=0.002 --set log.dir=" + dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(slurp(dir + "/config.toml").find("lr = 0.002"), std::string::npos);
  const auto facts = nlohmann::json::parse(slurp(dir + "/run.json"));
  EXPECT_NE(facts["command"].get<std::string>().find("--set train.lr=0.002"), std::string::npos);
  EXPECT_EQ(facts["world"], 1);
  EXPECT_EQ(facts["threads"]["per_rank"], 1);
  EXPECT_FALSE(facts["loom"]["version"].get<std::string>().empty());
  EXPECT_GT(facts["peak_flops"].get<double>(), 0);
  // log.cluster = auto reads this machine's cluster file.
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

TEST(CliDayOne, EtaCountsTheStepsThisProcessRan) {
  // Resumed at step 15 of 20: 5 steps in 10 s leave 5 steps, 10 s (not 10 / 20 x 5).
  EXPECT_DOUBLE_EQ(loom::eta_seconds(10.0, 5, 5), 10.0);
  EXPECT_DOUBLE_EQ(loom::eta_seconds(10.0, 0, 5), 0.0);
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
