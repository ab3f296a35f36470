// Bounded, plainly reported JSON parsing (runtime/json_read.h).
#include "runtime/json_read.h"

#include <algorithm>

#include "runtime/error.h"

namespace loom {

std::string json_depth_problem(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character, a quote included
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        return fmt::format("nests arrays and objects more than {} deep (at byte {}); loom reads JSON up to that depth",
                           max_depth, i);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return "";
}

namespace {
// Where byte `at` of `text` is, as a reader counts: "line L, column C".
std::string place(const std::string& text, size_t at) {
  at = std::min(at, text.size());
  const size_t line = size_t(std::count(text.begin(), text.begin() + long(at), '\n')) + 1;
  const size_t start = text.rfind('\n', at == 0 ? 0 : at - 1);
  const size_t column = at - (start == std::string::npos || at == 0 ? 0 : start + 1) + 1;
  return fmt::format("line {}, column {}", line, column);
}
}  // namespace

std::string json_problem(const std::string& text, int max_depth) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) return "is empty";
  if (std::string depth = json_depth_problem(text, max_depth); !depth.empty()) return depth;
  try {
    const nlohmann::json parsed = nlohmann::json::parse(text);
    (void)parsed;
    return "";
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte is 1-based: the byte the parser stopped at.
    const size_t at = e.byte > 0 ? size_t(e.byte - 1) : 0;
    const std::string said = e.what();
    if (said.find("UTF-8") != std::string::npos || said.find("UTF8") != std::string::npos)
      return fmt::format("holds bytes that are not UTF-8 ({}, byte {})", place(text, at), at);
    if (at >= text.size() || said.find("end of input") != std::string::npos)
      return fmt::format("is cut short (it ends at {} in the middle of a value)", place(text, text.size()));
    return fmt::format("breaks off at {} (byte {})", place(text, at), at);
  } catch (const nlohmann::json::exception&) {
    return "is not JSON loom can read";
  }
}

nlohmann::json json_parse(const std::string& text, const std::string& what,
                          const nlohmann::json::parser_callback_t& cb) {
  if (const std::string depth = json_depth_problem(text); !depth.empty())
    fail("{} is not valid JSON: it {}", what, depth);
  try {
    return nlohmann::json::parse(text, cb);
  } catch (const nlohmann::json::exception&) {
    fail("{} is not valid JSON: it {}", what, json_problem(text));
  }
}

}  // namespace loom
