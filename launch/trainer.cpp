#include "launch/trainer.h"

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

#include "launch/trainer_parts.h"
#include "model/decode.h"
#include "parallel/pipeline.h"
#include "runtime/cuda_api.h"

extern "C" void openblas_set_num_threads(int);

namespace loom {

int threads_set(int threads) {
  if (threads <= 0) {
    const EnvGet get = [](const char* k) { return std::getenv(k); };
    threads = threads_choose(0, launch_env_read(get), get, omp_get_num_procs()).threads;
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

std::string device_resolve(const Config& cfg, int gpus, std::string* why) {
  const TrainConfig& t = cfg.train;
  if (t.device != "auto") return t.device;
  const int hd = cfg.head_dim();
  std::string no;
  if (gpus == 0)
    no = LOOM_HAVE_CUDA ? "no CUDA device is visible" : "this build has no CUDA";
  else if (t.dtype == "f32")
    no = "train.dtype = \"f32\" and the GPU path computes in bf16";
  else if (hd != 32 && hd != 64 && hd != 128)
    no = fmt::format("the CUDA attention kernels take head dims 32, 64 and 128, not d_model / n_head = {}", hd);
  if (no.empty()) return "cuda";
  if (why && gpus > 0) *why = no;
  return "cpu";
}

DType dtype_resolve(const Config& cfg, const std::string& device) {
  if (cfg.train.dtype == "bf16") return DType::bf16;
  if (cfg.train.dtype == "f32") return DType::f32;
  return device == "cpu" ? DType::f32 : DType::bf16;
}

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
  LOOM_CHECK(p.device != "cuda" || gpus > 0,
             "train.device = \"cuda\" but no CUDA device is visible; use train.device = \"cpu\" or \"auto\"");
  if (!p.why.empty() && !opt.quiet && p.lead)
    spdlog::warn("train.device = \"auto\" trains on the CPU: {}; set train.device = \"cpu\" to say so", p.why);
  {
    const EnvGet get = [](const char* k) { return std::getenv(k); };
    const LaunchEnv env = launch_env_read(get);
    const ThreadChoice t = threads_choose(cfg.train.threads, env, get, omp_get_num_procs());
    p.threads = threads_set(t.threads);
    p.threads_why = t.why;
    // The ranks of this node share its memory (on GPUs, each GPU's).
    const int local = std::max(1, env.local_size);
    p.memory = p.device == "cuda" ? memory_available(DeviceKind::cuda, (local + gpus - 1) / std::max(1, gpus))
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
  }
#endif
  p.data = data_open(cfg);  // before allocating: a bad file fails fast

  MeshOptions mo;
  mo.use_mpi = opt.use_mpi;
  mo.timeout_s = cfg.parallel.timeout_s;
  mo.trace = &p.trace;
  mo.flight_dir = cfg.log.dir;
  mo.nccl_emulated = cfg.parallel.comm == "nccl-emulated";
  LOOM_CHECK(!mo.nccl_emulated || p.device == "cpu" || p.device == "cuda-emulated",
             "parallel.comm = \"nccl-emulated\" carries host buffers: it needs train.device = \"cpu\" or "
             "\"cuda-emulated\" (it is \"{}\"); on a GPU use parallel.comm = \"nccl\"",
             p.device);
  LOOM_CHECK(p.device != "cuda-emulated" || cfg.parallel.comm != "nccl",
             "parallel.comm = \"nccl\" needs GPUs, and train.device = \"cuda-emulated\" has none; use "
             "parallel.comm = \"mpi\" (its staged path carries the emulated device's buffers)");
  if (mo.nccl_emulated && !opt.use_mpi && p.lead && !opt.quiet)
    spdlog::warn(
        "parallel.comm = \"nccl-emulated\" on one process: there is no communication to check; launch "
        "the layout under mpirun or srun");
  if (p.device == "cuda" && opt.use_mpi) {
    // NCCL refuses two ranks on one GPU: where ranks share GPUs, MPI carries the CUDA buffers
    // through pinned host memory (a check of the layout, not a fast path).
#if LOOM_HAVE_MPI
    const int local = mpi_local_size();
#else
    const int local = 1;
#endif
    const bool shared = local > gpus;
    LOOM_CHECK(!(shared && cfg.parallel.comm == "nccl"),
               "parallel.comm = \"nccl\" but {} ranks share {} GPUs on this node, and NCCL takes one rank per GPU; "
               "use parallel.comm = \"mpi\" (staged through the host) or launch one rank per GPU",
               local, gpus);
    mo.nccl = cfg.parallel.comm == "nccl" || (cfg.parallel.comm == "auto" && !shared);
    if (!mo.nccl && cfg.parallel.comm == "auto" && p.lead && !opt.quiet)
      spdlog::warn(
          "{} ranks share {} GPU(s) on this node: collectives go through MPI, staged in host memory "
          "(for checking layouts, not for speed); launch one rank per GPU for NCCL",
          local, gpus);
  }
  const MeshDims dims{cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.cp, cfg.parallel.tp, cfg.parallel.ep};
  p.mesh = std::make_unique<DeviceMesh>(dims, opt.world_rank, opt.world_size, mo);

  const DeviceKind kind = p.device == "cuda"            ? DeviceKind::cuda
                          : p.device == "cuda-emulated" ? DeviceKind::cuda_emulated
                                                        : DeviceKind::cpu;
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
  for (Axis a : {p.dp_axis(), Axis::cp, Axis::tp, Axis::pp, Axis::embed})
    LOOM_CHECK(p.mesh->group(a).carries(kind), "the {} group cannot carry {} buffers", axis_name(a),
               device_is_cuda(kind) ? cuda_api(kind).name : "host");
  p.clock = std::make_unique<StepClock>(p.backend->stream());
  const int stage = cfg.parallel.zero;
  // Pipeline stages first: this rank's blocks (the embedding on the first stage, the head on
  // the last), and as many activation slots as its schedule keeps micro-batches in flight.
  // Checks the schedule: a broken table stops here, before any send.
  const ChunkSpec spec = pipeline_chunk_spec(cfg, p.mesh->coord().pp, &p.pipe_schedule);
  memory_fit_check(plan_memory(cfg, p.device, p.dtype, opt.world_rank, &spec), opt.world_rank, p.memory);
  if (cfg.parallel.pp > 1) p.pipe_ops = pipeline_in_order(p.pipe_schedule).ops[size_t(p.mesh->coord().pp)];
  p.whole = model_layout(cfg, p.mesh->coord().tp);
  const bool ep = cfg.parallel.ep > 1;
  p.chunk = std::make_unique<Chunk>(cfg, spec, *p.backend, p.tp(), p.trace, p.clock.get(),
                                    /*full_params=*/stage < 3, /*full_grads=*/stage < 2,
                                    ep ? &p.mesh->group(Axis::ep) : nullptr,
                                    cfg.parallel.cp > 1 ? &p.mesh->group(Axis::cp) : nullptr);
  p.dpar = data_parallel_make(cfg, *p.chunk,
                              {p.dp(), p.tp(), p.mesh->host_group(p.dp_axis()), ep ? &p.mesh->group(Axis::ep) : nullptr,
                               ep ? &p.mesh->group(Axis::edp) : nullptr, ep ? &p.mesh->host_group(Axis::edp) : nullptr},
                              p.clock.get());
  p.schedule = schedule_one_stage(cfg.accum_steps());
  if (cfg.parallel.pp > 1)
    p.pipe = std::make_unique<PipelineStage>(*p.chunk, *p.dpar, p.mesh->group(Axis::pp), cfg.accum_steps(),
                                             p.clock.get(), p.trace);
  p.fpt = flops_per_token(cfg, p.backend->traits().attention_probs);
  // The emulated device runs on the host's cores: its MFU is against their peak.
  p.peak = (kind == DeviceKind::cuda ? cuda_peak_flops() : cpu_peak_flops(p.threads)) * p.mesh->world();
  p.tokens_per_step = int64_t(cfg.train.global_batch) * cfg.model.seq_len;
  p.inputs.resize(size_t(cfg.train.micro_batch) * cfg.model.seq_len);
  p.targets.resize(p.inputs.size());
  p.log = std::make_unique<StepLog>(p.cfg, p.opt, val_batches_available() > 0, p.result);
  p.faults = std::make_unique<FaultInjector>(cfg, opt.world_rank, run_restarted());
  if (cfg.checkpoint.every > 0) {
    const nlohmann::json layout = {{"world", p.mesh->world()},  {"dp", cfg.parallel.dp},        {"tp", cfg.parallel.tp},
                                   {"pp", cfg.parallel.pp},     {"ep", cfg.parallel.ep},        {"cp", cfg.parallel.cp},
                                   {"zero", cfg.parallel.zero}, {"dtype", dtype_name(p.dtype)}, {"device", p.device}};
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
  }
}

Trainer::~Trainer() = default;

void Trainer::Parts::grad_norms_write() const {
  const int64_t n = int64_t(chunk->num_params());
  std::vector<float> g(static_cast<size_t>(n));
  backend->download(g.data(), Buf(chunk->grads(), n, DType::f32, backend->device()));
  nlohmann::json j = nlohmann::json::object();
  for (const ParamSpec& spec : chunk->registry().all()) {
    double ss = 0;
    for (int64_t i = 0; i < spec.numel(); ++i) ss += double(g[spec.offset + size_t(i)]) * g[spec.offset + size_t(i)];
    j[spec.name] = std::sqrt(ss);
  }
  if (cfg.log.dir.empty()) return;
  std::filesystem::create_directories(cfg.log.dir);
  std::ofstream(cfg.log.dir + "/grad_norms.json") << j.dump(1) << "\n";
}

void Trainer::Parts::startup_log() {
  const int T = cfg.model.seq_len, B = cfg.train.micro_batch;
  info(
      "model {}: {} layers, d_model {}, {} heads ({} kv), d_ff {}, vocab {} (padded to {}), seq_len {}: {:.2f}M "
      "parameters",
      cfg.model.arch, cfg.model.n_layer, cfg.model.d_model, cfg.model.n_head, cfg.kv_heads(), cfg.model.d_ff,
      cfg.model.vocab_size, cfg.vocab_padded(), T, whole.reg.global_numel() / 1e6);
  if (const auto& moe = cfg.model.moe; moe.num_experts > 0) {
    // The rows a MoE layer saves: its experts' inputs, fc and activation outputs (Rr rows
    // received), and the outputs back in token order (R rows), per activation slot.
    const int64_t N = int64_t(B) * cfg.local_seq(), R = moe_rows(cfg, N), Rr = moe_rows_received(cfg, N);
    const double mib =
        double(Rr * (cfg.model.d_model + 3 * cfg.model.d_ff) + R * cfg.model.d_model) * dtype_size(dtype) / 1048576.0;
    detail(
        "MoE: {} of {} blocks, {} experts ({} per rank over ep {}), top {}; {}; {:.2f}M of {:.2f}M parameters active "
        "per token",
        cfg.moe_layers(), cfg.model.n_layer, moe.num_experts, moe.num_experts / cfg.parallel.ep, cfg.parallel.ep,
        moe.top_k,
        moe.capacity_factor > 0
            ? fmt::format("capacity {} assignments per expert and micro-batch (capacity_factor {}), each expert a "
                          "slot of {} rows padded with zeros: every shape fixed, the host never waits for the device",
                          moe_capacity(cfg, N), moe.capacity_factor, moe_slot(cfg, N))
            : fmt::format("dropless: the experts' buffers hold the worst case, {} rows ({:.2f} MiB saved per MoE "
                          "layer and micro-batch in flight); the experts' GEMMs are sized on the device{}",
                          Rr, mib,
                          cfg.parallel.ep > 1 ? ", and each layer's forward reads its counts on the host to size "
                                                "the all-to-all (exchanged over the ep group on the device first)"
                                              : " and the host never waits for it"),
        double(active_param_count(cfg)) / 1e6, double(param_count(cfg)) / 1e6);
  }
  info("device: {} ({}); {} threads per rank ({}); data: {}", device, dtype_name(dtype), threads, threads_why,
       data.describe);
  // Every axis above one, outermost first, then data parallel's own description (dp ...).
  std::string axes;
  for (auto [name, n] : {std::pair{"pp", cfg.parallel.pp}, {"tp", cfg.parallel.tp}, {"cp", cfg.parallel.cp}})
    if (n > 1) axes += fmt::format("{} {} x ", name, n);
  info("layout: {} ranks over {}; {}{}{}", mesh->world(), mesh->comm_name(), axes, dpar->describe(),
       cfg.parallel.ep > 1 ? fmt::format("; experts over ep {}", cfg.parallel.ep) : std::string());
  if (tp().size() > 1) {
    const double nc = double(B) * cfg.local_seq() * cfg.model.d_model * dtype_size(dtype) / 1048576.0;
    detail("tensor parallel: tp {}{}; per block and micro-batch {}", tp().size(),
           cfg.parallel.sp ? " with sequence parallel" : "",
           cfg.parallel.sp
               ? fmt::format("all-gather 2 x {:.2f} MiB and reduce-scatter 2 x {:.2f} MiB forward, all-gather 4 x, "
                             "reduce-scatter 2 x backward",
                             nc, nc)
               : fmt::format("all-reduce 2 x {:.2f} MiB forward and 2 x backward", nc));
  }
  if (const int64_t have = val_available(); have > 0 && have < cfg.data.val_batches)
    info("validation: {} batches, all the validation data holds (data.val_batches = {})", have, cfg.data.val_batches);
  if (pipe) {
    std::string split, held;
    for (int b : pipeline_layers(cfg)) split += (split.empty() ? "" : ",") + std::to_string(b);
    for (int j = 0; j < chunk->pieces(); ++j) held += (j ? "+" : "") + std::to_string(chunk->slots(j));
    info(
        "pipeline: {} stages (blocks {} per model chunk), schedule {}, {} micro-batches; predicted bubble {:.3f} ({}); "
        "stage 0 holds {} in flight",
        cfg.parallel.pp, split, cfg.parallel.pp_schedule, cfg.accum_steps(), pipeline_bubble_predicted(pipe_schedule),
        pipeline_bubble_formula(pipe_schedule), held);
  }
  info(
      "batch: {} sequences x {} tokens = {} tokens per step, {} micro-batches of {} on each of {} dp ranks; "
      "recompute {}",
      cfg.train.global_batch, T, int64_t(cfg.train.global_batch) * T, cfg.accum_steps(), B, cfg.parallel.dp,
      cfg.train.recompute);
  if (cfg.parallel.cp > 1)
    detail("context parallel: each sequence over {} ranks, {} tokens each (chunks i and {} - i of {}), attention {}{}",
           cfg.parallel.cp, cfg.local_seq(), 2 * cfg.parallel.cp - 1, 2 * cfg.parallel.cp, cfg.parallel.cp_attention,
           cfg.parallel.cp_attention == "ring" && !cfg.parallel.cp_overlap ? " (transfers not overlapped)" : "");
  for (int j = 0; j < chunk->pieces(); ++j)  // a stage of the interleaved schedule holds several
    detail("activation plan (B={}, T={}{}):\n{}", B, cfg.local_seq(),
           chunk->pieces() > 1 ? fmt::format(", model chunk {}", j) : "", chunk->plan(j).table());
  {
    // Every rank's ledger, tabled by rank 0: ZeRO padding and tensor-parallel shards differ.
    const MemLedger& L = alloc->ledger();
    constexpr int K = kMemCategories + 1;
    const int world = mesh->world();
    std::vector<double> all(size_t(K) * size_t(world));
    for (int i = 0; i < kMemCategories; ++i) all[size_t(K * opt.world_rank + i)] = double(L.live[size_t(i)]);
    all[size_t(K * opt.world_rank + kMemCategories)] = double(L.peak_total);
    mesh->world_group()
        .all_gather(Buf(all.data() + K * opt.world_rank, K), Buf(all.data(), int64_t(all.size())))
        .wait();
    std::string table = fmt::format("{:<6}", "rank");
    for (int i = 0; i < kMemCategories; ++i) table += fmt::format(" {:>11}", mem_name(Mem(i)));
    table += fmt::format(" {:>11}", "peak");
    for (int r = 0; r < world; ++r) {
      table += fmt::format("\n{:<6}", r);
      for (int i = 0; i < K; ++i) table += fmt::format(" {:>11.2f}", all[size_t(K * r + i)] / 1048576.0);
    }
    detail("memory ledger per rank (MiB, {}):\n{}", device, table);
    double worst = 0;
    for (int r = 0; r < world; ++r) worst = std::max(worst, all[size_t(K * r + kMemCategories)]);
    info(
        "memory: {:.1f} MiB peak on the fullest rank ({}); --verbose prints the activation plan, every rank's "
        "ledger and the FLOPs",
        worst / 1048576.0, device);
  }
  detail("FLOPs/token {:.3g} (model), {:.3g} (hardware); MFU divides by a peak of {:.1f} GFLOP/s over all ranks{}",
         fpt.model, fpt.hardware, peak / 1e9,
         device == "cuda" ? std::string(" (the GPU's bf16 dense rate)")
                          : fmt::format(" ({} cores x {})", threads * mesh->world(), cpu_peak_describe()));
  if (peak == 0) info("this GPU is not in the peak table: MFU is reported as 0");
}

std::string Trainer::Parts::summary() const {
  const TrainResult& r = result;
  std::string out = fmt::format("run summary: {} of {} steps in {:.1f} s{}", r.steps_done, cfg.train.steps, r.seconds,
                                r.stopped_by ? fmt::format(" (stopped by {})", stop_signal_name(r.stopped_by)) : "");
  if (!r.losses.empty()) {
    out += fmt::format("\n  loss        train {:.4f}", r.losses.back());
    if (!r.val.empty()) out += fmt::format(", validation {:.4f} (step {})", r.val.back().second, r.val.back().first);
  }
  out += fmt::format("\n  tokens      {} ({} a step)", tokens_per_step * (r.steps_done - start_step), tokens_per_step);
  if (r.tokens_per_s > 0) out += fmt::format(", {:.0f} tokens/s, MFU {:.1f}%", r.tokens_per_s, 100 * r.mfu);
  if (ckpt && ckpt->last_saved() > 0)
    out += fmt::format("\n  checkpoint  {}/{}", cfg.checkpoint.dir, checkpoint_dir_name(ckpt->last_saved()));
  out += "\n  export      " + (cfg.export_final.empty() ? std::string("none (set export.final)") : cfg.export_final);
  if (!cfg.log.dir.empty())
    out += fmt::format("\n  logs        {}/: metrics.jsonl, config.toml, run.json", cfg.log.dir);
  return out;
}

void Trainer::init() {
  Parts& p = *p_;
  // Every rank initializes (same seed) or loads its whole chunk (its tp slices), then the data
  // parallel side keeps what it owns.
  // A checkpoint, when checkpoint.resume finds one, takes precedence over init.from (DESIGN 8).
  p.start_step =
      checkpoint_resume(p.cfg, p.mesh->world_group(), p.chunk->registry(), *p.dpar, p.opt.quiet, &p.resumed_from);
  p.result.steps_done = p.start_step;
  std::vector<float> host(p.chunk->num_params());
  if (!p.resumed_from.empty()) {
    p.info("resumed from {}: step {} of {}{}", p.resumed_from, p.start_step, p.cfg.train.steps,
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

StepMetrics Trainer::step(int64_t step) {
  Parts& p = *p_;
  FaultInjector& fi = *p.faults;
  const int64_t s1 = step + 1;  // 1-based, as the drills and metrics count
  p.next = s1;
  if (p.trace.enabled()) p.trace.record(p.trace_from <= s1 && s1 <= p.trace_to);
  fi.at(s1, "");
  if (fi.hang(s1)) {
    fi.note("hang", s1, "stopping inside this step's next collective");
    p.mesh->hang_next_op();
  }
  const CommCounters dp0 = p.dp().counters(), tp0 = p.tp().counters();
  StepMetrics m;
  const bool emulated = p.alloc->device() == DeviceKind::cuda_emulated;
  const uint64_t syncs0 = emulated ? cuda_emulated_host_syncs() : 0;
  StepClock& clock = *p.clock;
  const Clock::time_point wall = Clock::now();  // step_ms: the host's clock, apart from the marks
  clock.begin(Phase::compute);
  if (const double ms = fi.slow_ms(); ms > 0)
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
  const bool poison = fi.nan(s1), flip = fi.bitflip(s1);
  if (poison) fi.note("nan", s1, "a NaN into this rank's gradients");
  if (flip) fi.note("bitflip", s1, "a flipped bit in one weight while this step computes");
  bool sdc_unresolved = false;
  if (p.cfg.fault.sdc_every > 0 && s1 % p.cfg.fault.sdc_every == 0) {
    m.sdc_ranks = p.sdc_check(step, flip, poison, &sdc_unresolved);
    if (!m.sdc_ranks.empty() && p.lead) {
      std::string names;
      for (int r : m.sdc_ranks) names += (names.empty() ? "" : ", ") + std::to_string(r);
      spdlog::error("step {}: silent data corruption: rank {}'s gradients differ from its own recomputation; {}", s1,
                    names,
                    sdc_unresolved ? "no two of three agree, the update is skipped"
                                   : "a third computation agrees with one of them and the update uses it");
      event_append(p.cfg.log.dir, "sdc",
                   fmt::format("\"step\":{},\"ranks\":[{}],\"resolved\":{}", s1, names, !sdc_unresolved));
    }
  } else {
    const int64_t at = int64_t(p.chunk->num_params() / 2);
    if (flip) tensor_bit_flip(*p.backend, p.chunk->params_tensor(), at);
    p.micro_batches(step, true, poison);
    if (emulated) m.host_syncs_compute = int64_t(cuda_emulated_host_syncs() - syncs0);
    if (flip) tensor_bit_flip(*p.backend, p.chunk->params_tensor(), at);
  }
  const AdamWHyper hyper{lr_at(p.cfg.train, step), p.cfg.train.beta1, p.cfg.train.beta2, p.cfg.train.eps,
                         p.cfg.train.weight_decay};
  m.lr = hyper.lr;
  if (p.ckpt) {  // an async save still reading the state it saves: the update waits for it
    StepClock::Scope c(&clock, Phase::ckpt);
    p.ckpt->wait_reads();
  }
  double loss_sum = 0;
  {
    auto s = p.trace.scope("optimizer", Trace::host);
    clock.enter(Phase::optimizer);
    p.reduce_grads();
    if (s1 == 1 && p.cfg.log.grad_norms) p.grad_norms_write();
    loss_sum = p.loss_take();
    // The loss and the norm are reduced over the job: every rank decides the same.
    m.skipped = p.guard.check(loss_sum / double(p.tokens_per_step), p.dpar->grad_norm());
    if (m.skipped.empty() && sdc_unresolved) m.skipped = "silent data corruption (SDC check unresolved)";
    fi.at(s1, "optimizer");
    if (m.skipped.empty()) {
      p.dpar->apply(hyper, s1, p.cfg.train.grad_clip);
    } else {
      p.dpar->discard();
      p.skipped(s1, m.skipped);
    }
  }
  // Not after a rollback: the state is an earlier step's now, not step s1's.
  if (p.ckpt && p.ckpt->due(s1) && p.next == s1) {  // what the step loses to it is ckpt_block_ms
    auto s = p.trace.scope("checkpoint", Trace::host);
    clock.enter(Phase::ckpt);
    p.ckpt->save(s1, *p.dpar);
  }
  const StepTimes t = clock.end();
  if (emulated) m.host_syncs = int64_t(cuda_emulated_host_syncs() - syncs0);
  // A commit between the last step and this one (the manifest, pruning) is this step's loss too.
  const double commit_ms = p.ckpt ? p.ckpt->take_commit_ms() : 0.0;
  m.step_ms = ms_since(wall) + commit_ms;
  m.t_unix = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  m.stragglers = p.stragglers;
  p.last_compute_ms = t.of(Phase::compute);
  m.loss = loss_sum / double(p.tokens_per_step);
  m.grad_norm = p.dpar->grad_norm();
  p.moe_metrics(m);
  if (p.data.train->sources().size() > 1) {
    const std::vector<int64_t> n = step_source_tokens(*p.data.train, p.cfg, step);
    for (size_t j = 0; j < n.size(); ++j) m.source_tokens.push_back({p.data.train->sources()[j].name, n[j]});
  }
  m.compute_ms = t.of(Phase::compute);
  m.comm_exposed_ms = t.of(Phase::comm);
  m.bubble_ms = t.of(Phase::bubble);
  if (p.pipe) {  // the stage that waited most (each stage's own is on its trace track), and each one's compute
    double worst = m.bubble_ms, mine = m.compute_ms;
    ProcessGroup& pp = p.mesh->host_group(Axis::pp);
    pp.all_reduce(Buf(&worst, 1), ReduceOp::max).wait();
    m.bubble_ms = worst;
    m.stage_compute_ms.resize(size_t(pp.size()));
    pp.all_gather(Buf(&mine, 1), Buf(m.stage_compute_ms.data(), pp.size())).wait();
  }
  m.optimizer_ms = t.of(Phase::optimizer);
  m.data_ms = t.of(Phase::data);
  m.ckpt_block_ms = t.of(Phase::ckpt) + commit_ms;
  step_rates(m, step, p.cfg.train.steps, p.tokens_per_step, p.fpt.model, p.fpt.hardware, p.peak);
  m.mem = p.alloc->ledger();
  m.rss_peak_b = rss_peak_bytes();
  auto moved = [](const CommCounters& a, const CommCounters& b, CommOp op) {
    return b.bytes[int(op)] - a.bytes[int(op)];
  };
  const CommCounters &dp1 = p.dp().counters(), &tp1 = p.tp().counters();
  m.dp_all_reduce_b = moved(dp0, dp1, CommOp::all_reduce);
  m.dp_reduce_scatter_b = moved(dp0, dp1, CommOp::reduce_scatter);
  m.dp_all_gather_b = moved(dp0, dp1, CommOp::all_gather);
  m.tp_all_reduce_b = moved(tp0, tp1, CommOp::all_reduce);
  m.tp_reduce_scatter_b = moved(tp0, tp1, CommOp::reduce_scatter);
  m.tp_all_gather_b = moved(tp0, tp1, CommOp::all_gather);
  return m;
}

double Trainer::validate(int64_t batches) {
  Parts& p = *p_;
  // data.val_batches, as many as the data holds: more would read sequences twice.
  if (batches < 0) batches = std::min<int64_t>(p.cfg.data.val_batches, val_batches_available());
  LOOM_CHECK(p.data.val && batches > 0, "no validation data to evaluate on: {}", p.data.describe);
  auto s = p.trace.scope("validation", Trace::host);
  for (int64_t vb = 0; vb < batches; ++vb) {
    if (p.pipe) {  // forward only, through the stages
      const int pp = p.cfg.parallel.pp, s = p.mesh->coord().pp;
      p.pipe->run(
          pipeline_forward_ops(pp, p.cfg.parallel.pp_virtual, s, p.cfg.accum_steps(), p.cfg.pp_v_shape()),
          [&](int micro) { return p.stage(*p.data.val, vb, micro); }, 0.0f);
      continue;
    }
    for (int micro = 0; micro < p.cfg.accum_steps(); ++micro)
      p.chunk->forward(p.stage(*p.data.val, vb, micro), 0.0f, *p.dpar);
  }
  return p.loss_take() / (double(batches) * double(p.tokens_per_step));
}

int64_t Trainer::val_batches_available() const {
  return p_->val_available();
}

const std::string& Trainer::data_describe() const {
  return p_->data.describe;
}

std::vector<float> Trainer::weights_hf() {
  Parts& p = *p_;
  std::vector<float> local(p.chunk->num_params());
  p.dpar->weights_to(local.data());
  const ParamRegistry& reg = p.chunk->registry();
  const ParamRegistry& whole = p.whole.reg;  // the whole model's names and places
  ProcessGroup& tp = p.mesh->host_group(Axis::tp);
  std::vector<float> out(whole.global_numel(), 0.0f), all;
  const char* copy = p.chunk->holds_tied_copy() ? head_names(p.cfg).wte : nullptr;
  for (auto& s : reg.all()) {
    if (copy && s.name == copy) continue;  // the first stage exports the tied embedding
    float* dst = out.data() + whole.at(s.name).global_offset;
    if (s.replicated() || tp.size() == 1) {
      shard_put(s, 0, local.data() + s.offset, dst);
      continue;
    }
    all.resize(size_t(s.numel()) * size_t(tp.size()));
    tp.all_gather(Buf(local.data() + s.offset, s.numel()), Buf(all.data(), int64_t(all.size()))).wait();
    for (int r = 0; r < tp.size(); ++r) shard_put(s, r, all.data() + size_t(r) * size_t(s.numel()), dst);
  }
  // Expert parallel: each rank holds its experts; the dense tensors, the same on every ep rank,
  // come from the first.
  ProcessGroup& ep = p.mesh->host_group(Axis::ep);
  if (ep.size() > 1 && ep.rank() != 0)
    for (auto& s : reg.all())
      if (!expert_param(s.name) && !(copy && s.name == copy))
        std::fill_n(out.data() + whole.at(s.name).global_offset, s.global_numel(), 0.0f);
  // Each element comes from exactly one stage and ep rank (the rest add zeros): the sum is the
  // whole model.
  ProcessGroup& pp = p.mesh->host_group(Axis::pp);
  if (pp.size() > 1) pp.all_reduce(Buf(out.data(), int64_t(out.size())), ReduceOp::sum).wait();
  if (ep.size() > 1) ep.all_reduce(Buf(out.data(), int64_t(out.size())), ReduceOp::sum).wait();
  return out;
}

TrainResult Trainer::finish() {
  Parts& p = *p_;
  p.log->finish([this] { return validate(); }, p.tokens_per_step, p.fpt.model, p.peak, p.result.stopped_by,
                p.result.steps_done);
  if (p.pipe && p.cfg.pp_tied_across()) p.tied_copies_check();
  if (p.ckpt) {
    // The state a run ends in is always checkpointed: where it stopped on a signal, or where
    // it was resumed when there was nothing left to run (which reshards a checkpoint).
    // Rank 0 decides, so that every rank agrees even where their views of the file system differ.
    const std::string end = p.cfg.checkpoint.dir + "/" + checkpoint_dir_name(p.result.steps_done);
    int32_t save_end = p.ckpt->last_saved() != p.result.steps_done && !std::filesystem::exists(end + "/manifest.json");
    ProcessGroup& world = p.mesh->world_group();
    if (world.size() > 1) world.broadcast(Buf(&save_end, 1), 0).wait();
    if (save_end) p.ckpt->save(p.result.steps_done, *p.dpar);
    const auto t0 = std::chrono::steady_clock::now();
    p.ckpt->flush();
    // An async save's last write is paid here, after the last step's metrics: say what it cost.
    if (p.cfg.checkpoint.async)
      p.info("the end of the run waited {:.0f} ms for the last checkpoint to be written and committed",
             std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::vector<float> hf;
  if (!p.cfg.export_final.empty() || p.opt.keep_params) hf = weights_hf();
  if (!p.cfg.export_final.empty()) {
    // The model's shape travels with its weights, so `loom generate` needs no config.
    if (p.lead && export_is_dir(p.cfg.export_final)) {
      std::vector<StView> views;
      for (auto& s : p.whole.reg.all()) views.push_back({s.name, s.global_shape, hf.data() + s.global_offset});
      hf_dir_write(p.cfg.export_final, p.cfg, views);
    } else if (p.lead) {
      model_save(p.whole.reg, hf.data(), p.cfg.export_final, export_metadata(p.cfg));
    }
  }
  if (p.trace.enabled()) {
    // Each rank's own file, then on rank 0 all of them as one (a process per rank).
    std::filesystem::create_directories(p.cfg.log.dir);
    const int world = p.mesh->world();
    auto part = [&](int r) {
      return p.cfg.log.dir + (world == 1 ? "/trace.json" : fmt::format("/trace.rank{}.json", r));
    };
    p.trace.write(part(p.opt.world_rank));
    if (world > 1) {
      p.mesh->world_group().barrier().wait();
      if (p.lead) {
        std::vector<std::string> parts;
        for (int r = 0; r < world; ++r) parts.push_back(part(r));
        try {  // the run has trained: a log.dir that is not shared costs only the merged file
          trace_merge(parts, p.cfg.log.dir + "/trace.json");
        } catch (const Error& e) {
          if (!p.opt.quiet) spdlog::warn("traces not merged: {}", e.what());
        }
      }
    }
    p.info("wrote {}/trace.json ({} events on rank 0{}; open it in Perfetto)", p.cfg.log.dir, p.trace.size(),
           p.trace_to < INT64_MAX ? fmt::format(", steps {} to {}", p.trace_from, p.trace_to) : "");
  }
  if (p.lead && !p.opt.quiet) spdlog::info("{}", p.summary());
  p.result.mem = p.alloc->ledger();
  p.result.threads = p.threads;
  p.result.device = p.device;
  if (p.opt.keep_params) {
    p.result.params = std::move(hf);
    for (auto& s : p.whole.reg.all()) p.result.names.push_back({s.name, {int64_t(s.global_offset), s.global_numel()}});
  }
  p.mesh->world_group().barrier().wait();  // no rank tears down its groups while a peer still talks
  return p.result;
}

void Trainer::report(const StepMetrics& m) {
  p_->result.steps_done = m.step;
  p_->log->after_step(m, [this] { return validate(); });
}

TrainResult train_run(const Config& cfg, const TrainOptions& opt) {
  Trainer trainer(cfg, opt);
  trainer.init();
  for (int64_t s = trainer.first_step(); s < trainer.steps() && !trainer.between_steps(); s = trainer.next_step())
    trainer.report(trainer.step(s));
  return trainer.finish();
}

}  // namespace loom
