// runtime/file.h's temporaries and runtime/json_read.h's bounds, below the binary: writers of
// one path at the same time (two processes refreshing ~/.cache/loom/cpu_peak.json) each finish
// whole, a user's PATH.tmp is never touched, and JSON nested past the bound or broken is told
// in loom's words.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cli_run.h"
#include "runtime/error.h"
#include "runtime/file.h"
#include "runtime/json_read.h"

namespace {

namespace fs = std::filesystem;

std::string read(const std::string& path) {
  return loom::input_read_all(path, "", 1 << 20);
}

// The old temporary, PATH.tmp, was shared: each writer unlinked the other's as "stale", and
// the other's rename then failed (or renamed a file still being written).
TEST(TemporaryFiles, WritersOfOnePathAtOnceEachFinishWhole) {
  const std::string path = tmp("shared.json");
  fs::remove(path);
  std::vector<std::string> errors(4);
  std::vector<std::thread> writers;
  for (int w = 0; w < 4; ++w)
    writers.emplace_back([&, w] {
      const std::string text(4096, char('a' + w));
      try {
        for (int i = 0; i < 200; ++i)
          loom::file_write_atomic(path, [&](std::FILE* f) {
            for (char c : text) std::fputc(c, f);  // slowly: the writers overlap
          });
      } catch (const std::exception& e) {
        errors[size_t(w)] = e.what();
      }
    });
  for (auto& t : writers) t.join();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  const std::string last = read(path);
  ASSERT_EQ(last.size(), 4096u);
  EXPECT_EQ(last.find_first_not_of(last[0]), std::string::npos) << "a torn file";
  for (auto& e : fs::directory_iterator(fs::path(path).parent_path()))
    EXPECT_EQ(e.path().filename().string().rfind("loom_cli_WritersOfOnePathAtOnceEachFinishWhole_shared.json.tmp", 0),
              std::string::npos)
        << "a temporary left behind: " << e.path();
}

TEST(TemporaryFiles, AUsersDotTmpStaysAndAFailedWriteRemovesOnlyItsOwn) {
  const std::string path = tmp("out.bin");
  fs::remove(path);
  loom::file_write_atomic(path + ".tmp", [](std::FILE* f) { std::fputs("the user's", f); });
  loom::file_write_atomic(path, [](std::FILE* f) { std::fputs("loom's", f); });
  EXPECT_EQ(read(path + ".tmp"), "the user's");
  EXPECT_EQ(read(path), "loom's");
  EXPECT_THROW(loom::file_write_atomic(path, [](std::FILE*) { loom::fail("the writer failed"); }), loom::Error);
  EXPECT_EQ(read(path), "loom's");
  EXPECT_EQ(read(path + ".tmp"), "the user's");
  size_t left = 0;
  for (auto& e : fs::directory_iterator(fs::path(path).parent_path()))
    left += e.path().filename().string().rfind(fs::path(path).filename().string() + ".tmp-", 0) == 0;
  EXPECT_EQ(left, 0u);
  EXPECT_NE(loom::temporary_name(path, 1), loom::temporary_name(path, 2));
}

TEST(JsonRead, DepthIsBoundedAndProblemsAreLooms) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_NE(loom::json_depth_problem(deep).find("more than 512 deep"), std::string::npos);
  EXPECT_EQ(loom::json_depth_problem("[\"[[[[\"]", 2), "");  // brackets in strings do not count
  EXPECT_EQ(loom::json_depth_problem("[\"\\\"[[[\"]", 2), "");
  EXPECT_EQ(loom::json_problem(""), "is empty");
  EXPECT_EQ(loom::json_problem("{\"a\": [1"), "is cut short (it ends at line 1, column 9 in the middle of a value)");
  EXPECT_NE(loom::json_problem("{\"a\": \"\xff\"}").find("not UTF-8"), std::string::npos);
  EXPECT_EQ(loom::json_problem("{\"a\": 1,\n \"b\": x}"), "breaks off at line 2, column 7 (byte 15)");
  try {
    (void)loom::json_parse(deep, "'m.json'");
    FAIL() << "parsed";
  } catch (const loom::Error& e) {
    EXPECT_EQ(std::string(e.what()).find("json.exception"), std::string::npos) << e.what();
  }
}

}  // namespace
