#include "checkpoint/tools.h"

#include <filesystem>
#include <map>

#include "checkpoint/manifest.h"
#include "checkpoint/pieces.h"
#include "checkpoint/safetensors.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/tensor.h"

namespace loom {

namespace fs = std::filesystem;

int ckpt_verify(const std::string& dir) {
  const Manifest m = manifest_read(dir);
  const std::vector<std::string> bad = checkpoint_problems(dir, m);
  for (auto& b : bad) fmt::print(stderr, "error: {}\n", b);
  size_t shards = 0;
  int64_t bytes = 0;
  for (auto& [name, t] : m.tensors)
    for (auto& s : t.shards) {
      ++shards;
      int64_t n = 1;
      for (int64_t d : s.shape) n *= d;
      bytes += 4 * n;
    }
  if (!bad.empty()) {
    fmt::print("{}: {} problem(s) in {} shards; do not resume from it\n", dir, bad.size(), shards);
    return 1;
  }
  fmt::print("{}: ok: step {}, {} tensors, {} shards, {:.1f} MB, every hash verified and every tensor covered once\n",
             dir, m.step, m.tensors.size(), shards, bytes / 1e6);
  return 0;
}

void ckpt_inspect(const std::string& dir) {
  const Manifest m = manifest_read(dir);
  fmt::print("checkpoint {}\nstep: {}\nlayout: {}\n", dir, m.step, m.layout.dump());
  std::map<std::string, std::pair<int, int64_t>> kinds;
  std::map<std::string, int64_t> files;
  for (auto& [name, t] : m.tensors) {
    auto& k = kinds[name.substr(0, name.find('/'))];
    ++k.first;
    for (auto& s : t.shards) {
      int64_t n = 1;
      for (int64_t d : s.shape) n *= d;
      k.second += 4 * n;
      files[s.file] += 4 * n;
    }
  }
  fmt::print("{:<48} {:>14} {:>7}\n", "tensor", "shape", "shards");
  for (auto& [name, t] : m.tensors) fmt::print("{:<48} {:>14} {:>7}\n", name, shape_str(t.shape), t.shards.size());
  for (auto& [kind, k] : kinds) fmt::print("{:<11} {:>5} tensors {:>12.1f} MB\n", kind, k.first, k.second / 1e6);
  for (auto& [f, b] : files) {
    const std::string bad = ckpt_file_check(dir + "/" + f);
    std::error_code ec;
    const auto size = bad.empty() ? fs::file_size(dir + "/" + f, ec) : 0;
    fmt::print("{:<16} {:>12.1f} MB of shards, {} on disk\n", f, b / 1e6,
               !bad.empty() ? bad : ec ? std::string("unreadable") : fmt::format("{:.1f} MB", double(size) / 1e6));
  }
}

void ckpt_export(const std::string& dir, const std::string& out) {
  const Manifest m = manifest_read(dir);
  std::vector<std::pair<std::string, StTensor>> tensors;
  for (auto& [name, t] : m.tensors) {
    if (name.rfind("params/", 0) != 0) continue;
    StTensor whole{t.shape, std::vector<float>(size_t(shape_numel(t.shape)), 0.0f)};
    const int64_t cols = t.shape.back();
    int64_t got = 0;
    for (auto& s : t.shards) {
      const Box b = box_of(s.offset, s.shape);
      const std::vector<float> data = ckpt_shard_read(dir, name, s);
      for (int64_t r = 0; r < b.rows; ++r)
        std::copy_n(data.data() + r * b.cols, b.cols, whole.data.data() + (b.r0 + r) * cols + b.c0);
      got += b.rows * b.cols;
    }
    LOOM_CHECK(got == shape_numel(t.shape), "checkpoint '{}': tensor {} has {} of its {} elements in shards", dir, name,
               got, shape_numel(t.shape));
    tensors.push_back({name.substr(7), std::move(whole)});
  }
  std::vector<StView> views;
  for (auto& [name, t] : tensors) views.push_back({name, t.shape, t.data.data()});
  Config cfg = config_defaults();
  config_load_string(cfg, m.config, dir + "/manifest.json (config)");
  safetensors_write(out, views, {{"loom.model", config_to_toml(cfg, "model")}});
  fmt::print("exported {} tensors of step {} to {}\n", views.size(), m.step, out);
}

}  // namespace loom
