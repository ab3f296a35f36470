// Parameter registry: every parameter of a model chunk lives in one flat buffer (the compute
// dtype), its gradient at the same offset in a second one (fp32). The registry maps Hugging
// Face names to (offset, local shape, global shape, shard dim, shard index). DDP buckets, ZeRO
// shards and checkpoints are ranges and names of these buffers.
// Tensor-parallel sharding: dim `shard_dim` of the global tensor is viewed as `shard_parts`
// equal blocks (GPT-2's fused q|k|v is three), and each block is split into tp slices; rank
// t holds slice t of every block, back to back. shard_dim < 0: the tensor is replicated.
// Padding: a tensor may hold more rows (dim 0) than its Hugging Face shape (the vocabulary,
// padded to a multiple of tp x 64); padded rows are zero, never read from a file, never
// written to one. The HF view of the registry (global_offset, global_numel) is the same on
// every rank of every layout: it is how weights enter and leave loom.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/tensor.h"

namespace loom {

struct ParamSpec {
  std::string name;
  Shape shape;               // local: what this rank holds
  Shape global_shape;        // what the file holds
  int64_t padded_rows = 0;   // dim 0 of the padded global tensor (>= global_shape[0])
  size_t offset = 0;         // elements into the flat buffer
  size_t global_offset = 0;  // elements into the HF concatenation of global tensors
  bool decay = true;         // AdamW weight decay: tensors of two or more dims
  float init_std = 0.02f;
  enum class Init { normal, zeros, ones } init = Init::normal;
  int shard_dim = -1, shard_parts = 1, tp = 1, tp_rank = 0;
  int64_t numel() const { return shape_numel(shape); }
  int64_t global_numel() const { return shape_numel(global_shape); }
  bool replicated() const { return shard_dim < 0; }
};
// A MoE expert's weight (Mixtral's names): split over the ep group, reduced over expert-dp.
inline bool expert_param(const std::string& name) {
  return name.find(".block_sparse_moe.experts.") != std::string::npos;
}

class ParamRegistry {
 public:
  // A replicated tensor, or one sharded over tp along shard_dim (see the file comment), with
  // `padded_rows` rows in loom (0: as the global shape).
  ParamSpec& add(const std::string& name, Shape global_shape, ParamSpec::Init init, float std = 0.02f,
                 int shard_dim = -1, int shard_parts = 1, int tp = 1, int tp_rank = 0, int64_t padded_rows = 0);
  const ParamSpec& at(const std::string& name) const;
  const ParamSpec* find(const std::string& name) const;
  const std::vector<ParamSpec>& all() const { return specs_; }
  size_t numel() const { return total_; }
  size_t global_numel() const { return global_total_; }

 private:
  std::vector<ParamSpec> specs_;
  std::unordered_map<std::string, size_t> index_;
  size_t total_ = 0, global_total_ = 0;
};

// Copies this rank's shard out of the global HF tensor (full: global_shape elements); padded
// rows become zeros.
void shard_take(const ParamSpec& s, const float* full, float* local);
// Puts shard `rank`'s elements (local: the spec's local size) into the global HF tensor,
// leaving out padded rows.
void shard_put(const ParamSpec& s, int rank, const float* local, float* full);

// Fills params by name: each tensor draws its global values from its own generator seeded by
// (seed, name), then keeps its shard, so values depend neither on the rest of the model nor
// on the layout (nor on padding).
void registry_init(const ParamRegistry& reg, float* params, uint64_t seed);

}  // namespace loom
