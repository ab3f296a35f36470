#include "checkpoint/tools.h"

#include <filesystem>
#include <map>
#include <set>

#include "checkpoint/hf_export.h"
#include "checkpoint/manifest.h"
#include "checkpoint/pieces.h"
#include "checkpoint/safetensors.h"
#include "model/flops.h"
#include "model/layout.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/file.h"
#include "runtime/tensor.h"

namespace loom {

namespace fs = std::filesystem;

namespace {
// What keeps a sound set of files from resuming: the manifest's config must describe a model
// whose every parameter is there with its moments, at its global shape, and nothing else; the
// step must lie within that run. `params_only`: what an export needs, the weights alone.
std::vector<std::string> model_problems(const std::string& dir, const Manifest& m, bool params_only = false) {
  const std::string path = dir + "/manifest.json";
  Config cfg = config_defaults();
  try {
    config_load_string(cfg, m.config, path + " (config)");
    config_validate(cfg);
  } catch (const Error& e) {
    return {fmt::format("'{}': its config does not describe a run loom can resume: {}", path, e.what())};
  }
  std::vector<std::string> bad;
  if (!params_only && m.step > cfg.train.steps)
    bad.push_back(fmt::format("'{}': step {} is beyond its run's train.steps = {}", path, m.step, cfg.train.steps));
  // Counted before the model is laid out: a config describing a huge model must not be built.
  double held = 0;
  for (auto& [name, t] : m.tensors)
    if (name.rfind("params/", 0) == 0) held += double(shape_numel(t.shape));
  const ModelDims model = model_dims(cfg);
  if (param_count_f64(model) != held) {
    bad.push_back(
        fmt::format("'{}': its config describes a model of {:.6g} parameters and its params/ tensors hold {:.6g}", path,
                    param_count_f64(model), held));
    if (param_count_f64(model) > 4 * held + 1e6) return bad;
  }
  std::map<std::string, Shape> want;
  const ModelLayout layout = model_layout(model);
  for (const ParamSpec& s : layout.reg.all())
    for (const char* kind : {"params", "exp_avg", "exp_avg_sq"})
      if (!params_only || kind == std::string("params")) want[std::string(kind) + "/" + s.name] = s.global_shape;
  for (auto& [name, shape] : want) {
    auto it = m.tensors.find(name);
    if (it == m.tensors.end())
      bad.push_back(fmt::format("'{}': tensor {} ({}) of the model is missing", path, name, shape_str(shape)));
    else if (it->second.shape != shape)
      bad.push_back(fmt::format("'{}': tensor {} has shape {} where the model has {}", path, name,
                                shape_str(it->second.shape), shape_str(shape)));
  }
  for (auto& [name, t] : m.tensors)
    if (!want.count(name) && (!params_only || name.rfind("params/", 0) == 0))
      bad.push_back(fmt::format("'{}': tensor {} is not of the model its config describes", path, name));
  return bad;
}

// A checkpoint that failed to read while the run saving into its directory pruned it (its
// manifest, which pruning removes first, is gone now, and a run holds the directory's lock):
// what to say instead of calling it damaged ("" where that is not what happened).
std::string pruned_while_read(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "manifest.json", ec)) return "";
  const std::string holder = dir_lock_holder(fs::path(dir).lexically_normal().parent_path().string());
  if (holder.empty()) return "";
  return fmt::format(
      "'{}' was removed while it was read: the run that saves into its checkpoint.dir ({}) pruned it "
      "(checkpoint.keep); nothing says it was damaged. Read a newer one, or keep more (checkpoint.keep)",
      dir, holder);
}

// Runs a reader of checkpoint `dir`; an Error it raises while a running job prunes `dir` says so.
template <class F>
auto read_beside_pruning(const std::string& dir, F&& read) {
  try {
    return read();
  } catch (const Error& e) {
    if (const std::string why = pruned_while_read(dir); !why.empty()) fail("{}", why);
    throw;
  }
}

int ckpt_verify_now(const std::string& dir) {
  const Manifest m = manifest_read(dir);
  std::vector<std::string> bad = checkpoint_problems(dir, m);
  for (auto& b : model_problems(dir, m)) bad.push_back(b);
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
    if (const std::string why = pruned_while_read(dir); !why.empty()) fail("{}", why);
    for (auto& b : bad) fmt::print(stderr, "error: {}\n", b);
    fmt::print("{}: {} in {}; do not resume from it\n", dir, plural(bad.size(), "problem"), plural(shards, "shard"));
    return 1;
  }
  fmt::print(
      "{}: ok: step {}, {}, {}, {:.1f} MB, every hash verified, every tensor covered once, the model's "
      "every tensor there\n",
      dir, m.step, plural(m.tensors.size(), "tensor"), plural(shards, "shard"), bytes / 1e6);
  return 0;
}

void ckpt_inspect_now(const std::string& dir) {
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
               !bad.empty() ? bad
               : ec         ? std::string("unreadable")
                            : fmt::format("{:.1f} MB", double(size) / 1e6));
  }
}

void ckpt_export_now(const std::string& dir, const std::string& out) {
  export_output_check(out, config_defaults(), {}, "the output");
  const Manifest m = manifest_read(dir);
  // The weights of the whole model its config describes, or no export: part of a model is not one.
  if (const std::vector<std::string> bad = model_problems(dir, m, true); !bad.empty())
    fail("{}{}; `loom ckpt verify {}` lists what is wrong", bad.front(),
         bad.size() > 1 ? fmt::format(" (and {} more problems)", bad.size() - 1) : "", dir);
  Config cfg = config_defaults();
  config_load_string(cfg, m.config, dir + "/manifest.json (config)");
  export_output_check(out, cfg, {}, "the output");  // the tokenizer's files too, now that it is known
  {
    // The weights are assembled whole before they are written: what the manifest claims must
    // fit in its files before anything is allocated.
    int64_t claimed = 0, held = 0;
    std::set<std::string> files;
    for (auto& [name, t] : m.tensors) {
      if (name.rfind("params/", 0) == 0) claimed += 4 * shape_numel(t.shape);
      for (auto& s : t.shards) files.insert(s.file);
    }
    for (const std::string& f : files) {
      if (const std::string bad = ckpt_file_check(dir + "/" + f); !bad.empty())
        fail("checkpoint '{}': file {} {}", dir, f, bad);
      std::error_code ec;
      const auto size = fs::file_size(dir + "/" + f, ec);
      held += ec ? 0 : int64_t(size);
    }
    LOOM_CHECK(claimed <= held,
               "checkpoint '{}': its manifest claims {} bytes of weights but its files hold {} bytes in all; the "
               "manifest is corrupt",
               dir, claimed, held);
  }
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
  if (export_is_dir(out)) {
    hf_dir_write(out, cfg, views);
    fmt::print("exported {} tensors of step {} to {} (model.safetensors and config.json, as transformers loads them)\n",
               views.size(), m.step, out);
    return;
  }
  safetensors_write(out, views, export_metadata(cfg));
  fmt::print("exported {} tensors of step {} to {}\n", views.size(), m.step, out);
}
}  // namespace

int ckpt_verify(const std::string& dir) {
  return read_beside_pruning(dir, [&] { return ckpt_verify_now(dir); });
}

void ckpt_inspect(const std::string& dir) {
  read_beside_pruning(dir, [&] { ckpt_inspect_now(dir); });
}

void ckpt_export(const std::string& dir, const std::string& out) {
  read_beside_pruning(dir, [&] { ckpt_export_now(dir, out); });
}

}  // namespace loom
