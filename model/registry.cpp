#include "model/registry.h"

#include <random>

namespace loom {

ParamSpec& ParamRegistry::add(const std::string& name, Shape shape, ParamSpec::Init init, float std) {
  LOOM_ASSERT(!index_.count(name));
  ParamSpec s;
  s.name = name;
  s.shape = std::move(shape);
  s.offset = total_;
  s.decay = s.shape.size() >= 2;
  s.init = init;
  s.init_std = std;
  total_ += size_t(s.numel());
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

void registry_init(const ParamRegistry& reg, float* params, uint64_t seed) {
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
    for (int64_t i = 0; i < s.numel(); ++i) p[i] = dist(gen);
  }
}

}  // namespace loom
