// Caching allocator and memory ledger. Every byte is tagged with a category when it is
// allocated; the ledger's per-category current and peak counts are what metrics.jsonl
// reports and what tests compare against formulas. Freed blocks are cached by exact size
// and reused; the cache is not counted as live. Not thread-safe: one allocator per rank.
#pragma once
#include <array>
#include <map>
#include <vector>

#include "runtime/tensor.h"

namespace loom {

enum class Mem { params, grads, optim, activations, comm, workspace };
constexpr int kMemCategories = 6;
const char* mem_name(Mem m);

struct MemLedger {
  std::array<int64_t, kMemCategories> live{};
  std::array<int64_t, kMemCategories> peak{};
  int64_t live_total = 0;
  int64_t peak_total = 0;
  int64_t of(Mem m) const { return live[int(m)]; }
};

class Allocator {
 public:
  explicit Allocator(DeviceKind device = DeviceKind::cpu) : device_(device) {}
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Zero-filled tensor of `shape`, tagged `category`.
  Tensor empty(Shape shape, DType dtype, Mem category);
  const MemLedger& ledger() const { return ledger_; }
  std::string ledger_table() const;

 private:
  void* take(size_t bytes);
  void give_back(void* p, size_t bytes, Mem category);

  DeviceKind device_;
  MemLedger ledger_;
  std::multimap<size_t, void*> cache_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace loom
