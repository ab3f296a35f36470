#include "runtime/file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>
#include <vector>

#include "runtime/error.h"

namespace loom {

namespace {
std::string why() {
  return std::strerror(errno);
}
}  // namespace

void close_checked(std::FILE* f, const std::string& path) {
  const bool flushed = std::fflush(f) == 0, synced = flushed && ::fsync(fileno(f)) == 0;
  const std::string err = why();
  const bool closed = std::fclose(f) == 0;
  if (!(flushed && synced && closed)) fail_io("writing '{}' failed ({}); is the disk full?", path, err);
}

void dir_fsync(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // some filesystems do not open directories; the rename is still atomic
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // EINVAL: the filesystem does not sync directories (the entry is as durable as it gets).
  LOOM_CHECK(rc == 0 || err == EINVAL, "fsync of directory '{}' failed ({})", dir, std::strerror(err));
}

void file_write(std::FILE* f, const void* data, size_t bytes, const std::string& path) {
  if (bytes != 0 && std::fwrite(data, 1, bytes, f) != bytes)
    fail_io("writing '{}' failed ({}); is the disk full?", path, why());
}

std::string file_kind_if_not_regular(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return "";
  if (S_ISREG(st.st_mode)) return "";
  if (S_ISLNK(st.st_mode)) return "a symbolic link";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "not a regular file";
}

namespace {
std::string named(const std::string& what) {
  return what.empty() ? "" : what + " ";
}
[[noreturn]] void refuse_output(const std::string& path, const std::string& kind, const std::string& what) {
  fail(
      "{}'{}' is {}; loom writes its outputs only as regular files and never replaces or writes through anything "
      "else: choose another path",
      named(what), path, kind);
}
}  // namespace

void parent_create(const std::string& path) {
  const std::filesystem::path p(path);
  std::error_code ec;
  if (!p.has_parent_path()) return;
  std::filesystem::create_directories(p.parent_path(), ec);
  // Something that is not a directory in the way, or a name too long, is the path's fault, not
  // the machine's.
  if (ec == std::errc::filename_too_long)
    fail("'{}' cannot be written: a name in it is longer than the file system allows; choose a shorter one", path);
  if (ec && ec != std::errc::not_a_directory && ec != std::errc::file_exists)
    fail_io("cannot create the directory of '{}': {}", path, ec.message());
  if (ec || !std::filesystem::is_directory(p.parent_path()))
    fail("'{}' cannot be written: '{}' is not a directory; choose another path", path, p.parent_path().string());
}
// A new temporary beside `path`, under a name of loom's own (PATH.tmp-PID-RANDOM): created
// exclusively (O_EXCL|O_NOFOLLOW), so never an existing file (a user's PATH.tmp, another
// process's temporary) and never through a link. A name taken is tried again under another.
int temporary_create(const std::string& path, std::string* tmp) {
  std::random_device rd;
  for (int attempt = 0; attempt < 16; ++attempt) {
    *tmp = temporary_name(path, rd());
    const int fd = ::open(tmp->c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0) return fd;
    if (errno == ENAMETOOLONG)
      fail(
          "'{}' cannot be written: a name in it is longer than the file system allows (with the {} bytes loom's "
          "temporary beside it adds); choose a shorter one",
          path, tmp->size() - path.size());
    if (errno != EEXIST) fail_io("cannot write '{}' ({})", *tmp, why());
  }
  fail_io("cannot create a temporary file beside '{}': every name tried was taken", path);
}
// Removes the temporary `tmp` that `fd` (still open) created: only while the name is still that
// file, so what another process put there since stays.
void temporary_remove(int fd, const std::string& tmp) {
  struct stat mine {
  }, there{};
  if (::fstat(fd, &mine) == 0 && ::lstat(tmp.c_str(), &there) == 0 && mine.st_dev == there.st_dev &&
      mine.st_ino == there.st_ino)
    ::unlink(tmp.c_str());
}

void output_check(const std::string& path, const std::string& what) {
  if (const std::string kind = file_kind_if_not_regular(path); !kind.empty()) refuse_output(path, kind, what);
}

void output_not_input(const std::string& out, const std::vector<std::string>& inputs, const std::string& what) {
  struct stat o {};
  if (::stat(out.c_str(), &o) != 0) return;
  for (const std::string& in : inputs) {
    struct stat i {};
    if (::stat(in.c_str(), &i) == 0 && i.st_dev == o.st_dev && i.st_ino == o.st_ino)
      fail("{}'{}' is the input '{}' (the same file); writing it would replace what is read: choose another output",
           named(what), out, in);
  }
}

void output_kind_check(const std::string& path, const std::string& kind, bool (*looks_like)(const std::string& head),
                       const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) return;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return;  // what cannot be read is refused where it is written
  char head[64];
  const ssize_t n = ::pread(fd, head, sizeof head, 0);
  ::close(fd);
  if (n <= 0 || looks_like(std::string(head, size_t(n)))) return;
  fail(
      "{}'{}' exists and is not {}; loom replaces only a file of the kind it writes there: choose another path, "
      "or move that file away first",
      named(what), path, kind);
}

