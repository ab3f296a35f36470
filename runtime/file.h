// Durable files: written to a temporary of loom's own beside PATH (temporary_name), flushed,
// fsynced and closed with every step checked, then renamed over PATH and the directory fsynced,
// so PATH is either the old file or the whole new one, never a torn or unflushed write (a full
// disk is an error naming the file).
// Streams (metrics.jsonl) append through DurableAppend: every line flushed, fsynced on close.
// Every file loom writes goes through here: an output is only ever a regular file (a device,
// FIFO, directory or symbolic link at its name is refused, never replaced or followed), and a
// temporary is created new under a unique name (O_CREAT|O_EXCL|O_NOFOLLOW), never opened
// through a link, and removed only by the process that created it, only while it is still its
// file: a file of anyone else's (a user's PATH.tmp, another process's temporary) is never
// touched. A temporary left by a process that was killed stays where it was.
// Every file loom reads whole goes through input_read_all: a regular file only, of bounded size.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace loom {

// What stands at `path` without following a link: "" for a regular file or nothing, else its
// kind ("a symbolic link", "a character device", "a FIFO", "a directory", ...).
std::string file_kind_if_not_regular(const std::string& path);
// Refuses (exit 2) an output path whose name holds anything but a regular file; `what` names the
// setting or argument that gave it ("export.final", "--out").
void output_check(const std::string& path, const std::string& what);
// Refuses an output that is one of the inputs (the same file by device and inode, whatever the
// names): writing it would replace what is being read.
void output_not_input(const std::string& out, const std::vector<std::string>& inputs, const std::string& what);
// Refuses to replace an existing, non-empty `path` that is not of the kind loom writes there:
// `looks_like` judges its first bytes (up to 64), and `kind` names the kind ("a safetensors
// file"). A text, a config or a run's metrics given as an output by mistake stays as it was.
void output_kind_check(const std::string& path, const std::string& kind, bool (*looks_like)(const std::string& head),
                       const std::string& what);
// An fd for writing `path` in place (appended to, or truncated where `truncate`): created if
// absent, opened without following a link and without blocking, refused unless a regular file.
int output_open(const std::string& path, bool truncate, const std::string& what);

// The name of a temporary that PATH is written through: PATH.tmp-PID-RANDOM (8 hex digits).
std::string temporary_name(const std::string& path, uint32_t random);
// `write` gets the open temporary file (open for reading too: a writer may read back what it
// wrote); return normally when done. `what` as for output_check.
void file_write_atomic(const std::string& path, const std::function<void(std::FILE*)>& write,
                       const std::string& what = "");
// The pieces file_write_atomic and FileSet (runtime/file_set.h) share: the directories of `path`
// made; a new temporary beside `path` under a name of loom's own (*tmp: temporary_name's),
// created exclusively, so never an existing file and never through a link; that temporary
// removed while its name is still the file `fd` holds (what another process put there since
// stays); a written file flushed, fsynced and closed, each step checked.
void parent_create(const std::string& path);
int temporary_create(const std::string& path, std::string* tmp);
void temporary_remove(int fd, const std::string& tmp);
void close_checked(std::FILE* f, const std::string& path);

// The whole of `path`, which must be a regular file (a FIFO, device, directory or link to one is
// refused without opening it for long) of at most max_bytes; `what` names where it came from.
std::string input_read_all(const std::string& path, const std::string& what, int64_t max_bytes);
// Refuses (exit 2) an input that is not a regular file; returns its size.
int64_t input_check(const std::string& path, const std::string& what);
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

// A file as far as cheaply seen: "N bytes, xxh64 H" of its size, first 4 KiB and last 64 KiB;
// "missing" where it cannot be read. Ranks compare what each wrote with what rank 0 sees.
std::string file_sketch(const std::string& path);

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
// an Error naming the holder (pid, host, start) and the key to change. `shared`: a reader's lock
// (a run that resumes from a directory it does not save into): readers together, never beside
// the writer; taken where the lock file can be opened (a read-only directory has no writer).
class DirLock {
 public:
  DirLock() = default;
  explicit DirLock(const std::string& dir, const std::string& key = "checkpoint.dir", const std::string& name = ".lock",
                   bool shared = false);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

// Who holds DIR/NAME's exclusive lock (a DirLock's holder description, or "another process"),
// or "" where nobody does; takes no lock and creates nothing.
std::string dir_lock_holder(const std::string& dir, const std::string& name = ".lock");

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
