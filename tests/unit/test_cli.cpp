// Bad input through the `loom` binary: each case must end with a non-zero exit status and
// exactly one line that names the problem and the fix, never a crash or a backtrace.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "checkpoint/safetensors.h"
#include "cli_run.h"
#include "data/batches.h"
#include "testing.h"

// Each ending has its status, apart from the others: a broken invariant (LOOM_ASSERT) is a bug
// (70), never a user's error (2), an I/O failure (74) or ckpt verify's damage (1).
TEST(Cli, ExitStatusSaysWhoseFaultItIs) {
  auto status_of = [](auto&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return loom::exit_status_of(e);
    }
    return 0;
  };
  EXPECT_EQ(status_of([] { LOOM_ASSERT(1 + 1 == 3); }), loom::kExitBug);
  EXPECT_EQ(loom::kExitBug, 70);
  EXPECT_EQ(status_of([] { loom::fail_bug("a broken invariant"); }), 70);
  EXPECT_EQ(status_of([] { LOOM_CHECK(false, "a user's error"); }), 2);
  EXPECT_EQ(status_of([] { loom::fail_io("a full disk"); }), loom::kExitIo);
  EXPECT_EQ(status_of([] { throw std::bad_alloc(); }), 1);
  // A handler of users' errors does not take a bug for one.
  bool as_error = false;
  try {
    LOOM_ASSERT(false);
  } catch (const loom::Error&) {
    as_error = true;
  } catch (const loom::Bug& b) {
    EXPECT_NE(std::string(b.what()).find("internal error: false failed at"), std::string::npos) << b.what();
  }
  EXPECT_FALSE(as_error);
}

TEST(Cli, UnknownKey) {
  expect_one_line_error("train --set model.n_layers=2", "did you mean 'model.n_layer'");
}

TEST(Cli, WrongType) {
  std::ofstream(tmp("wrong.toml")) << "[train]\nsteps = \"many\"\n";
  expect_one_line_error("train --config " + tmp("wrong.toml"), "train.steps must be an integer, got a string");
}

TEST(Cli, HeadsDoNotDivideWidth) {
  expect_one_line_error("train --set model.d_model=96 --set model.n_head=5", "does not divide model.d_model = 96");
}

TEST(Cli, HeadsNotAMultipleOfKvHeads) {
  expect_one_line_error("train --set model.arch=llama --set model.n_head=4 --set model.n_kv_head=3",
                        "not a multiple of model.n_kv_head = 3");
}

TEST(Cli, MissingDataFile) {
  expect_one_line_error("train --set data.source=tokens --set data.path=/no/such/file.bin",
                        "'/no/such/file.bin' does not exist");
}

