#include "data/shards.h"

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "runtime/error.h"
#include "runtime/file.h"

namespace loom {

namespace {
constexpr int64_t kHeaderBytes = 256 * 4;

// A mapped shard cut shorter while a run reads it raises SIGBUS on the pages that are gone: the
// handler returns to the copy that touched them (this thread's, if any), which then fails with
// loom's error naming the shard; any other SIGBUS goes to the handler before (MPI's, say), or
// ends the process as it would have.
// volatile: the stores around the copy must stay (the copy itself never reads it).
thread_local sigjmp_buf* volatile t_mapped_copy = nullptr;
struct sigaction g_sigbus_before {};  // written once, before the handler that reads it is set

void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  if (sigjmp_buf* j = t_mapped_copy) siglongjmp(*j, 1);
  if ((g_sigbus_before.sa_flags & SA_SIGINFO) && g_sigbus_before.sa_sigaction) {
    g_sigbus_before.sa_sigaction(sig, info, ctx);
    return;
  }
  if (g_sigbus_before.sa_handler != SIG_DFL && g_sigbus_before.sa_handler != SIG_IGN &&
      g_sigbus_before.sa_handler != nullptr) {
    g_sigbus_before.sa_handler(sig);
    return;
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void sigbus_catch() {
  static std::once_flag once;  // one handler per process: signals are the process's
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_sigbus_before);
  });
}

// memcpy from a mapping; false where its pages are gone (the file was cut).
[[gnu::noinline]] bool mapped_copy(void* dst, const void* src, size_t n) {
  sigjmp_buf jump;
  if (sigsetjmp(jump, 1) != 0) {
    t_mapped_copy = nullptr;
    return false;
  }
  t_mapped_copy = &jump;
  std::memcpy(dst, src, n);
  t_mapped_copy = nullptr;
  return true;
}
}  // namespace

namespace {

// The header of the shard open on `fd`, checked against the file's size on that same descriptor
// (what is mapped next is what was checked).
ShardHeader header_of(int fd, const std::string& path) {
  int32_t header[256] = {};
  const ssize_t got = ::pread(fd, header, sizeof(header), 0);
  LOOM_CHECK(got == ssize_t(sizeof(header)), "token shard '{}' is shorter than its 1024-byte header", path);
  ShardHeader h;
  if (header[0] == kShardMagic) {
    LOOM_CHECK(header[1] == 1, "token shard '{}' has GPT-2's magic but version {}; loom reads version 1 (uint16)", path,
               header[1]);
    h.width = 2;
  } else if (header[0] == kShardMagicU32) {
    LOOM_CHECK(header[1] == 7, "token shard '{}' has LLaMA-3's magic but version {}; loom reads version 7 (uint32)",
               path, header[1]);
    h.width = 4;
  } else {
    fail(
        "'{}' is not an llm.c token shard: magic {} where {} (GPT-2, uint16) or {} (LLaMA-3, uint32) was expected; "
        "make shards with `loom data`",
        path, header[0], kShardMagic, kShardMagicU32);
  }
  h.count = header[2];
  LOOM_CHECK(h.count >= 0, "token shard '{}' has a negative token count {}", path, h.count);
  struct stat st {};
  LOOM_CHECK(::fstat(fd, &st) == 0, "cannot stat token shard '{}': {}", path, std::strerror(errno));
  const int64_t body = int64_t(st.st_size) - kHeaderBytes;
  LOOM_CHECK(h.count * h.width <= body,
             "token shard '{}' is truncated: its header says {} tokens ({} bytes) but the body has {} bytes", path,
             h.count, h.count * h.width, body);
  LOOM_CHECK(h.count * h.width == body,
             "token shard '{}' has {} bytes after its header but its header says {} tokens ({} bytes); it is damaged "
             "or was written by something else: remake it with `loom data`",
             path, body, h.count, h.count * h.width);
  return h;
}

int shard_open(const std::string& path) {
  input_check(path, "token shard");  // a FIFO would hang, a directory read as "too short"
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  LOOM_CHECK(fd >= 0, "cannot open token shard '{}' ({}); check data.path (make shards with `loom data`)", path,
             std::strerror(errno));
  return fd;
}

}  // namespace

