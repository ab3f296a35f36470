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
#if LOOM_HAVE_CUDA
  const int gpus = cuda_device_count();
#else
  const int gpus = 0;
#endif
  p_->preflight(gpus);
  p_->build(gpus);
  if (cfg.checkpoint.every > 0) p_->checkpoint_wire();
}

void Trainer::Parts::preflight(int gpus) {
  lead = opt.world_rank == 0;
  device = device_resolve(cfg, gpus, &why);
  dtype = dtype_resolve(cfg, device);
  LOOM_CHECK(device != DeviceKind::cuda || gpus > 0,
             "train.device = \"cuda\" but no CUDA device is visible; use train.device = \"cpu\" or \"auto\"");
  if (!why.empty() && !opt.quiet && lead)
    spdlog::warn("train.device = \"auto\" trains on the CPU: {}; set train.device = \"cpu\" to say so", why);
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
    threads = threads_set(t.threads);
    threads_why = t.why;
    // The ranks of this node share its memory (on GPUs, each GPU's).
    const int local = std::max(1, env.local_size);
    memory = device == DeviceKind::cuda ? memory_available(DeviceKind::cuda, (local + gpus - 1) / std::max(1, gpus))
                                        : memory_available(device, local);
    memory_fit_rough(cfg, dtype, opt.world_size, memory);
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
    const std::string probe = mpi_all_gather_text(lead ? dir_probe_create(cfg) : "")[0];
    const std::vector<std::string> views = mpi_all_gather_text(dir_probe_view(cfg, probe) + data_view(cfg));
    if (lead) dir_probe_remove(cfg, probe);
    const std::string apart = shared_view_disagreement(views, cfg);
    LOOM_CHECK(apart.empty(), "{}", apart);
  }
#endif
  data = data_open(cfg);  // before allocating: a bad file fails fast
}

