// The training loop on one GPU: the CPU loop's data order, loss, schedule and metrics, with
// the model and optimizer on the device (model/model_cuda.h). Refused by config validation
// for layouts the GPU path does not have yet (dp, tp, ZeRO, recompute).
#include <spdlog/spdlog.h>

#include <chrono>

#include "checkpoint/safetensors.h"
#include "launch/trainer.h"
#include "model/flops.h"
#include "runtime/data.h"
#include "runtime/metrics.h"

#if LOOM_HAVE_CUDA
#include "kernels/cuda/check.h"
#include "model/model_cuda.h"
#include "runtime/comm/nccl_group.h"
#endif

namespace loom {

#if LOOM_HAVE_CUDA
TrainResult train_run_cuda(const Config& cfg, const TrainOptions& opt) {
  LOOM_CHECK(cuda_device_count() > 0,
             "train.device = \"cuda\" but no CUDA device is visible; use train.device = \"cpu\"");
  threads_set(cfg.train.threads);
  const int B = cfg.train.micro_batch, T = cfg.model.seq_len, accum = cfg.accum_steps();
  DataStreams data = data_open(cfg);
  cudaStream_t stream;
  cudaEvent_t opt_begin, opt_end;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  LOOM_CUDA_CHECK(cudaEventCreate(&opt_begin));
  LOOM_CUDA_CHECK(cudaEventCreate(&opt_end));
  TrainResult result;
  {
    Allocator alloc(DeviceKind::cuda);
    CudaModel model(cfg, alloc, B, stream);
    {
      std::vector<float> host(model.num_params());
      if (!cfg.init_from.empty())
        model_load(model.layout().reg, host.data(), cfg.init_from);
      else
        registry_init(model.layout().reg, host.data(), uint64_t(cfg.train.seed));
      model.weights_from(host.data());
    }
    const FlopsPerToken fpt = flops_per_token(cfg, true);
    const double peak = cuda_peak_flops();
    if (!opt.quiet) {
      spdlog::info("model {} on CUDA (bf16, fp32 master weights): {:.2f}M parameters; data: {}", cfg.model.arch,
                   model.num_params() / 1e6, data.describe);
      spdlog::info("GPU memory ledger:\n{}", alloc.ledger_table());
      if (peak == 0) spdlog::info("this GPU is not in the peak table: MFU is reported as 0");
    }
    std::vector<int32_t> in(size_t(B) * T), tg(size_t(B) * T);
    const int64_t tokens_per_step = int64_t(cfg.train.global_batch) * T;
    const float dloss = 1.0f / float(tokens_per_step);
    StepLog log(cfg, opt, data.val != nullptr, result);
    auto validation = [&] {
      for (int vb = 0; vb < cfg.data.val_batches; ++vb)
        for (int micro = 0; micro < accum; ++micro) {
          batch_read(*data.val, cfg, vb, 0, micro, in.data(), tg.data());
          model.forward(in.data(), tg.data(), 0.0f);
        }
      return model.loss_take() / (double(cfg.data.val_batches) * double(tokens_per_step));
    };
    for (int64_t step = 0; step < cfg.train.steps; ++step) {
      log.fault_drills(step);
      const auto t0 = Clock::now();
      StepMetrics m;
      model.zero_grad();
      for (int micro = 0; micro < accum; ++micro) {
        const auto td = Clock::now();
        batch_read(*data.train, cfg, step, 0, micro, in.data(), tg.data(), cfg.data.shuffle);
        m.data_ms += ms_since(td);
        model.forward(in.data(), tg.data(), dloss);
        model.backward();
      }
      m.lr = lr_at(cfg.train, step);
      LOOM_CUDA_CHECK(cudaEventRecord(opt_begin, stream));
      model.step({m.lr, cfg.train.beta1, cfg.train.beta2, cfg.train.eps, cfg.train.weight_decay}, step + 1,
                 cfg.train.grad_clip);
      LOOM_CUDA_CHECK(cudaEventRecord(opt_end, stream));
      // The step's one wait, for the loss and norm the log shows; the optimizer's share is
      // timed on the GPU by the events around it.
      m.loss = model.loss_take() / double(tokens_per_step);
      m.grad_norm = model.grad_norm();
      float opt_ms = 0.0f;
      LOOM_CUDA_CHECK(cudaEventElapsedTime(&opt_ms, opt_begin, opt_end));
      m.optimizer_ms = opt_ms;
      m.step_ms = ms_since(t0);
      m.compute_ms = m.step_ms - m.optimizer_ms - m.data_ms;
      step_rates(m, step, cfg.train.steps, tokens_per_step, fpt.model, fpt.hardware, peak);
      m.mem = alloc.ledger();
      log.after_step(m, validation);
    }
    log.finish(validation, tokens_per_step, fpt.model, peak);
    if (!cfg.export_final.empty() || opt.keep_params) {
      std::vector<float> host(model.num_params());
      model.weights_to(host.data());
      if (!cfg.export_final.empty()) model_save(model.layout().reg, host.data(), cfg.export_final);
      if (opt.keep_params) result.params = host;
    }
    result.activation_bytes = alloc.ledger().of(Mem::activations);
  }
  cudaEventDestroy(opt_begin);
  cudaEventDestroy(opt_end);
  cudaStreamDestroy(stream);
  return result;
}
#else
TrainResult train_run_cuda(const Config&, const TrainOptions&) {
  fail("train.device = \"cuda\": this build has no CUDA; rebuild with the CUDA toolkit (LOOM_CUDA=ON)");
}
#endif

}  // namespace loom
