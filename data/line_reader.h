// A file's lines as they were before compression: plain, gzip (zlib; concatenated members
// too) or zstd (libzstd; any number of frames), told apart by their first bytes. Memory stays
// at the buffers and the longest line, whatever the file's size or its compression ratio.
// Not here: what a line holds (data/documents.h reads JSON Lines records).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace loom {

class LineReader {
 public:
  // `max_line`: a longer line is an Error naming the file and the line (a record must fit in
  // memory; a file with no line ends is not JSON Lines), or skipped (next()'s `too_long`).
  LineReader(const std::string& path, size_t max_line);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;
  // The next line without its '\n' (a last line without one counts); false at the end. A
  // compressed stream that ends early or is damaged is an Error naming the file and the line.
  // A line longer than max_line is an Error, or, where `too_long` is given, read to its end
  // without being held: true, with *too_long set and `line` empty. A long line is handed over
  // in the buffer it was read into, not copied, and the buffer starts small again.
  bool next(std::string& line, bool* too_long = nullptr);
  int64_t line_number() const { return line_; }  // of the line next() gave
  const char* compression() const;               // "plain", "gzip" or "zstd"

 private:
  struct Stream;
  bool refill();                                          // more decompressed bytes into buf_; false at the end
  void take(std::string& line, size_t end, size_t next);  // buf_[at_, end) out; read on at `next`
  void skip_line();                                       // on past the next '\n' (or the end)
  std::unique_ptr<Stream> in_;
  std::string path_, buf_;
  size_t at_ = 0, max_line_;
  int64_t line_ = 0;
  bool eof_ = false;
};

// Whether a file's name says it is compressed (.gz, .zst, .zstd), JSON (.json, .jsonl, with or
// without those), or neither.
bool name_compressed(const std::string& path);
bool name_json(const std::string& path);
// "gzip" or "zstd" where a file's first bytes say it is compressed, else null.
const char* compression_of(const std::string& path);

}  // namespace loom