TEST(Cli, ShardWithBadMagicTruncatedBodyOrLargeIds) {
  std::vector<int32_t> t(100, 5);
  t[50] = 70;  // >= vocab_size 64
  loom::shard_write(tmp("big.bin"), t);
  // Ids are checked as they are read (opening a shard reads its header only): the run stops at
  // the step that reads it, with the error last.
  CliRun bad = loom_run(tiny() + "--set data.source=tokens --set data.path=" + tmp("big.bin"));
  EXPECT_EQ(bad.status, 2) << bad.output;
  EXPECT_NE(bad.output.find("\nerror: token shard '" + tmp("big.bin") +
                            "' holds token id 70 at position 50, but model.vocab_size is 64"),
            std::string::npos)
      << bad.output;
  std::ifstream in(tmp("big.bin"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(tmp("trunc.bin"), std::ios::binary) << bytes.substr(0, bytes.size() - 10);
  expect_one_line_error(tiny() + "--set data.source=tokens --set data.path=" + tmp("trunc.bin"), "is truncated");
  bytes[1] = 0x11;
  std::ofstream(tmp("magic.bin"), std::ios::binary) << bytes;
  expect_one_line_error(tiny() + "--set data.source=tokens --set data.path=" + tmp("magic.bin"),
                        "is not an llm.c token shard");
}

TEST(Cli, SafetensorsShapeAndPositionTable) {
  CliRun made = loom_run(tiny() + "--set train.steps=0 --set export.final=" + tmp("w.safetensors"));
  ASSERT_EQ(made.status, 0) << made.output;
  expect_one_line_error(tiny() + "--set model.d_model=32 --set init.from=" + tmp("w.safetensors"),
                        "has shape [64, 16] but the model expects [64, 32]");
  expect_one_line_error(tiny() + "--set model.seq_len=16 --set init.from=" + tmp("w.safetensors"),
                        "model.seq_len = 16 is above the position table");
  CliRun ok = loom_run(tiny() + "--set model.seq_len=4 --set train.steps=1 --set init.from=" + tmp("w.safetensors"));
  EXPECT_EQ(ok.status, 0) << ok.output;  // a longer table loads its first rows
}

TEST(Cli, DataCommandAndTextSourceTrain) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  std::ofstream(tmp("corpus.txt")) << text;
  CliRun d = loom_run("data " + tmp("corpus.txt") + " " + tmp("corpus.bin"));
  ASSERT_EQ(d.status, 0) << d.output;
  EXPECT_EQ(loom::shard_read(tmp("corpus.bin"), 256).size(), text.size());
  const std::string bytes = tiny() + "--set model.vocab_size=256 --set train.steps=3 --set data.val_batches=1 ";
  CliRun a = loom_run(bytes + "--set data.source=text --set data.path=" + tmp("corpus.txt"));
  CliRun b = loom_run(bytes + "--set data.source=tokens --set data.path=" + tmp("corpus.bin"));
  ASSERT_EQ(a.status, 0) << a.output;
  ASSERT_EQ(b.status, 0) << b.output;
  // The same bytes through either source give the same losses.
  auto losses = [](const std::string& out) {
    std::string s;
    for (size_t at = out.find("loss "); at != std::string::npos; at = out.find("loss ", at + 1))
      s += out.substr(at, 12) + ";";
    return s;
  };
  EXPECT_FALSE(losses(a.output).empty());
  EXPECT_EQ(losses(a.output), losses(b.output));
  expect_one_line_error(tiny() + "--set data.source=text --set data.path=" + tmp("corpus.txt"),
                        "set model.vocab_size >= 256");
}

TEST(Cli, TraceAndMetricsAreWritten) {
  const std::string dir = tmp("trace_run");
  std::filesystem::remove_all(dir);
  CliRun r = loom_run(tiny() + "--set train.steps=2 --set log.trace=true --set log.dir=" + dir);
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream t(dir + "/trace.json");
  std::string trace((std::istreambuf_iterator<char>(t)), std::istreambuf_iterator<char>());
  EXPECT_NE(trace.find("\"name\":\"attention_backward\",\"ph\":\"X\""), std::string::npos);
  std::ifstream m(dir + "/metrics.jsonl");
  std::string line;
  int lines = 0;
  std::getline(m, line);
  EXPECT_EQ(line.rfind("{\"run\":1,\"started\":", 0), 0u) << line;  // the run's header
  while (std::getline(m, line)) {
    if (line.rfind("{\"split_ms\":", 0) == 0) continue;  // the predicted and measured split, at the end
    ++lines;
    for (auto* key : {"\"step\":", "\"loss\":", "\"grad_norm\":", "\"mfu\":", "\"hfu\":", "\"comm_exposed_ms\":",
                      "\"peak_b\":", "\"act_b\":"})
      EXPECT_NE(line.find(key), std::string::npos) << key;
  }
  EXPECT_EQ(lines, 2);
}

// One run per log.dir: a second run given a log.dir that holds another run's logs writes the
// next numbered one (log.dir-2), and says so; a run that continues the run there (resumed from
// its checkpoint, restarted with LOOM_RESTART by loom supervise) appends under a header of its
// own, into the newest of them.
TEST(Cli, RunsDoNotClobberRuns) {
  const std::string dir = tmp("two_runs"), ck = tmp("two_runs_ck");
  for (const std::string& d : {dir, dir + "-2", dir + "-3", ck}) std::filesystem::remove_all(d);
  auto headers_and_steps = [](const std::string& path) {
    std::ifstream m(path);
    std::string line, headers;
    int steps = 0;
    while (std::getline(m, line)) {
      if (line.rfind("{\"run\":", 0) == 0) headers += line.substr(0, 8) + ";";
      steps += line.find("\"loss\":") != std::string::npos;
    }
    return headers + std::to_string(steps);
  };
  ASSERT_EQ(loom_run(tiny() + "--set train.steps=3 --set log.dir=" + dir).status, 0);
  CliRun second = loom_run(tiny() + "--set train.steps=2 --set log.dir=" + dir);
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("metrics: " + dir + "-2/metrics.jsonl (log.dir '" + dir + "' holds another run's logs)"),
            std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("logs        " + dir + "-2/"), std::string::npos) << second.output;
  EXPECT_EQ(headers_and_steps(dir + "/metrics.jsonl"), "{\"run\":1;3");
  EXPECT_EQ(headers_and_steps(dir + "-2/metrics.jsonl"), "{\"run\":1;2");
  // A restart of the run in dir-2 continues it there.
  ASSERT_EQ(loom_run(tiny() + "--set train.steps=2 --set log.dir=" + dir, "LOOM_RESTART=1").status, 0);
  EXPECT_EQ(headers_and_steps(dir + "-2/metrics.jsonl"), "{\"run\":1;{\"run\":2;4");
  // A run that saves checkpoints goes to dir-3; resumed from them, it goes on in dir-3.
  const std::string saves = " --set checkpoint.dir=" + ck + " --set checkpoint.every=2 --set checkpoint.resume=latest";
  ASSERT_EQ(loom_run(tiny() + "--set train.steps=2 --set log.dir=" + dir + saves).status, 0);
  ASSERT_EQ(loom_run(tiny() + "--set train.steps=4 --set log.dir=" + dir + saves).status, 0);
  EXPECT_EQ(headers_and_steps(dir + "-3/metrics.jsonl"), "{\"run\":1;{\"run\":2;4");
  EXPECT_FALSE(std::filesystem::exists(dir + "-4"));
}