void Trainer::Parts::build(int gpus) {
  MeshOptions mo;
  mo.use_mpi = opt.use_mpi;
  mo.timeout_s = cfg.parallel.timeout_s;
  mo.trace = &trace;
  mo.flight_dir = cfg.log.dir;
  {
#if LOOM_HAVE_MPI
    const int local = device == DeviceKind::cuda && opt.use_mpi ? mpi_local_size() : 1;
#else
    const int local = 1;
#endif
    const CommPlan comm = comm_choose(cfg.parallel.comm, device, opt.use_mpi, local, gpus);
    mo.nccl = comm.nccl;
    mo.nccl_emulated = comm.nccl_emulated;
    if (!comm.note.empty() && lead && !opt.quiet) spdlog::warn("{}", comm.note);
  }
  const MeshDims dims{cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.cp, cfg.parallel.tp, cfg.parallel.ep};
  mesh = std::make_unique<DeviceMesh>(dims, opt.world_rank, opt.world_size, mo);

  const DeviceKind kind = device;
  // Pipeline stages first: this rank's blocks (the embedding on the first stage, the head on
  // the last), and as many activation slots as its schedule keeps micro-batches in flight.
  // Checks the schedule: a broken table stops here, before any send.
  const PartSpec spec = pipeline_chunk_spec(cfg, mesh->coord().pp, &pipe_schedule);
  // The flash backward's stored dS only where the device has room for it beside the plan: a
  // run that fits without it runs, dQ recomputing, and says so.
  MemoryPlan plan = plan_memory(cfg, device, dtype, opt.world_rank, &spec);
  if (const AttentionDsFit ds = attention_ds_fit(cfg, kind, dtype, opt.world_rank, &spec, memory, plan.total());
      !ds.fits) {
    cfg.train.attention_ds = false;
    if (!opt.quiet) spdlog::warn("rank {}: {}", opt.world_rank, ds.note);
    plan = plan_memory(cfg, device, dtype, opt.world_rank, &spec);  // without the store
  }
  memory_fit_check(plan, opt.world_rank, memory);
  const ModelDims model = model_dims(cfg);
  stream = device_is_cuda(kind) ? cuda_stream_create(kind) : host_stream();
  alloc = std::make_unique<Allocator>(kind, stream);
  if (kind == DeviceKind::cuda_emulated) {
    backend = cuda_emulated_backend(model, *alloc);
  } else {
#if LOOM_HAVE_CUDA
    backend = kind == DeviceKind::cuda ? cuda_backend(model, *alloc) : cpu_backend(model, dtype, *alloc);
#else
    backend = cpu_backend(model, dtype, *alloc);
#endif
  }
  if (!cfg.log.profile_steps.empty()) {  // every op through the timing wrapper; else no wrapper at all
    std::tie(profile_from, profile_to) = steps_range_parse("log.profile_steps", cfg.log.profile_steps);
    auto wrapped = std::make_unique<ProfiledBackend>(std::move(backend));
    profiler = wrapped.get();
    backend = std::move(wrapped);
    // The roofline, measured (once per machine, then cached) before the model takes the memory;
    // one rank measures.
    if (lead) result.roofline = roofline_rates(kind, threads);
  }
  for (Axis a : {dp_axis(), Axis::cp, Axis::tp, Axis::pp, Axis::embed})
    LOOM_CHECK(mesh->group(a).carries(kind), "the {} group cannot carry {} buffers", axis_name(a),
               device_is_cuda(kind) ? cuda_api(kind).name : "host");
  clock = std::make_unique<StepClock>(backend->stream());
  const int zero_stage = cfg.parallel.zero;
  // Every pp degree runs a list of ops; at pp 1 it is 1F1B on one stage, F0 B0 F1 B1 ...: the
  // accumulation loop, one micro-batch's activations at a time.
  pipe_ops = pipeline_stage_ops(pipe_schedule, mesh->coord().pp, cfg.accum_steps());
  whole = model_layout(model, mesh->coord().tp);
  const bool ep = cfg.parallel.ep > 1;
  chunk = std::make_unique<DecoderPart>(model, spec, *backend, tp(), trace, clock.get(),
                                        /*full_params=*/zero_stage < 3, /*full_grads=*/zero_stage < 2,
                                        ep ? &mesh->group(Axis::ep) : nullptr,
                                        cfg.parallel.cp > 1 ? &mesh->group(Axis::cp) : nullptr);
  dpar = data_parallel_make(data_parallel_options(cfg), *chunk,
                            {dp(), tp(), mesh->host_group(dp_axis()), ep ? &mesh->group(Axis::ep) : nullptr,
                             ep ? &mesh->group(Axis::edp) : nullptr, ep ? &mesh->host_group(Axis::edp) : nullptr},
                            clock.get());
  pipe = std::make_unique<PipelineStage>(*chunk, *dpar, mesh->group(Axis::pp), cfg.accum_steps(),
                                         pipeline_stage_slots(cfg, mesh->coord().pp), clock.get(), trace);
  pipe_val_ops = pipeline_forward_ops(cfg.parallel.pp, cfg.parallel.pp_virtual, mesh->coord().pp, cfg.accum_steps(),
                                      cfg.pp_v_shape());
  fpt = flops_per_token(model, backend->traits().attention_probs);
  // The emulated device runs on the host's cores: its MFU is against their peak.
  peak = (kind == DeviceKind::cuda ? cuda_peak_flops() : cpu_peak_flops(threads)) * mesh->world();
  tokens_per_step = int64_t(cfg.train.global_batch) * cfg.model.seq_len;
  inputs.resize(size_t(cfg.train.micro_batch) * cfg.model.seq_len);
  targets.resize(inputs.size());
  log = std::make_unique<StepLog>(cfg, opt, val_available() > 0, result);
  faults = std::make_unique<FaultInjector>(cfg, opt.world_rank, run_restarted());
  drills = std::make_unique<StepDrills>(*faults, *mesh, *backend, *chunk);
}

void Trainer::Parts::checkpoint_wire() {
  const nlohmann::json layout = {
      {"world", mesh->world()},    {"dp", cfg.parallel.dp},      {"tp", cfg.parallel.tp},
      {"pp", cfg.parallel.pp},     {"ep", cfg.parallel.ep},      {"cp", cfg.parallel.cp},
      {"zero", cfg.parallel.zero}, {"dtype", dtype_name(dtype)}, {"device", device_name(device)}};
  ckpt = std::make_unique<Checkpointer>(cfg, mesh->world_group(), layout, opt.quiet);
  FaultInjector* fi = faults.get();
  ckpt->fault_in_write = [fi](int64_t step) { fi->at(step, "checkpoint"); };
  ckpt->fault_enospc = [fi](int64_t step) {
    if (!fi->enospc(step)) return false;
    fi->note("enospc", step, "the checkpoint write fails as on a full disk");
    return true;
  };
  ckpt->fault_after_commit = [fi](int64_t step, const std::string& dir) {
    if (fi->ckpt_corrupt(step)) checkpoint_corrupt(*fi, step, dir);
  };
  ckpt->proven = [parts = this] { return parts->next - parts->guard.skips_in_a_row(); };
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
    p.info("loaded {}; {} in it unused{}", p.cfg.init_from, plural(unused.size(), "tensor"), names);
    // eval runs quiet, and says so too: a file's tensors are never dropped without a word.
    if (p.opt.quiet && p.lead && !unused.empty())
      fmt::print(stderr, "{} in {} unused{}\n", plural(unused.size(), "tensor"), p.cfg.init_from, names);
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
