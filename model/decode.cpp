#include "model/decode.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "checkpoint/safetensors.h"
#include "kernels/ops.h"
#include "model/flops.h"
#include "runtime/error.h"
#include "runtime/file.h"

namespace loom {

Decoder::Decoder(const Config& cfg, const std::string& path) : cfg_(cfg) {
  cfg_.parallel = ParallelConfig{};  // one process holds every tensor whole
  LOOM_CHECK(cfg_.model.moe.num_experts == 0,
             "generation with MoE layers is not supported yet (the decoder has no expert routing); use a dense model");
  layout_ = model_layout(cfg_);
  w_.resize(layout_.reg.numel());
  unused_ = model_load(layout_.reg, w_.data(), path);
  const ModelConfig& m = cfg_.model;
  T_ = m.seq_len, C_ = m.d_model, H_ = m.n_head, KV_ = cfg_.kv_heads(), D_ = cfg_.head_dim(), F_ = m.d_ff;
  V_ = m.vocab_size, Vp_ = int(cfg_.vocab_padded()), L_ = m.n_layer;
  llama_ = m.arch == "llama";
  k_.assign(size_t(L_) * size_t(T_) * size_t(KV_ * D_), 0.0f);
  v_.assign(k_.size(), 0.0f);
  if (llama_) {
    cos_.resize(size_t(T_) * size_t(D_ / 2));
    sin_.resize(cos_.size());
    cpu::rope_table(cos_.data(), sin_.data(), T_, D_, float(m.rope_theta));
  }
}

const float* Decoder::at(int layer, WField f) const {
  const size_t off = layout_.layer_offsets[size_t(layer)][f];
  return off == SIZE_MAX ? nullptr : w_.data() + off;
}

const float* Decoder::named(const char* name) const {
  return name ? w_.data() + layout_.reg.at(name).offset : nullptr;
}

// Queries at positions pos_ .. pos_ + n - 1 against every cached key up to their own position.
void Decoder::attend(float* out, const float* qkv, int layer, int n) const {
  const int row = (H_ + 2 * KV_) * D_, group = H_ / KV_, kvw = KV_ * D_;
  const float scale = 1.0f / std::sqrt(float(D_));
  const float* K = k_.data() + size_t(layer) * size_t(T_) * size_t(kvw);
  const float* V = v_.data() + size_t(layer) * size_t(T_) * size_t(kvw);
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(T_));
#pragma omp for collapse(2) schedule(static)
    for (int i = 0; i < n; ++i)
      for (int h = 0; h < H_; ++h) {
        const float* q = qkv + int64_t(i) * row + h * D_;
        const int kv = h / group, last = pos_ + i;
        float mx = -INFINITY;
        for (int j = 0; j <= last; ++j) {
          const float* k = K + int64_t(j) * kvw + kv * D_;
          float s = 0.0f;
          for (int d = 0; d < D_; ++d) s += q[d] * k[d];
          p[size_t(j)] = s * scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        float sum = 0.0f;
        for (int j = 0; j <= last; ++j) sum += p[size_t(j)] = std::exp(p[size_t(j)] - mx);
        float* o = out + int64_t(i) * H_ * D_ + h * D_;
        std::fill(o, o + D_, 0.0f);
        for (int j = 0; j <= last; ++j) {
          const float* v = V + int64_t(j) * kvw + kv * D_;
          const float w = p[size_t(j)] / sum;
          for (int d = 0; d < D_; ++d) o[d] += w * v[d];
        }
      }
  }
}

