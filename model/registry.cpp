#include "model/registry.h"

#include <random>

namespace loom {

ParamSpec& ParamRegistry::add(const std::string& name, Shape global_shape, ParamSpec::Init init, float std,
                              int shard_dim, int shard_parts, int tp, int tp_rank, int64_t padded_rows) {
  LOOM_ASSERT(!index_.count(name));
  ParamSpec s;
  s.name = name;
  s.global_shape = global_shape;
  s.padded_rows = padded_rows ? padded_rows : global_shape[0];
  LOOM_ASSERT(s.padded_rows >= global_shape[0]);
  s.shape = global_shape;
  s.shape[0] = s.padded_rows;
  if (tp > 1 && shard_dim >= 0) {
    const int64_t d = s.shape[size_t(shard_dim)];
    LOOM_CHECK(d % (int64_t(shard_parts) * tp) == 0,
               "tensor {} dim {} = {} does not split into {} x {} parts; "
               "change the model shape or parallel.tp",
               name, shard_dim, d, shard_parts, tp);
    s.shape[size_t(shard_dim)] = d / tp;
    s.shard_dim = shard_dim;
    s.shard_parts = shard_parts;
    s.tp = tp;
    s.tp_rank = tp_rank;
  }
  s.offset = total_;
  s.global_offset = global_total_;
  s.decay = global_shape.size() >= 2;
  s.init = init;
  s.init_std = std;
  total_ += size_t(s.numel());
  global_total_ += size_t(s.global_numel());
  index_[name] = specs_.size();
  specs_.push_back(std::move(s));
  return specs_.back();
}

const ParamSpec* ParamRegistry::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &specs_[it->second];
}

const ParamSpec& ParamRegistry::at(const std::string& name) const {
  auto* s = find(name);
  LOOM_CHECK(s, "no parameter named '{}' in this model", name);
  return *s;
}

namespace {
// Walks the shard's elements: for each (outer, local index along the dim, inner) calls
// f(global element, local element) with the element's index in the padded global tensor;
// padding is on dim 0 only, so below global_numel() that is its index in the HF tensor too.
template <class F>
void shard_walk(const ParamSpec& s, int rank, F&& f) {
  Shape g = s.global_shape;
  g[0] = s.padded_rows;
  const size_t d = size_t(s.shard_dim);
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < d; ++i) outer *= g[i];
  for (size_t i = d + 1; i < g.size(); ++i) inner *= g[i];
  const int64_t dim = g[d], local_dim = dim / s.tp, block = dim / s.shard_parts, slice = block / s.tp;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < local_dim; ++j) {
      const int64_t gj = (j / slice) * block + int64_t(rank) * slice + j % slice;
      const int64_t gbase = (o * dim + gj) * inner, lbase = (o * local_dim + j) * inner;
      for (int64_t i = 0; i < inner; ++i) f(gbase + i, lbase + i);
    }
}
}  // namespace

void shard_take(const ParamSpec& s, const float* full, float* local) {
  const int64_t real = s.global_numel();
  if (s.replicated() || s.tp == 1) {
    std::copy_n(full, real, local);
    std::fill(local + real, local + s.numel(), 0.0f);  // padded rows
    return;
  }
  shard_walk(s, s.tp_rank, [&](int64_t g, int64_t l) { local[l] = g < real ? full[g] : 0.0f; });
}

void shard_put(const ParamSpec& s, int rank, const float* local, float* full) {
  const int64_t real = s.global_numel();
  if (s.replicated() || s.tp == 1) {
    std::copy_n(local, real, full);
    return;
  }
  shard_walk(s, rank, [&](int64_t g, int64_t l) {
    if (g < real) full[g] = local[l];
  });
}

void registry_init(const ParamRegistry& reg, float* params, uint64_t seed) {
  std::vector<float> full;
  for (auto& s : reg.all()) {
    float* p = params + s.offset;
    if (s.init != ParamSpec::Init::normal) {
      std::fill(p, p + s.numel(), s.init == ParamSpec::Init::ones ? 1.0f : 0.0f);
      continue;
    }
    uint64_t h = 1469598103934665603ull;  // FNV-1a: stable across platforms, unlike std::hash
    for (unsigned char c : s.name) h = (h ^ c) * 1099511628211ull;
    std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32), uint32_t(h), uint32_t(h >> 32)};
    std::mt19937_64 gen(seq);
    std::normal_distribution<float> dist(0.0f, s.init_std);
    full.resize(size_t(shape_numel(s.global_shape)));
    for (auto& x : full) x = dist(gen);
    shard_take(s, full.data(), p);
  }
}

}  // namespace loom
