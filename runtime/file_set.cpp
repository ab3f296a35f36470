#include "runtime/file_set.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "runtime/error.h"
#include "runtime/file.h"

namespace loom {

FileSet::~FileSet() {
  for (File& f : files_) {
    if (f.f) std::fclose(f.f);
    // Not renamed (no commit, or a failed one): the temporary goes, while its name is still the
    // file loom made.
    struct stat there {};
    if (!f.tmp.empty() && ::lstat(f.tmp.c_str(), &there) == 0 && uint64_t(there.st_dev) == f.dev &&
        uint64_t(there.st_ino) == f.ino)
      ::unlink(f.tmp.c_str());
  }
}

std::FILE* FileSet::open(const std::string& path) {
  output_check(path, what_);
  parent_create(path);
  File f{path, "", nullptr};
  const int fd = temporary_create(path, &f.tmp);
  struct stat mine {};
  if (::fstat(fd, &mine) == 0) f.dev = uint64_t(mine.st_dev), f.ino = uint64_t(mine.st_ino);
  f.f = ::fdopen(fd, "wb");
  if (!f.f) {
    const int err = errno;
    temporary_remove(fd, f.tmp);
    ::close(fd);
    fail_io("cannot write '{}' ({})", f.tmp, std::strerror(err));
  }
  files_.push_back(f);
  return files_.back().f;
}

void FileSet::commit(const std::vector<std::string>& stale) {
  for (File& f : files_) {
    std::FILE* open = f.f;
    f.f = nullptr;
    close_checked(open, f.tmp);
  }
  // Each name's old file, kept under a name of loom's own ("" where the name held none, or where the file
  // system gives no hard link: then it cannot be put back).
  std::vector<std::string> kept(files_.size());
  std::vector<char> existed(files_.size(), 0);
  auto drop_kept = [&] {
    for (const std::string& k : kept)
      if (!k.empty()) ::unlink(k.c_str());
  };
  std::random_device rd;
  for (size_t i = 0; i < files_.size(); ++i) {
    const std::string& path = files_[i].path;
    if (::access(path.c_str(), F_OK) != 0) continue;
    existed[i] = 1;
    // Under a name of loom's own, made by link() itself (never an existing file's name).
    int linked = -1, err = 0;
    std::string old;
    for (int attempt = 0; attempt < 16 && linked != 0; ++attempt) {
      old = temporary_name(path + ".old", rd());
      linked = ::link(path.c_str(), old.c_str());
      err = linked ? errno : 0;
      if (linked != 0 && err != EEXIST) break;
    }
    if (linked == 0) {
      kept[i] = old;
    } else if (err != EPERM && err != EXDEV && err != ENOTSUP && err != EMLINK) {
      drop_kept();
      fail_io("cannot keep '{}' as '{}' while {} replaced ({})", path, old, files_.size() > 1 ? "its set is" : "it is",
              std::strerror(err));
    }
  }
  for (size_t i = 0; i < files_.size(); ++i) {
    if (std::rename(files_[i].tmp.c_str(), files_[i].path.c_str()) == 0) {
      files_[i].tmp.clear();
      continue;
    }
    const int err = errno;
    std::string replaced;  // what stays replaced: only where no old file could be kept
    for (size_t j = 0; j < i; ++j) {
      const std::string& path = files_[j].path;
      if (!kept[j].empty()) {
        std::rename(kept[j].c_str(), path.c_str());
        kept[j].clear();
      } else if (existed[j]) {
        replaced += (replaced.empty() ? "'" : ", '") + path + "'";
      } else {
        ::unlink(path.c_str());  // it had no old file: the set's new one goes
      }
    }
    drop_kept();
    fail_io("cannot rename '{}' to '{}' ({}); {}", files_[i].tmp, files_[i].path, std::strerror(err),
            replaced.empty() ? "nothing was replaced"
                             : replaced + " already replaced (this file system keeps no hard link to put it back)");
  }
  drop_kept();
  for (const std::string& s : stale) ::unlink(s.c_str());
  std::vector<std::string> dirs;
  for (const File& f : files_) {
    const std::string d = std::filesystem::path(f.path).parent_path().string();
    if (std::find(dirs.begin(), dirs.end(), d) == dirs.end()) dirs.push_back(d);
  }
  for (const std::string& d : dirs) dir_fsync(d);
}

}  // namespace loom