std::vector<float> Decoder::forward(const int32_t* tokens, int n, bool all_rows) {
  LOOM_CHECK(n > 0 && pos_ + n <= T_,
             "the model's context is model.seq_len = {} tokens and {} are in it already; {} more do not fit", T_, pos_,
             n);
  for (int i = 0; i < n; ++i)
    LOOM_CHECK(tokens[i] >= 0 && tokens[i] < V_, "token id {} is outside the model's vocabulary of {}", tokens[i], V_);
  using cpu::WLayout;
  const WLayout wl = llama_ ? WLayout::out_in : WLayout::in_out;
  const HeadNames names = head_names(cfg_);
  const int qkvw = (H_ + 2 * KV_) * D_, fcw = llama_ ? 2 * F_ : F_, kvw = KV_ * D_;
  const float eps = float(cfg_.model.norm_eps);
  std::vector<float> x(size_t(n) * C_), h(x.size()), tmp(x.size()), qkv(size_t(n) * qkvw), att(size_t(n) * H_ * D_),
      fc(size_t(n) * fcw), act(size_t(n) * F_), mean(static_cast<size_t>(n)), rstd(static_cast<size_t>(n));
  const float* wpe = named(names.wpe);
  cpu::embedding_forward(x.data(), tokens, named(names.wte), 0, Vp_, wpe ? wpe + int64_t(pos_) * C_ : nullptr, 1, n,
                         C_);
  auto norm = [&](float* out, float* in, const float* w, const float* b, int rows) {
    if (llama_)
      cpu::rmsnorm_forward(out, rstd.data(), in, static_cast<const float*>(nullptr), w, rows, C_, eps);
    else
      cpu::layernorm_forward(out, mean.data(), rstd.data(), in, static_cast<const float*>(nullptr), w, b, rows, C_,
                             eps);
  };
  for (int l = 0; l < L_; ++l) {
    norm(h.data(), x.data(), at(l, NORM1_W), at(l, NORM1_B), n);
    cpu::matmul_forward(qkv.data(), h.data(), at(l, QKV_W), at(l, QKV_B), n, C_, qkvw, wl);
    if (llama_) {
      const size_t off = size_t(pos_) * size_t(D_ / 2);
      cpu::rope_forward(qkv.data(), cos_.data() + off, sin_.data() + off, 1, n, H_, KV_, D_);
    }
    float* K = k_.data() + (size_t(l) * size_t(T_) + size_t(pos_)) * size_t(kvw);
    float* V = v_.data() + (size_t(l) * size_t(T_) + size_t(pos_)) * size_t(kvw);
    for (int i = 0; i < n; ++i) {
      const float* r = qkv.data() + size_t(i) * qkvw + H_ * D_;
      std::copy_n(r, kvw, K + size_t(i) * kvw);
      std::copy_n(r + kvw, kvw, V + size_t(i) * kvw);
    }
    attend(att.data(), qkv.data(), l, n);
    cpu::matmul_forward(tmp.data(), att.data(), at(l, PROJ_W), at(l, PROJ_B), n, H_ * D_, C_, wl);
    cpu::add_inplace(x.data(), tmp.data(), int64_t(x.size()));
    norm(h.data(), x.data(), at(l, NORM2_W), at(l, NORM2_B), n);
    cpu::matmul_forward(fc.data(), h.data(), at(l, FC_W), at(l, FC_B), n, C_, fcw, wl);
    if (llama_)
      cpu::swiglu_forward(act.data(), fc.data(), n, F_);
    else
      cpu::gelu_forward(act.data(), fc.data(), int64_t(act.size()));
    cpu::matmul_forward(tmp.data(), act.data(), at(l, DOWN_W), at(l, DOWN_B), n, F_, C_, wl);
    cpu::add_inplace(x.data(), tmp.data(), int64_t(x.size()));
  }
  pos_ += n;
  const int first = all_rows ? 0 : n - 1, rows = n - first;
  norm(h.data(), x.data() + size_t(first) * C_, named(names.norm_w), named(names.norm_b), rows);
  std::vector<float> padded(size_t(rows) * Vp_);
  cpu::matmul_forward(padded.data(), h.data(), named(names.lm_head), nullptr, rows, C_, Vp_, WLayout::out_in);
  std::vector<float> logits(size_t(rows) * V_);
  for (int r = 0; r < rows; ++r) std::copy_n(padded.data() + size_t(r) * Vp_, V_, logits.data() + size_t(r) * V_);
  return logits;
}

int32_t token_sample(const float* logits, int n, const SampleOptions& opt, std::mt19937_64& rng) {
  if (opt.temperature <= 0.0) return int32_t(std::max_element(logits, logits + n) - logits);
  const int k = opt.top_k > 0 ? std::min(opt.top_k, n) : n;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  // Largest first, ties by id: the same logits give the same order on every machine.
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  std::vector<double> p(static_cast<size_t>(k));
  double sum = 0.0;
  for (int i = 0; i < k; ++i)
    sum += p[size_t(i)] = std::exp((double(logits[ids[size_t(i)]]) - logits[ids[0]]) / opt.temperature);
  const double u = double(rng() >> 11) * 0x1.0p-53 * sum;  // uniform in [0, sum), not library-defined
  double acc = 0.0;
  for (int i = 0; i < k; ++i)
    if ((acc += p[size_t(i)]) > u) return ids[size_t(i)];
  return ids[size_t(k - 1)];
}

