// UTF-8 read strictly, as Unicode defines it (RFC 3629's table: no overlong forms, no
// surrogates, nothing past U+10FFFF): the one reader that settings, JSON Lines records and the
// tokenizers share. Not here: normalization (data/hf_pipeline.h, through utf8proc).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

// What starts at s[at]: a well-formed character (`ok`, its code point and length 1 to 4), or
// not, with `len` the maximal ill-formed subsequence there (1 to 3 bytes: a lead byte and the
// continuation bytes that can follow it), which Unicode's recommended practice replaces by
// one U+FFFD.
struct Utf8Char {
  uint32_t cp = 0;
  size_t len = 1;
  bool ok = false;
};
Utf8Char utf8_char(std::string_view s, size_t at);

// The offset of the first byte of `s` that is not part of a well-formed character, or npos.
size_t utf8_invalid_at(std::string_view s);
inline bool utf8_valid(std::string_view s) {
  return utf8_invalid_at(s) == std::string_view::npos;
}

// `s` with each maximal ill-formed subsequence replaced by U+FFFD (as Python's
// errors="replace" does).
std::string utf8_replace_invalid(std::string_view s);

}  // namespace loom
