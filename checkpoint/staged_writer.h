// A rank's checkpoint file written through a bounded staging area. When the shards come from
// the live training state, a reader thread copies them out a run of rows at a time into free
// staging blocks and the writer hashes and writes the blocks in order: the state may change
// (the next optimizer step) once the reader is done, which is when the writer has all but what
// staging holds left to write; staging holds a few of the largest shards (at least two
// blocks). Shards from a private copy (the state a CUDA rank downloaded) need no reader: the
// writer gathers them through one block. Not here: which shards a rank writes (the
// Checkpointer), the manifest and the commit.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/pieces.h"

namespace loom {

// One shard of the file: the piece of a tensor's local storage it holds (src[k] is local
// element f0 + k) and its manifest entry, whose xxh64 the write fills.
struct StagedShard {
  std::string tensor;  // params/NAME, exp_avg/NAME, exp_avg_sq/NAME
  std::vector<int64_t> global_shape;
  ShardRef shard;
  const ParamSpec* spec;
  Piece piece;
  const float* src;
  int64_t f0;
  int64_t nonfinite = 0;  // NaN and infinite values the write found in it
};

class Stager {
 public:
  explicit Stager(int64_t block_floats = kBlockFloats) : min_block_(block_floats) {}
  // Staging for `shards`: blocks of kBlockFloats (or their longest row) holding up to
  // kLargestShards of the largest shard, and never more than all of them (live), or one block
  // (a private copy); kept between saves.
  static constexpr int64_t kBlockFloats = int64_t(4) << 20;  // 16 MiB
  static constexpr int kLargestShards = 4;
  void reserve(const std::vector<StagedShard>& shards, bool live);
  int64_t bytes() const { return int64_t(blocks_.size()) * block_ * int64_t(sizeof(float)); }

  // Writes `shards` into the HDF5 file `path` (flushed and fsynced on return), counting each
  // one's NaN and infinite values as it hashes them. live: the shards
  // point into state that changes once reads_done() is called (else reads_done() is called at
  // once). at(i) runs on the writer before shard i (the fault drills). Throws the writer's error.
  void write(const std::string& path, std::vector<StagedShard>& shards, bool live,
             const std::function<void()>& reads_done, const std::function<void(size_t)>& at);

 private:
  int64_t min_block_;
  int64_t block_ = 0;  // floats per block
  // Not zeroed: their pages are first touched by the reader, off the training thread.
  std::vector<std::unique_ptr<float[]>> blocks_;
};

}  // namespace loom
