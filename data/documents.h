// The documents `loom data` tokenizes, in order: each text file (whole, or in pieces read one
// after another), or each record of JSON Lines files (plain, gzip or zstd), whose text is one
// string-valued key. Bad records are refused with their file and line; nothing is cut, joined or
// mended. Not here: tokenizing (where a document's pieces may be cut for the tokenizer).
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace loom {

class LineReader;

struct RawDoc {
  size_t file = 0;        // index into the reader's files
  int64_t line = 0;       // a record's line (1-based); 0 for a text file
  std::string bytes;      // a text file's bytes, or a record's line
  bool too_long = false;  // a record longer than max_line, skipped unread (`bytes` empty)
  bool more = false;      // a text file's piece that the next one continues
};

class DocReader {
 public:
  // `jsonl`: the files are JSON Lines (records up to max_line bytes), else each file is one
  // document (read whole). `skip_long`: a longer record is given as too_long (to be counted
  // as bad), else it is an Error naming its file and line.
  // `text_piece`: a text file is given in pieces of that many bytes (0: whole), so that a file
  // of any size (one line of 1 GB too) costs a piece at a time.
  DocReader(std::vector<std::string> files, bool jsonl, size_t max_line, bool skip_long = false, size_t text_piece = 0);
  ~DocReader();
  bool next(RawDoc& d);  // false at the end; blank lines of JSON Lines are not records
  const std::vector<std::string>& files() const { return files_; }
  size_t max_line() const { return max_line_; }

 private:
  std::vector<std::string> files_;
  bool jsonl_, skip_long_;
  size_t max_line_, text_piece_, file_ = 0;
  std::unique_ptr<LineReader> lines_;
  std::FILE* text_ = nullptr;  // the text file being read in pieces
};

// The records of a JSON Lines file (its lines that are not blank, too long ones included),
// read through once.
int64_t jsonl_count_records(const std::string& path, size_t max_line);

// A record's text: true with `text` set, else false with `why`, one line without the file and
// line ("not valid JSON (...)", "no \"text\" key (...)", "\"text\" is a number, not a string",
// "invalid UTF-8 at byte 12"). Read as events, not into a document: the text is moved out of
// the parser, so a record costs its line, the parser's copy of the string and the text.
bool jsonl_record_text(const std::string& line, const std::string& key, std::string& text, std::string& why);

}  // namespace loom
