// Parameter registry: every parameter of a model chunk lives in one flat f32 buffer, its
// gradient at the same offset in a second one. The registry maps Hugging Face names to
// (offset, shape, decay). DDP buckets, ZeRO shards and checkpoints are ranges and names of
// these buffers. Sharded layouts (local vs global shape) arrive with tensor parallelism.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/tensor.h"

namespace loom {

struct ParamSpec {
  std::string name;
  Shape shape;
  size_t offset = 0;  // elements into the flat buffer
  bool decay = true;  // AdamW weight decay: tensors of two or more dims
  float init_std = 0.02f;  // 0: ones (norm gains) or zeros (biases), see init_kind
  enum class Init { normal, zeros, ones } init = Init::normal;
  int64_t numel() const { return shape_numel(shape); }
};

class ParamRegistry {
 public:
  ParamSpec& add(const std::string& name, Shape shape, ParamSpec::Init init, float std = 0.02f);
  const ParamSpec& at(const std::string& name) const;
  const ParamSpec* find(const std::string& name) const;
  const std::vector<ParamSpec>& all() const { return specs_; }
  size_t numel() const { return total_; }

 private:
  std::vector<ParamSpec> specs_;
  std::unordered_map<std::string, size_t> index_;
  size_t total_ = 0;
};

// Fills params by name: each tensor draws from its own generator seeded by (seed, name),
// so a tensor's values do not depend on what else the model holds or how it is sharded.
void registry_init(const ParamRegistry& reg, float* params, uint64_t seed);

}  // namespace loom
