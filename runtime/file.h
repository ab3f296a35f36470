// Durable files: written to PATH.tmp, flushed, fsynced and closed with every step checked,
// then renamed over PATH and the directory fsynced, so PATH is either the old file or the
// whole new one, never a torn or unflushed write (a full disk is an error naming the file).
// Streams (metrics.jsonl) append through DurableAppend: every line flushed, fsynced on close.
#pragma once
#include <cstdio>
#include <functional>
#include <string>

namespace loom {

// `write` gets the open temporary file; return normally when done.
void file_write_atomic(const std::string& path, const std::function<void(std::FILE*)>& write);
// fsync of a directory (its entries: a renamed or created file's name is on disk); a failure
// is an error naming it.
void dir_fsync(const std::string& dir);
// fwrite that fails with a message naming `path` (e.g. a full disk).
void file_write(std::FILE* f, const void* data, size_t bytes, const std::string& path);

// Appends one event {"event": ..., "t": <unix seconds>, ...fields} to <dir>/faults.jsonl (no-op
// for an empty dir): the record of faults, skips, rollbacks, resumes and restarts that drill
// reports read. `fields` is JSON without braces, e.g. "\"rank\":1,\"step\":5". One write with
// O_APPEND: lines of several ranks never interleave. Best effort: it never fails the run.
void event_append(const std::string& dir, const std::string& event, const std::string& fields);

// xxh64 of this process's executable file, as 16 hex digits ("" where it cannot be read): ranks
// that must run the same binary compare it.
std::string binary_digest();
// This machine's name, and the time now as UTC "YYYY-MM-DDTHH:MM:SSZ": what run headers, run
// facts and lock holders say of themselves.
std::string host_name();
std::string utc_now_text();

// An exclusive lock on DIR/NAME (flock), held while the object lives and released by the
// kernel when the process ends however it ends. Taken by a job that saves into and prunes a
// checkpoint directory (`key` checkpoint.dir), or writes a log.dir's metrics; a second job gets
// an Error naming the holder (pid, host, start) and the key to change.
class DirLock {
 public:
  DirLock() = default;
  explicit DirLock(const std::string& dir, const std::string& key = "checkpoint.dir",
                   const std::string& name = ".lock");
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

class DurableAppend {
 public:
  DurableAppend() = default;
  // Opens `path` for appending ("a") or truncated ("w"); creates its directory.
  DurableAppend(const std::string& path, const char* mode);
  ~DurableAppend();  // close(), reporting a failure on stderr (destructors cannot throw)
  DurableAppend(DurableAppend&& o) noexcept;
  DurableAppend& operator=(DurableAppend&& o) noexcept;
  bool open() const { return f_ != nullptr; }
  void line(const std::string& text);  // text + "\n", flushed
  void close();                        // fflush, fsync, fclose, each checked

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
};

}  // namespace loom
