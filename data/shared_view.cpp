#include "data/shared_view.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <filesystem>
#include <random>
#include <sstream>

#include "data/shards.h"
#include "runtime/error.h"
#include "runtime/file.h"

namespace loom {

namespace {
std::string files_view(const std::string& path, bool val) {
  try {
    const std::vector<std::string> files = shard_files(path, val);
    XXH64_state_t* st = XXH64_createState();
    XXH64_reset(st, 0);
    int64_t bytes = 0;
    for (const std::string& f : files) {
      const int64_t size = input_check(f, "");
      bytes += size;
      char head[4096];
      ssize_t n = 0;
      if (const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
        n = ::pread(fd, head, sizeof head, 0);
        ::close(fd);
      }
      XXH64_update(st, &size, sizeof size);
      if (n > 0) XXH64_update(st, head, size_t(n));
    }
    const uint64_t h = XXH64_digest(st);
    XXH64_freeState(st);
    return fmt::format("{}, {}, xxh64 of their headers {:016x}", plural(files.size(), "file"), plural(bytes, "byte"),
                       h);
  } catch (const std::exception& e) {
    return fmt::format("unreadable ({})", e.what());
  }
}
}  // namespace

std::string data_view(const Config& cfg) {
  std::string out;
  if (cfg.data.source != DataKind::synthetic) {
    if (!cfg.data.path.empty()) out += "data.path = " + files_view(cfg.data.path, false) + "\n";
    for (size_t i = 0; i < cfg.data.sources.size(); ++i)
      out += fmt::format("data.sources[{}] = {}\n", i, files_view(cfg.data.sources[i].path, false));
  }
  if (!cfg.data.val_path.empty()) out += "data.val_path = " + files_view(cfg.data.val_path, true) + "\n";
  return out;
}

namespace {
bool shares_checkpoints(const Config& cfg) {
  return !cfg.checkpoint.dir.empty() && (cfg.checkpoint.every > 0 || cfg.checkpoint.resume == "latest");
}
}  // namespace

std::string dir_probe_create(const Config& cfg) {
  if (!shares_checkpoints(cfg)) return "";
  std::random_device rd;
  const std::string nonce = fmt::format("{:08x}{:08x}{:08x}", rd(), rd(), rd());
  const std::string name = ".probe-" + nonce.substr(0, 12);
  const std::string path = cfg.checkpoint.dir + "/" + name;
  try {
    file_write_atomic(
        path, [&](std::FILE* f) { file_write(f, nonce.data(), nonce.size(), path); }, "checkpoint.dir");
  } catch (const Error&) {
    return "";  // nothing to compare: rank 0's own use of the directory names the problem
  }
  return name + " " + nonce;
}

std::string dir_probe_view(const Config& cfg, const std::string& probe) {
  const size_t sp = probe.find(' ');
  if (probe.empty() || sp == std::string::npos) return "";
  const std::string path = cfg.checkpoint.dir + "/" + probe.substr(0, sp);
  std::string seen;
  try {
    seen = input_read_all(path, "", 4096);
  } catch (const Error&) {
    return "checkpoint.dir = does not hold rank 0's probe file '" + path + "'\n";
  }
  return seen == probe.substr(sp + 1) ? "checkpoint.dir = holds rank 0's probe file\n"
                                      : "checkpoint.dir = holds another probe file at '" + path + "'\n";
}

void dir_probe_remove(const Config& cfg, const std::string& probe) {
  const size_t sp = probe.find(' ');
  if (probe.empty() || sp == std::string::npos) return;
  ::unlink((cfg.checkpoint.dir + "/" + probe.substr(0, sp)).c_str());
}

std::string shared_view_disagreement(const std::vector<std::string>& views, const Config& cfg) {
  auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  };
  const std::vector<std::string> ref = lines(views.empty() ? "" : views[0]);
  for (size_t r = 1; r < views.size(); ++r) {
    const std::vector<std::string> mine = lines(views[r]);
    for (size_t i = 0; i < std::max(ref.size(), mine.size()); ++i) {
      const std::string a = i < ref.size() ? ref[i] : "", b = i < mine.size() ? mine[i] : "";
      if (a == b) continue;
      const std::string key = (a.empty() ? b : a).substr(0, (a.empty() ? b : a).find(" = "));
      auto value = [](const std::string& l) {
        const size_t at = l.find(" = ");
        return at == std::string::npos ? std::string("nothing") : l.substr(at + 3);
      };
      if (key == "checkpoint.dir")
        return fmt::format(
            "rank {} does not see the checkpoint.dir '{}' rank 0 sees: it {}; every rank must save into one shared "
            "directory (a filesystem every node mounts at the same path, the same working directory for a relative "
            "path): set checkpoint.dir to such a path",
            r, cfg.checkpoint.dir, value(b));
      return fmt::format(
          "rank {} reads other data than rank 0: {} is {} on rank {} but {} on rank 0; every rank must read the same "
          "files: put them on a filesystem every node mounts at the same path (or copy them byte for byte)",
          r, key, value(b), r, value(a));
    }
  }
  return "";
}

}  // namespace loom
