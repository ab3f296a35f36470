#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/error.h"
#include "runtime/file.h"
#include "runtime/json_read.h"

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
// One tensor of a safetensors header, checked: its dtype is one loom reads, its shape holds
// non-negative integers, its data offsets are integers inside the data, as long as the shape
// says, and overlap no other tensor's.
struct StEntry {
  std::string name, dtype;
  Shape shape;
  uint64_t begin = 0, end = 0, numel = 0;
  size_t esize = 0;
};
struct StHeader {
  nlohmann::json metadata;  // __metadata__, or null
  std::vector<StEntry> tensors;
  uint64_t data_start = 0;
};

// Parses JSON refusing a repeated key in any object: nlohmann keeps the last silently, so a
// header naming a tensor twice would load whichever came second.
nlohmann::json json_parse_unique(const std::string& text, const std::string& path) {
  std::vector<std::set<std::string>> open;
  std::string repeated;
  using Event = nlohmann::json::parse_event_t;
  const nlohmann::json::parser_callback_t cb = [&](int, Event ev, nlohmann::json& parsed) {
    if (ev == Event::object_start) open.emplace_back();
    if (ev == Event::object_end && !open.empty()) open.pop_back();
    if (ev == Event::key && !open.empty() && !open.back().insert(parsed.get<std::string>()).second && repeated.empty())
      repeated = parsed.get<std::string>();
    return true;
  };
  const nlohmann::json j = json_parse(text, fmt::format("the safetensors header of '{}'", path), cb);
  LOOM_CHECK(repeated.empty(), "'{}' has a corrupt safetensors header: key '{}' appears more than once", path,
             repeated);
  return j;
}

StEntry entry_parse(const std::string& path, const std::string& name, const nlohmann::json& info, uint64_t data_size) {
  StEntry t;
  t.name = name;
  auto bad = [&](const std::string& what) {
    fail("'{}': tensor '{}' has a malformed header entry ({}); the file is corrupt", path, name, what);
  };
  if (!info.is_object()) bad("not an object");
  const auto dtype = info.find("dtype"), shape = info.find("shape"), offsets = info.find("data_offsets");
  if (dtype == info.end() || !dtype->is_string()) bad("no dtype string");
  t.dtype = dtype->get<std::string>();
  t.esize = t.dtype == "F32" ? 4 : (t.dtype == "BF16" || t.dtype == "F16") ? 2 : 0;
  LOOM_CHECK(t.esize, "'{}': tensor '{}' has dtype {}; loom reads F32, BF16 and F16", path, name, t.dtype);
  if (shape == info.end() || !shape->is_array()) bad("no shape array");
  // The element count, checked for overflow: it decides what is allocated.
  t.numel = 1;
  for (auto& d : *shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      bad(fmt::format("shape {} is not of non-negative integers", shape->dump()));
    const uint64_t n = d.get<uint64_t>();
    LOOM_CHECK(n == 0 || t.numel <= data_size / n,
               "'{}': tensor '{}' has shape {}, larger than the file's {} data bytes; the file is corrupt", path, name,
               shape->dump(), data_size);
    t.numel *= n;
    t.shape.push_back(int64_t(n));
  }
  if (offsets == info.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned())
    bad("data_offsets is not two non-negative integers");
  t.begin = (*offsets)[0].get<uint64_t>();
  t.end = (*offsets)[1].get<uint64_t>();
  LOOM_CHECK(t.end >= t.begin && t.end <= data_size && t.end - t.begin == t.numel * t.esize,
             "'{}': tensor '{}' has data offsets [{}, {}] that do not match shape {} x {} bytes "
             "within {} data bytes; the file is corrupt or truncated",
             path, name, t.begin, t.end, shape_str(t.shape), t.esize, data_size);
  return t;
}

// The most a safetensors header may hold (Hugging Face's limit).
constexpr uint64_t kHeaderMaxBytes = 100'000'000;

// The header of a safetensors file, every entry checked against the file's size and the others;
// `in` is left open.
StHeader header_read(const std::string& path, std::ifstream& in) {
  // A link is followed (Hugging Face's cache links its files to blobs); a FIFO would hang.
  std::error_code ec;
  LOOM_CHECK(!std::filesystem::exists(path, ec) || std::filesystem::is_regular_file(path, ec),
             "safetensors file '{}' is not a regular file; point init.from at a weights file", path);
  in.open(path, std::ios::binary);
  LOOM_CHECK(in, "cannot open safetensors file '{}'; check init.from", path);
  const uint64_t file_size = std::filesystem::file_size(path);
  uint64_t header_size = 0;
  in.read(reinterpret_cast<char*>(&header_size), 8);
  // Checked before the header is allocated: a corrupt size must not ask for exabytes.
  LOOM_CHECK(file_size >= 8 && in.gcount() == 8 && header_size <= file_size - 8,
             "'{}' is not a safetensors file: its header size {} does not fit its {} bytes", path, header_size,
             file_size);
  // Hugging Face's own readers refuse a header above 100 MB: a (sparse) file can claim any size.
  LOOM_CHECK(header_size <= kHeaderMaxBytes,
             "'{}' is not a safetensors file loom reads: its header claims {} bytes, more than the {} a safetensors "
             "header may have (the file is corrupt, or not a weights file)",
             path, header_size, kHeaderMaxBytes);
  std::string text(header_size, '\0');
  in.read(text.data(), std::streamsize(header_size));
  const nlohmann::json j = json_parse_unique(text, path);
  LOOM_CHECK(j.is_object(), "'{}' has a corrupt safetensors header: not a JSON object", path);
  StHeader h;
  h.data_start = 8 + header_size;
  const uint64_t data_size = file_size - h.data_start;
  for (auto& [name, info] : j.items()) {
    if (name == "__metadata__") {
      h.metadata = info;
      continue;
    }
    h.tensors.push_back(entry_parse(path, name, info, data_size));
  }
  // Two tensors on the same bytes would load as one another.
  std::vector<const StEntry*> by_offset;
  for (auto& t : h.tensors)
    if (t.end > t.begin) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    LOOM_CHECK(by_offset[i]->begin >= by_offset[i - 1]->end,
               "'{}': tensors '{}' (bytes [{}, {})) and '{}' (bytes [{}, {})) overlap; the file is corrupt", path,
               by_offset[i - 1]->name, by_offset[i - 1]->begin, by_offset[i - 1]->end, by_offset[i]->name,
               by_offset[i]->begin, by_offset[i]->end);
  return h;
}
}  // namespace

