// The `loom` binary run as a user runs it: its exit status and everything it printed.
#pragma once
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

#include "testing.h"

struct CliRun {
  int status;
  std::string output;
};

// `env`: NAME=VALUE... set for this run only.
inline CliRun loom_run(const std::string& args, const std::string& env = "") {
  std::string cmd = (env.empty() ? "" : "env " + env + " ") + std::string(LOOM_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}

// A path of the running test's own: ctest runs tests side by side, and two that shared a name
// would remove and write each other's files.
inline std::string tmp(const std::string& name) {
  const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "loom_cli_" + (t ? std::string(t->name()) + "_" : std::string()) + name;
}

// A tiny run, its log.dir the test's own: one run at a time writes a log.dir, and ctest runs
// tests side by side. Each later run of a test gets the next numbered log.dir (dir-2, ...): the
// first call in a test clears the ones an earlier test run left.
inline std::string tiny() {
  const std::string name =
      std::string("loom_cli_log_") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  static std::string cleared;
  if (cleared != name) {
    std::error_code ec;
    for (std::filesystem::directory_iterator it(::testing::TempDir(), ec), end; !ec && it != end; it.increment(ec)) {
      const std::string f = it->path().filename().string();
      if (f == name || (f.rfind(name + "-", 0) == 0 && f.find_first_not_of("0123456789", name.size() + 1) == f.npos))
        std::filesystem::remove_all(it->path(), ec);
    }
    cleared = name;
  }
  return std::string(
             "train --set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 --set model.vocab_size=64 "
             "--set model.seq_len=8 --set train.micro_batch=2 --set train.global_batch=2 --set train.threads=1 "
             "--set data.val_batches=0 --set log.dir=") +
         ::testing::TempDir() + name + " ";
}

inline void expect_one_line_error(const std::string& args, const std::string& phrase) {
  CliRun r = loom_run(args);
  EXPECT_EQ(r.status, 2) << r.output;
  ASSERT_FALSE(r.output.empty());
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << r.output;
  EXPECT_NE(r.output.find(phrase), std::string::npos) << "missing '" << phrase << "' in: " << r.output;
}
