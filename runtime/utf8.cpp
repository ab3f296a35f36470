#include "runtime/utf8.h"

namespace loom {

Utf8Char utf8_char(std::string_view s, size_t at) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const unsigned char c = p[at];
  if (c < 0x80) return {c, 1, true};
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range (RFC 3629's table)
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    if (c == 0xe0) lo = 0xa0;  // no overlong forms
    if (c == 0xed) hi = 0x9f;  // no surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;  // nothing past U+10FFFF
  } else {
    return {0, 1, false};
  }
  uint32_t cp = c & (len == 2 ? 0x1fu : len == 3 ? 0x0fu : 0x07u);
  for (size_t k = 1; k < len; ++k) {
    const bool fits = at + k < s.size() && p[at + k] >= (k == 1 ? lo : 0x80) && p[at + k] <= (k == 1 ? hi : 0xbf);
    if (!fits) return {0, k, false};
    cp = (cp << 6) | (p[at + k] & 0x3fu);
  }
  return {cp, len, true};
}

size_t utf8_invalid_at(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (uint8_t(s[i]) < 0x80) {  // ASCII first: most of any text
      ++i;
      continue;
    }
    const Utf8Char c = utf8_char(s, i);
    if (!c.ok) return i;
    i += c.len;
  }
  return std::string_view::npos;
}

std::string utf8_replace_invalid(std::string_view s) {
  size_t i = utf8_invalid_at(s);
  if (i == std::string_view::npos) return std::string(s);
  std::string out(s.substr(0, i));
  while (i < s.size()) {
    const Utf8Char c = utf8_char(s, i);
    if (c.ok)
      out.append(s, i, c.len);
    else
      out += "\xef\xbf\xbd";
    i += c.len;
  }
  return out;
}

}  // namespace loom
