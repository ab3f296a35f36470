#include "launch/trainer.h"

#include <omp.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "checkpoint/safetensors.h"
#include "model/flops.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "parallel/ddp.h"
#include "parallel/zero.h"
#include "runtime/data.h"
#include "runtime/mesh.h"
#if LOOM_HAVE_CUDA
#include "runtime/comm/nccl_group.h"
#endif
#include "runtime/metrics.h"

extern "C" void openblas_set_num_threads(int);

namespace loom {

int threads_set(int threads) {
  if (threads <= 0) {
    // OMP_NUM_THREADS when the launcher set it; else this node's cores shared by its ranks.
    const char* omp = std::getenv("OMP_NUM_THREADS");
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (!local) local = std::getenv("SLURM_NTASKS_PER_NODE");
    if (omp && std::atoi(omp) > 0)
      threads = std::atoi(omp);
    else
      threads = std::max(1, omp_get_num_procs() / std::max(1, local ? std::atoi(local) : 1));
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  return threads;
}

StepLog::StepLog(const Config& cfg, const TrainOptions& opt, bool has_val, TrainResult& result)
    : cfg_(cfg),
      opt_(opt),
      lead_(opt.world_rank == 0),
      print_(lead_ && !opt.quiet),
      has_val_(has_val && cfg.data.val_batches > 0),
      result_(result),
      metrics_(lead_ ? cfg.log.dir : "") {}

void StepLog::fault_drills(int64_t step) const {
  if (opt_.fault_exit_rank == opt_.world_rank && opt_.fault_exit_step == step + 1) {
    spdlog::error("rank {}: fault drill: exit(3) at step {}", opt_.world_rank, step + 1);
    std::_Exit(3);  // a crash: no destructors, no MPI_Finalize
  }
  if (opt_.fault_hang_rank == opt_.world_rank && opt_.fault_hang_step == step + 1) {
    spdlog::error("rank {}: fault drill: hanging at step {}", opt_.world_rank, step + 1);
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

void StepLog::validation(int64_t step, const std::function<double()>& validate) {
  if (!has_val_) return;
  const double v = validate();
  result_.val.push_back({step, v});
  metrics_.validation(step, v);
  if (print_) spdlog::info("step {} | val_loss {:.4f}", step, v);
}

void StepLog::after_step(const StepMetrics& m, const std::function<double()>& validate) {
  metrics_.step(m);
  result_.losses.push_back(m.loss);
  if (m.step > 1) timed_ms_ += m.step_ms;
  const double elapsed = ms_since(start_) / 1e3;
  if (print_ && (m.step % cfg_.log.every == 0 || m.step == 1 || m.step == m.steps))
    spdlog::info("{}", progress_line(m, elapsed / double(m.step) * double(m.steps - m.step)));
  if (cfg_.data.val_every > 0 && m.step % cfg_.data.val_every == 0 && m.step != m.steps) validation(m.step, validate);
}

void StepLog::finish(const std::function<double()>& validate, int64_t tokens_per_step, double flops_model,
                     double peak) {
  validation(cfg_.train.steps, validate);
  if (cfg_.train.steps > 1) {
    result_.tokens_per_s = double(tokens_per_step) * double(cfg_.train.steps - 1) / (timed_ms_ / 1e3);
    result_.mfu = peak > 0 ? result_.tokens_per_s * flops_model / peak : 0.0;
  }
}

namespace {

// Sums a value over the dp group (identity on one rank, so single-rank results keep every bit).
double dp_sum(ProcessGroup& dp, double v) {
  if (dp.size() == 1) return v;
  float f = float(v);
  dp.all_reduce(Buf(&f, 1)).wait();
  return f;
}

double validate(Model& model, UnitAccess* access, const TokenStream& val, const Config& cfg, ProcessGroup& dp,
                std::vector<int32_t>& in, std::vector<int32_t>& tg) {
  double sum = 0.0;
  for (int vb = 0; vb < cfg.data.val_batches; ++vb)
    for (int micro = 0; micro < cfg.accum_steps(); ++micro) {
      batch_read(val, cfg, vb, dp.rank(), micro, in.data(), tg.data());
      sum += model.forward(in.data(), tg.data(), 0.0f, access);
    }
  const double tokens = double(cfg.data.val_batches) * cfg.train.global_batch * cfg.model.seq_len;
  return dp_sum(dp, sum) / tokens;
}
}  // namespace

std::string device_resolve(const Config& cfg, int gpus, std::string* why) {
  const TrainConfig& t = cfg.train;
  if (t.device != "auto") return t.device;
  std::string no;
  if (gpus == 0)
    no = LOOM_HAVE_CUDA ? "no CUDA device is visible" : "this build has no CUDA";
  else if (!cfg.gpu_layout())
    no = "the GPU path has no dp, tp or ZeRO yet (parallel.dp, parallel.tp, parallel.zero)";
  else if (t.dtype == "f32")
    no = "train.dtype = \"f32\" and the GPU path computes in bf16";
  if (no.empty()) return "cuda";
  LOOM_CHECK(t.dtype != "bf16", "train.dtype = \"bf16\" needs the GPU path, but {}; use train.dtype = \"auto\"", no);
  if (why && gpus > 0) *why = no;
  return "cpu";
}

// The composition order (DESIGN 3) lives here, and each step needs the one before it:
//   mesh (the groups) -> model, split over tp (it fixes this rank's flat buffers) ->
//   weights, initialized or loaded whole and sliced to this rank's shards ->
//   DDP buckets or ZeRO shards over dp (ranges of those flat buffers) ->
//   the optimizer over what this rank owns (everything under DDP, its shard under ZeRO).
// Pipeline stages and expert sharding will split the model before tp does.
TrainResult train_run(const Config& cfg_in, const TrainOptions& opt) {
  std::string why;
#if LOOM_HAVE_CUDA
  const int gpus = cuda_device_count();
#else
  const int gpus = 0;
#endif
  const std::string device = device_resolve(cfg_in, gpus, &why);
  if (device == "cuda") {
    Config c = cfg_in;
    c.train.device = "cuda";
    return train_run_cuda(c, opt);
  }
  const Config& cfg = cfg_in;
  const bool lead = opt.world_rank == 0;
  if (!why.empty() && lead && !opt.quiet)
    spdlog::warn("train.device = \"auto\" trains on the CPU: {}; set train.device = \"cpu\" to say so", why);
#define info(...)                                      \
  do {                                                 \
    if (!opt.quiet && lead) spdlog::info(__VA_ARGS__); \
  } while (0)
  const int threads = threads_set(cfg.train.threads);
  const int B = cfg.train.micro_batch, T = cfg.model.seq_len, accum = cfg.accum_steps();
  DataStreams data = data_open(cfg);  // before allocating: a bad file fails fast

  Trace trace(cfg.log.trace, opt.world_rank);
  const MeshDims dims{cfg.parallel.pp, cfg.parallel.dp, 1, cfg.parallel.tp, cfg.parallel.ep};
  DeviceMesh mesh(dims, opt.world_rank, opt.world_size, opt.use_mpi, &trace, cfg.parallel.timeout_s);
  ProcessGroup& dp = mesh.group(Axis::dp);
  ProcessGroup& tp = mesh.group(Axis::tp);

  Allocator alloc;
  const int stage = cfg.parallel.zero;
  Model model(cfg, alloc, B, &trace, /*full_params=*/stage < 3, /*full_grads=*/stage < 2, &tp);
  std::unique_ptr<Ddp> ddp;
  std::unique_ptr<Zero> zero;
  std::unique_ptr<AdamW> adamw;
  if (stage == 0) {
    ddp = std::make_unique<Ddp>(dp, model, cfg.parallel.bucket_mb);
    adamw = std::make_unique<AdamW>(adam_segments(model.registry()), int64_t(model.num_params()), alloc);
  } else {
    zero = std::make_unique<Zero>(stage, model, dp, tp, alloc);
  }
  UnitAccess* access = zero ? static_cast<UnitAccess*>(zero.get()) : ddp.get();
  {
    // Weights: every rank initializes (same seed) or loads the whole model, then keeps its part.
    // ZeRO-3 holds no full buffer, so it uses a temporary one here.
    Tensor tmp;
    float* full = model.params();
    if (!full) {
      tmp = alloc.empty({int64_t(model.num_params())}, DType::f32, Mem::workspace);
      full = tmp.f32();
    }
    if (!cfg.init_from.empty()) {
      auto unused = model_load(model.registry(), full, cfg.init_from);
      info("loaded {} ({} tensors in the file unused)", cfg.init_from, unused.size());
    } else {
      registry_init(model.registry(), full, uint64_t(cfg.train.seed));
    }
    if (zero) zero->shard_from(full);
  }
  // The whole model in the Hugging Face layout: ZeRO-3 slices gathered over dp, tensor-
  // parallel shards over tp. Collective; every rank gets it.
  const ModelLayout global = model_layout([&] {
    Config one = cfg;
    one.parallel.tp = 1;
    return one;
  }());
  auto full_weights = [&](std::vector<float>& out) {
    std::vector<float> local;
    const float* mine = model.params();
    if (!mine) {
      local.resize(model.num_params());
      zero->gather_to(local.data());
      mine = local.data();
    }
    out.assign(global.reg.numel(), 0.0f);
    std::vector<float> all;
    for (auto& s : model.registry().all()) {
      float* dst = out.data() + global.reg.at(s.name).offset;
      if (s.replicated() || tp.size() == 1) {
        std::copy_n(mine + s.offset, s.numel(), dst);
        continue;
      }
      all.resize(size_t(s.numel()) * size_t(tp.size()));
      tp.all_gather(Buf(const_cast<float*>(mine) + s.offset, s.numel()), Buf(all.data(), int64_t(all.size()))).wait();
      for (int r = 0; r < tp.size(); ++r) shard_put(s, r, all.data() + size_t(r) * size_t(s.numel()), dst);
    }
  };
  const FlopsPerToken fpt = flops_per_token(cfg);
  const double peak = cpu_peak_flops(threads) * mesh.world();

  info("model {}: {} layers, d_model {}, {} heads ({} kv), d_ff {}, vocab {}, seq_len {}: {:.2f}M parameters",
       cfg.model.arch, cfg.model.n_layer, cfg.model.d_model, cfg.model.n_head, cfg.kv_heads(), cfg.model.d_ff,
       cfg.model.vocab_size, T, global.reg.numel() / 1e6);
  info("data: {}", data.describe);
  if (ddp)
    info("layout: {} ranks (dp {}), {} gradient buckets of {} MB; {} threads per rank", mesh.world(), dp.size(),
         ddp->num_buckets(), cfg.parallel.bucket_mb, threads);
  else
    info("layout: {} ranks (dp {}), ZeRO stage {}; {} threads per rank", mesh.world(), dp.size(), stage, threads);
  if (tp.size() > 1) {
    const double nc = double(B) * T * cfg.model.d_model * 4 / 1048576.0;
    info("tensor parallel: tp {}{}; per block and micro-batch {}", tp.size(),
         cfg.parallel.sp ? " with sequence parallel" : "",
         cfg.parallel.sp
             ? fmt::format("all-gather 2 x {:.2f} MiB and reduce-scatter 2 x {:.2f} MiB forward, all-gather 4 x, "
                           "reduce-scatter 2 x backward",
                           nc, nc)
             : fmt::format("all-reduce 2 x {:.2f} MiB forward and 2 x backward", nc));
  }
  info("batch: {} sequences x {} tokens per step = {} micro-batches of {} on each of {} dp ranks; recompute {}",
       cfg.train.global_batch, T, accum, B, dp.size(), cfg.train.recompute);
  info("activation plan (B={}, T={}):\n{}", B, T, model.plan().table());
  {
    // Every rank's ledger, tabled by rank 0: ZeRO padding and tensor-parallel shards differ.
    const MemLedger& L = alloc.ledger();
    const int64_t mine[7] = {L.of(Mem::params), L.of(Mem::grads),     L.of(Mem::optim), L.of(Mem::activations),
                             L.of(Mem::comm),   L.of(Mem::workspace), L.peak_total};
    const int world = mesh.world();
    std::vector<int32_t> all(size_t(14) * size_t(world));
    std::memcpy(all.data() + 14 * opt.world_rank, mine, sizeof(mine));
    mesh.world_group()
        .all_gather(Buf(all.data() + 14 * opt.world_rank, 14), Buf(all.data(), int64_t(all.size())))
        .wait();
    std::string table = fmt::format("{:<6} {:>10} {:>10} {:>10} {:>12} {:>10} {:>10} {:>10}", "rank", "params", "grads",
                                    "optim", "activations", "comm", "workspace", "peak");
    for (int r = 0; r < world; ++r) {
      int64_t v[7];
      std::memcpy(v, all.data() + 14 * r, sizeof(v));
      table += fmt::format("\n{:<6} {:>10.2f} {:>10.2f} {:>10.2f} {:>12.2f} {:>10.2f} {:>10.2f} {:>10.2f}", r,
                           v[0] / 1048576.0, v[1] / 1048576.0, v[2] / 1048576.0, v[3] / 1048576.0, v[4] / 1048576.0,
                           v[5] / 1048576.0, v[6] / 1048576.0);
    }
    info("memory ledger per rank (MiB):\n{}", table);
  }
  info("FLOPs/token {:.3g} (model), {:.3g} (hardware); CPU peak {:.1f} GFLOP/s over all ranks", fpt.model, fpt.hardware,
       peak / 1e9);

  std::vector<int32_t> inputs(size_t(B) * T), targets(size_t(B) * T);
  const int64_t tokens_per_step = int64_t(cfg.train.global_batch) * T;
  const float dloss = 1.0f / float(tokens_per_step);  // loss is the mean over the global batch
  TrainResult result;
  StepLog log(cfg, opt, data.val != nullptr, result);
  auto validation = [&] {
    auto s = trace.scope("validation", Trace::host);
    return validate(model, access, *data.val, cfg, dp, inputs, targets);
  };

  for (int64_t step = 0; step < cfg.train.steps; ++step) {
    log.fault_drills(step);
    const auto t0 = Clock::now();
    const CommCounters comm0 = dp.counters(), tp0 = tp.counters();
    StepMetrics m;
    model.zero_grad();
    double loss_sum = 0.0;
    for (int micro = 0; micro < accum; ++micro) {
      auto td = Clock::now();
      {
        auto s = trace.scope("data", Trace::host);
        batch_read(*data.train, cfg, step, dp.rank(), micro, inputs.data(), targets.data(), cfg.data.shuffle);
      }
      m.data_ms += ms_since(td);
      loss_sum += model.forward(inputs.data(), targets.data(), dloss, access);
      if (ddp) ddp->set_last(micro + 1 == accum);  // accumulation micro-batches do not communicate
      model.backward(inputs.data(), access);
    }
    const AdamWHyper hyper{lr_at(cfg.train, step), cfg.train.beta1, cfg.train.beta2, cfg.train.eps,
                           cfg.train.weight_decay};
    m.lr = hyper.lr;
    if (ddp) {
      {
        auto s = trace.scope("grad_sync_wait", Trace::host);
        m.comm_exposed_ms = ddp->step_end();
      }
      const auto to = Clock::now();
      auto s = trace.scope("optimizer", Trace::host);
      m.grad_norm = clip_grad_norm_tp(model.registry(), model.grads(), cfg.train.grad_clip, tp);
      adamw->update(model.params(), model.grads(), hyper, step + 1);
      m.optimizer_ms = ms_since(to);
    } else {
      m.comm_exposed_ms = zero->take_wait_ms();  // gathers and reductions that compute did not hide
      const auto to = Clock::now();
      auto s = trace.scope("optimizer", Trace::host);
      m.grad_norm = zero->step(hyper, step + 1, cfg.train.grad_clip);
      const double waited = zero->take_wait_ms();
      m.comm_exposed_ms += waited;
      m.optimizer_ms = ms_since(to) - waited;
    }
    m.loss = dp_sum(dp, loss_sum) / double(tokens_per_step);
    m.step_ms = ms_since(t0);
    m.compute_ms = m.step_ms - m.optimizer_ms - m.data_ms - m.comm_exposed_ms;
    step_rates(m, step, cfg.train.steps, tokens_per_step, fpt.model, fpt.hardware, peak);
    m.mem = alloc.ledger();
    const CommCounters& comm1 = dp.counters();
    auto moved = [&](CommOp op) { return comm1.bytes[int(op)] - comm0.bytes[int(op)]; };
    m.dp_all_reduce_b = moved(CommOp::all_reduce);
    m.dp_reduce_scatter_b = moved(CommOp::reduce_scatter);
    m.dp_all_gather_b = moved(CommOp::all_gather);
    const CommCounters& tp1 = tp.counters();
    m.tp_all_reduce_b = tp1.bytes[int(CommOp::all_reduce)] - tp0.bytes[int(CommOp::all_reduce)];
    m.tp_reduce_scatter_b = tp1.bytes[int(CommOp::reduce_scatter)] - tp0.bytes[int(CommOp::reduce_scatter)];
    m.tp_all_gather_b = tp1.bytes[int(CommOp::all_gather)] - tp0.bytes[int(CommOp::all_gather)];
    result.comm_exposed_ms += m.comm_exposed_ms;
    if (ddp) result.comm_total_ms += ddp->comm_us() / 1e3;
    log.after_step(m, validation);
  }
  log.finish(validation, tokens_per_step, fpt.model, peak);

  std::vector<float> gathered;
  if (!cfg.export_final.empty() || opt.keep_params) full_weights(gathered);
  if (!cfg.export_final.empty()) {
    if (lead) model_save(global.reg, gathered.data(), cfg.export_final);
    info("exported weights to {}", cfg.export_final);
  }
  if (cfg.log.trace) {
    std::filesystem::create_directories(cfg.log.dir);
    std::string path =
        cfg.log.dir + (mesh.world() == 1 ? "/trace.json" : fmt::format("/trace.rank{}.json", opt.world_rank));
    trace.write(path);
    info("wrote {} ({} events; open it in Perfetto)", path, trace.size());
  }
  result.activation_bytes = alloc.ledger().of(Mem::activations);
  if (opt.keep_params) {
    result.params = gathered;
    for (auto& s : global.reg.all()) result.names.push_back({s.name, {int64_t(s.offset), s.numel()}});
  }
  mesh.world_group().barrier().wait();  // no rank tears down its groups while a peer still talks
  return result;
#undef info
}

}  // namespace loom
