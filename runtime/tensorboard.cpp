#include "runtime/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "runtime/error.h"
#include "runtime/file.h"
#include "runtime/tb/event.pb.h"

namespace loom {

namespace {
std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = c & 1 ? 0x82F63B78u ^ (c >> 1) : c >> 1;  // Castagnoli, reflected
    t[i] = c;
  }
  return t;
}

double now_unix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t crc32c_masked(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::filesystem::create_directories(dir);
  path_ = fmt::format("{}/events.out.tfevents.{}.{}.{}", dir, int64_t(now_unix()), host_name(), ::getpid());
  const int fd = output_open(path_, true, "log.dir");
  f_ = ::fdopen(fd, "wb");
  if (!f_) {
    ::close(fd);
    fail_io("cannot create the TensorBoard file '{}': {}", path_, std::strerror(errno));
  }
  tb::Event e;
  e.set_wall_time(now_unix());
  e.set_file_version("brain.Event:2");
  record(e.SerializeAsString());
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::record(const std::string& bytes) {
  const uint64_t len = bytes.size();
  char head[12];
  std::memcpy(head, &len, 8);  // little-endian, as every host loom builds for
  const uint32_t len_crc = crc32c_masked(head, 8), data_crc = crc32c_masked(bytes.data(), bytes.size());
  std::memcpy(head + 8, &len_crc, 4);
  const bool ok = std::fwrite(head, 1, 12, f_) == 12 &&
                  std::fwrite(bytes.data(), 1, bytes.size(), f_) == bytes.size() &&
                  std::fwrite(&data_crc, 1, 4, f_) == 4 && std::fflush(f_) == 0;
  if (!ok) fail_io("writing '{}' failed ({}); is the disk full?", path_, std::strerror(errno));
}

void TensorBoardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  if (!f_) return;
  tb::Event e;
  e.set_wall_time(now_unix());
  e.set_step(step);
  for (auto& [tag, v] : values) {
    if (!std::isfinite(v)) continue;  // a diverged loss: TensorBoard plots no point there
    tb::SummaryValue* s = e.mutable_summary()->add_value();
    s->set_tag(tag);
    s->set_simple_value(float(v));
  }
  record(e.SerializeAsString());
}

void TensorBoardWriter::step(const StepMetrics& m) {
  if (!f_) return;
  std::vector<std::pair<std::string, double>> v = {
      {"train/loss", m.loss},
      {"train/lr", m.lr},
      {"train/grad_norm", m.grad_norm},
      {"train/tokens_per_s", m.tokens_per_s},
      {"train/mfu", m.mfu},
      {"train/skipped", m.skipped.empty() ? 0.0 : 1.0},
      {"time/step_ms", m.step_ms},
      {"time/compute_ms", m.compute_ms},
      {"time/comm_exposed_ms", m.comm_exposed_ms},
      {"time/bubble_ms", m.bubble_ms},
      {"time/optimizer_ms", m.optimizer_ms},
      {"time/data_ms", m.data_ms},
      {"time/ckpt_block_ms", m.ckpt_block_ms},
      {"mem/peak_mib", double(m.mem.peak_total) / 1048576.0},
  };
  for (int i = 0; i < kMemCategories; ++i)
    v.push_back({fmt::format("mem/{}_mib", mem_name(Mem(i))), double(m.mem.of(Mem(i))) / 1048576.0});
  if (!m.moe.empty()) v.push_back({"moe/aux_loss", m.aux_loss});
  for (auto& l : m.moe) {
    v.push_back({fmt::format("moe/layer{}/load", l.layer), l.load});
    v.push_back({fmt::format("moe/layer{}/dropped", l.layer), l.dropped});
  }
  scalars(m.step, v);
}

}  // namespace loom
