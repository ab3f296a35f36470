#include "checkpoint/safetensors.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/error.h"
#include "runtime/file.h"

namespace loom {

namespace {
float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalize
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) man <<= 1, --exp;
      u = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

namespace {
// The JSON header of a safetensors file, checked against the file's size; `in` is left at the
// first data byte.
nlohmann::json header_read(const std::string& path, std::ifstream& in, uint64_t& file_size, uint64_t& header_size) {
  in.open(path, std::ios::binary);
  LOOM_CHECK(in, "cannot open safetensors file '{}'; check init.from", path);
  file_size = std::filesystem::file_size(path);
  header_size = 0;
  in.read(reinterpret_cast<char*>(&header_size), 8);
  // Checked before the header is allocated: a corrupt size must not ask for exabytes.
  LOOM_CHECK(file_size >= 8 && in.gcount() == 8 && header_size <= file_size - 8,
             "'{}' is not a safetensors file: its header size {} does not fit its {} bytes", path, header_size,
             file_size);
  std::string header(header_size, '\0');
  in.read(header.data(), std::streamsize(header_size));
  try {
    return nlohmann::json::parse(header);
  } catch (const std::exception& e) {
    fail("'{}' has a corrupt safetensors header: {}", path, e.what());
  }
}
}  // namespace

std::map<std::string, StTensor> safetensors_read(const std::string& path) {
  std::ifstream in;
  uint64_t file_size = 0, header_size = 0;
  const nlohmann::json j = header_read(path, in, file_size, header_size);
  const uint64_t data_start = 8 + header_size, data_size = file_size - data_start;
  std::map<std::string, StTensor> out;
  for (auto& [name, info] : j.items()) {
    if (name == "__metadata__") continue;
    try {
      std::string dtype = info.at("dtype");
      Shape shape = info.at("shape").get<Shape>();
      uint64_t b = info.at("data_offsets")[0], e = info.at("data_offsets")[1];
      size_t esize = dtype == "F32" ? 4 : (dtype == "BF16" || dtype == "F16") ? 2 : 0;
      LOOM_CHECK(esize, "'{}': tensor '{}' has dtype {}; loom reads F32, BF16 and F16", path, name, dtype);
      // The element count, checked for overflow: it decides what is allocated.
      uint64_t n = 1;
      for (int64_t d : shape) {
        LOOM_CHECK(d >= 0 && (d == 0 || n <= data_size / uint64_t(d)),
                   "'{}': tensor '{}' has shape {}, larger than the file's {} data bytes; the file is corrupt", path,
                   name, shape_str(shape), data_size);
        n *= uint64_t(d);
      }
      LOOM_CHECK(e >= b && e <= data_size && e - b == n * esize,
                 "'{}': tensor '{}' has data offsets [{}, {}] that do not match shape {} x {} bytes "
                 "within {} data bytes; the file is corrupt or truncated",
                 path, name, b, e, shape_str(shape), esize, data_size);
      std::vector<char> raw(e - b);
      in.seekg(std::streamoff(data_start + b));
      in.read(raw.data(), std::streamsize(raw.size()));
      LOOM_CHECK(in.gcount() == std::streamsize(raw.size()), "'{}' is truncated inside tensor '{}'", path, name);
      StTensor t{shape, std::vector<float>(size_t(n))};
      if (dtype == "F32") {
        std::memcpy(t.data.data(), raw.data(), raw.size());
      } else {
        auto* h = reinterpret_cast<const uint16_t*>(raw.data());
        for (uint64_t i = 0; i < n; ++i) t.data[size_t(i)] = dtype == "BF16" ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
      }
      out.emplace(name, std::move(t));
    } catch (const nlohmann::json::exception& e) {
      fail("'{}': tensor '{}' has a malformed header entry: {}", path, name, e.what());
    }
  }
  return out;
}

void safetensors_write(const std::string& path, const std::vector<StView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json j;
  uint64_t at = 0;
  for (auto& t : tensors) {
    uint64_t bytes = uint64_t(shape_numel(t.shape)) * 4;
    j[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  j["__metadata__"] = {{"format", "pt"}};
  for (auto& [k, v] : metadata) j["__metadata__"][k] = v;
  std::string header = j.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
  file_write_atomic(path, [&](std::FILE* f) {
    uint64_t n = header.size();
    file_write(f, &n, 8, path);
    file_write(f, header.data(), n, path);
    for (auto& t : tensors) file_write(f, t.data, size_t(shape_numel(t.shape)) * 4, path);
  });
}

namespace {
// The files of a weights path: itself, the model.safetensors of a directory, or every file an
// index (model.safetensors.index.json, given or in the directory) names, sorted.
std::vector<std::string> weights_files(const std::string& path) {
  namespace fs = std::filesystem;
  LOOM_CHECK(fs::exists(path), "'{}' does not exist; check init.from", path);
  std::string index = path;
  if (fs::is_directory(path)) {
    index = path + "/model.safetensors.index.json";
    if (!fs::exists(index)) {
      LOOM_CHECK(fs::exists(path + "/model.safetensors"),
                 "'{}' holds neither model.safetensors nor model.safetensors.index.json; point init.from at a "
                 "weights file",
                 path);
      return {path + "/model.safetensors"};
    }
  }
  if (index.size() < 5 || index.compare(index.size() - 5, 5, ".json") != 0) return {path};
  // A checkpoint split over several files: the index maps every tensor to its file.
  std::ifstream in(index);
  LOOM_CHECK(in, "cannot open '{}'; check init.from", index);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail("'{}' is not a safetensors index: {}", index, e.what());
  }
  LOOM_CHECK(j.contains("weight_map") && j["weight_map"].is_object(),
             "'{}' has no weight_map; it is not a safetensors index", index);
  std::set<std::string> files;
  for (auto& [name, file] : j["weight_map"].items()) files.insert(file.get<std::string>());
  const fs::path dir = fs::path(index).parent_path();
  std::vector<std::string> out;
  for (auto& f : files) out.push_back((dir / f).string());
  return out;
}
}  // namespace

std::map<std::string, StTensor> weights_read(const std::string& path) {
  std::map<std::string, StTensor> out;
  for (auto& f : weights_files(path))
    for (auto& [name, t] : safetensors_read(f)) out.emplace(name, std::move(t));
  return out;
}

std::map<std::string, std::string> weights_metadata(const std::string& path) {
  const std::vector<std::string> files = weights_files(path);
  std::ifstream in;
  uint64_t file_size = 0, header_size = 0;
  const nlohmann::json j = header_read(files.front(), in, file_size, header_size);
  std::map<std::string, std::string> out;
  if (j.contains("__metadata__") && j["__metadata__"].is_object())
    for (auto& [k, v] : j["__metadata__"].items())
      if (v.is_string()) out[k] = v.get<std::string>();
  return out;
}

namespace {
// Where a registered tensor is in a file: under its own name, or as Hugging Face's GPT-2
// ships it, without the "transformer." prefix (wte.weight, h.0.attn.c_attn.weight, ...).
std::map<std::string, StTensor>::iterator weight_find(std::map<std::string, StTensor>& file, const std::string& name) {
  auto it = file.find(name);
  const std::string prefix = "transformer.";
  if (it == file.end() && name.rfind(prefix, 0) == 0) it = file.find(name.substr(prefix.size()));
  return it;
}
}  // namespace

std::vector<std::string> model_load(const ParamRegistry& reg, float* params, const std::string& path) {
  auto file = weights_read(path);
  for (auto& s : reg.all()) {
    auto it = weight_find(file, s.name);
    LOOM_CHECK(it != file.end(), "'{}' has no tensor '{}' (shape {}) that this model needs", path, s.name,
               shape_str(s.global_shape));
    const Shape& fs = it->second.shape;
    const bool positions = s.name == "transformer.wpe.weight";
    if (positions && fs.size() == 2 && fs[1] == s.shape[1] && fs[0] != s.shape[0]) {
      LOOM_CHECK(fs[0] > s.shape[0],
                 "model.seq_len = {} is above the position table of '{}' ({} rows in {}); lower "
                 "model.seq_len to at most {}",
                 s.shape[0], path, fs[0], s.name, fs[0]);  // replicated: the first rows are this rank's
      std::memcpy(params + s.offset, it->second.data.data(), size_t(s.numel()) * 4);
    } else {
      LOOM_CHECK(fs == s.global_shape,
                 "'{}': tensor '{}' has shape {} but the model expects {}; check the model.* keys", path, s.name,
                 shape_str(fs), shape_str(s.global_shape));
      shard_take(s, it->second.data.data(), params + s.offset);  // tensor parallel: this rank's slice
    }
    file.erase(it);
  }
  std::vector<std::string> unused;
  for (auto& [name, t] : file) unused.push_back(name);
  return unused;
}

void model_save(const ParamRegistry& reg, const float* hf, const std::string& path,
                const std::map<std::string, std::string>& metadata) {
  std::vector<StView> views;
  for (auto& s : reg.all()) views.push_back({s.name, s.global_shape, hf + s.global_offset});
  safetensors_write(path, views, metadata);
}

}  // namespace loom