int output_open(const std::string& path, bool truncate, const std::string& what) {
  output_check(path, what);
  parent_create(path);
  const int flags = O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (truncate ? 0 : O_APPEND);
  const int fd = ::open(path.c_str(), flags, 0666);
  if (fd < 0) {
    const int err = errno;
    if (const std::string kind = file_kind_if_not_regular(path); !kind.empty()) refuse_output(path, kind, what);
    fail_io("cannot write '{}' ({})", path, std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    refuse_output(path, "not a regular file", what);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  if (truncate && ::ftruncate(fd, 0) != 0) {
    const int err = errno;
    ::close(fd);
    fail_io("cannot write '{}' ({})", path, std::strerror(err));
  }
  return fd;
}

std::string temporary_name(const std::string& path, uint32_t random) {
  return fmt::format("{}.tmp-{}-{:08x}", path, ::getpid(), random);
}

void file_write_atomic(const std::string& path, const std::function<void(std::FILE*)>& write, const std::string& what) {
  output_check(path, what);
  parent_create(path);
  std::string tmp;
  const int fd = temporary_create(path, &tmp);
  std::FILE* f = ::fdopen(fd, "wb");
  if (!f) {
    const std::string err = why();
    temporary_remove(fd, tmp);
    ::close(fd);
    fail_io("cannot write '{}' ({})", tmp, err);
  }
  // A second descriptor of the temporary: what is removed on failure must still be it.
  const int keep = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  bool closing = false;  // close_checked closes the file whether it succeeds or not
  try {
    write(f);
    closing = true;
    close_checked(f, tmp);
  } catch (...) {
    if (!closing) std::fclose(f);
    if (keep >= 0) temporary_remove(keep, tmp);
    if (keep >= 0) ::close(keep);
    throw;
  }
  // rename replaces the name itself: a link put there since the check is replaced, not followed.
  const bool renamed = std::rename(tmp.c_str(), path.c_str()) == 0;
  const std::string err = why();
  if (!renamed && keep >= 0) temporary_remove(keep, tmp);
  if (keep >= 0) ::close(keep);
  LOOM_CHECK(renamed, "cannot rename '{}' to '{}' ({})", tmp, path, err);
  dir_fsync(std::filesystem::path(path).parent_path().string());
}

int64_t input_check(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ELOOP) fail("{}'{}' is a loop of symbolic links; give the file itself", named(what), path);
    if (err == ENOENT) fail("{}'{}' does not exist", named(what), path);
    fail("{}cannot read '{}' ({})", named(what), path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    std::string kind = file_kind_if_not_regular(path);
    if (kind == "a symbolic link") {
      if (S_ISDIR(st.st_mode))
        kind = "a link to a directory";
      else if (S_ISFIFO(st.st_mode))
        kind = "a link to a FIFO";
      else
        kind = "a link to a device or other special file";
    }
    fail("{}'{}' is {}, not a regular file; loom reads its inputs only from regular files", named(what), path,
         kind.empty() ? "not a regular file" : kind);
  }
  return int64_t(st.st_size);
}

std::string input_read_all(const std::string& path, const std::string& what, int64_t max_bytes) {
  input_check(path, what);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail("{}cannot read '{}' ({})", named(what), path, why());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}'{}' is not a regular file; loom reads its inputs only from regular files", named(what), path);
  }
  if (st.st_size > max_bytes) {
    ::close(fd);
    fail("{}'{}' is {} bytes, more than the {} loom reads whole for it; is it the right file?", named(what), path,
         int64_t(st.st_size), max_bytes);
  }
  // To its end, not its stated size: a file of the kernel's (/proc/self/environ) says 0 bytes and
  // holds more, and a file cut while read ends early.
  std::string out(size_t(st.st_size) + 1, '\0');
  size_t done = 0;
  while (true) {
    if (done == out.size()) {
      if (int64_t(done) > max_bytes) break;
      out.resize(std::min<size_t>(std::max<size_t>(2 * done, 4096), size_t(max_bytes) + 1));
    }
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += size_t(n);
  }
  ::close(fd);
  if (int64_t(done) > max_bytes)
    fail("{}'{}' holds more than the {} bytes loom reads whole for it; is it the right file?", named(what), path,
         max_bytes);
  out.resize(done);
  return out;
}

