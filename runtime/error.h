// Errors users can act on: one line that names the problem and the fix.
// loom::fail throws loom::Error; the CLI prints its message and exits non-zero. Internal
// invariants use LOOM_ASSERT, which names file and line because no user can fix them.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace loom {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A failure of the machine rather than of the input (a full disk, a write error): the CLI
// exits with kExitIo, which a supervisor may retry, where an Error's status 2 says "fix the
// input first".
struct IoError : Error {
  using Error::Error;
};
constexpr int kExitIo = 74;  // EX_IOERR

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
[[noreturn]] void fail_io(fmt::format_string<Args...> f, Args&&... args) {
  throw IoError(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace loom

#define LOOM_CHECK(cond, ...)               \
  do {                                      \
    if (!(cond)) ::loom::fail(__VA_ARGS__); \
  } while (0)

#define LOOM_ASSERT(cond)                                                                       \
  do {                                                                                          \
    if (!(cond)) ::loom::fail("internal error: {} failed at {}:{}", #cond, __FILE__, __LINE__); \
  } while (0)
