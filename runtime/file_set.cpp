#include "runtime/file_set.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "runtime/error.h"
#include "runtime/file.h"

namespace loom {

FileSet::~FileSet() {
  for (File& f : files_) {
    if (f.f) std::fclose(f.f);
    if (!f.tmp.empty()) ::unlink(f.tmp.c_str());
  }
}

std::FILE* FileSet::open(const std::string& path) {
  output_check(path, what_);
  parent_create(path);
  File f{path, path + ".tmp", nullptr};
  const int fd = temporary_create(f.tmp, what_);
  f.f = ::fdopen(fd, "wb");
  if (!f.f) {
    ::close(fd);
    ::unlink(f.tmp.c_str());
    fail_io("cannot write '{}' ({})", f.tmp, std::strerror(errno));
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
  // Each name's old file, kept under PATH.loom-old ("" where the name held none, or where the file
  // system gives no hard link: then it cannot be put back).
  std::vector<std::string> kept(files_.size());
  std::vector<char> existed(files_.size(), 0);
  auto drop_kept = [&] {
    for (const std::string& k : kept)
      if (!k.empty()) ::unlink(k.c_str());
  };
  for (size_t i = 0; i < files_.size(); ++i) {
    const std::string& path = files_[i].path;
    if (::access(path.c_str(), F_OK) != 0) continue;
    existed[i] = 1;
    const std::string old = path + ".loom-old";
    if (file_kind_if_not_regular(old).empty()) ::unlink(old.c_str());  // an earlier attempt's
    if (::link(path.c_str(), old.c_str()) == 0) {
      kept[i] = old;
    } else if (errno != EPERM && errno != EXDEV && errno != ENOTSUP && errno != EMLINK) {
      const int err = errno;
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
