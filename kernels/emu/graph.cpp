// Stream capture and CUDA graphs on the emulated device: while a stream captures, the work issued
// to it (kernels, GEMMs, async copies and memsets, event records) is recorded into a graph, not
// run; an instantiated graph's launch replays the recorded work in order as one item of a stream.
// As CUDA's global capture mode: a synchronization, a synchronous copy, an allocation or a free,
// or work on the legacy stream while any stream captures fails, and the capture is invalidated.
// One stream per capture: a fork into another stream through an event is refused (not emulated),
// and a replay's writes are not tracked (a host read racing a graph's launch goes unreported).
#include <atomic>
#include <map>
#include <mutex>

#include "kernels/emu/runtime.h"

namespace loom::emu::rt {
// A node: its work and whether it is control (an event's record), which runs after a fault too.
using GraphNode = std::pair<std::function<void()>, bool>;
struct CUgraph_st {
  std::vector<GraphNode> nodes;
};
struct CUgraphExec_st {
  std::vector<GraphNode> nodes;
};
}  // namespace loom::emu::rt

namespace loom::emu {

namespace {

struct Capture {
  cudaGraph_t graph = nullptr;
  bool invalid = false;
  std::string why;  // what invalidated it
};
std::mutex capture_mu;
std::map<cudaStream_t, Capture>& captures() {
  static auto* c = new std::map<cudaStream_t, Capture>;  // never destroyed, as the streams
  return *c;
}
std::atomic<int> n_captures{0};
std::atomic<uint64_t> n_device_ops{0}, n_graph_launches{0};

}  // namespace

bool capture_take(cudaStream_t s, std::function<void()>& work, bool control) {
  if (!s || n_captures.load() == 0) return false;
  std::lock_guard lk(capture_mu);
  auto it = captures().find(s);
  if (it == captures().end()) return false;
  if (!it->second.invalid) it->second.graph->nodes.push_back({std::move(work), control});
  return true;
}

bool stream_capturing(cudaStream_t s) {
  if (!s || n_captures.load() == 0) return false;
  std::lock_guard lk(capture_mu);
  return captures().count(s) > 0;
}

cudaError_t capture_refuse(cudaError_t code, const std::string& call) {
  if (n_captures.load() == 0) return cudaSuccess;
  std::lock_guard lk(capture_mu);
  for (auto& [s, c] : captures())
    if (!c.invalid) c.invalid = true, c.why = call + " while the stream captured";
  set_last_error(code, call +
                           " is not allowed while a stream captures (global capture mode): "
                           "the capture is invalidated");
  return code;
}

void count_device_op() {
  ++n_device_ops;
}
uint64_t device_ops() {
  return n_device_ops.load();
}
uint64_t graph_launches() {
  return n_graph_launches.load();
}

}  // namespace loom::emu

namespace loom::emu::rt {

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  if (!s) {
    emu::set_last_error(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture: the legacy stream cannot capture");
    return cudaErrorStreamCaptureUnsupported;
  }
  if (mode != cudaStreamCaptureModeGlobal) {
    emu::set_last_error(cudaErrorInvalidValue, "cudaStreamBeginCapture: only the global capture mode is emulated");
    return cudaErrorInvalidValue;
  }
  std::lock_guard lk(emu::capture_mu);
  if (emu::captures().count(s)) {
    emu::set_last_error(cudaErrorIllegalState, "cudaStreamBeginCapture: the stream captures already");
    return cudaErrorIllegalState;
  }
  emu::captures()[s] = emu::Capture{new CUgraph_st};
  ++emu::n_captures;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  *graph = nullptr;
  std::lock_guard lk(emu::capture_mu);
  auto it = emu::captures().find(s);
  if (it == emu::captures().end()) {
    emu::set_last_error(cudaErrorIllegalState, "cudaStreamEndCapture: the stream does not capture");
    return cudaErrorIllegalState;
  }
  emu::Capture c = std::move(it->second);
  emu::captures().erase(it);
  --emu::n_captures;
  if (c.invalid) {
    delete c.graph;
    emu::set_last_error(cudaErrorStreamCaptureInvalidated,
                        "cudaStreamEndCapture: the capture was invalidated by " + c.why);
    return cudaErrorStreamCaptureInvalidated;
  }
  *graph = c.graph;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  std::lock_guard lk(emu::capture_mu);
  auto it = emu::captures().find(s);
  *status = it == emu::captures().end() ? cudaStreamCaptureStatusNone
            : it->second.invalid        ? cudaStreamCaptureStatusInvalidated
                                        : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!graph) return cudaErrorInvalidValue;
  *exec = new CUgraphExec_st{graph->nodes};  // the recorded arguments, shared with the graph
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (!exec) return cudaErrorInvalidResourceHandle;
  if (emu::stream_capturing(s)) {
    emu::set_last_error(cudaErrorStreamCaptureUnsupported, "cudaGraphLaunch into a capturing stream (not emulated)");
    return cudaErrorStreamCaptureUnsupported;
  }
  if (!s && emu::capture_refuse(cudaErrorStreamCaptureImplicit, "cudaGraphLaunch on the legacy stream") != cudaSuccess)
    return cudaErrorStreamCaptureImplicit;
  ++emu::n_graph_launches;
  // One item: the nodes run in their recorded order; a node that fails faults the device and
  // the rest are skipped, as a stream's later work is.
  emu::stream_enqueue_graph(s, [nodes = exec->nodes] {
    bool failed = false;
    for (const auto& [work, control] : nodes) {
      failed = failed || emu::device_fault() != cudaSuccess || cudaPeekAtLastError() != cudaSuccess;
      if (!failed || control) work();
    }
  });
  return emu::device_fault();
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;  // a queued launch holds its own copy of the nodes
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

}  // namespace loom::emu::rt