namespace {
// A Hugging Face config.json as loom keys; refuses what loom's forward does not compute.
std::vector<std::string> hf_config_keys(const nlohmann::json& j, const std::string& path) {
  const std::string type = j.value("model_type", "");
  auto num = [&](const char* k) {
    LOOM_CHECK(j.contains(k) && j[k].is_number(), "'{}' has no number '{}'", path, k);
    return j[k].dump();
  };
  std::vector<std::string> out;
  if (type == "gpt2") {
    const std::string act = j.value("activation_function", "gelu_new");
    LOOM_CHECK(act == "gelu_new", "'{}': activation_function '{}'; loom's GPT-2 computes gelu_new", path, act);
    out = {"model.arch=gpt2",
           "model.d_model=" + num("n_embd"),
           "model.n_head=" + num("n_head"),
           "model.n_layer=" + num("n_layer"),
           "model.vocab_size=" + num("vocab_size"),
           "model.seq_len=" + num("n_positions"),
           "model.tie_embeddings=true"};
    if (j.contains("n_inner") && j["n_inner"].is_number()) out.push_back("model.d_ff=" + num("n_inner"));
    if (j.contains("layer_norm_epsilon")) out.push_back("model.norm_eps=" + num("layer_norm_epsilon"));
  } else if (type == "llama") {
    LOOM_CHECK(!j.contains("rope_scaling") || j["rope_scaling"].is_null(),
               "'{}' sets rope_scaling, which loom's RoPE does not compute", path);
    const std::string act = j.value("hidden_act", "silu");
    LOOM_CHECK(act == "silu", "'{}': hidden_act '{}'; loom's LLaMA computes silu", path, act);
    out = {"model.arch=llama",
           "model.d_model=" + num("hidden_size"),
           "model.n_head=" + num("num_attention_heads"),
           "model.n_kv_head=" +
               (j.contains("num_key_value_heads") ? num("num_key_value_heads") : num("num_attention_heads")),
           "model.n_layer=" + num("num_hidden_layers"),
           "model.d_ff=" + num("intermediate_size"),
           "model.vocab_size=" + num("vocab_size"),
           "model.seq_len=" + num("max_position_embeddings"),
           fmt::format("model.tie_embeddings={}", j.value("tie_word_embeddings", false))};
    if (j.contains("rms_norm_eps")) out.push_back("model.norm_eps=" + num("rms_norm_eps"));
    if (j.contains("rope_theta")) out.push_back("model.rope_theta=" + num("rope_theta"));
  } else {
    fail("'{}': model_type '{}'; loom runs gpt2 and llama", path, type);
  }
  return out;
}
}  // namespace

