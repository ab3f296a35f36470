// Inference on one CPU process: the model's forward over a key/value cache, so each new token
// costs one row through every layer instead of the whole prefix again. It reads the same
// registry (names, shapes, padding) and the same CPU kernels as training; attention over the
// cache is its own loop because training's kernel assumes queries and keys start together.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "model/layout.h"
#include "runtime/config.h"

namespace loom {

class Decoder {
 public:
  // Weights from `path` (a safetensors file, an index, or a directory, as init.from takes).
  // cfg: its model section; parallel keys are ignored (one process, fp32).
  Decoder(const Config& cfg, const std::string& path);
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
  Config cfg_;
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

// The model's shape for `loom generate` and `loom eval` when no config is given: the [model]
// section loom's export writes into the file's metadata, else the config.json that Hugging
// Face ships beside the weights. Throws, saying to pass --config, when neither is there.
Config model_config_find(const std::string& weights_path);
// The config.json that Hugging Face's transformers reads for this model (GPT2LMHeadModel,
// LlamaForCausalLM, or MixtralForCausalLM where every block is sparse); the inverse of what
// model_config_find reads. An Error says what transformers cannot describe.
std::string hf_config_json(const Config& cfg);
// Whether an export path names a Hugging Face directory (a trailing '/', or a directory that
// exists) rather than one .safetensors file.
bool export_is_dir(const std::string& out);
// What an export records beside the weights: the [model] section (loom.model), and the
// tokenizer the data was made with (loom.tokenizer: byte, or gpt2 with loom.tokenizer_dir)
// where the config says it.
std::map<std::string, std::string> export_metadata(const Config& cfg);
// The weights as a directory transformers loads as it is: model.safetensors (metadata format
// "pt", and export_metadata) and config.json, with GPT-2's vocab.json and merges.txt when the
// data was made with them.
void hf_dir_write(const std::string& dir, const Config& cfg, const std::vector<StView>& tensors);
// Refuses, from the file's headers alone (before anything is allocated), a config describing
// more parameters than `weights_path` holds; `origin` names where the config came from.
void model_config_check_file(const Config& cfg, const std::string& weights_path, const std::string& origin);

}  // namespace loom
