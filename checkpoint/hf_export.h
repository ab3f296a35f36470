// Hugging Face's side of loom's weights: config.json both ways, export metadata, a directory
// transformers loads as it is, and a config checked against a weights file.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "runtime/config.h"

namespace loom {

// The model's shape for `loom generate` and `loom eval` when no config is given: the [model]
// section loom's export writes into the file's metadata, else the config.json that Hugging
// Face ships beside the weights. Throws, saying to pass --config, when neither is there.
Config model_config_find(const std::string& weights_path);
// The config.json that Hugging Face's transformers reads for this model (GPT2LMHeadModel,
// LlamaForCausalLM, or MixtralForCausalLM where every block is sparse); the inverse of what
// model_config_find reads. An Error says what transformers cannot describe.
std::string hf_config_json(const Config& cfg);
// Whether an export path names a Hugging Face directory (a trailing '/') rather than one
// .safetensors file.
bool export_is_dir(const std::string& out);
// Refuses (exit 2), before anything is written, an export (export.final, `loom ckpt export`)
// that would replace anything but what loom writes there, naming the file: every file of a
// directory export is checked as the weights are (model.safetensors a safetensors file,
// config.json a Hugging Face model config, vocab.json a vocabulary, merges.txt merges,
// tokenizer.model a ranks file), and none may be one of `inputs`. A directory named without the
// trailing '/' is refused (the '/' asks for a directory export).
void export_output_check(const std::string& out, const Config& cfg, const std::vector<std::string>& inputs,
                         const std::string& what);
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