DurableAppend::DurableAppend(const std::string& path, const char* mode) : path_(path) {
  const bool append = std::strcmp(mode, "a") == 0;
  // Opened for reading too, to look at the last line; appended writes still go to the end.
  const int fd0 = output_open(path, !append, "log.dir");
  f_ = ::fdopen(fd0, append ? "a+" : "w+");
  if (!f_) {
    ::close(fd0);
    fail_io("cannot write '{}' ({}); check log.dir", path, why());
  }
  // A last line without its newline was cut by a write that failed (a full disk, a kill): it
  // would glue onto the first line appended now, so it goes.
  const int fd = fileno(f_);
  const off_t end = ::lseek(fd, 0, SEEK_END);
  off_t keep = end;
  char c = '\n';
  while (keep > 0 && ::pread(fd, &c, 1, keep - 1) == 1 && c != '\n') --keep;
  if (keep < end && ::ftruncate(fd, keep) == 0)
    std::fprintf(stderr, "warning: dropped the cut last line of '%s' (%lld bytes)\n", path.c_str(),
                 static_cast<long long>(end - keep));
}

DurableAppend::DurableAppend(DurableAppend&& o) noexcept : f_(o.f_), path_(std::move(o.path_)) {
  o.f_ = nullptr;
}

DurableAppend& DurableAppend::operator=(DurableAppend&& o) noexcept {
  std::swap(f_, o.f_);
  std::swap(path_, o.path_);
  return *this;
}

DurableAppend::~DurableAppend() {
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
}

void DurableAppend::line(const std::string& text) {
  if (!f_) return;
  // Straight to the file (nothing waits in stdio's buffer), and all of the line or none of it:
  // a failed write is cut back off.
  const std::string l = text + "\n";
  const int fd = fileno(f_);
  const off_t at = ::lseek(fd, 0, SEEK_END);
  for (size_t done = 0; done < l.size();) {
    const ssize_t n = ::write(fd, l.data() + done, l.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string err = n < 0 ? why() : "nothing written";
      const int cut = at >= 0 ? ::ftruncate(fd, at) : -1;  // if this fails too, the next open drops it
      (void)cut;
      fail_io("writing '{}' failed ({}); is the disk full?", path_, err);
    }
    done += size_t(n);
  }
}

void DurableAppend::close() {
  if (!f_) return;
  std::FILE* f = f_;
  f_ = nullptr;
  close_checked(f, path_);
}