TEST(Cli, PlanMemoryReproducesTheZeroPaper) {
  CliRun r = loom_run("plan memory --params 7.5e9 --dp 64");
  ASSERT_EQ(r.status, 0) << r.output;
  for (auto* want : {"zero 0:      120.0", "zero 1:       31.4", "zero 2:       16.6", "zero 3:        1.9"})
    EXPECT_NE(r.output.find(want), std::string::npos) << want << " in " << r.output;
  CliRun own = loom_run("plan memory --dp 2 --set parallel.zero=3 --json");
  ASSERT_EQ(own.status, 0) << own.output;
  EXPECT_NE(own.output.find("\"zero\":3"), std::string::npos) << own.output;
  EXPECT_NE(own.output.find("{\"rank\":1,"), std::string::npos) << own.output;
}

// The step-time model from the command line: the committed cluster files load, the search
// prints the ranked table, --predict one layout's terms, and the errors are one line. (The
// search is over GPT-2 124M, whose batch of 4 bounds dp: 0.2 s, where the 8B model's space
// takes 80 s on one core.)
TEST(Cli, PlanLayoutRanksAndPredicts) {
  const std::string src = LOOM_SOURCE_DIR;
  CliRun r = loom_run("plan layout --cluster " + src + "/examples/clusters/h100_64.toml --config " + src +
                      "/examples/configs/gpt2_124m.toml --top 3");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("H100 SXM x 64: 8 nodes x 8 cuda devices"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\n  1  tp "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\n  3  tp "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("\n  4  tp "), std::string::npos) << r.output;
  for (const char* cluster : {"this_machine", "nodes2_1gbit", "nodes2_100mbit", "h100_1024", "h200"}) {
    CliRun p = loom_run("plan layout --predict --json --cluster " + src + "/examples/clusters/" + cluster +
                        ".toml --set parallel.dp=2 --set parallel.tp=2");
    ASSERT_EQ(p.status, 0) << cluster << ": " << p.output;
    EXPECT_NE(p.output.find("\"layout\":\"tp 2 pp 1 dp 2 zero 0"), std::string::npos) << p.output;
  }
  // Seconds-long steps print in plain milliseconds, not 1.421e+04.
  CliRun big = loom_run("plan layout --predict --cluster " + src + "/examples/clusters/h100_64.toml --config " + src +
                        "/examples/configs/llama3_70b.toml --set train.global_batch=128 --set parallel.tp=4 --set "
                        "parallel.sp=true --set parallel.pp=4 --set parallel.pp_schedule=interleaved --set "
                        "parallel.pp_virtual=5 --set parallel.cp=2 --set parallel.dp=2 --set parallel.zero=1");
  ASSERT_EQ(big.status, 0) << big.output;
  EXPECT_NE(big.output.find("predicted step 1"), std::string::npos) << big.output;
  EXPECT_EQ(big.output.find("e+0"), std::string::npos) << big.output;
  // parallel.invariant's cost on a line of its own, against the same layout without the mode.
  CliRun inv = loom_run("plan layout --predict --cluster " + src +
                        "/examples/clusters/h100_64.toml --set parallel.dp=8 --set train.global_batch=128 --set "
                        "parallel.invariant=true");
  ASSERT_EQ(inv.status, 0) << inv.output;
  EXPECT_NE(inv.output.find("\nparallel.invariant: +"), std::string::npos) << inv.output;
  EXPECT_NE(inv.output.find("ms without it: micro-batch tree"), std::string::npos) << inv.output;
  expect_one_line_error("plan layout --cluster /no/such.toml", "cannot open the cluster file '/no/such.toml'");
  expect_one_line_error("plan layout --predict --cluster " + src +
                            "/examples/clusters/this_machine.toml --set parallel.dp=8 --set train.micro_batch=2",
                        "the layout needs 8 ranks (pp 1 x dp 8 x cp 1 x tp 1), the cluster has 4 devices");
}

