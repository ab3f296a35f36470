#include "data/documents.h"

#include <cerrno>
#include <cstring>
#include <new>
#include <nlohmann/json.hpp>

#include "data/line_reader.h"
#include "runtime/error.h"
#include "runtime/file.h"
#include "runtime/utf8.h"

namespace loom {

namespace {
bool blank_line(const std::string& s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\r') return false;
  return true;
}
}  // namespace

DocReader::DocReader(std::vector<std::string> files, bool jsonl, size_t max_line, bool skip_long, size_t text_piece)
    : files_(std::move(files)), jsonl_(jsonl), skip_long_(skip_long), max_line_(max_line), text_piece_(text_piece) {}

DocReader::~DocReader() {
  if (text_) std::fclose(text_);
}

bool DocReader::next(RawDoc& d) {
  d.more = false;
  if (!jsonl_ && text_piece_ > 0) {
    if (file_ >= files_.size()) return false;
    const std::string& f = files_[file_];
    if (!text_) {
      input_check(f, "input");  // a regular file (not a FIFO or a device)
      text_ = std::fopen(f.c_str(), "rb");
      if (!text_) fail_io("cannot open the input '{}': {}", f, std::strerror(errno));
    }
    d.file = file_;
    d.line = 0;
    d.bytes.resize(text_piece_);
    d.bytes.resize(std::fread(d.bytes.data(), 1, text_piece_, text_));
    if (std::ferror(text_)) fail_io("cannot read the input '{}': {}", f, std::strerror(errno));
    const int c = std::fgetc(text_);
    if (c != EOF) {
      std::ungetc(c, text_);
      d.more = true;
    } else {
      std::fclose(text_);
      text_ = nullptr;
      ++file_;
    }
    return true;
  }
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
    while (lines_->next(d.bytes, skip_long_ ? &d.too_long : nullptr)) {
      if (!d.too_long && blank_line(d.bytes)) continue;
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
  bool too_long = false;
  int64_t n = 0;
  while (in.next(line, &too_long)) n += too_long || !blank_line(line) ? 1 : 0;
  return n;
}

namespace {
// The parser's events for one record: the top level's keys, and the value under `key` (its
// string moved out of the parser), nothing else kept.
struct RecordEvents : nlohmann::json_sax<nlohmann::json> {
  const std::string& wanted;
  std::string& text;
  int depth = 0;
  bool object = false, at_key = false, found = false;
  const char* first = nullptr;  // the kind of a top level that is not an object
  const char* kind = nullptr;   // of the value under `key`, where it is not a string
  std::string keys;             // the top level's keys, for the error that lacks `key`
  bool more_keys = false;
  std::string error;
  RecordEvents(const std::string& k, std::string& t) : wanted(k), text(t) {}

  // A value at depth 1 under the key we want: its kind (null: a string, taken).
  void value(const char* what) {
    if (depth == 0 && !first) first = what;
    if (depth == 1 && at_key) found = true, kind = what;
    if (depth == 1) at_key = false;
  }
  bool null() override { return value("null"), true; }
  bool boolean(bool) override { return value("a boolean"), true; }
  bool number_integer(number_integer_t) override { return value("a number"), true; }
  bool number_unsigned(number_unsigned_t) override { return value("a number"), true; }
  bool number_float(number_float_t, const string_t&) override { return value("a number"), true; }
  bool binary(binary_t&) override { return value("binary"), true; }
  bool string(string_t& s) override {
    if (depth == 0 && !first) first = "a string";
    if (depth == 1 && at_key) {
      found = true, kind = nullptr;
      text = std::move(s);  // the parser's own copy, not copied again
    }
    if (depth == 1) at_key = false;
    return true;
  }
  bool start_object(std::size_t) override {
    if (depth == 0 && !first) object = true, first = "an object";
    value_open("an object");
    return true;
  }
  bool start_array(std::size_t) override {
    if (depth == 0 && !first) first = "an array";
    value_open("an array");
    return true;
  }
  void value_open(const char* what) {
    if (depth == 1 && at_key) found = true, kind = what;
    if (depth == 1) at_key = false;
    ++depth;
  }
  bool end_object() override { return --depth, true; }
  bool end_array() override { return --depth, true; }
  bool key(string_t& k) override {
    if (depth != 1) return true;
    if (keys.size() <= 60)
      keys += (keys.empty() ? "" : ", ") + nlohmann::json(k).dump();
    else
      more_keys = true;
    at_key = k == wanted;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error = e.what();
    return false;
  }
};
}  // namespace

bool jsonl_record_text(const std::string& line, const std::string& key, std::string& text, std::string& why) {
  if (const size_t bad = utf8_invalid_at(line); bad != std::string::npos) {
    why = fmt::format("invalid UTF-8 at byte {} of the line", bad + 1);
    return false;
  }
  text.clear();
  RecordEvents events(key, text);
  if (!nlohmann::json::sax_parse(line, &events)) {
    // e.what(): "[json.exception.parse_error.101] parse error at line 1, column 5: ..."
    std::string what = events.error;
    if (const size_t at = what.find("column "); at != std::string::npos) what = what.substr(at);
    if (what.size() > 120) {  // "last read" may quote a whole record
      size_t cut = 117;
      while (cut > 0 && (uint8_t(what[cut]) & 0xc0) == 0x80) --cut;  // not inside a character
      what = what.substr(0, cut) + "...";
    }
    text.clear();
    // A \u escape of half a surrogate pair stands for no character: no UTF-8 can hold it.
    why = std::string(what.find("surrogate") != std::string::npos ? "invalid UTF-8 in a string: a lone surrogate ("
                                                                  : "not valid JSON (") +
          what + ")";
    return false;
  }
  if (!events.object) {
    why = fmt::format("{}, not a JSON object with a \"{}\" key", events.first, key);
    return false;
  }
  if (!events.found) {
    why = fmt::format("no \"{}\" key (it has {}; choose the key with --text-key)", key,
                      events.keys.empty() ? "none" : events.keys + (events.more_keys ? ", ..." : ""));
    return false;
  }
  if (events.kind) {
    text.clear();
    why = fmt::format("\"{}\" is {}, not a string", key, events.kind);
    return false;
  }
  return true;
}

}  // namespace loom
