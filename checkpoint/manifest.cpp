#include "checkpoint/manifest.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "checkpoint/h5.h"
#include "checkpoint/pieces.h"
#include "runtime/error.h"
#include "runtime/file.h"
#include "runtime/json_read.h"
#include "runtime/tensor.h"

namespace loom {

namespace fs = std::filesystem;

namespace {

// Dims and element counts past this are no tensor loom writes (and their products would wrap).
constexpr int64_t kMaxNumel = int64_t(1) << 50;

const char* file_kind(const fs::file_status& st) {
  switch (st.type()) {
    case fs::file_type::symlink:
      return "a symbolic link";
    case fs::file_type::directory:
      return "a directory";
    case fs::file_type::fifo:
      return "a FIFO";
    case fs::file_type::socket:
      return "a socket";
    case fs::file_type::block:
    case fs::file_type::character:
      return "a device";
    default:
      return "not a regular file";
  }
}

// A shard's file is a name inside the checkpoint directory: no path, nothing that leaves it.
bool shard_file_ok(const std::string& file) {
  return !file.empty() && file != "." && file != ".." && file.find('/') == std::string::npos &&
         file.find('\0') == std::string::npos;
}

// What is wrong with a tensor's shape and its shards' names and boxes, every bound checked
// without overflow; empty when nothing is.
std::vector<std::string> boxes_problems(const std::string& path, const std::string& name, const TensorEntry& t) {
  std::vector<std::string> bad;
  if (t.shape.size() != 1 && t.shape.size() != 2)
    return {fmt::format("'{}': tensor {} has {} dims; loom writes 1 or 2", path, name, t.shape.size())};
  int64_t numel = 1;
  for (int64_t d : t.shape) {
    if (d < 1 || d > kMaxNumel / numel)
      return {fmt::format("'{}': tensor {} has shape {}, which no checkpoint holds", path, name, shape_str(t.shape))};
    numel *= d;
  }
  if (t.shards.empty()) return {fmt::format("'{}': tensor {} has no shards", path, name)};
  for (const ShardRef& s : t.shards) {
    if (!shard_file_ok(s.file)) {
      bad.push_back(
          fmt::format("'{}': tensor {} names shard file '{}', which is not a file of the checkpoint "
                      "directory (a shard file is a bare name: rank-NNNNN.h5)",
                      path, name, s.file));
      continue;
    }
    if (s.offset.size() != t.shape.size() || s.shape.size() != t.shape.size()) {
      bad.push_back(fmt::format("'{}': shard {}:{} of tensor {} has offset {} and shape {} for a tensor of {} dims",
                                path, s.file, s.dataset, name, shape_str(s.offset), shape_str(s.shape),
                                t.shape.size()));
      continue;
    }
    for (size_t i = 0; i < t.shape.size(); ++i)
      if (s.shape[i] < 1 || s.offset[i] < 0 || s.offset[i] > t.shape[i] - s.shape[i]) {
        bad.push_back(
            fmt::format("'{}': shard {}:{} of tensor {} (offset {}, shape {}) lies outside the tensor's "
                        "shape {}",
                        path, s.file, s.dataset, name, shape_str(s.offset), shape_str(s.shape), shape_str(t.shape)));
        break;
      }
  }
  return bad;
}

// The shards cover their tensor exactly once: on the grid their edges cut (a few cells per
// shard, never the tensor's own elements), every cell in one box. "" when they do.
std::string coverage_problem(const std::string& name, const TensorEntry& t) {
  std::vector<Box> boxes;
  std::vector<int64_t> rows{0, t.shape.size() == 1 ? 1 : t.shape[0]}, cols{0, t.shape.back()};
  for (const ShardRef& s : t.shards) {
    boxes.push_back(box_of(s.offset, s.shape));
    rows.push_back(boxes.back().r0), rows.push_back(boxes.back().r0 + boxes.back().rows);
    cols.push_back(boxes.back().c0), cols.push_back(boxes.back().c0 + boxes.back().cols);
  }
  for (auto* v : {&rows, &cols}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  const size_t R = rows.size() - 1, C = cols.size() - 1;
  std::vector<int32_t> cover(R * C, 0);
  auto at = [](const std::vector<int64_t>& v, int64_t x) {
    return size_t(std::lower_bound(v.begin(), v.end(), x) - v.begin());
  };
  for (const Box& b : boxes)
    for (size_t r = at(rows, b.r0); r < at(rows, b.r0 + b.rows); ++r)
      for (size_t c = at(cols, b.c0); c < at(cols, b.c0 + b.cols); ++c) ++cover[r * C + c];
  int64_t twice = 0, none = 0;
  for (size_t r = 0; r < R; ++r)
    for (size_t c = 0; c < C; ++c) {
      const int64_t cells = (rows[r + 1] - rows[r]) * (cols[c + 1] - cols[c]);
      if (cover[r * C + c] == 0) none += cells;
      if (cover[r * C + c] > 1) twice += cells;
    }
  if (!twice && !none) return "";
  return fmt::format("tensor {}: {} elements in no shard, {} in more than one", name, none, twice);
}

// The manifest's fields, each of the type loom writes: a forged or damaged manifest is refused
// naming the field and what it holds instead (not in the JSON library's words), and a number
// that is not a whole one in range (384.5, 1e30) is refused, not truncated or wrapped.
struct Fields {
  const std::string& path;

  [[noreturn]] void wrong(const std::string& what, const nlohmann::json& v, const std::string& want) const {
    std::string shown = v.dump();
    if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
    fail("'{}' is not a valid manifest: {} is {} {}, not {}", path, what, v.type_name(), shown, want);
  }
  const nlohmann::json& at(const nlohmann::json& j, const std::string& where, const char* key) const {
    if (!j.is_object()) wrong(where.empty() ? "the manifest" : where, j, "a JSON object");
    const auto it = j.find(key);
    if (it == j.end()) fail("'{}' is not a valid manifest: {} has no \"{}\"", path, where.empty() ? "it" : where, key);
    return *it;
  }
  static std::string name(const std::string& where, const char* key) {
    return where.empty() ? fmt::format("\"{}\"", key) : fmt::format("{}'s \"{}\"", where, key);
  }
  std::string text(const nlohmann::json& j, const std::string& where, const char* key) const {
    const nlohmann::json& v = at(j, where, key);
    if (!v.is_string()) wrong(name(where, key), v, "a string");
    return v.get<std::string>();
  }
  int64_t whole(const nlohmann::json& v, const std::string& what, int64_t lo, int64_t hi) const {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi)) ||
        v.get<int64_t>() < lo || v.get<int64_t>() > hi)
      wrong(what, v,
            lo == INT64_MIN && hi == INT64_MAX ? "a whole number of 64 bits"
                                               : fmt::format("a whole number from {} to {}", lo, hi));
    return v.get<int64_t>();
  }
  int64_t whole(const nlohmann::json& j, const std::string& where, const char* key, int64_t lo, int64_t hi) const {
    return whole(at(j, where, key), name(where, key), lo, hi);
  }
  std::vector<int64_t> wholes(const nlohmann::json& j, const std::string& where, const char* key) const {
    const nlohmann::json& v = at(j, where, key);
    if (!v.is_array()) wrong(name(where, key), v, "an array of whole numbers");
    std::vector<int64_t> out;
    for (size_t i = 0; i < v.size(); ++i)
      out.push_back(whole(v[i], fmt::format("{}[{}]", name(where, key), i), INT64_MIN, INT64_MAX));
    return out;
  }
};

}  // namespace

