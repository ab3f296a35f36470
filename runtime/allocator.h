// Caching allocator and memory ledger. Every byte is tagged with a category when it is
// allocated; the ledger's per-category current and peak counts are what metrics.jsonl
// reports and what `loom plan memory` must equal. Freed blocks are cached by exact size and
// reused; the cache is not counted as live. Stream-ordered: blocks are zero-filled on the
// allocator's stream, and a block freed by work on that stream may be taken again by later
// work on it without a wait. Not thread-safe: one allocator per rank and device.
// Categories: params (the compute-dtype weights), grads (fp32 gradients: the main gradients
// with bf16 compute), master (fp32 master weights, bf16 runs only), optim (Adam moments),
// activations, comm (communication buffers), workspace (everything else).
#pragma once
#include <array>
#include <map>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/tensor.h"

namespace loom {

enum class Mem { params, grads, master, optim, activations, comm, workspace };
constexpr int kMemCategories = 7;
const char* mem_name(Mem m);

// One allocation a component will make. Components that allocate list their buffers as
// PlanItems and allocate exactly those, so the planner (which adds the same lists up without a
// device) equals the ledger to the byte.
struct PlanItem {
  std::string name;
  int64_t numel;
  DType dtype;
  Mem mem;
};

struct MemLedger {
  std::array<int64_t, kMemCategories> live{};
  std::array<int64_t, kMemCategories> peak{};
  int64_t live_total = 0;
  int64_t peak_total = 0;
  int64_t of(Mem m) const { return live[int(m)]; }
};

class Allocator {
 public:
  explicit Allocator(DeviceKind device = DeviceKind::cpu, Stream stream = host_stream())
      : device_(device), stream_(stream) {}
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Zero-filled tensor of `shape`, tagged `category`. Every allocation is rounded up to a
  // multiple of 64 bytes (at least 64): alloc_bytes says what a request costs.
  Tensor empty(Shape shape, DType dtype, Mem category);
  Tensor empty(const PlanItem& item) { return empty({item.numel}, item.dtype, item.mem); }
  static int64_t alloc_bytes(int64_t numel, DType dtype);
  DeviceKind device() const { return device_; }
  const Stream& stream() const { return stream_; }
  const MemLedger& ledger() const { return ledger_; }
  std::string ledger_table() const;

 private:
  void* take(size_t bytes);
  void give_back(void* p, size_t bytes, Mem category);

  DeviceKind device_;
  Stream stream_;
  MemLedger ledger_;
  std::multimap<size_t, void*> cache_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace loom
