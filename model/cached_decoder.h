// Inference on one CPU process: the model's forward over a key/value cache, so each new token
// costs one row through every layer instead of the whole prefix again. It reads the same
// registry (names, shapes, padding) and the same CPU kernels as training; attention over the
// cache is its own loop because training's kernel assumes queries and keys start together.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/layout.h"
#include "model/model_dims.h"

namespace loom {

// Fills the weights (fp32, laid out by the registry) and returns the names the source held that
// the model does not use. The caller reads the file: this layer knows no file formats.
using WeightLoader = std::function<std::vector<std::string>(const ParamRegistry& reg, float* weights)>;

class CachedDecoder {
 public:
  // dims: the model's shapes; its parallel degrees are ignored (one process, fp32).
  CachedDecoder(const ModelDims& dims, const WeightLoader& load);
  // Feeds tokens at positions [pos(), pos() + n) and returns their logits over the real
  // vocabulary: [n, V] with all_rows, else the last row's [V].
  std::vector<float> forward(const int32_t* tokens, int n, bool all_rows = false);
  void reset() { pos_ = 0; }
  int pos() const { return pos_; }
  int context() const { return T_; }  // model.seq_len: the longest sequence the model knows
  int vocab() const { return V_; }
  const std::vector<std::string>& unused() const { return unused_; }

 private:
  const float* at(int layer, WField f) const;
  const float* named(const char* name) const;
  void attend(float* out, const float* qkv, int layer, int n) const;
  ModelDims dims_;
  ModelLayout layout_;
  std::vector<float> w_;
  std::vector<std::string> unused_;
  std::vector<float> k_, v_;  // per layer [T, KV*D]
  std::vector<float> cos_, sin_;
  int T_, C_, H_, KV_, D_, F_, V_, Vp_, L_;
  bool llama_;
  int pos_ = 0;
};

struct SampleOptions {
  double temperature = 0.0;  // 0: greedy
  int top_k = 0;             // 0: the whole vocabulary
};
// Picks the next token from logits[0, n): argmax at temperature 0; otherwise softmax of
// logits / temperature over the top_k largest, drawn with rng (the same seed, the same draw).
int32_t token_sample(const float* logits, int n, const SampleOptions& opt, std::mt19937_64& rng);

}  // namespace loom
