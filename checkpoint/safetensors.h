// safetensors files (the Hugging Face weight format): an 8-byte little-endian header size,
// a JSON header {name: {dtype, shape, data_offsets}}, then raw tensor bytes. loom reads F32,
// BF16 and F16 (converted to f32) and writes F32. model_load/model_save map the registry's
// Hugging Face names onto the flat parameter buffer.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "model/registry.h"

namespace loom {

struct StTensor {
  Shape shape;
  std::vector<float> data;
};
std::map<std::string, StTensor> safetensors_read(const std::string& path);

struct StView {
  std::string name;
  Shape shape;
  const float* data;
};
// metadata: string pairs for the header's __metadata__ (beside "format": "pt").
// Whether a file's first bytes open a safetensors file (a header length, then its JSON).
bool safetensors_like(const std::string& head);
// Refuses (exit 2) a weights output that is not a regular file's name, that names an existing
// file which is not safetensors (a text, a config, a run's metrics), or that is one of `inputs`.
void safetensors_output_check(const std::string& path, const std::vector<std::string>& inputs, const std::string& what);
void safetensors_write(const std::string& path, const std::vector<StView>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// The __metadata__ of a weights file (for an index or directory, of its first file); empty
// when there is none.
std::map<std::string, std::string> weights_metadata(const std::string& path);

// The name and shape of every tensor of a weights path, from the headers alone (nothing of
// the data is read or allocated).
std::map<std::string, Shape> weights_shapes(const std::string& path);

// Every tensor of a weights file, or of a checkpoint split over several
// (model.safetensors.index.json, or a directory holding it or model.safetensors).
std::map<std::string, StTensor> weights_read(const std::string& path);

// Loads every registered parameter from `path` (a file, an index, or a directory as
// weights_read takes) into this rank's flat fp32 buffer (its tensor-parallel slices, padded
// rows zero). A tensor is found under its name or, for GPT-2, without the "transformer."
// prefix, as Hugging Face ships it. A missing tensor or a shape mismatch is an error naming
// the tensor and both shapes. A position table with more rows than model.seq_len loads its
// first rows; fewer rows is an error. Returns the names in the file that the model does not
// use (e.g. attention mask buffers), for the log.
std::vector<std::string> model_load(const ParamRegistry& reg, float* params, const std::string& path);
// Writes the Hugging Face tensors of `reg` from hf (the HF concatenation: each tensor's
// global_shape at its global_offset).
void model_save(const ParamRegistry& reg, const float* hf, const std::string& path,
                const std::map<std::string, std::string>& metadata = {});

}  // namespace loom
