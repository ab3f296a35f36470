// Hugging Face's side of loom's weights: the config.json transformers reads (both ways), the
// metadata an export records, a directory transformers loads as it is, and the check of a
// config against a weights file's headers.
#include "checkpoint/hf_export.h"

#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "model/flops.h"
#include "runtime/error.h"
#include "runtime/file.h"
#include "runtime/json_read.h"

namespace loom {

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
  if (m.arch == Arch::gpt2) {
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
  return !out.empty() && out.back() == '/';
}

namespace {
// The tokenizer's files in a Hugging Face directory, as transformers' AutoTokenizer reads them:
// (where from, name there, or the text itself when `from` is empty).
std::vector<std::array<std::string, 3>> tokenizer_files(const Config& cfg) {
  const DataConfig& d = cfg.data;
  namespace fs = std::filesystem;
  // tokenizer_config.json: the one beside the tokenizer's file, else the class that reads it.
  auto config_of = [&](const std::string& file, const char* cls) -> std::array<std::string, 3> {
    const std::string beside = (fs::path(file).parent_path() / "tokenizer_config.json").string();
    if (fs::is_regular_file(beside)) return {beside, "tokenizer_config.json", ""};
    nlohmann::json j = {{"tokenizer_class", cls}, {"model_max_length", cfg.model.seq_len}};
    return {"", "tokenizer_config.json", j.dump(2) + "\n"};
  };
  if (d.tokenizer == "gpt2")
    return {{d.tokenizer_dir + "/vocab.json", "vocab.json", ""},
            {d.tokenizer_dir + "/merges.txt", "merges.txt", ""},
            config_of(d.tokenizer_dir + "/vocab.json", "GPT2Tokenizer")};
  if (d.tokenizer == "llama3") return {{d.tokenizer_dir + "/tokenizer.model", "tokenizer.model", ""}};
  if (d.tokenizer == "hf")
    return {{d.tokenizer_file, "tokenizer.json", ""}, config_of(d.tokenizer_file, "PreTrainedTokenizerFast")};
  if (d.tokenizer == "spm")
    return {{d.tokenizer_file, "tokenizer.model", ""}, config_of(d.tokenizer_file, "LlamaTokenizer")};
  return {};
}
// What stands at `path`, judged whole (a file loom would replace): "" when it is of the kind
// an export writes there, else that kind.
std::string export_file_kind(const std::string& name, const std::string& path) {
  std::string text;
  try {
    text = input_read_all(path, "", int64_t(256) << 20);
  } catch (const Error&) {
    return "";  // what cannot be read is refused where it is written
  }
  if (text.empty()) return "";
  auto json_object = [&] { return json_problem(text).empty() ? nlohmann::json::parse(text) : nlohmann::json(); };
  if (name == "config.json") {
    const nlohmann::json j = json_object();
    return j.is_object() && j.contains("model_type") && j["model_type"].is_string()
               ? ""
               : "a Hugging Face model config (a JSON object with a model_type)";
  }
  if (name == "vocab.json") {
    const nlohmann::json j = json_object();
    bool ids = j.is_object() && !j.empty();
    for (auto it = j.begin(); ids && it != j.end(); ++it) ids = it->is_number_integer();
    return ids ? "" : "a tokenizer vocabulary (a JSON object of token: id)";
  }
  if (name == "merges.txt") return text.rfind("#version", 0) == 0 ? "" : "a merges file (opening with #version)";
  if (name == "tokenizer.json") {
    const nlohmann::json j = json_object();
    return j.is_object() && j.contains("model") ? "" : "a Hugging Face tokenizer (a JSON object with a model)";
  }
  if (name == "tokenizer_config.json") return json_object().is_object() ? "" : "a tokenizer config (a JSON object)";
  if (name == "tokenizer.model") {
    const size_t space = text.find(' '), end = text.find('\n');
    const bool ranks =
        space != std::string::npos && end != std::string::npos && space > 0 && space < end &&
        text.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") == space &&
        text.find_first_not_of("0123456789", space + 1) == end;
    // Or a SentencePiece model: a protobuf whose first field is its pieces (field 1, bytes).
    const bool sentencepiece = text[0] == '\x0a';
    return ranks || sentencepiece ? "" : "a tokenizer model (a ranks file of base64 tokens, or a SentencePiece model)";
  }
  return "";
}
}  // namespace

void export_output_check(const std::string& out, const Config& cfg, const std::vector<std::string>& inputs,
                         const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!export_is_dir(out)) {
    LOOM_CHECK(!fs::is_directory(fs::symlink_status(out, ec)),
               "{} '{}' is a directory; a Hugging Face directory export names it with a trailing '/' ('{}/'), and "
               "then writes model.safetensors and config.json into it; or name a .safetensors file",
               what, out, out);
    safetensors_output_check(out, inputs, what);
    return;
  }
  const std::string dir = out.substr(0, out.find_last_not_of('/') + 1);
  // A file, a link or a device where the directory goes is not written into, nor through.
  const fs::file_status st = fs::symlink_status(dir.empty() ? "/" : dir, ec);
  if (fs::exists(st) && !fs::is_directory(st)) {
    const std::string kind = file_kind_if_not_regular(dir);
    fail("{} '{}' is {}, not a directory; choose another path for the directory export", what, dir,
         kind.empty() ? "a file" : kind);
  }
  safetensors_output_check(dir + "/model.safetensors", inputs, what);
  std::vector<std::string> files = {"config.json"};
  for (const auto& f : tokenizer_files(cfg)) files.push_back(f[1]);
  for (const std::string& name : files) {
    const std::string path = dir + "/" + name;
    output_check(path, what);
    output_not_input(path, inputs, what);
    if (const std::string kind = export_file_kind(name, path); !kind.empty())
      fail(
          "{} '{}' would replace '{}', which is not {}; loom replaces only a file of the kind it writes there: "
          "choose another directory, or move that file away first",
          what, out, path, kind);
  }
}

