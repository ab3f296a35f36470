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
  // memory; a file with no line ends is not JSON Lines).
  LineReader(const std::string& path, size_t max_line);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;
  // The next line without its '\n' (a last line without one counts); false at the end. A
  // compressed stream that ends early or is damaged is an Error naming the file and the line.
  bool next(std::string& line);
  int64_t line_number() const { return line_; }  // of the line next() gave
  const char* compression() const;               // "plain", "gzip" or "zstd"

 private:
  struct Stream;
  bool refill();  // more decompressed bytes into buf_; false at the end
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

}  // namespace loom
