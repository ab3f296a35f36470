#include "data/token_text.h"

#include <algorithm>
#include <iterator>

#include "runtime/utf8.h"

namespace loom {

// ---- SentencePiece-style pieces ----

void metaspace_decode(std::string_view piece, std::string& out) {
  for (size_t at = 0; at < piece.size();) {
    if (piece.compare(at, 3, "\u2581") == 0) {
      out += ' ';
      at += 3;
    } else {
      out += piece[at++];
    }
  }
}

bool byte_piece_decode(std::string_view piece, std::string& out) {
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>' || hex(piece[3]) < 0 || hex(piece[4]) < 0)
    return false;
  out += char(hex(piece[3]) * 16 + hex(piece[4]));
  return true;
}

// ---- GPT-2's byte-level alphabet ----

namespace {
// Printable bytes stand for themselves; the others, in order, for U+0100 on.
bool byte_printable(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}
constexpr uint32_t kStandIns = 256 + 68;  // the code points the alphabet uses: below U+0144
struct ByteAlphabet {
  std::string chars[256];
  int16_t byte_of[kStandIns];  // code point -> its byte, -1 where none
  ByteAlphabet() {
    std::fill(std::begin(byte_of), std::end(byte_of), int16_t(-1));
    uint32_t extra = 0;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = byte_printable(b) ? uint32_t(b) : 256 + extra++;
      byte_of[cp] = int16_t(b);
      if (cp < 0x80) {
        chars[b] = std::string(1, char(cp));
      } else {
        chars[b] += char(0xc0 | (cp >> 6));
        chars[b] += char(0x80 | (cp & 0x3f));
      }
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}
}  // namespace

const std::string& byte_level_char(uint8_t b) {
  return alphabet().chars[b];
}

bool byte_level_decode(std::string_view s, std::string& out) {
  const ByteAlphabet& a = alphabet();
  std::string bytes;  // committed to `out` only when every character is in the alphabet
  bytes.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const Utf8Char c = utf8_char(s, i);
    if (!c.ok || c.cp >= kStandIns || a.byte_of[c.cp] < 0) return false;
    bytes += char(a.byte_of[c.cp]);
    i += c.len;
  }
  out += bytes;
  return true;
}

}  // namespace loom
