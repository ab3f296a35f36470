#include "train/trainer.h"

#include <omp.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "checkpoint/hf_export.h"
#include "checkpoint/safetensors.h"
#include "data/shared_view.h"
#include "parallel/pipeline.h"
#include "parallel/pipeline_split.h"
#include "runtime/cuda_api.h"
#include "train/resume_note.h"
#include "train/trainer_parts.h"

extern "C" void openblas_set_num_threads(int);

namespace loom {

int threads_set(int threads) {
  if (threads <= 0) {
    const EnvGet get = [](const char* k) { return std::getenv(k); };
    threads = threads_choose(0, launch_env_read(get), get, cores_visible(get)).threads;
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  return threads;
}

double cuda_peak_flops() {
#if LOOM_HAVE_CUDA
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return 0.0;
  const std::string name = prop.name;
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) return 989e12;
  if (name.find("A100") != std::string::npos) return 312e12;
#endif
  return 0.0;
}

// The composition order, each step needing the one before it:
//   device and dtype (the backend every later part computes with), threads and memory ->
//   data (a bad file fails before anything is allocated) ->
//   mesh (the groups; NCCL ones when the buffers live on GPUs that each rank has alone) ->
//   stream, allocator, backend ->
//   the pipeline's split (this stage's blocks), then the DecoderPart split over tp, with its
//   experts placed over ep and its attention over cp (it fixes this rank's flat buffers and
//   activation plan) ->
//   DDP buckets or ZeRO shards over dp (ranges of those flat buffers), with the optimizer over
//   what this rank owns (everything under DDP, its shard under ZeRO) ->
//   the pipeline stage's executor, the step log, the drills, the checkpointer.
Trainer::Trainer(const Config& cfg, const TrainOptions& opt) : p_(std::make_unique<Parts>(cfg, opt)) {
  Parts& p = *p_;
  p.lead = opt.world_rank == 0;
#if LOOM_HAVE_CUDA
  const int gpus = cuda_device_count();
#else
  const int gpus = 0;
#endif
  p.device = device_resolve(cfg, gpus, &p.why);
  p.dtype = dtype_resolve(cfg, p.device);
  LOOM_CHECK(p.device != DeviceKind::cuda || gpus > 0,
             "train.device = \"cuda\" but no CUDA device is visible; use train.device = \"cpu\" or \"auto\"");
  if (!p.why.empty() && !opt.quiet && p.lead)
    spdlog::warn("train.device = \"auto\" trains on the CPU: {}; set train.device = \"cpu\" to say so", p.why);
  if (!cfg.export_final.empty()) {
    // Refused now, not after the run: an export that would replace a file of another kind (the
    // training text, a config, the run's metrics) or the weights it starts from.
    std::vector<std::string> inputs = {cfg.init_from, cfg.data.path, cfg.data.val_path};
    for (const auto& src : cfg.data.sources) inputs.push_back(src.path);
    export_output_check(cfg.export_final, cfg, inputs, "export.final");
  }
  {
    const EnvGet get = [](const char* k) { return std::getenv(k); };
    const LaunchEnv env = launch_env_read(get);
    const ThreadChoice t = threads_choose(cfg.train.threads, env, get, cores_visible(get));
    p.threads = threads_set(t.threads);
    p.threads_why = t.why;
    // The ranks of this node share its memory (on GPUs, each GPU's).
    const int local = std::max(1, env.local_size);
    p.memory = p.device == DeviceKind::cuda ? memory_available(DeviceKind::cuda, (local + gpus - 1) / std::max(1, gpus))
                                            : memory_available(DeviceKind::cpu, local);
    memory_fit_rough(cfg, p.dtype, opt.world_size, p.memory);
  }
#if LOOM_HAVE_MPI
  if (opt.use_mpi && opt.world_size > 1) {
    // Ranks launched with different configs (another file on another node, an MPMD launch) or
    // binaries would train diverging replicas or abort in a collective whose sizes disagree.
    const std::string mine = config_to_toml(cfg) + fmt::format("\n[binary]\nloom = \"{} {} {}\"\n", LOOM_VERSION,
                                                               LOOM_BUILD_TYPE, binary_digest());
    const std::string bad = config_disagreement(mpi_all_gather_text(mine));
    LOOM_CHECK(bad.empty(), "{}", bad);
    // The same config may still name places that are not shared (per-rank working
    // directories, node-local disks): rank 0 leaves a probe in checkpoint.dir for the others
    // to find, and every rank describes the data files it sees.
    const std::string probe = mpi_all_gather_text(p.lead ? dir_probe_create(cfg) : "")[0];
    const std::vector<std::string> views = mpi_all_gather_text(dir_probe_view(cfg, probe) + data_view(cfg));
    if (p.lead) dir_probe_remove(cfg, probe);
    const std::string apart = shared_view_disagreement(views, cfg);
    LOOM_CHECK(apart.empty(), "{}", apart);
  }
#endif
  p.data = data_open(cfg);  // before allocating: a bad file fails fast

  MeshOptions mo;
  mo.use_mpi = opt.use_mpi;
  mo.timeout_s = cfg.parallel.timeout_s;
  mo.trace = &p.trace;
  mo.flight_dir = cfg.log.dir;
  {
#if LOOM_HAVE_MPI
    const int local = p.device == DeviceKind::cuda && opt.use_mpi ? mpi_local_size() : 1;
#else
    const int local = 1;
#endif
    const CommPlan comm = comm_choose(cfg.parallel.comm, p.device, opt.use_mpi, local, gpus);
    mo.nccl = comm.nccl;
    mo.nccl_emulated = comm.nccl_emulated;
    if (!comm.note.empty() && p.lead && !opt.quiet) spdlog::warn("{}", comm.note);
  }
  const MeshDims dims{cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.cp, cfg.parallel.tp, cfg.parallel.ep};
  p.mesh = std::make_unique<DeviceMesh>(dims, opt.world_rank, opt.world_size, mo);

  const DeviceKind kind = p.device;
  p.stream = device_is_cuda(kind) ? cuda_stream_create(kind) : host_stream();
  p.alloc = std::make_unique<Allocator>(kind, p.stream);
  if (kind == DeviceKind::cuda_emulated) {
    p.backend = cuda_emulated_backend(cfg, *p.alloc);
  } else {
#if LOOM_HAVE_CUDA
    p.backend = kind == DeviceKind::cuda ? cuda_backend(cfg, *p.alloc) : cpu_backend(cfg, p.dtype, *p.alloc);
#else
    p.backend = cpu_backend(cfg, p.dtype, *p.alloc);
#endif
  }
  if (!cfg.log.profile_steps.empty()) {  // every op through the timing wrapper; else no wrapper at all
    std::tie(p.profile_from, p.profile_to) = steps_range_parse("log.profile_steps", cfg.log.profile_steps);
    auto wrapped = std::make_unique<ProfiledBackend>(std::move(p.backend));
    p.profiler = wrapped.get();
    p.backend = std::move(wrapped);
    // The roofline, measured (once per machine, then cached) before the model takes the memory;
    // one rank measures.
    if (p.lead) p.result.roofline = roofline_rates(kind, p.threads);
  }
  for (Axis a : {p.dp_axis(), Axis::cp, Axis::tp, Axis::pp, Axis::embed})
    LOOM_CHECK(p.mesh->group(a).carries(kind), "the {} group cannot carry {} buffers", axis_name(a),
               device_is_cuda(kind) ? cuda_api(kind).name : "host");
  p.clock = std::make_unique<StepClock>(p.backend->stream());
  const int stage = cfg.parallel.zero;
  // Pipeline stages first: this rank's blocks (the embedding on the first stage, the head on
  // the last), and as many activation slots as its schedule keeps micro-batches in flight.
  // Checks the schedule: a broken table stops here, before any send.
  const PartSpec spec = pipeline_chunk_spec(cfg, p.mesh->coord().pp, &p.pipe_schedule);
  memory_fit_check(plan_memory(cfg, p.device, p.dtype, opt.world_rank, &spec), opt.world_rank, p.memory);
  // Every pp degree runs a list of ops; at pp 1 it is 1F1B on one stage, F0 B0 F1 B1 ...: the
  // accumulation loop, one micro-batch's activations at a time.
  p.pipe_ops = pipeline_stage_ops(p.pipe_schedule, p.mesh->coord().pp, cfg.accum_steps());
  p.whole = model_layout(cfg, p.mesh->coord().tp);
  const bool ep = cfg.parallel.ep > 1;
  p.chunk = std::make_unique<DecoderPart>(cfg, spec, *p.backend, p.tp(), p.trace, p.clock.get(),
                                          /*full_params=*/stage < 3, /*full_grads=*/stage < 2,
                                          ep ? &p.mesh->group(Axis::ep) : nullptr,
                                          cfg.parallel.cp > 1 ? &p.mesh->group(Axis::cp) : nullptr);
  p.dpar = data_parallel_make(cfg, *p.chunk,
                              {p.dp(), p.tp(), p.mesh->host_group(p.dp_axis()), ep ? &p.mesh->group(Axis::ep) : nullptr,
                               ep ? &p.mesh->group(Axis::edp) : nullptr, ep ? &p.mesh->host_group(Axis::edp) : nullptr},
                              p.clock.get());
  p.pipe = std::make_unique<PipelineStage>(*p.chunk, *p.dpar, p.mesh->group(Axis::pp), cfg.accum_steps(), p.clock.get(),
                                           p.trace);
  p.pipe_val_ops = pipeline_forward_ops(cfg.parallel.pp, cfg.parallel.pp_virtual, p.mesh->coord().pp, cfg.accum_steps(),
                                        cfg.pp_v_shape());
  p.fpt = flops_per_token(cfg, p.backend->traits().attention_probs);
  // The emulated device runs on the host's cores: its MFU is against their peak.
  p.peak = (kind == DeviceKind::cuda ? cuda_peak_flops() : cpu_peak_flops(p.threads)) * p.mesh->world();
  p.tokens_per_step = int64_t(cfg.train.global_batch) * cfg.model.seq_len;
  p.inputs.resize(size_t(cfg.train.micro_batch) * cfg.model.seq_len);
  p.targets.resize(p.inputs.size());
  p.log = std::make_unique<StepLog>(p.cfg, p.opt, val_batches_available() > 0, p.result);
  p.faults = std::make_unique<FaultInjector>(cfg, opt.world_rank, run_restarted());
  p.drills = std::make_unique<StepDrills>(*p.faults, *p.mesh, *p.backend, *p.chunk);
  if (cfg.checkpoint.every > 0) {
    const nlohmann::json layout = {
        {"world", p.mesh->world()},  {"dp", cfg.parallel.dp},        {"tp", cfg.parallel.tp},
        {"pp", cfg.parallel.pp},     {"ep", cfg.parallel.ep},        {"cp", cfg.parallel.cp},
        {"zero", cfg.parallel.zero}, {"dtype", dtype_name(p.dtype)}, {"device", device_name(p.device)}};
    p.ckpt = std::make_unique<Checkpointer>(p.cfg, p.mesh->world_group(), layout, opt.quiet);
    FaultInjector* fi = p.faults.get();
    p.ckpt->fault_in_write = [fi](int64_t step) { fi->at(step, "checkpoint"); };
    p.ckpt->fault_enospc = [fi](int64_t step) {
      if (!fi->enospc(step)) return false;
      fi->note("enospc", step, "the checkpoint write fails as on a full disk");
      return true;
    };
    p.ckpt->fault_after_commit = [fi](int64_t step, const std::string& dir) {
      if (fi->ckpt_corrupt(step)) checkpoint_corrupt(*fi, step, dir);
    };
    p.ckpt->proven = [parts = &p] { return parts->next - parts->guard.skips_in_a_row(); };
  }
}

Trainer::~Trainer() = default;

void Trainer::init() {
  Parts& p = *p_;
  // Every rank initializes (same seed) or loads its whole chunk (its tp slices), then the data
  // parallel side keeps what it owns.
  // A checkpoint, when checkpoint.resume finds one, takes precedence over init.from (docs/checkpoints.md).
  p.start_step =
      checkpoint_resume(p.cfg, p.mesh->world_group(), p.chunk->registry(), *p.dpar, p.opt.quiet, &p.resumed_from);
  p.result.steps_done = p.start_step;
  std::vector<float> host(p.chunk->num_params());
  if (!p.resumed_from.empty()) {
    p.info("resumed from {}: step {} of {}{}{}", p.resumed_from, p.start_step, p.cfg.train.steps,
           p.lead ? resume_reshard_note(p.resumed_from, p.cfg, p.mesh->world(), dtype_name(p.dtype)) : "",
           p.cfg.init_from.empty() ? "" : "; init.from is not read (a checkpoint takes precedence)");
  } else if (!p.cfg.init_from.empty()) {
    auto unused = model_load(p.chunk->registry(), host.data(), p.cfg.init_from);
    // A pipeline stage leaves the other stages' tensors: unused means in no stage.
    std::erase_if(unused, [&](const std::string& n) { return p.whole.reg.find(n) != nullptr; });
    std::string names;
    for (size_t i = 0; i < unused.size() && i < 6; ++i) names += (i ? ", " : ": ") + unused[i];
    if (unused.size() > 6) names += fmt::format(" and {} more", unused.size() - 6);
    p.info("loaded {}; {} tensors in it unused{}", p.cfg.init_from, unused.size(), names);
    // eval runs quiet, and says so too: a file's tensors are never dropped without a word.
    if (p.opt.quiet && p.lead && !unused.empty())
      fmt::print(stderr, "{} tensors in {} unused{}\n", unused.size(), p.cfg.init_from, names);
  } else {
    registry_init(p.chunk->registry(), host.data(), uint64_t(p.cfg.train.seed));
  }
  if (p.resumed_from.empty()) p.dpar->weights_from(host.data());
  p.startup_log();  // after the weights: a bad init.from fails before the log
  p.facts_write();
  p.log->predict(p.device, p.mesh->world());
}

int64_t Trainer::steps() const {
  return p_->cfg.train.steps;
}

int64_t Trainer::first_step() const {
  return p_->start_step;
}

TrainResult train_run(const Config& cfg, const TrainOptions& opt) {
  Trainer trainer(cfg, opt);
  trainer.init();
  for (int64_t s = trainer.first_step(); s < trainer.steps() && !trainer.between_steps(); s = trainer.next_step())
    trainer.report(trainer.step(s));
  return trainer.finish();
}

}  // namespace loom
