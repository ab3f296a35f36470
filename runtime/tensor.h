// Tensor: a shape, a dtype and a device over a view into a Storage. No autograd: layers own
// their forward and backward explicitly. Storage comes from the Allocator, which tags it.
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/error.h"

namespace loom {

// f64 holds the scalars that travel between ranks (loss sums, squared norms) at full width.
enum class DType { f32, bf16, i32, f64 };
// cuda_emulated: the CUDA backend, kernels and runtime calls on the CPU emulation (kernels/emu),
// device memory in host memory; everything that is not the CPU treats it as a CUDA device.
enum class DeviceKind { cpu, cuda, cuda_emulated };
inline bool device_is_cuda(DeviceKind d) {
  return d != DeviceKind::cpu;
}
// As train.device names it.
inline const char* device_name(DeviceKind d) {
  return d == DeviceKind::cpu ? "cpu" : d == DeviceKind::cuda ? "cuda" : "cuda-emulated";
}

inline size_t dtype_size(DType t) {
  return t == DType::bf16 ? 2 : t == DType::f64 ? 8 : 4;
}
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "i32";
    case DType::f64:
      return "f64";
  }
  return "?";
}

// bf16 is the top half of an fp32; conversion rounds to nearest even.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// A bf16 value in host memory (the bits of __nv_bfloat16, so buffers pass between devices).
struct bf16 {
  uint16_t bits;
};

using Shape = std::vector<int64_t>;
inline int64_t shape_numel(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>());
}
std::string shape_str(const Shape& s);

struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  DeviceKind device = DeviceKind::cpu;
  std::function<void(Storage&)> release;  // returns the block to its allocator
  ~Storage() {
    if (release) release(*this);
  }
};

struct Tensor {
  std::shared_ptr<Storage> storage;
  size_t offset = 0;  // in elements
  Shape shape;
  DType dtype = DType::f32;

  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  DeviceKind device() const { return storage ? storage->device : DeviceKind::cpu; }
  template <class T>
  T* data() const {
    return reinterpret_cast<T*>(static_cast<char*>(storage->data) + offset * dtype_size(dtype));
  }
  float* f32() const {
    LOOM_ASSERT(dtype == DType::f32);
    return data<float>();
  }
  bool defined() const { return storage != nullptr; }
  // A view of `n` elements from element `at`, with a new shape.
  Tensor view(size_t at, Shape s) const {
    LOOM_ASSERT(at + size_t(shape_numel(s)) <= size_t(numel()));
    return Tensor{storage, offset + at, std::move(s), dtype};
  }
};

}  // namespace loom