std::map<std::string, StTensor> safetensors_read(const std::string& path) {
  std::ifstream in;
  const StHeader h = header_read(path, in);
  std::map<std::string, StTensor> out;
  for (const StEntry& e : h.tensors) {
    std::vector<char> raw(e.end - e.begin);
    in.seekg(std::streamoff(h.data_start + e.begin));
    in.read(raw.data(), std::streamsize(raw.size()));
    LOOM_CHECK(in.gcount() == std::streamsize(raw.size()), "'{}' is truncated inside tensor '{}'", path, e.name);
    StTensor t{e.shape, std::vector<float>(size_t(e.numel))};
    if (e.dtype == "F32") {
      std::memcpy(t.data.data(), raw.data(), raw.size());
    } else {
      auto* p = reinterpret_cast<const uint16_t*>(raw.data());
      for (uint64_t i = 0; i < e.numel; ++i)
        t.data[size_t(i)] = e.dtype == "BF16" ? bf16_to_f32(p[i]) : f16_to_f32(p[i]);
    }
    out.emplace(e.name, std::move(t));
  }
  return out;
}

bool safetensors_like(const std::string& head) {
  if (head.size() < 9) return false;
  uint64_t n = 0;
  std::memcpy(&n, head.data(), 8);
  return n > 0 && head[8] == '{';
}

void safetensors_output_check(const std::string& path, const std::vector<std::string>& inputs,
                              const std::string& what) {
  output_check(path, what);
  output_kind_check(path, "a safetensors file", &safetensors_like, what);
  output_not_input(path, inputs, what);
}

void safetensors_write(const std::string& path, const std::vector<StView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  safetensors_output_check(path, {}, "");
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
  const std::string text = input_read_all(index, "the safetensors index", int64_t(256) << 20);
  const nlohmann::json j = json_parse(text, fmt::format("'{}' (a safetensors index)", index));
  LOOM_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
             "'{}' has no weight_map; it is not a safetensors index", index);
  std::set<std::string> files;
  for (auto& [name, file] : j["weight_map"].items()) {
    LOOM_CHECK(file.is_string() && !file.get<std::string>().empty() &&
                   file.get<std::string>().find('/') == std::string::npos && file.get<std::string>() != "..",
               "'{}': weight_map gives tensor '{}' the file {}, not a file name beside the index; the index is "
               "corrupt",
               index, name, file.dump());
    files.insert(file.get<std::string>());
  }
  LOOM_CHECK(!files.empty(), "'{}' has an empty weight_map: it names no file of weights; the index is corrupt", index);
  const fs::path dir = fs::path(index).parent_path();
  std::vector<std::string> out;
  for (auto& f : files) out.push_back((dir / f).string());
  return out;
}
}  // namespace

std::map<std::string, StTensor> weights_read(const std::string& path) {
  std::map<std::string, StTensor> out;
  for (auto& f : weights_files(path))
    for (auto& [name, t] : safetensors_read(f))
      LOOM_CHECK(out.emplace(name, std::move(t)).second, "'{}': tensor '{}' is in more than one file of the index",
                 path, name);
  return out;
}

std::map<std::string, std::string> weights_metadata(const std::string& path) {
  const std::vector<std::string> files = weights_files(path);
  std::ifstream in;
  const StHeader h = header_read(files.front(), in);
  std::map<std::string, std::string> out;
  if (h.metadata.is_object())
    for (auto& [k, v] : h.metadata.items())
      if (v.is_string()) out[k] = v.get<std::string>();
  return out;
}

std::map<std::string, Shape> weights_shapes(const std::string& path) {
  std::map<std::string, Shape> out;
  for (auto& f : weights_files(path)) {
    std::ifstream in;
    for (auto& e : header_read(f, in).tensors)
      LOOM_CHECK(out.emplace(e.name, e.shape).second, "'{}': tensor '{}' is in more than one file of the index", path,
                 e.name);
  }
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
    // Non-finite weights train to nothing (every update skipped) and generate nothing.
    const auto bad =
        std::count_if(it->second.data.begin(), it->second.data.end(), [](float v) { return !std::isfinite(v); });
    LOOM_CHECK(bad == 0, "'{}': tensor '{}' holds {} values that are NaN or infinite; these weights cannot be used",
               path, it->first, bad);
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