std::string ckpt_file_check(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);
  if (!fs::exists(st)) return "is missing";
  if (!fs::is_regular_file(st))
    return fmt::format("is {}, not a regular file (loom opens only regular files inside the checkpoint directory)",
                       file_kind(st));
  return "";
}

nlohmann::json shard_to_json(const ShardRef& s) {
  return {{"file", s.file}, {"dataset", s.dataset}, {"offset", s.offset}, {"shape", s.shape}, {"xxh64", s.xxh64}};
}

ShardRef shard_from_json(const nlohmann::json& j, const std::string& path, const std::string& where) {
  const Fields f{path};
  return {f.text(j, where, "file"), f.text(j, where, "dataset"), f.wholes(j, where, "offset"),
          f.wholes(j, where, "shape"), f.text(j, where, "xxh64")};
}

std::string manifest_dump(const Manifest& m) {
  nlohmann::ordered_json j;
  j["format"] = "loom checkpoint";
  j["version"] = m.version;
  j["step"] = m.step;
  j["layout"] = nlohmann::ordered_json::parse(m.layout.dump());
  j["config"] = m.config;
  nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
  for (auto& [name, t] : m.tensors) {
    nlohmann::ordered_json shards = nlohmann::ordered_json::array();
    for (auto& s : t.shards)
      shards.push_back(nlohmann::ordered_json{
          {"file", s.file}, {"dataset", s.dataset}, {"offset", s.offset}, {"shape", s.shape}, {"xxh64", s.xxh64}});
    tensors[name] = {{"shape", t.shape}, {"dtype", "float32"}, {"shards", shards}};
  }
  j["tensors"] = tensors;
  return j.dump(1) + "\n";
}