// --list-keys gives each key's type, default and meaning; --print-config prints numbers as
// written and round-trips; info reports what the build has, from the libraries themselves.
TEST(Cli, ListKeysPrintConfigAndInfo) {
  CliRun keys = loom_run("train --list-keys");
  ASSERT_EQ(keys.status, 0);
  EXPECT_NE(keys.output.find("train.lr                     float   0.003          peak learning rate\n"),
            std::string::npos)
      << keys.output;
  EXPECT_NE(keys.output.find("parallel.timeout_s "), std::string::npos);
  EXPECT_NE(keys.output.find("log.profile_steps "), std::string::npos);
  CliRun cfg = loom_run("train --print-config --set model.n_layer=7 --set train.lr=0.003 --set train.min_lr=3e-5");
  ASSERT_EQ(cfg.status, 0);
  EXPECT_NE(cfg.output.find("n_layer = 7\n"), std::string::npos);
  EXPECT_NE(cfg.output.find("lr = 0.003\n"), std::string::npos) << cfg.output;
  EXPECT_NE(cfg.output.find("min_lr = 3e-05\n"), std::string::npos) << cfg.output;
  EXPECT_NE(cfg.output.find("top_k = 2"), std::string::npos) << cfg.output;  // the MoE keys, at their defaults
  EXPECT_NE(cfg.output.find("[checkpoint]\ndir = \"\"\nevery = 0\n"), std::string::npos) << cfg.output;
  std::ofstream(tmp("printed.toml")) << cfg.output;
  CliRun again = loom_run("train --print-config --config " + tmp("printed.toml"));
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_EQ(again.output, cfg.output);
  CliRun info = loom_run("info");
  ASSERT_EQ(info.status, 0);
  for (auto* line : {"OpenBLAS", "\nMPI: ", "\nNCCL: ", "\ncheckpoints: HDF5 ", "\nCUDA kernels: "})
    EXPECT_NE(info.output.find(line), std::string::npos) << line << " in " << info.output;
  EXPECT_EQ(info.output.find("not in this build yet\n"), std::string::npos);  // the old fixed string
  EXPECT_NE(info.output.find(LOOM_HAVE_CUDA ? "CUDA kernels: in this build" : "CUDA kernels: not in this build"),
            std::string::npos);
  expect_one_line_error("train --fault-exit 3", "expected RANK:STEP");
}

// Every command-line mistake ends as one line and status 2, not CLI11's own codes (106, 114).
TEST(Cli, CommandLineErrorsAreOneLineAndStatusTwo) {
  expect_one_line_error("train --config", "--config: 1 required TEXT missing");
  expect_one_line_error("data", "paths is required");
  expect_one_line_error("train --no-such-flag", "no-such-flag");
  expect_one_line_error("frobnicate", "A subcommand is required");
}

// "Did you mean" looks in the key's own section first and knows other trainers' names.
TEST(Cli, SuggestionsKnowSectionsAndSynonyms) {
  expect_one_line_error("train --set learning_rate=1", "did you mean 'train.lr'");
  expect_one_line_error("train --set train.warmup=3", "did you mean 'train.warmup_steps'");
  expect_one_line_error("train --set model.n_embd=64", "did you mean 'model.d_model'");
  expect_one_line_error("train --set data.val_batchs=2", "did you mean 'data.val_batches'");
}

// A key that is accepted but would do nothing is refused, naming what is missing.
TEST(Cli, KeysThatWouldDoNothingAreErrors) {
  expect_one_line_error("train --set checkpoint.dir=/tmp/ck", "checkpoint.dir is set but nothing saves or resumes");
  expect_one_line_error("train --set checkpoint.every=5", "checkpoint.every = 5 needs checkpoint.dir");
  expect_one_line_error("train --set model.moe.top_k=1", "model.moe.top_k is set but model.moe.num_experts = 0");
  expect_one_line_error("train --set parallel.pp_schedule=gpipe", "parallel.pp_schedule is set but parallel.pp = 1");
  expect_one_line_error("train --set parallel.pp_layers=2,2", "parallel.pp_layers is set but parallel.pp = 1");
}

