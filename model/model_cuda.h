// The decoder on one GPU in mixed precision: bf16 weights, activations and gradients, fp32
// master weights, Adam moments, norm statistics and loss (DESIGN 5). The same layer loop as
// model/model.cpp, with the kernels of kernels/cuda/ on one compute stream. Nothing in a step
// waits for the host: inputs go up through pinned staging, the loss and the gradient norm stay
// on the device until loss_take / grad_norm read them, and clipping is computed on the device.
// Built with CUDA. Not here yet: recompute, tensor parallel and ZeRO on the GPU (the trainer
// refuses them).
#pragma once
#if LOOM_HAVE_CUDA
#include <cuda_runtime.h>

#include <memory>

#include "kernels/cuda/ops_cuda.h"
#include "model/model.h"
#include "optim/adamw.h"

namespace loom {

class CudaModel {
 public:
  CudaModel(const Config& cfg, Allocator& device_alloc, int B, cudaStream_t stream);
  ~CudaModel();
  const ModelLayout& layout() const { return layout_; }
  size_t num_params() const { return layout_.reg.numel(); }
  // Full fp32 weights from the host (init or load) into the master copy and the bf16 weights.
  void weights_from(const float* host);
  void weights_to(float* host) const;
  void zero_grad();
  // tokens, targets: host [B, T]. Adds the sum of per-token losses to a device accumulator;
  // with dloss != 0, the logits' gradient is kept for backward.
  void forward(const int32_t* tokens, const int32_t* targets, float dloss);
  void backward();
  // Waits for the stream; returns the accumulated loss sum and resets it.
  double loss_take();
  // Global-norm clipping and AdamW, all on the device.
  void step(const AdamWHyper& h, int64_t step, double grad_clip);
  // Waits for the stream; the norm of the last step's gradients before clipping.
  double grad_norm() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
  ModelLayout layout_;
};

// bf16 dense peak of the current GPU from a table (H100/H200 SXM 989 TFLOP/s, A100 312);
// 0 when the GPU is not in the table (MFU is then not reported).
double cuda_peak_flops();

}  // namespace loom
#endif
