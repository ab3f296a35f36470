#include "data/line_reader.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "runtime/error.h"
#include "runtime/file.h"

namespace loom {

namespace {
constexpr size_t kBlock = size_t(1) << 20;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
std::string without_compression(const std::string& path) {
  for (const char* ext : {".gz", ".zst", ".zstd"})
    if (ends_with(path, ext)) return path.substr(0, path.size() - std::strlen(ext));
  return path;
}
}  // namespace

bool name_compressed(const std::string& path) {
  return without_compression(path) != path;
}

bool name_json(const std::string& path) {
  const std::string p = without_compression(path);
  return ends_with(p, ".jsonl") || ends_with(p, ".json");
}

namespace {
bool gzip_magic(const unsigned char* head, ssize_t got) {
  return got >= 2 && head[0] == 0x1f && head[1] == 0x8b;
}
bool zstd_magic(const unsigned char* head, ssize_t got) {
  return got == 4 && head[0] == 0x28 && head[1] == 0xb5 && head[2] == 0x2f && head[3] == 0xfd;
}
}  // namespace

const char* compression_of(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return nullptr;
  unsigned char head[4] = {};
  const ssize_t got = ::pread(fd, head, sizeof head, 0);
  ::close(fd);
  return gzip_magic(head, got) ? "gzip" : zstd_magic(head, got) ? "zstd" : nullptr;
}

// The raw file and its decoder: read() gives decompressed bytes, 0 at the end of the data.
struct LineReader::Stream {
  enum Kind { PLAIN, GZIP, ZSTD } kind = PLAIN;
  int fd = -1;
  std::string path;
  std::vector<char> raw;  // compressed bytes read and not yet decoded: [raw_at, raw_end)
  size_t raw_at = 0, raw_end = 0;
  bool file_done = false;
  z_stream z{};
  bool z_open = false, z_ended = true;  // z_ended: between members (nothing half-decoded)
  ZSTD_DCtx* zd = nullptr;
  size_t zstd_hint = 0;  // ZSTD_decompressStream's last return: 0 where a frame is complete