std::map<std::string, std::string> export_metadata(const Config& cfg) {
  std::map<std::string, std::string> m = {{"loom.model", config_to_toml(cfg, "model")}};
  const std::string tok = !cfg.data.tokenizer.empty()         ? cfg.data.tokenizer
                          : cfg.data.source == DataKind::text ? "byte"
                                                              : "";
  if (!tok.empty()) m["loom.tokenizer"] = tok;
  if (tok == "gpt2" || tok == "llama3")
    m["loom.tokenizer_dir"] = std::filesystem::absolute(cfg.data.tokenizer_dir).string();
  if (tok == "hf" || tok == "spm")
    m["loom.tokenizer_file"] = std::filesystem::absolute(cfg.data.tokenizer_file).string();
  return m;
}

void hf_dir_write(const std::string& dir, const Config& cfg, const std::vector<StView>& tensors) {
  const std::string config = hf_config_json(cfg);  // refuses before anything is written
  // Checked again now: a long run's directory may have gained a user's file since its start.
  export_output_check(export_is_dir(dir) ? dir : dir + "/", cfg, {}, "the export");
  std::filesystem::create_directories(dir);
  auto meta = export_metadata(cfg);
  meta["format"] = "pt";
  safetensors_write(dir + "/model.safetensors", tensors, meta);
  // What transformers' tokenizers read (GPT2Tokenizer's files, a tokenizer.json, a SentencePiece
  // model, with tokenizer_config.json); LLaMA-3's ranks file as Meta ships it.
  for (const auto& [from, name, made] : tokenizer_files(cfg)) {
    std::error_code ec;
    const std::string to = dir + "/" + name;
    if (!from.empty() && std::filesystem::equivalent(from, to, ec)) continue;
    const std::string text = from.empty() ? made : input_read_all(from, "the data's tokenizer file", int64_t(1) << 30);
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
    const nlohmann::json j =
        json_parse(input_read_all(json, "the model's config.json", int64_t(64) << 20), fmt::format("'{}'", json));
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
  const double described = param_count_f64(model_dims(cfg));
  LOOM_CHECK(described <= held,
             "'{}' holds {:.4g} parameters and the model its {} describe has {:.4g}; correct the description, or "
             "pass --config with the [model] section the weights were trained with",
             weights_path, held, origin, described);
}

}  // namespace loom
