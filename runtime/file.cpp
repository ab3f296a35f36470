#include "runtime/file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <vector>

#include "runtime/error.h"

namespace loom {

namespace {
std::string why() {
  return std::strerror(errno);
}
void close_checked(std::FILE* f, const std::string& path) {
  const bool flushed = std::fflush(f) == 0, synced = flushed && ::fsync(fileno(f)) == 0;
  const std::string err = why();
  const bool closed = std::fclose(f) == 0;
  if (!(flushed && synced && closed)) fail_io("writing '{}' failed ({}); is the disk full?", path, err);
}
}  // namespace

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

void file_write_atomic(const std::string& path, const std::function<void(std::FILE*)>& write) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  LOOM_CHECK(f, "cannot write '{}' ({})", tmp, why());
  try {
    write(f);
    close_checked(f, tmp);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  LOOM_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '{}' to '{}' ({})", tmp, path, why());
  dir_fsync(p.parent_path().string());
}

DurableAppend::DurableAppend(const std::string& path, const char* mode) : path_(path) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  // Appends open for reading too ("a+"), to look at the last line; writes still go to the end.
  f_ = std::fopen(path.c_str(), std::strcmp(mode, "a") == 0 ? "a+" : mode);
  LOOM_CHECK(f_, "cannot write '{}' ({}); check log.dir", path, why());
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

DirLock::DirLock(const std::string& dir, const std::string& key, const std::string& name) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = dir + "/" + name;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) fail_io("cannot open '{}' to lock {}: {}", path, key, why());
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[256] = {0};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    ::close(fd_);
    fd_ = -1;
    std::string who = n > 0 ? std::string(holder, size_t(n)) : std::string("another process");
    while (!who.empty() && who.back() == '\n') who.pop_back();
    const char* does = key == "checkpoint.dir" ? "saves and prunes there" : "writes its metrics there";
    LOOM_CHECK(err != EWOULDBLOCK,
               "{} '{}' is in use by another run ({}), which {}; give this run its own {}, or wait "
               "for that run to end",
               key, dir, who, does, key);
    fail_io("cannot lock '{}': {}", path, std::strerror(err));
  }
  const std::string me = fmt::format("pid {} on {}, since {}\n", ::getpid(), host_name(), utc_now_text());
  // The holder's description is a courtesy (the lock is what counts): a failed write is let be.
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, me.data(), me.size(), 0);
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
  if (std::FILE* f = std::fopen((dir + "/faults.jsonl").c_str(), "a")) {
    std::fwrite(line.data(), 1, line.size(), f);
    std::fclose(f);
  }
}

}  // namespace loom