ShardHeader shard_header_read(const std::string& path) {
  const int fd = shard_open(path);
  try {
    const ShardHeader h = header_of(fd, path);
    ::close(fd);
    return h;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

std::vector<std::string> shard_files(const std::string& path, bool val) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    input_check(path, "data file (data.path, data.val_path or data.sources)");
    return val ? std::vector<std::string>{} : std::vector<std::string>{path};
  }
  std::vector<std::string> files;
  for (auto& e : fs::directory_iterator(path)) {
    // Only regular files (or links to them) are shards: a FIFO or a directory named x.bin is not,
    // and is skipped with a word.
    if (e.path().extension() == ".bin" && !e.is_regular_file(ec)) {
      if (!val)
        fmt::print(stderr, "warning: skipping '{}' in shard directory '{}': {}, not a regular file\n",
                   e.path().string(), path, e.is_directory(ec) ? "a directory" : "a FIFO, device or link to nothing");
      continue;
    }
    const std::string stem = e.path().stem().string();
    const bool is_val =
        stem.size() >= 4 && (stem.compare(stem.size() - 4, 4, "_val") == 0 || stem.find("_val_") != std::string::npos);
    if (e.path().extension() == ".bin" && is_val == val) files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  LOOM_CHECK(val || !files.empty(), "directory '{}' holds no .bin token shards{}", path,
             shard_files(path, true).empty() ? "" : " (only validation ones, *_val.bin)");
  return files;
}

ShardStream::ShardStream(std::vector<std::string> files, int vocab_size) : vocab_(vocab_size) {
  LOOM_CHECK(!files.empty(), "no token shards given");
  sigbus_catch();
  try {
    for (std::string& path : files) {
      const int fd = shard_open(path);
      ShardHeader h;
      try {
        h = header_of(fd, path);
        LOOM_CHECK(shards_.empty() || h.width == width_,
                   "token shards '{}' ({}) and '{}' ({}) are of different formats; one source holds one format "
                   "(remake them with one `loom data` tokenizer)",
                   shards_.empty() ? "" : shards_.front().path, width_ == 2 ? "uint16, GPT-2" : "uint32, LLaMA-3", path,
                   h.width == 2 ? "uint16, GPT-2" : "uint32, LLaMA-3");
      } catch (...) {
        ::close(fd);
        throw;
      }
      if (shards_.empty()) width_ = h.width;
      Shard s;
      s.path = std::move(path);
      s.first = total_;
      s.count = h.count;
      if (h.count > 0) {
        s.map_bytes = size_t(kHeaderBytes + h.count * h.width);
        s.map = ::mmap(nullptr, s.map_bytes, PROT_READ, MAP_SHARED, fd, 0);
      }
      ::close(fd);
      if (h.count > 0) {
        LOOM_CHECK(s.map != MAP_FAILED, "cannot map token shard '{}': {}", s.path, std::strerror(errno));
        // Sequences are read at random: no read-ahead past the pages a sequence needs.
        ::madvise(s.map, s.map_bytes, MADV_RANDOM);
        s.body = static_cast<const uint8_t*>(s.map) + kHeaderBytes;
      }
      total_ += h.count;
      shards_.push_back(std::move(s));
    }
  } catch (...) {
    for (Shard& s : shards_)
      if (s.map) ::munmap(s.map, s.map_bytes);
    throw;
  }
}

ShardStream::~ShardStream() {
  for (Shard& s : shards_)
    if (s.map) ::munmap(s.map, s.map_bytes);
}

void ShardStream::read(int64_t start, int64_t count, int32_t* out) const {
  LOOM_ASSERT(start >= 0 && count >= 0 && start + count <= total_);
  // The shard holding `start`: the last whose first token is at or before it.
  auto it =
      std::upper_bound(shards_.begin(), shards_.end(), start, [](int64_t at, const Shard& s) { return at < s.first; });
  size_t i = size_t(it - shards_.begin()) - 1;
  while (count > 0) {
    const Shard& s = shards_[i++];
    const int64_t off = start - s.first, n = std::min(count, s.count - off);
    if (n <= 0) continue;  // an empty shard
    std::vector<uint8_t> raw(size_t(n * width_));
    LOOM_CHECK(mapped_copy(raw.data(), s.body + off * width_, raw.size()),
               "token shard '{}' became shorter while this run read it (the file changed under the run); loom reads "
               "its shards in place and needs them unchanged until it ends: restore the file, or write new shards "
               "under other names and resume",
               s.path);
    for (int64_t j = 0; j < n; ++j) {
      uint32_t id;
      if (width_ == 2) {
        uint16_t v;
        std::memcpy(&v, raw.data() + j * 2, 2);
        id = v;
      } else {
        std::memcpy(&id, raw.data() + j * 4, 4);
      }
      LOOM_CHECK(id < uint32_t(vocab_),
                 "token shard '{}' holds token id {} at position {}, but model.vocab_size is {}; raise "
                 "model.vocab_size or re-tokenize",
                 s.path, id, off + j, vocab_);
      out[j] = int32_t(id);
    }
    out += n;
    start += n;
    count -= n;
  }
}

std::vector<int32_t> shard_read(const std::string& path, int vocab_size) {
  ShardStream s({path}, vocab_size);
  std::vector<int32_t> out(size_t(s.num_tokens()));
  s.read(0, s.num_tokens(), out.data());
  return out;
}

namespace {
// The record's words: a tag, its version, vocabulary, document token, the hash's two halves,
// then the kind (32 bytes) and the files' paths ('\n' between them) to the header's end.
constexpr int32_t kRecordTag = 0x6d6f6f6c;  // "loom"
constexpr int kKindAt = 9, kKindBytes = 32, kFilesAt = kKindAt + kKindBytes / 4;
constexpr size_t kFilesBytes = size_t(256 - kFilesAt) * 4;

void header_fill(int32_t (&header)[256], int width, int64_t count, const TokenizerRecord& r) {
  std::memset(header, 0, sizeof header);
  header[0] = width == 2 ? kShardMagic : kShardMagicU32;
  header[1] = width == 2 ? 1 : 7;
  header[2] = int32_t(count);
  if (r.kind.empty()) return;
  LOOM_ASSERT(r.kind.size() < size_t(kKindBytes) && r.vocab_size > 0 && r.vocab_size <= INT32_MAX);
  header[3] = kRecordTag;
  header[4] = 1;
  header[5] = int32_t(r.vocab_size);
  header[6] = r.doc_token;
  header[7] = int32_t(uint32_t(r.hash));
  header[8] = int32_t(uint32_t(r.hash >> 32));
  std::memcpy(reinterpret_cast<char*>(header + kKindAt), r.kind.data(), r.kind.size());
  std::string files;
  for (const std::string& f : r.files) files += (files.empty() ? "" : "\n") + f;
  // Paths too long to fit are left out: the kind, hash and sizes still say what made the shard.
  if (files.size() < kFilesBytes) std::memcpy(reinterpret_cast<char*>(header + kFilesAt), files.data(), files.size());
}

void tokens_pack(const int32_t* ids, size_t n, int width, std::vector<uint8_t>& raw) {
  raw.resize(n * size_t(width));
  for (size_t i = 0; i < n; ++i) {
    LOOM_ASSERT(ids[i] >= 0 && (width == 4 || ids[i] < 65536));
    if (width == 2) {
      const uint16_t v = uint16_t(ids[i]);
      std::memcpy(raw.data() + i * 2, &v, 2);
    } else {
      const uint32_t v = uint32_t(ids[i]);
      std::memcpy(raw.data() + i * 4, &v, 4);
    }
  }
}
}  // namespace

std::string TokenizerRecord::describe() const {
  if (kind.empty()) return "no tokenizer recorded";
  if (kind == "byte") return fmt::format("byte ({} tokens, no files)", vocab_size);
  return fmt::format("{} ({} tokens, files xxh64 {:016x}{})", kind, vocab_size, hash,
                     files.empty() ? "" : fmt::format(", '{}'", files.front()));
}

TokenizerRecord shard_record_read(const std::string& path) {
  const int fd = shard_open(path);
  int32_t header[256] = {};
  const ssize_t got = ::pread(fd, header, sizeof(header), 0);
  ::close(fd);
  TokenizerRecord r;
  if (got != ssize_t(sizeof(header)) || header[3] != kRecordTag || header[4] != 1) return r;
  const char* kind = reinterpret_cast<const char*>(header + kKindAt);
  r.kind.assign(kind, strnlen(kind, kKindBytes));
  r.vocab_size = header[5];
  r.doc_token = header[6];
  r.hash = uint64_t(uint32_t(header[7])) | (uint64_t(uint32_t(header[8])) << 32);
  const char* files = reinterpret_cast<const char*>(header + kFilesAt);
  const std::string all(files, strnlen(files, kFilesBytes));
  for (size_t at = 0; at < all.size();) {
    const size_t nl = std::min(all.find('\n', at), all.size());
    r.files.push_back(all.substr(at, nl - at));
    at = nl + 1;
  }
  LOOM_CHECK(r.vocab_size > 0 && r.doc_token < r.vocab_size && !r.kind.empty(),
             "token shard '{}' has a damaged tokenizer record (vocabulary {}, document token {}); remake it with "
             "`loom data`",
             path, r.vocab_size, r.doc_token);
  return r;
}

ShardAppender::ShardAppender(std::FILE* f, std::string path, int width, TokenizerRecord record)
    : f_(f), path_(std::move(path)), width_(width), record_(std::move(record)) {
  LOOM_ASSERT(width == 2 || width == 4);
  int32_t header[256];
  header_fill(header, width_, 0, record_);
  file_write(f_, header, sizeof(header), path_);
}

void ShardAppender::append(const int32_t* ids, size_t n) {
  LOOM_CHECK(count_ + int64_t(n) < (int64_t(1) << 31),
             "'{}' would hold 2^31 tokens or more, more than an llm.c shard's count holds; give fewer inputs at a time",
             path_);
  tokens_pack(ids, n, width_, raw_);
  file_write(f_, raw_.data(), raw_.size(), path_);
  count_ += int64_t(n);
}

void ShardAppender::finish() {
  int32_t header[256];
  header_fill(header, width_, count_, record_);
  LOOM_CHECK(std::fseek(f_, 0, SEEK_SET) == 0, "cannot seek in '{}' ({})", path_, std::strerror(errno));
  file_write(f_, header, sizeof(header), path_);
  LOOM_CHECK(std::fseek(f_, 0, SEEK_END) == 0, "cannot seek in '{}' ({})", path_, std::strerror(errno));
}

void shard_write(const std::string& path, const std::vector<int32_t>& tokens, int width,
                 const TokenizerRecord& record) {
  LOOM_CHECK(tokens.size() < (size_t(1) << 31), "a shard holds fewer than 2^31 tokens; split the input");
  int32_t top = 0;
  for (int32_t t : tokens) {
    LOOM_CHECK(t >= 0, "token id {} is negative", t);
    top = std::max(top, t);
  }
  if (width == 0) width = top < 65536 ? 2 : 4;
  LOOM_CHECK(width == 2 || width == 4, "a shard's tokens take 2 or 4 bytes, not {}", width);
  LOOM_CHECK(width == 4 || top < 65536, "token id {} does not fit a uint16 shard", top);
  file_write_atomic(path, [&](std::FILE* f) {
    ShardAppender out(f, path, width, record);
    out.append(tokens.data(), tokens.size());
    out.finish();
  });
}

}  // namespace loom