std::string hf_config_json(const Config& cfg) {
  const ModelConfig& m = cfg.model;
  nlohmann::ordered_json j;
  if (m.arch == "gpt2") {
    j = {{"architectures", {"GPT2LMHeadModel"}},
         {"model_type", "gpt2"},
         {"n_embd", m.d_model},
         {"n_head", m.n_head},
         {"n_layer", m.n_layer},
         {"n_positions", m.seq_len},
         {"n_ctx", m.seq_len},
         {"n_inner", m.d_ff},
         {"vocab_size", m.vocab_size},
         {"activation_function", "gelu_new"},
         {"layer_norm_epsilon", m.norm_eps},
         {"resid_pdrop", 0.0},
         {"embd_pdrop", 0.0},
         {"attn_pdrop", 0.0},
         {"tie_word_embeddings", m.tie_embeddings}};
  } else {
    const bool moe = m.moe.num_experts > 0;
    LOOM_CHECK(!moe || m.moe.every == 1,
               "model.moe.every = {}: transformers' Mixtral makes every block sparse, so this model has no Hugging "
               "Face directory form; export one .safetensors file instead",
               m.moe.every);
    j = {{"architectures", {moe ? "MixtralForCausalLM" : "LlamaForCausalLM"}},
         {"model_type", moe ? "mixtral" : "llama"},
         {"hidden_size", m.d_model},
         {"intermediate_size", m.d_ff},
         {"num_attention_heads", m.n_head},
         {"num_key_value_heads", cfg.kv_heads()},
         {"num_hidden_layers", m.n_layer},
         {"vocab_size", m.vocab_size},
         {"max_position_embeddings", m.seq_len},
         {"rms_norm_eps", m.norm_eps},
         {"rope_theta", m.rope_theta},
         {"hidden_act", "silu"},
         {"tie_word_embeddings", m.tie_embeddings},
         {"attention_bias", false}};
    if (moe) {
      j["num_local_experts"] = m.moe.num_experts;
      j["num_experts_per_tok"] = m.moe.top_k;
      j["router_aux_loss_coef"] = m.moe.aux_loss_coef;
    } else {
      j["mlp_bias"] = false;
    }
  }
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

bool export_is_dir(const std::string& out) {
  return !out.empty() && (out.back() == '/' || std::filesystem::is_directory(out));
}

std::map<std::string, std::string> export_metadata(const Config& cfg) {
  std::map<std::string, std::string> m = {{"loom.model", config_to_toml(cfg, "model")}};
  const std::string tok = !cfg.data.tokenizer.empty() ? cfg.data.tokenizer : cfg.data.source == "text" ? "byte" : "";
  if (!tok.empty()) m["loom.tokenizer"] = tok;
  if (tok == "gpt2" || tok == "llama3")
    m["loom.tokenizer_dir"] = std::filesystem::absolute(cfg.data.tokenizer_dir).string();
  return m;
}

void hf_dir_write(const std::string& dir, const Config& cfg, const std::vector<StView>& tensors) {
  const std::string config = hf_config_json(cfg);  // refuses before anything is written
  std::filesystem::create_directories(dir);
  auto meta = export_metadata(cfg);
  meta["format"] = "pt";
  safetensors_write(dir + "/model.safetensors", tensors, meta);
  // What transformers' GPT2Tokenizer reads; LLaMA-3's ranks file as Meta ships it.
  std::vector<const char*> files;
  if (cfg.data.tokenizer == "gpt2") files = {"vocab.json", "merges.txt"};
  if (cfg.data.tokenizer == "llama3") files = {"tokenizer.model"};
  for (const char* f : files) {
    std::error_code ec;
    const std::string from = cfg.data.tokenizer_dir + "/" + f, to = dir + "/" + f;
    if (std::filesystem::equivalent(from, to, ec)) continue;
    const std::string text = input_read_all(from, "data.tokenizer_dir's", int64_t(1) << 30);
    file_write_atomic(to, [&](std::FILE* o) { file_write(o, text.data(), text.size(), to); });
  }
  const std::string path = dir + "/config.json";
  file_write_atomic(path, [&](std::FILE* f) { file_write(f, config.data(), config.size(), path); });
}

Config model_config_find(const std::string& weights_path) {
  namespace fs = std::filesystem;
  Config cfg = config_defaults();
  const auto meta = weights_metadata(weights_path);
  if (auto it = meta.find("loom.model"); it != meta.end()) {
    config_load_string(cfg, it->second, weights_path + " (its loom.model metadata)");
  } else {
    const fs::path dir = fs::is_directory(weights_path) ? fs::path(weights_path) : fs::path(weights_path).parent_path();
    const std::string json = (dir / "config.json").string();
    LOOM_CHECK(fs::exists(json),
               "'{}' does not say the model's shape (no loom.model metadata, no config.json beside it); pass "
               "--config with the [model] section it was trained with",
               weights_path);
    std::ifstream in(json);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      fail("'{}' is not JSON: {}", json, e.what());
    }
    for (auto& s : hf_config_keys(j, json)) config_set(cfg, s);
  }
  config_validate(cfg);
  return cfg;
}

void model_config_check_file(const Config& cfg, const std::string& weights_path, const std::string& origin) {
  // Checked from the headers before anything is allocated: metadata describing a larger model
  // than the file holds would be built whole before a tensor is compared.
  double held = 0;
  for (auto& [name, shape] : weights_shapes(weights_path)) held += double(shape_numel(shape));  // each fits the file
  LOOM_CHECK(param_count_f64(cfg) <= held,
             "'{}' holds {:.4g} parameters and the model its {} describe has {:.4g}; correct the description, or "
             "pass --config with the [model] section the weights were trained with",
             weights_path, held, origin, param_count_f64(cfg));
}

}  // namespace loom
