// `loom ckpt verify | inspect | export`: a checkpoint directory read on its own, in one
// process, whatever layout wrote it.
#pragma once
#include <string>

namespace loom {

// Every shard's hash and every tensor's coverage; prints each problem and returns 1 if any.
int ckpt_verify(const std::string& dir);
// Step, layout, the tensors by kind with sizes, the files.
void ckpt_inspect(const std::string& dir);
// The weights (params/*) as one safetensors file with Hugging Face names and the real
// vocabulary, the model's shape in its metadata as export.final writes it.
void ckpt_export(const std::string& dir, const std::string& out);

}  // namespace loom
