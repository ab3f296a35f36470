// TensorBoard event files (log.tensorboard): each step's scalars (loss, lr, grad norm, rates,
// the step split, memory, MoE load, skipped updates) and each validation, as Event messages
// (protobuf, TensorBoard's field numbers) framed as TFRecords: length, masked CRC-32C of the
// length, the message, masked CRC-32C of the message. One file per run, written by rank 0,
// flushed every step so that TensorBoard shows a run while it trains.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "runtime/metrics.h"

namespace loom {

// CRC-32C (Castagnoli), as TFRecord frames use it, and its mask.
uint32_t crc32c(const void* data, size_t n);
uint32_t crc32c_masked(const void* data, size_t n);

class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;
  // dir/events.out.tfevents.<unix seconds>.<host>.<pid>; an Error when it cannot be created.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  bool open() const { return f_ != nullptr; }
  const std::string& path() const { return path_; }
  // One Event of `step` holding these tagged scalars.
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  void step(const StepMetrics& m);
  void validation(int64_t step, double val_loss) { scalars(step, {{"val/loss", val_loss}}); }

 private:
  void record(const std::string& bytes);
  std::FILE* f_ = nullptr;
  std::string path_;
};

}  // namespace loom
