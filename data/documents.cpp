#include "data/documents.h"

#include <new>
#include <nlohmann/json.hpp>

#include "data/line_reader.h"
#include "runtime/error.h"
#include "runtime/file.h"

namespace loom {

namespace {
bool blank_line(const std::string& s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\r') return false;
  return true;
}
const char* json_kind(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::boolean:
      return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
    case nlohmann::json::value_t::number_float:
      return "a number";
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::object:
      return "an object";
    default:
      return "a string";
  }
}
}  // namespace

DocReader::DocReader(std::vector<std::string> files, bool jsonl, size_t max_line)
    : files_(std::move(files)), jsonl_(jsonl), max_line_(max_line) {}

DocReader::~DocReader() = default;

bool DocReader::next(RawDoc& d) {
  if (!jsonl_) {
    if (file_ >= files_.size()) return false;
    d.file = file_;
    d.line = 0;
    // Regular files only: their size is their own (input_read_all refuses anything else).
    try {
      d.bytes = input_read_all(files_[file_], "input", int64_t(1) << 40);
    } catch (const std::bad_alloc&) {
      fail(
          "loom data reads a text file whole, and '{}' ({} bytes) does not fit in memory; split it, or give its "
          "documents as JSON Lines (--format jsonl), read a record at a time",
          files_[file_], input_check(files_[file_], "input"));
    }
    ++file_;
    return true;
  }
  while (file_ < files_.size()) {
    if (!lines_) lines_ = std::make_unique<LineReader>(files_[file_], max_line_);
    while (lines_->next(d.bytes)) {
      if (blank_line(d.bytes)) continue;
      d.file = file_;
      d.line = lines_->line_number();
      return true;
    }
    lines_.reset();
    ++file_;
  }
  return false;
}

int64_t jsonl_count_records(const std::string& path, size_t max_line) {
  LineReader in(path, max_line);
  std::string line;
  int64_t n = 0;
  while (in.next(line)) n += blank_line(line) ? 0 : 1;
  return n;
}

size_t utf8_invalid_at(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range (RFC 3629's table)
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;  // no surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;  // nothing past U+10FFFF
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if ((p[i + k] & 0xc0) != 0x80) return i;
    i += len;
  }
  return std::string::npos;
}

bool jsonl_record_text(const std::string& line, const std::string& key, std::string& text, std::string& why) {
  if (const size_t bad = utf8_invalid_at(line); bad != std::string::npos) {
    why = fmt::format("invalid UTF-8 at byte {} of the line", bad + 1);
    return false;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    // e.what(): "[json.exception.parse_error.101] parse error at line 1, column 5: ..."
    std::string what = e.what();
    if (const size_t at = what.find("column "); at != std::string::npos) what = what.substr(at);
    if (what.size() > 120) {  // "last read" may quote a whole record
      size_t cut = 117;
      while (cut > 0 && (uint8_t(what[cut]) & 0xc0) == 0x80) --cut;  // not inside a character
      what = what.substr(0, cut) + "...";
    }
    // A \u escape of half a surrogate pair stands for no character: no UTF-8 can hold it.
    why = std::string(what.find("surrogate") != std::string::npos ? "invalid UTF-8 in a string: a lone surrogate ("
                                                                  : "not valid JSON (") +
          what + ")";
    return false;
  }
  if (!j.is_object()) {
    why = fmt::format("{}, not a JSON object with a \"{}\" key", json_kind(j), key);
    return false;
  }
  const auto it = j.find(key);
  if (it == j.end()) {
    std::string keys;
    for (auto& [k, v] : j.items()) {
      if (keys.size() > 60) {
        keys += ", ...";
        break;
      }
      keys += (keys.empty() ? "" : ", ") + nlohmann::json(k).dump();
    }
    why = fmt::format("no \"{}\" key (it has {}; choose the key with --text-key)", key, keys.empty() ? "none" : keys);
    return false;
  }
  if (!it->is_string()) {
    why = fmt::format("\"{}\" is {}, not a string", key, json_kind(*it));
    return false;
  }
  text = it->get<std::string>();
  return true;
}

}  // namespace loom
