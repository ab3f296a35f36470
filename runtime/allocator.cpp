#include "runtime/allocator.h"

#include <cstdlib>

#include "runtime/cuda_api.h"

namespace loom {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

const char* mem_name(Mem m) {
  static const char* names[] = {"params", "grads", "master", "optim", "activations", "comm", "workspace"};
  return names[int(m)];
}

namespace {
void block_free(DeviceKind d, void* p) {
  if (d != DeviceKind::cpu)
    cuda_api(d).free(p);
  else
    std::free(p);
}
}  // namespace

Allocator::~Allocator() {
  *alive_ = false;
  for (auto& [bytes, p] : cache_) block_free(device_, p);
}

void* Allocator::take(size_t bytes) {
  auto it = cache_.find(bytes);
  if (it != cache_.end()) {
    void* p = it->second;
    cache_.erase(it);
    return p;
  }
  if (device_ != DeviceKind::cpu) {
    // Blocks are reused in stream order: work on the allocator's stream that frees a block
    // runs before work that takes it again, so no synchronization is needed.
    std::string error;
    void* p = cuda_api(device_).malloc(bytes, &error);
    LOOM_CHECK(p,
               "out of GPU memory allocating {} bytes ({}); lower train.micro_batch, use "
               "train.recompute or parallel.zero",
               bytes, error);
    return p;
  }
  // 64-byte alignment: a cache line, and what AVX-512 loads like.
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  LOOM_CHECK(p, "out of host memory allocating {} bytes; lower train.micro_batch or model size", bytes);
  return p;
}

void Allocator::give_back(void* p, size_t bytes, Mem category) {
  cache_.emplace(bytes, p);
  ledger_.live[int(category)] -= int64_t(bytes);
  ledger_.live_total -= int64_t(bytes);
}

int64_t Allocator::alloc_bytes(int64_t numel, DType dtype) {
  const int64_t bytes = numel * int64_t(dtype_size(dtype));
  return std::max<int64_t>(64, (bytes + 63) / 64 * 64);
}

Tensor Allocator::empty(Shape shape, DType dtype, Mem category) {
  const size_t padded = size_t(alloc_bytes(shape_numel(shape), dtype));
  auto st = std::make_shared<Storage>();
  st->data = take(padded);
  if (device_ != DeviceKind::cpu)
    cuda_api(device_).memset_async(st->data, 0, padded, stream_.handle);
  else
    std::memset(st->data, 0, padded);
  st->bytes = padded;
  st->device = device_;
  auto& L = ledger_;
  L.live[int(category)] += int64_t(padded);
  L.live_total += int64_t(padded);
  L.peak[int(category)] = std::max(L.peak[int(category)], L.live[int(category)]);
  L.peak_total = std::max(L.peak_total, L.live_total);
  st->release = [this, alive = alive_, category](Storage& s) {
    if (*alive)
      give_back(s.data, s.bytes, category);
    else
      block_free(s.device, s.data);
  };
  return Tensor{st, 0, std::move(shape), dtype};
}

std::string Allocator::ledger_table() const {
  std::string out = fmt::format("{:<12} {:>12} {:>12}\n", "memory", "live MiB", "peak MiB");
  for (int i = 0; i < kMemCategories; ++i)
    out += fmt::format("{:<12} {:>12.2f} {:>12.2f}\n", mem_name(Mem(i)), ledger_.live[i] / 1048576.0,
                       ledger_.peak[i] / 1048576.0);
  out += fmt::format("{:<12} {:>12.2f} {:>12.2f}", "total", ledger_.live_total / 1048576.0,
                     ledger_.peak_total / 1048576.0);
  return out;
}

}  // namespace loom