Manifest manifest_read(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  if (const std::string bad = ckpt_file_check(path); !bad.empty())
    fail("'{}' {}: not a complete checkpoint", path, bad);
  // Far above any manifest (a thousand tensors over a thousand ranks is about 200 MB).
  const std::string text = input_read_all(path, "the checkpoint's manifest", int64_t(1) << 30);
  Manifest m;
  const nlohmann::json j = json_parse(text, fmt::format("'{}' (a checkpoint manifest)", path));
  const Fields f{path};
  m.version = int(f.whole(j, "", "version", 0, INT32_MAX));
  LOOM_CHECK(m.version == Manifest::kVersion, "'{}' is checkpoint format version {}; this loom reads version {}", path,
             m.version, Manifest::kVersion);
  m.step = f.whole(j, "", "step", INT64_MIN, INT64_MAX);  // a negative one is refused below
  m.layout = f.at(j, "", "layout");
  if (!m.layout.is_object()) f.wrong("\"layout\"", m.layout, "a JSON object");
  m.config = f.text(j, "", "config");
  const nlohmann::json& tensors = f.at(j, "", "tensors");
  if (!tensors.is_object()) f.wrong("\"tensors\"", tensors, "a JSON object");
  for (auto& [name, t] : tensors.items()) {
    const std::string where = fmt::format("tensor {}", name);
    TensorEntry e;
    e.shape = f.wholes(t, where, "shape");
    const std::string dtype = t.contains("dtype") ? f.text(t, where, "dtype") : "float32";
    LOOM_CHECK(dtype == "float32", "'{}': tensor {} has dtype {}; loom writes float32", path, name, dtype);
    const nlohmann::json& shards = f.at(t, where, "shards");
    if (!shards.is_array()) f.wrong(Fields::name(where, "shards"), shards, "an array of shards");
    for (size_t i = 0; i < shards.size(); ++i)
      e.shards.push_back(shard_from_json(shards[i], path, fmt::format("tensor {}'s shard {}", name, i)));
    m.tensors.emplace(name, std::move(e));
  }
  std::vector<std::string> bad = manifest_problems(path, m);
  // The step names the directory, so the two must agree (a renamed copy keeps its name's).
  const int64_t named = checkpoint_step_of(dir);
  if (m.step < 0 || (named >= 0 && named != m.step))
    bad.insert(bad.begin(), fmt::format("'{}' says step {}{}; the manifest is wrong or the directory was renamed", path,
                                        m.step, named >= 0 ? fmt::format(" in {}", checkpoint_dir_name(named)) : ""));
  if (!bad.empty())
    fail("{}{}", bad.front(), bad.size() > 1 ? fmt::format(" (and {} more problems)", bad.size() - 1) : "");
  return m;
}

std::vector<std::string> manifest_problems(const std::string& path, const Manifest& m) {
  std::vector<std::string> bad;
  for (auto& [name, t] : m.tensors) {
    std::vector<std::string> b = boxes_problems(path, name, t);
    if (b.empty()) {
      const std::string cover = coverage_problem(name, t);
      if (!cover.empty()) b.push_back(fmt::format("'{}': {}; every element must be in exactly one shard", path, cover));
    }
    bad.insert(bad.end(), b.begin(), b.end());
  }
  return bad;
}

std::string checkpoint_dir_name(int64_t step) {
  return fmt::format("step-{:08d}", step);
}

int64_t checkpoint_step_of(const std::string& dir) {
  fs::path path = fs::path(dir).lexically_normal();
  if (path.filename().empty()) path = path.parent_path();  // "…/step-00000010/"
  const std::string name = path.filename().string();
  if (name.size() != 13 || name.rfind("step-", 0) != 0) return -1;
  if (!std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; })) return -1;
  return std::stoll(name.substr(5));
}

std::vector<std::string> checkpoints_complete(const std::string& root, std::vector<std::string>* partial) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (auto& e : fs::directory_iterator(root, ec)) {
    const int64_t step = checkpoint_step_of(e.path().string());
    // A link is never taken for a checkpoint: nothing is read, written or pruned through it.
    if (step < 0 || e.is_symlink() || !e.is_directory()) continue;
    if (fs::exists(e.path() / "manifest.json"))
      found.push_back({step, e.path().string()});
    else if (partial)
      partial->push_back(e.path().string());
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> out;
  for (auto& [step, dir] : found) out.push_back(dir);
  return out;
}

std::vector<float> ckpt_shard_read(const std::string& dir, const std::string& tensor, const ShardRef& s) {
  const std::string path = dir + "/" + s.file;
  if (const std::string bad = ckpt_file_check(path); !bad.empty())
    fail("checkpoint '{}': file {} (tensor {}) {}", dir, s.file, tensor, bad);
  std::vector<float> data = H5Reader(path).read(s.dataset, s.shape);
  const std::string got = xxh64_hex(data.data(), int64_t(data.size()));
  LOOM_CHECK(got == s.xxh64,
             "checkpoint '{}': shard {}:{} of tensor {} is corrupt (xxh64 {} where the manifest says {})", dir, s.file,
             s.dataset, tensor, got, s.xxh64);
  // Verified bytes, but not a state a run can go on from: the run that wrote them had diverged.
  const int64_t bad = std::count_if(data.begin(), data.end(), [](float v) { return !std::isfinite(v); });
  LOOM_CHECK(bad == 0,
             "checkpoint '{}': shard {}:{} of tensor {} holds {} (the run that wrote it had "
             "diverged); do not resume from it",
             dir, s.file, s.dataset, tensor, plural(bad, "NaN or infinite value"));
  return data;
}

std::vector<std::string> checkpoint_problems(const std::string& dir, const Manifest& m) {
  std::vector<std::string> bad = manifest_problems(dir + "/manifest.json", m);
  for (auto& [name, t] : m.tensors)
    for (auto& s : t.shards) {
      if (!shard_file_ok(s.file)) continue;  // reported above; never opened
      try {
        ckpt_shard_read(dir, name, s);
      } catch (const Error& e) {
        bad.push_back(e.what());
      }
    }
  return bad;
}

}  // namespace loom
