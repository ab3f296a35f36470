// Errors users can act on: one line that names the problem and the fix.
// loom::fail throws loom::Error; the CLI prints its message and exits 2. Internal invariants use
// LOOM_ASSERT (or fail_bug), which names file and line because no user can fix them: a Bug,
// status kExitBug. plural() words a count for any message ("1 rank", "2 ranks").
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

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

// A broken invariant of loom itself: not the input's fault, and no retry cures it. Not an
// Error, so that no handler of users' errors takes it for one.
struct Bug : std::logic_error {
  using std::logic_error::logic_error;
};
constexpr int kExitBug = 70;  // EX_SOFTWARE: apart from 1 (ckpt verify's damage) and 2 (a user's error)

// The CLI's exit status for what ended a command: 2 a user's error, kExitIo an I/O failure,
// kExitBug a bug in loom, 1 anything else (memory that ran out, a library's exception).
inline int exit_status_of(const std::exception& e) {
  if (dynamic_cast<const IoError*>(&e)) return kExitIo;
  if (dynamic_cast<const Error*>(&e)) return 2;
  if (dynamic_cast<const Bug*>(&e)) return kExitBug;
  return 1;
}

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
[[noreturn]] void fail_bug(fmt::format_string<Args...> f, Args&&... args) {
  throw Bug("internal error: " + fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
[[noreturn]] void fail_io(fmt::format_string<Args...> f, Args&&... args) {
  throw IoError(fmt::format(f, std::forward<Args>(args)...));
}

// A count and its noun as a message says them: "1 thread", "2 threads", "0 ranks". The plural
// adds -es after s, x, ch or sh ("2 micro-batches") and -s otherwise; give `many` where the
// noun's plural is neither.
inline std::string plural(int64_t n, std::string_view noun, std::string_view many = {}) {
  if (n == 1) return fmt::format("1 {}", noun);
  if (!many.empty()) return fmt::format("{} {}", n, many);
  // Written for C++17 as well: the CUDA sources include this header.
  const auto ends = [&](std::string_view tail) {
    return noun.size() >= tail.size() && noun.substr(noun.size() - tail.size()) == tail;
  };
  const bool es = ends("s") || ends("x") || ends("ch") || ends("sh");
  return fmt::format("{} {}{}", n, noun, es ? "es" : "s");
}

}  // namespace loom

#define LOOM_CHECK(cond, ...)               \
  do {                                      \
    if (!(cond)) ::loom::fail(__VA_ARGS__); \
  } while (0)

#define LOOM_ASSERT(cond)                                                           \
  do {                                                                              \
    if (!(cond)) ::loom::fail_bug("{} failed at {}:{}", #cond, __FILE__, __LINE__); \
  } while (0)
