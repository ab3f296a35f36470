#include "checkpoint/manifest.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "checkpoint/h5.h"
#include "checkpoint/pieces.h"
#include "runtime/error.h"
#include "runtime/tensor.h"

namespace loom {

namespace fs = std::filesystem;

nlohmann::json shard_to_json(const ShardRef& s) {
  return {{"file", s.file}, {"dataset", s.dataset}, {"offset", s.offset}, {"shape", s.shape}, {"xxh64", s.xxh64}};
}

ShardRef shard_from_json(const nlohmann::json& j) {
  return {j.at("file").get<std::string>(), j.at("dataset").get<std::string>(),
          j.at("offset").get<std::vector<int64_t>>(), j.at("shape").get<std::vector<int64_t>>(),
          j.at("xxh64").get<std::string>()};
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
  std::ifstream in(path);
  LOOM_CHECK(in, "'{}' has no manifest.json: not a complete checkpoint", dir);
  Manifest m;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    m.version = j.at("version").get<int>();
    LOOM_CHECK(m.version == Manifest::kVersion, "'{}' is checkpoint format version {}; this loom reads version {}",
               path, m.version, Manifest::kVersion);
    m.step = j.at("step").get<int64_t>();
    m.layout = j.at("layout");
    m.config = j.at("config").get<std::string>();
    for (auto& [name, t] : j.at("tensors").items()) {
      TensorEntry e;
      e.shape = t.at("shape").get<std::vector<int64_t>>();
      LOOM_CHECK(t.value("dtype", "float32") == "float32", "'{}': tensor {} has dtype {}; loom writes float32", path,
                 name, t.value("dtype", ""));
      for (auto& s : t.at("shards")) e.shards.push_back(shard_from_json(s));
      m.tensors.emplace(name, std::move(e));
    }
  } catch (const nlohmann::json::exception& e) {
    fail("'{}' is not a valid manifest: {}", path, e.what());
  }
  return m;
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
    if (step < 0 || !e.is_directory()) continue;
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
  LOOM_CHECK(fs::exists(path), "checkpoint '{}': file {} (tensor {}) is missing", dir, s.file, tensor);
  std::vector<float> data = H5Reader(path).read(s.dataset, s.shape);
  const std::string got = xxh64_hex(data.data(), int64_t(data.size()));
  LOOM_CHECK(got == s.xxh64,
             "checkpoint '{}': shard {}:{} of tensor {} is corrupt (xxh64 {} where the manifest says {})", dir, s.file,
             s.dataset, tensor, got, s.xxh64);
  return data;
}

std::vector<std::string> checkpoint_problems(const std::string& dir, const Manifest& m) {
  std::vector<std::string> bad;
  for (auto& [name, t] : m.tensors) {
    LOOM_CHECK(t.shape.size() == 1 || t.shape.size() == 2, "'{}': tensor {} has {} dims", dir, name, t.shape.size());
    const int64_t rows = t.shape.size() == 1 ? 1 : t.shape[0], cols = t.shape.back();
    std::vector<uint8_t> seen(size_t(rows * cols), 0);
    for (auto& s : t.shards) {
      try {
        const Box b = box_of(s.offset, s.shape);
        LOOM_CHECK(b.r0 >= 0 && b.c0 >= 0 && b.r0 + b.rows <= rows && b.c0 + b.cols <= cols,
                   "shard {}:{} of tensor {} lies outside its shape {}", s.file, s.dataset, name, shape_str(t.shape));
        for (int64_t r = b.r0; r < b.r0 + b.rows; ++r)
          for (int64_t c = b.c0; c < b.c0 + b.cols; ++c) ++seen[size_t(r * cols + c)];
        ckpt_shard_read(dir, name, s);
      } catch (const Error& e) {
        bad.push_back(e.what());
      }
    }
    const auto twice = std::count_if(seen.begin(), seen.end(), [](uint8_t n) { return n > 1; });
    const auto none = std::count(seen.begin(), seen.end(), uint8_t(0));
    if (twice || none)
      bad.push_back(fmt::format("tensor {}: {} elements in no shard, {} in more than one", name, none, twice));
  }
  return bad;
}

}  // namespace loom