DirLock::DirLock(const std::string& dir, const std::string& key, const std::string& name, bool shared) {
  std::error_code ec;
  if (!shared) std::filesystem::create_directories(dir, ec);
  if (shared && !std::filesystem::exists(dir, ec)) return;  // nothing there to read, nor to guard
  LOOM_CHECK(std::filesystem::is_directory(dir, ec), "{} '{}' is not a directory (a file is there); choose another {}",
             key, dir, key);
  const std::string path = dir + "/" + name;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd_ < 0 && shared) fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd_ < 0 && shared) return;
  if (fd_ < 0) fail_io("cannot open '{}' to lock {}: {}", path, key, why());
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    fail("'{}' is not a regular file; it is {}'s lock file: remove it", path, key);
  }
  if (::flock(fd_, (shared ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
    const int err = errno;
    char holder[256] = {0};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    ::close(fd_);
    fd_ = -1;
    std::string who = n > 0 ? std::string(holder, size_t(n)) : std::string("another process");
    while (!who.empty() && who.back() == '\n') who.pop_back();
    const char* does = key != "checkpoint.dir" ? "writes its metrics there"
                       : shared                ? "saves and prunes there"
                                               : "saves there or resumes from there";
    LOOM_CHECK(err != EWOULDBLOCK,
               "{} '{}' is in use by another run ({}), which {}; give this run its own {}, or wait "
               "for that run to end",
               key, dir, who, does, key);
    fail_io("cannot lock '{}': {}", path, std::strerror(err));
  }
  if (shared) return;  // readers leave the writer's description be
  const std::string me = fmt::format("pid {} on {}, since {}\n", ::getpid(), host_name(), utc_now_text());
  // The holder's description is a courtesy (the lock is what counts): a failed write is let be.
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, me.data(), me.size(), 0);
}

std::string dir_lock_holder(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return "";
  struct stat st {};
  std::string who;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    char holder[256] = {0};
    const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
    who = n > 0 ? std::string(holder, size_t(n)) : std::string("another process");
    while (!who.empty() && who.back() == '\n') who.pop_back();
  }
  ::close(fd);  // and with it a shared lock it may have taken
  return who;
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);
}

std::string host_name() {
  char host[128] = {0};
  ::gethostname(host, sizeof host - 1);
  return host;
}

std::string utc_now_text() {
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return when;
}

std::string file_sketch(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    if (fd >= 0) ::close(fd);
    return "missing";
  }
  const int64_t size = st.st_size;
  std::vector<char> head(4096), tail(65536);
  const ssize_t h = ::pread(fd, head.data(), head.size(), 0);
  const off_t at = size > int64_t(tail.size()) ? off_t(size - int64_t(tail.size())) : 0;
  const ssize_t t = ::pread(fd, tail.data(), tail.size(), at);
  ::close(fd);
  XXH64_state_t* s = XXH64_createState();
  XXH64_reset(s, 0);
  XXH64_update(s, &size, sizeof size);
  if (h > 0) XXH64_update(s, head.data(), size_t(h));
  if (t > 0) XXH64_update(s, tail.data(), size_t(t));
  const uint64_t x = XXH64_digest(s);
  XXH64_freeState(s);
  return fmt::format("{} bytes, xxh64 {:016x}", size, x);
}

std::string binary_digest() {
  std::FILE* f = std::fopen("/proc/self/exe", "rb");
  if (!f) return "";
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  std::vector<char> buf(size_t(1) << 20);
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), f)) > 0;) XXH64_update(st, buf.data(), n);
  std::fclose(f);
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return fmt::format("{:016x}", h);
}

void event_append(const std::string& dir, const std::string& event, const std::string& fields) {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const double t = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string line =
      fmt::format("{{\"event\":\"{}\",\"t\":{:.3f}{}{}}}\n", event, t, fields.empty() ? "" : ",", fields);
  try {
    const int fd = output_open(dir + "/faults.jsonl", false, "log.dir");
    (void)!::write(fd, line.data(), line.size());
    ::close(fd);
  } catch (const Error&) {  // best effort: a log.dir that refuses it is reported by the metrics
  }
}

}  // namespace loom
