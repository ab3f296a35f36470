// Several files replaced together (a shard and its validation shard, numbered shards): each is
// written to a temporary of loom's own as file_write_atomic writes one, and only when all are
// written are they renamed over their names, the file each replaces kept as a hard link under a
// name of loom's own (PATH.old.tmp-PID-RANDOM) until every rename is done. A rename that fails puts back every name already replaced (the old file, or
// no file), so the names hold the old set or the new one. Where the file system has no hard
// links, a failure after the first rename cannot be undone, and the error names what was
// replaced. Not here: what is written (the caller's).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace loom {

class FileSet {
 public:
  explicit FileSet(std::string what) : what_(std::move(what)) {}
  ~FileSet();  // the temporaries of a set not committed are removed
  FileSet(const FileSet&) = delete;
  FileSet& operator=(const FileSet&) = delete;
  // A new temporary for `path` (refused as output_check refuses), open for writing.
  std::FILE* open(const std::string& path);
  // Every file closed (flushed, fsynced) and renamed over its name; then `stale` (names an
  // earlier set had and this one does not) removed.
  void commit(const std::vector<std::string>& stale = {});

 private:
  struct File {
    std::string path, tmp;  // tmp: "" once renamed over path
    std::FILE* f = nullptr;
    uint64_t dev = 0, ino = 0;  // the temporary loom made: removed only while its name is still that file
  };
  std::vector<File> files_;
  std::string what_;
};

}  // namespace loom