// The CPU tests see no GPU (tests/CMakeLists.txt), so both GPU commands say what is missing.
TEST(Cli, GpuCommandsWithoutAGpuSaySo) {
  expect_one_line_error("bench kernels", LOOM_HAVE_CUDA ? "needs a CUDA device" : "this build has no CUDA");
  expect_one_line_error(tiny() + "--set model.d_model=64 --set train.device=cuda",  // head dim 32
                        LOOM_HAVE_CUDA ? "no CUDA device is visible" : "this build has no CUDA");
}

namespace {
// The per-step losses a run printed (its progress lines), for comparing runs.
std::string printed_losses(const std::string& out) {
  std::string s;
  for (size_t at = out.find("| loss "); at != std::string::npos; at = out.find("| loss ", at + 1))
    s += out.substr(at, 14) + ";";
  return s;
}
}  // namespace

// Weights as Hugging Face ships them: GPT-2 without the "transformer." prefix and with its
// attention-mask buffers; LLaMA split over two files with model.safetensors.index.json. Both
// load (the log names what was ignored), train as the full-name file does, and export full
// names.
TEST(Cli, HuggingFaceWeightsAsTheyShip) {
  const std::string run = tiny() + "--set train.steps=3 --set log.every=1 ";
  ASSERT_EQ(loom_run(tiny() + "--set train.steps=0 --set export.final=" + tmp("full.safetensors")).status, 0);
  {
    auto t = loom::safetensors_read(tmp("full.safetensors"));
    std::vector<loom::StView> views;
    std::vector<float> mask(64, 1.0f), bias(1, -1e4f);
    for (auto& [name, x] : t)
      views.push_back({name.substr(std::string("transformer.").size()), x.shape, x.data.data()});
    views.push_back({"h.0.attn.bias", {1, 1, 8, 8}, mask.data()});
    views.push_back({"h.0.attn.masked_bias", {}, bias.data()});
    loom::safetensors_write(tmp("hf.safetensors"), views);
  }
  CliRun full = loom_run(run + "--set init.from=" + tmp("full.safetensors"));
  CliRun hf =
      loom_run(run + "--set init.from=" + tmp("hf.safetensors") + " --set export.final=" + tmp("out.safetensors"));
  ASSERT_EQ(hf.status, 0) << hf.output;
  EXPECT_FALSE(printed_losses(full.output).empty());
  EXPECT_EQ(printed_losses(hf.output), printed_losses(full.output));
  EXPECT_NE(hf.output.find("2 tensors in it unused: h.0.attn.bias, h.0.attn.masked_bias"), std::string::npos)
      << hf.output;
  EXPECT_TRUE(loom::safetensors_read(tmp("out.safetensors")).count("transformer.wte.weight"));

  const std::string llama = run + "--set model.arch=llama --set model.n_kv_head=1 ";
  ASSERT_EQ(loom_run(llama + "--set train.steps=0 --set export.final=" + tmp("llama.safetensors")).status, 0);
  const std::string dir = tmp("llama_sharded");
  std::filesystem::create_directories(dir);
  {
    auto t = loom::safetensors_read(tmp("llama.safetensors"));
    std::vector<loom::StView> a, b;
    std::string map;
    for (auto& [name, x] : t) {
      const bool first = name.find("layers.0.") != std::string::npos || name.find("embed") != std::string::npos;
      (first ? a : b).push_back({name, x.shape, x.data.data()});
      map +=
          fmt::format("{}\"{}\": \"model-0000{}-of-00002.safetensors\"", map.empty() ? "" : ",", name, first ? 1 : 2);
    }
    loom::safetensors_write(dir + "/model-00001-of-00002.safetensors", a);
    loom::safetensors_write(dir + "/model-00002-of-00002.safetensors", b);
    std::ofstream(dir + "/model.safetensors.index.json") << "{\"metadata\": {}, \"weight_map\": {" << map << "}}";
  }
  CliRun one = loom_run(llama + "--set init.from=" + tmp("llama.safetensors"));
  CliRun index = loom_run(llama + "--set init.from=" + dir + "/model.safetensors.index.json");
  CliRun folder = loom_run(llama + "--set init.from=" + dir);
  ASSERT_EQ(index.status, 0) << index.output;
  ASSERT_EQ(folder.status, 0) << folder.output;
  EXPECT_FALSE(printed_losses(one.output).empty());
  EXPECT_EQ(printed_losses(index.output), printed_losses(one.output));
  EXPECT_EQ(printed_losses(folder.output), printed_losses(one.output));
}