  ~Stream() {
    if (z_open) inflateEnd(&z);
    if (zd) ZSTD_freeDCtx(zd);
    if (fd >= 0) ::close(fd);
  }
  bool fill_raw() {  // more raw bytes; false at the end of the file
    if (raw_at < raw_end) return true;
    if (file_done) return false;
    ssize_t n;
    do {
      n = ::read(fd, raw.data(), raw.size());
    } while (n < 0 && errno == EINTR);
    if (n < 0) fail_io("cannot read '{}' ({})", path, std::strerror(errno));
    raw_at = 0, raw_end = size_t(n);
    if (n == 0) file_done = true;
    return n > 0;
  }
  // Up to `cap` decompressed bytes; `line` names where a damaged or cut stream is.
  size_t read(char* out, size_t cap, int64_t line) {
    if (kind == PLAIN) {
      if (!fill_raw()) return 0;
      const size_t n = std::min(cap, raw_end - raw_at);
      std::memcpy(out, raw.data() + raw_at, n);
      raw_at += n;
      return n;
    }
    for (;;) {
      if (!fill_raw()) {
        LOOM_CHECK(kind == GZIP ? z_ended : zstd_hint == 0,
                   "'{}': the {} stream ends early in line {} (the file is cut short); compress it again, or give "
                   "the part that is whole",
                   path, kind == GZIP ? "gzip" : "zstd", line);
        return 0;
      }
      size_t made;
      if (kind == GZIP) {
        if (z_ended) {  // a new member (or trailing bytes that must be one)
          LOOM_CHECK(inflateReset(&z) == Z_OK, "'{}': zlib cannot restart", path);
          z_ended = false;
        }
        z.next_in = reinterpret_cast<Bytef*>(raw.data() + raw_at);
        z.avail_in = uInt(raw_end - raw_at);
        z.next_out = reinterpret_cast<Bytef*>(out);
        z.avail_out = uInt(cap);
        const int rc = inflate(&z, Z_NO_FLUSH);
        LOOM_CHECK(rc == Z_OK || rc == Z_STREAM_END || rc == Z_BUF_ERROR,
                   "'{}': the gzip data is damaged in line {} (zlib: {}); it cannot be read past there", path, line,
                   z.msg ? z.msg : zError(rc));
        raw_at = raw_end - z.avail_in;
        made = cap - z.avail_out;
        if (rc == Z_STREAM_END) z_ended = true;
      } else {
        ZSTD_inBuffer in{raw.data() + raw_at, raw_end - raw_at, 0};
        ZSTD_outBuffer o{out, cap, 0};
        zstd_hint = ZSTD_decompressStream(zd, &o, &in);
        LOOM_CHECK(!ZSTD_isError(zstd_hint),
                   "'{}': the zstd data is damaged in line {} (zstd: {}); it cannot be read past there", path, line,
                   ZSTD_getErrorName(zstd_hint));
        raw_at += in.pos;
        made = o.pos;
      }
      if (made > 0) return made;
    }
  }
};

LineReader::LineReader(const std::string& path, size_t max_line)
    : in_(std::make_unique<Stream>()), path_(path), max_line_(max_line) {
  input_check(path, "input");
  in_->path = path;
  in_->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LOOM_CHECK(in_->fd >= 0, "cannot open input '{}' ({})", path, std::strerror(errno));
  in_->raw.resize(kBlock);
  unsigned char head[4] = {};
  const ssize_t got = ::pread(in_->fd, head, sizeof head, 0);
  if (gzip_magic(head, got)) {
    in_->kind = Stream::GZIP;
    LOOM_CHECK(inflateInit2(&in_->z, 15 + 16) == Z_OK, "zlib cannot start for '{}'", path);
    in_->z_open = true;
  } else if (zstd_magic(head, got)) {
    in_->kind = Stream::ZSTD;
    in_->zd = ZSTD_createDCtx();
    LOOM_CHECK(in_->zd, "libzstd cannot start for '{}'", path);
  } else {
    LOOM_CHECK(!name_compressed(path),
               "'{}' is named as compressed but holds neither gzip nor zstd data (its first bytes); rename it or "
               "compress it again",
               path);
  }
}

LineReader::~LineReader() = default;

const char* LineReader::compression() const {
  return in_->kind == Stream::GZIP ? "gzip" : in_->kind == Stream::ZSTD ? "zstd" : "plain";
}

bool LineReader::refill() {
  if (eof_) return false;
  if (at_ > 0) {
    buf_.erase(0, at_);
    at_ = 0;
  }
  const size_t old = buf_.size();
  buf_.resize(old + kBlock);
  const size_t n = in_->read(buf_.data() + old, kBlock, line_ + 1);
  buf_.resize(old + n);
  if (n == 0) eof_ = true;
  return n > 0;
}

void LineReader::take(std::string& line, size_t end, size_t next) {
  if (end - at_ < kBlock) {
    line.assign(buf_, at_, end - at_);
    at_ = next;
    return;
  }
  std::string rest(buf_, std::min(next, buf_.size()));  // what was read past the line: under a block
  buf_.resize(end);
  buf_.erase(0, at_);
  line.swap(buf_);
  buf_ = std::move(rest);
  at_ = 0;
}

void LineReader::skip_line() {
  for (;;) {
    if (const void* nl = std::memchr(buf_.data() + at_, '\n', buf_.size() - at_)) {
      at_ = size_t(static_cast<const char*>(nl) - buf_.data()) + 1;
      return;
    }
    std::string().swap(buf_);  // the long line's buffer goes back
    at_ = 0;
    if (!refill()) return;
  }
}

bool LineReader::next(std::string& line, bool* too_long) {
  if (too_long) *too_long = false;
  size_t scanned = at_;
  for (;;) {
    const void* nl = std::memchr(buf_.data() + scanned, '\n', buf_.size() - scanned);
    const size_t end = nl ? size_t(static_cast<const char*>(nl) - buf_.data()) : buf_.size();
    if (end - at_ > max_line_) {
      LOOM_CHECK(too_long,
                 "'{}' line {} is longer than {} MB (--max-record): a record is held in memory whole; raise "
                 "--max-record, or --skip-bad skips such records (is the file JSON Lines, one record a line?)",
                 path_, line_ + 1, max_line_ >> 20);
      skip_line();
      line.clear();
      *too_long = true;
      ++line_;
      return true;
    }
    if (nl) {
      take(line, end, end + 1);
      ++line_;
      return true;
    }
    const size_t seen = buf_.size() - at_;
    if (!refill()) {
      if (at_ >= buf_.size()) return false;
      take(line, buf_.size(), buf_.size());  // the last line, without its '\n'
      ++line_;
      return true;
    }
    scanned = at_ + seen;
  }
}

}  // namespace loom
