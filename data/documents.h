// The documents `loom data` tokenizes, in order: each text file whole, or each record of JSON
// Lines files (plain, gzip or zstd), whose text is one string-valued key. Bad records are
// refused with their file and line; nothing is cut, joined or mended. Not here: tokenizing.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom {

class LineReader;

struct RawDoc {
  size_t file = 0;    // index into the reader's files
  int64_t line = 0;   // a record's line (1-based); 0 for a text file
  std::string bytes;  // a text file's bytes, or a record's line
};

class DocReader {
 public:
  // `jsonl`: the files are JSON Lines (records up to max_line bytes), else each file is one
  // document (read whole).
  DocReader(std::vector<std::string> files, bool jsonl, size_t max_line);
  ~DocReader();
  bool next(RawDoc& d);  // false at the end; blank lines of JSON Lines are not records
  const std::vector<std::string>& files() const { return files_; }

 private:
  std::vector<std::string> files_;
  bool jsonl_;
  size_t max_line_, file_ = 0;
  std::unique_ptr<LineReader> lines_;
};

// The records of a JSON Lines file (its lines that are not blank), read through once.
int64_t jsonl_count_records(const std::string& path, size_t max_line);

// A record's text: true with `text` set, else false with `why`, one line without the file and
// line ("not valid JSON (...)", "no \"text\" key (...)", "\"text\" is a number, not a string",
// "invalid UTF-8 at byte 12").
bool jsonl_record_text(const std::string& line, const std::string& key, std::string& text, std::string& why);

// The offset of the first byte of `s` that does not belong to well-formed UTF-8 (overlong
// forms, surrogates and code points past U+10FFFF included), or npos.
size_t utf8_invalid_at(const std::string& s);

}  // namespace loom
