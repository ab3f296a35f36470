// A checkpoint's manifest.json (docs/checkpoints.md): written last, its presence marks the directory
// complete. It names every tensor of the state ("params/<HF name>", "exp_avg/<HF name>",
// "exp_avg_sq/<HF name>") with its global shape and the shards that hold it: a shard is the
// hyperslab [offset, offset + shape) of the global tensor, stored as a dataset of one of the
// directory's HDF5 files, with the xxh64 of its float32 bytes.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom {

struct ShardRef {
  std::string file, dataset;
  std::vector<int64_t> offset, shape;
  std::string xxh64;
};
struct TensorEntry {
  std::vector<int64_t> shape;
  std::vector<ShardRef> shards;
};
struct Manifest {
  static constexpr int kVersion = 1;
  int version = kVersion;
  int64_t step = 0;
  nlohmann::json layout;  // world, dp, tp, pp, ep, zero, dtype, device of the run that wrote it
  std::string config;     // that run's resolved config, as TOML
  std::map<std::string, TensorEntry> tensors;
};

nlohmann::json shard_to_json(const ShardRef& s);
// A shard's entry; an Error names `path` (the manifest or the rank's record) and `where` (which
// shard) where a field is missing or of another type.
ShardRef shard_from_json(const nlohmann::json& j, const std::string& path = "a rank's shard record",
                         const std::string& where = "the shard");
std::string manifest_dump(const Manifest& m);
// DIR/manifest.json; an Error names the file and what is wrong with it. Checked here for every
// reader: shard files are bare names inside DIR; shapes and boxes are in bounds (without
// overflow); each tensor's shards cover it exactly once.
Manifest manifest_read(const std::string& dir);
// What is wrong with a manifest's tensors (`path` names it in the messages): shapes, shard file
// names, boxes, coverage. manifest_read refuses a manifest with any.
std::vector<std::string> manifest_problems(const std::string& path, const Manifest& m);
// "" when `path` is a regular file, else what it is ("is missing", "is a FIFO, not a regular
// file ..."): nothing else is opened (a FIFO would hang the reader, a link leave the checkpoint).
std::string ckpt_file_check(const std::string& path);

// step-00000010: the directory of the checkpoint after 10 steps.
std::string checkpoint_dir_name(int64_t step);
// The complete checkpoints under `root` (step-* directories holding manifest.json), newest
// first; `partial` (if given) gets the step-* directories without one.
std::vector<std::string> checkpoints_complete(const std::string& root, std::vector<std::string>* partial = nullptr);
// The step a checkpoint directory's name says, or -1.
int64_t checkpoint_step_of(const std::string& dir);

// Reads and verifies one shard: the dataset must have the manifest's shape and hash, and its
// values must be finite. An Error names the file, the dataset and the tensor.
std::vector<float> ckpt_shard_read(const std::string& dir, const std::string& tensor, const ShardRef& s);

// Every problem of a checkpoint: its manifest's (manifest_problems) and its files' (missing,
// not regular, unreadable, hash mismatches); empty when it is sound.
std::vector<std::string> checkpoint_problems(const std::string& dir, const Manifest& m);

}  // namespace loom
