// Device, Stream and Event. On the CPU a stream runs work inline, so an event is complete
// the moment it is recorded; the types exist so that layers hand work between compute and
// communication the same way on every device. CUDA streams come with the CUDA backend.
#pragma once
#include "runtime/tensor.h"

namespace loom {

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  std::string name() const { return kind == DeviceKind::cpu ? "cpu" : fmt::format("cuda:{}", index); }
};

struct Event {
  bool recorded = false;
  bool done() const { return recorded; }
  void wait() const {}
};

struct Stream {
  Device device;
  // CPU work has already run when the call that issued it returned.
  Event record() const { return Event{true}; }
  void wait(const Event&) const {}
  void synchronize() const {}
};

}  // namespace loom
