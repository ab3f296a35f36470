// The `loom` command: parse, build, run. Every subcommand's errors end as one line on
// stderr and a non-zero exit status; nothing here holds state beyond one invocation.
#include <cblas.h>
#include <omp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>

#include "checkpoint/h5.h"
#include "checkpoint/tools.h"
#include "launch/bench.h"
#include "launch/data_cmd.h"
#include "launch/infer.h"
#include "launch/launch_env.h"
#include "launch/plan.h"
#include "launch/plan_layout.h"
#include "launch/report.h"
#include "launch/stop.h"
#include "launch/trainer.h"
#if LOOM_HAVE_MPI
#include "runtime/comm/mpi_group.h"
#endif
#if LOOM_HAVE_CUDA
#include "runtime/comm/nccl_group.h"
#endif
#include "launch/supervise.h"
#include "parallel/pipeline_schedule.h"
#include "runtime/config.h"
#include "runtime/data.h"
#include "runtime/error.h"
#include "runtime/mesh.h"
#include "runtime/tokenizer.h"

extern "C" char* openblas_get_config(void);

namespace {

// `--section.key=value` and `--section.key value` (torchtitan's form) as `--set section.key=value`,
// for the sections loom's config has; anything else is left for the parser to judge.
std::vector<std::string> args_expand_sections(int argc, char** argv) {
  static const std::vector<std::string> sections = {"model", "train", "data",   "parallel", "checkpoint",
                                                    "fault", "init",  "export", "log"};
  std::vector<std::string> out(argv, argv + argc);
  for (size_t i = 1; i < out.size(); ++i) {
    const std::string& a = out[i];
    if (a.rfind("--", 0) != 0 || a == "--") {
      if (a == "--") break;
      continue;
    }
    const std::string name = a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
    const size_t dot = name.find('.');
    if (dot == std::string::npos || std::find(sections.begin(), sections.end(), name.substr(0, dot)) == sections.end())
      continue;
    if (a.find('=') != std::string::npos) {
      out[i] = a.substr(2);
    } else if (i + 1 < out.size() && out[i + 1].rfind("--", 0) != 0) {
      out[i] = name + "=" + out[i + 1];
      out.erase(out.begin() + long(i) + 1);
    } else {
      out[i] = name + "=true";  // a bare flag, as torchtitan's booleans are given
    }
    out.insert(out.begin() + long(i), "--set");
    ++i;
  }
  return out;
}

// The config of a file and --set overrides. Launched as `world` ranks without parallel.dp, the
// ranks the other axes leave are data parallel (torchtitan's -1, Megatron's implicit dp); rank
// 0 says so (`lead`). Commands that read the data (`reads_data`) take data.source from the files
// the config names when it does not set it.
loom::Config config_build(const std::string& path, const std::vector<std::string>& sets, int world = 1,
                          bool lead = false, bool reads_data = false) {
  loom::Config cfg = loom::config_defaults();
  if (!path.empty()) loom::config_load_file(cfg, path);
  for (auto& s : sets) loom::config_set(cfg, s);
  if (reads_data) loom::data_source_infer(cfg);
  const int other = cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.cp;
  if (world > 1 && !cfg.set_keys.count("parallel.dp") && other > 0 && world % other == 0) {
    cfg.parallel.dp = world / other;
    if (lead && cfg.parallel.dp > 1)
      spdlog::info("parallel.dp = {}: the {} ranks over tp {}{} x pp {} (set parallel.dp to choose)", cfg.parallel.dp,
                   world, cfg.parallel.tp, cfg.parallel.cp > 1 ? fmt::format(" x cp {}", cfg.parallel.cp) : "",
                   cfg.parallel.pp);
  }
  loom::config_validate(cfg);
  return cfg;
}

// What this build has and what it sees, from the libraries themselves.
void info_print() {
  fmt::print("loom {} ({} build)\n", LOOM_VERSION, LOOM_BUILD_TYPE);
  fmt::print("CPU: {} cores visible; OpenBLAS: {}; OpenMP {} (max threads {}, wait policy {})\n", omp_get_num_procs(),
             openblas_get_config(), _OPENMP, omp_get_max_threads(),
             std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "the runtime's default");
#if LOOM_HAVE_CUDA
  fmt::print("CUDA kernels: in this build; {}\nNCCL: {}\n", loom::cuda_describe(), loom::nccl_version());
#else
  fmt::print("CUDA kernels: not in this build (no CUDA toolkit at build time)\nNCCL: not in this build\n");
#endif
#if LOOM_HAVE_MPI
  fmt::print("MPI: {}\n", loom::mpi_library_version());
#else
  fmt::print("MPI: not in this build (LOOM_MPI=OFF): one process only\n");
#endif
  fmt::print("checkpoints: {}\n", loom::checkpoint_libraries());
  fmt::print("spdlog: {}.{}.{}  fmt: {}\n", SPDLOG_VER_MAJOR, SPDLOG_VER_MINOR, SPDLOG_VER_PATCH, FMT_VERSION);
}

// Parsed by hand: everything after "--" is the command, options and all.
int supervise_main(int argc, char** argv) {
  loom::SuperviseOptions o;
  std::vector<std::string> command;
  int i = 2;
  auto value = [&](const std::string& flag) -> std::string {
    LOOM_CHECK(i + 1 < argc, "loom supervise: {} needs a value", flag);
    return argv[++i];
  };
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    try {
      if (a == "--max-restarts")
        o.max_restarts = std::stoi(value(a));
      else if (a == "--backoff-s")
        o.backoff_s = std::stod(value(a));
      else if (a == "--log-dir")
        o.log_dir = value(a);
      else if (a == "--verdict-grace-s")
        o.verdict_grace_s = std::stod(value(a));
      else if (a == "--ranks") {
        const std::string r = value(a);
        const size_t colon = r.find(':');
        LOOM_CHECK(colon != std::string::npos, "--ranks takes MIN:MAX (e.g. 2:4), not '{}'", r);
        o.elastic.min_ranks = std::stoi(r.substr(0, colon));
        o.elastic.max_ranks = std::stoi(r.substr(colon + 1));
      } else if (a == "--hosts")
        o.elastic.hosts = loom::hosts_parse(value(a));
      else if (a == "--probe")
        o.elastic.probe = value(a);
      else if (a == "--probe-s")
        o.elastic.probe_s = std::stod(value(a));
      else if (a == "--replica")
        o.elastic.replica = std::stoi(value(a));
      else if (a == "-h" || a == "--help") {
        fmt::print(
            "loom supervise [--max-restarts N (3)] [--backoff-s S (1, doubling up to 60)] [--log-dir DIR]\n"
            "               [--verdict-grace-s S (30)] [--ranks MIN:MAX [--hosts H:SLOTS,... (else the Slurm\n"
            "               allocation's)] [--probe 'CMD {{host}}'] [--probe-s S (10)] [--replica K (1)]] -- "
            "COMMAND...\n"
            "  runs COMMAND and runs it again (with LOOM_RESTART=k) when it fails for a reason a restart can cure;\n"
            "  not after status 0, 2 (usage or config error), or a SIGINT/SIGTERM to the supervisor.\n"
            "  --ranks: before each run, the hosts that answer the probe take the largest world size from MIN to MAX\n"
            "  (a multiple of K ranks per replica) that the run's config accepts; COMMAND names it with {{ranks}},\n"
            "  {{dp}} (ranks / K) and {{hosts}} (H:SLOTS,... of the hosts used), and resumes its last checkpoint.\n");
        return 0;
      } else
        loom::fail(
            "loom supervise: unknown option '{}'; usage: loom supervise [--max-restarts N] [--backoff-s S] "
            "[--log-dir DIR] [--ranks MIN:MAX --hosts LIST --probe CMD --replica K] -- COMMAND... (--help says more)",
            a);
    } catch (const std::invalid_argument&) {
      loom::fail("loom supervise: {} takes a number", a);
    }
  }
  for (; i < argc; ++i) command.push_back(argv[i]);
  loom::elastic_check(o.elastic, command);
  return loom::supervise_run(command, o);
}

int run(int argc, char** argv) {
  CLI::App app{"loom: train decoder-only transformers"};
  app.require_subcommand(1);

  std::string config_path;
  std::vector<std::string> sets;
  bool list_keys = false, print_config = false;
  auto* train = app.add_subcommand("train", "train a model (no config: the default job)");
  train->add_option("--config", config_path, "TOML config file");
  train->add_option("--set", sets, "override one key: section.key=value (repeatable)");
  train->add_flag("--list-keys", list_keys, "list every config key and exit");
  train->add_flag("--print-config", print_config, "print the resolved config and exit");
  bool verbose = false;
  train->add_flag("--verbose", verbose,
                  "also print the activation plan, every rank's memory ledger, FLOPs per token and the step-time "
                  "prediction at the start");
  std::string fault, hang;
  train->add_option("--fault-exit", fault,
                    "fault drill: rank RANK exits with status 3 at step STEP (RANK:STEP; fault.exit)");
  train->add_option("--fault-hang", hang,
                    "fault drill: rank RANK stops inside its next collective at step STEP (RANK:STEP; fault.hang)");
  std::string kill_in_save;
  train->add_option("--fault-kill-in-save", kill_in_save,
                    "fault drill: rank RANK SIGKILLs itself halfway through writing checkpoint STEP (RANK:STEP; "
                    "fault.kill = RANK:STEP:checkpoint)");

  std::string ckpt_dir, ckpt_out;
  auto* ckpt = app.add_subcommand("ckpt", "verify, inspect or export a checkpoint directory");
  ckpt->require_subcommand(1);
  auto* cverify = ckpt->add_subcommand("verify", "every shard's hash and every tensor's coverage (exit 1 if not)");
  cverify->add_option("dir", ckpt_dir, "checkpoint directory (…/step-N)")->required();
  auto* cinspect = ckpt->add_subcommand("inspect", "step, layout, tensors and files");
  cinspect->add_option("dir", ckpt_dir, "checkpoint directory (…/step-N)")->required();
  auto* cexport = ckpt->add_subcommand("export", "the weights as one Hugging Face safetensors file");
  cexport->add_option("dir", ckpt_dir, "checkpoint directory (…/step-N)")->required();
  cexport->add_option("out", ckpt_out, "output .safetensors")->required();

  app.add_subcommand("info", "build options, library versions and devices");

  std::vector<std::string> report_dirs;
  std::string report_out;
  auto* report = app.add_subcommand(
      "report", "one HTML page of runs: loss, throughput, MFU, step split, memory, config (several runs overlaid)");
  report->add_option("dirs", report_dirs, "run directories (each run's log.dir)")->required();
  report->add_option("--out", report_out,
                     "the page to write (default report.html, numbered report-2.html, ... where one exists)");

  std::vector<std::string> data_paths;
  loom::DataOptions dopt;
  auto* data = app.add_subcommand(
      "data", "text files or directories to an llm.c token shard: one document per file, on every thread");
  data->add_option("paths", data_paths, "INPUT... OUTPUT: text files or directories, then the shard (.bin)")
      ->required();
  data->add_option("--tokenizer", dopt.tokenizer, "byte | gpt2 | llama3")
      ->check(CLI::IsMember({"byte", "gpt2", "llama3"}));
  data->add_option("--vocab", dopt.vocab, "GPT-2 vocab.json (gpt2), or LLaMA-3's tokenizer.model (llama3)");
  data->add_option("--merges", dopt.merges, "GPT-2 merges.txt (tokenizer gpt2)");
  data->add_option("--val-fraction", dopt.val_fraction,
                   "this share of the documents (of the tokens, for one) into OUTPUT's stem + _val (default 0: none)");
  data->add_option("--threads", dopt.threads, "threads (0: every core)")->check(CLI::NonNegativeNumber);

  loom::EvalOptions eopt;
  auto* eval = app.add_subcommand("eval", "loss and perplexity of a weights file on a data set (any layout)");
  eval->add_option("--from", eopt.from, "weights: a .safetensors file, an index, or a directory")->required();
  eval->add_option("--config", eopt.config, "TOML config (default: the model shape the weights carry)");
  eval->add_option("--set", eopt.sets, "override one key: section.key=value (repeatable)");
  eval->add_option("--data", eopt.data,
                   "token shard, directory of shards, or text file (default: the config's "
                   "validation data)");
  eval->add_option("--threads", eopt.threads, "threads per rank (default: train.threads; 0: the node's cores shared)")
      ->check(CLI::NonNegativeNumber);
  eval->add_option("--batches", eopt.batches,
                   "batches of train.global_batch sequences (default data.val_batches; "
                   "0: all)");

  loom::GenerateOptions gopt;
  auto* gen = app.add_subcommand("generate", "continue a prompt with a trained model (one process, CPU, KV-cached)");
  gen->add_option("--from", gopt.from, "weights: a .safetensors file, an index, or a directory")->required();
  gen->add_option("--prompt", gopt.prompt, "the text to continue")->required();
  gen->add_option("--config", gopt.config, "TOML config (default: the model shape the weights carry)");
  gen->add_option("--set", gopt.sets, "override one key: section.key=value (repeatable)");
  gen->add_option("--tokenizer", gopt.tokenizer,
                  "byte | gpt2 | llama3 (default: what the weights record, else vocab.json + merges.txt beside them, "
                  "else byte)")
      ->check(CLI::IsMember({"byte", "gpt2", "llama3"}));
  gen->add_option("--vocab", gopt.vocab, "GPT-2 vocab.json (gpt2), or LLaMA-3's tokenizer.model (llama3)");
  gen->add_option("--merges", gopt.merges, "GPT-2 merges.txt (tokenizer gpt2)");
  gen->add_option("--max-new", gopt.max_new, "tokens to generate (default 64, or what the context leaves)")
      ->check(CLI::NonNegativeNumber);
  // Checked by generate_run: finite and >= 0.
  gen->add_option("--temperature", gopt.temperature, "0: greedy (default); above 0: sampled");
  gen->add_option("--top-k", gopt.top_k, "sample among the k likeliest tokens (0: all)")->check(CLI::NonNegativeNumber);
  gen->add_option("--seed", gopt.seed, "sampling seed: the same seed, the same text");
  gen->add_option("--threads", gopt.threads,
                  "threads (default 1: decoding one token gains nothing from more; 0: "
                  "train.threads)")
      ->check(CLI::NonNegativeNumber);

  auto* bench = app.add_subcommand("bench", "measure kernels and training speed");
  bench->require_subcommand(1);
  int bench_threads = 0;
  auto* bgemm = bench->add_subcommand("gemm", "fp32 GEMM rate; caches the CPU peak used for MFU");
  bgemm->add_option("--threads", bench_threads, "threads (0: every core)");
  auto* btrain = bench->add_subcommand("train", "time a training run of a config");
  btrain->add_option("--config", config_path, "TOML config file");
  btrain->add_option("--set", sets, "override one key: section.key=value (repeatable)");
  auto* bkernels = bench->add_subcommand("kernels", "GPU bf16 GEMM and attention rates (tensor-core vs row-wise)");
  bkernels->add_option("--config", config_path, "TOML config file (its model and micro_batch set the shapes)");
  bkernels->add_option("--set", sets, "override one key: section.key=value (repeatable)");
  double comm_max_mb = 64;
  auto* bcomm =
      bench->add_subcommand("comm", "time, algorithm and bus bandwidth of each collective (under mpirun/srun)");
  bcomm->add_option("--max-mb", comm_max_mb, "largest message in MB");

  auto* plan = app.add_subcommand("plan", "predict before launch");
  plan->require_subcommand(1);
  auto* ppipe = plan->add_subcommand(
      "pipeline", "a pipeline schedule as a per-stage timeline, with its bubble and micro-batches in flight");
  int pipe_pp = 0, pipe_virtual = 0, pipe_micro = 0;
  std::string pipe_schedule;
  ppipe->add_option("--config", config_path, "TOML config (parallel.pp, pp_schedule, pp_virtual; the micro-batches)");
  ppipe->add_option("--set", sets, "override one key: section.key=value (repeatable)");
  ppipe->add_option("--pp", pipe_pp, "stages (default: parallel.pp)");
  ppipe->add_option("--schedule", pipe_schedule,
                    "gpipe | 1f1b | interleaved | zb | zbv | dualpipev (default: parallel.pp_schedule)");
  ppipe->add_option("--virtual", pipe_virtual,
                    "chunks per stage, interleaved (default: parallel.pp_virtual; 2 for zbv, dualpipev)");
  ppipe->add_option("--micro", pipe_micro, "micro-batches per step (default: the config's accumulation steps)");
  auto* pmem =
      plan->add_subcommand("memory", "per-rank bytes of a run (any layout, dtype, device), or of the ZeRO paper");
  double plan_params = 0;
  int plan_dp = 0;
  std::string plan_precision = "mixed";
  bool plan_json = false;
  pmem->add_option("--params", plan_params, "parameter count (the ZeRO paper's setting; no config needed)");
  pmem->add_option("--dp", plan_dp, "data-parallel ranks (overrides parallel.dp)");
  pmem->add_option("--precision", plan_precision, "mixed (2+2+12 bytes/param) | fp32 (4+4+8)")
      ->check(CLI::IsMember({"mixed", "fp32"}));
  pmem->add_option("--config", config_path, "TOML config of a loom run");
  pmem->add_option("--set", sets, "override one key: section.key=value (repeatable)");
  pmem->add_flag("--json", plan_json, "every rank's bytes at the config's stage, as JSON (loom runs)");
  std::string mem_cluster;
  pmem->add_option("--cluster", mem_cluster,
                   "plan for this cluster file's device and dtype (examples/clusters/; default: train.device)");

  auto* play = plan->add_subcommand(
      "layout", "rank the layouts of a model on a cluster by predicted MFU (the step-time model), or predict one");
  std::string cluster_path;
  int layout_top = 10;
  bool layout_predict = false;
  play->add_option("--cluster", cluster_path, "cluster description (TOML; examples/clusters/)")->required();
  play->add_option("--config", config_path, "TOML config: the model, global batch and dtypes");
  play->add_option("--set", sets, "override one key: section.key=value (repeatable)");
  play->add_option("--top", layout_top, "layouts to print")->check(CLI::PositiveNumber);
  play->add_flag("--predict", layout_predict, "predict the config's own layout (parallel.*, train.*) instead");
  play->add_flag("--json", plan_json, "as JSON");

  app.add_subcommand("supervise",
                     "run COMMAND and restart it when it fails curably: loom supervise [--max-restarts N] "
                     "[--backoff-s S] [--log-dir DIR] -- COMMAND...");
  if (argc > 1 && std::string(argv[1]) == "supervise") return supervise_main(argc, argv);

  try {
    std::vector<std::string> args = args_expand_sections(argc, argv);
    std::vector<char*> ptrs;
    for (auto& a : args) ptrs.push_back(a.data());
    app.parse(int(ptrs.size()), ptrs.data());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Like every other error: one line, status 2.
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    fmt::print(stderr, "error: {}; see `loom --help` or `loom COMMAND --help`\n", what);
    return 2;
  }

  // Under mpirun or srun, MPI comes up before anything else and goes down last.
  const loom::LaunchEnv env = loom::launch_env_read();
  loom::TrainOptions topt;
  for (int i = 0; i < argc; ++i) {  // as a shell would read it back
    std::string a = argv[i];
    const bool plain =
        !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") ==
                          std::string::npos;
    if (!plain) {
      std::string q = "'";
      for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
      a = q + "'";
    }
    topt.command += (i ? " " : "") + a;
  }
#if LOOM_HAVE_MPI
  std::unique_ptr<loom::MpiWorld> mpi;
  if (env.distributed() && (*train || *btrain || *bcomm || *eval)) mpi = std::make_unique<loom::MpiWorld>(&argc, &argv);
  if (mpi) topt.world_rank = mpi->rank(), topt.world_size = mpi->size(), topt.use_mpi = true;
#else
  LOOM_CHECK(!env.distributed() || env.world == 1,
             "launched as one of {} ranks, but this build has no MPI (LOOM_MPI=OFF); rebuild with MPI", env.world);
#endif
#if LOOM_HAVE_CUDA
  if (env.distributed()) loom::cuda_device_select(env.local_rank);  // local rank picks the GPU
#endif

  auto dispatch = [&]() -> int {
    if (*train) {
      if (list_keys) {
        fmt::print("{:<28} {:<7} {:<14} {}\n{}", "key", "type", "default", "meaning", loom::config_keys_table());
        return 0;
      }
      // The drill flags are shorthands for fault.* keys.
      if (!fault.empty()) sets.push_back("fault.exit=" + fault);
      if (!hang.empty()) sets.push_back("fault.hang=" + hang);
      if (!kill_in_save.empty()) sets.push_back("fault.kill=" + kill_in_save + ":checkpoint");
      // A config or layout error is found alike by every rank (building the config talks to no
      // peer): the ranks agree on it, the first that failed says it once, and all end with
      // status 2 (no abort, and no copy of the message per rank).
      loom::Config cfg;
      std::exception_ptr refused;
      try {
        cfg = config_build(config_path, sets, topt.world_size, topt.world_rank == 0 && !print_config, true);
        if (!print_config)
          loom::mesh_validate({cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.cp, cfg.parallel.tp, cfg.parallel.ep},
                              topt.world_size);
      } catch (const loom::Error&) {
        refused = std::current_exception();
      }
#if LOOM_HAVE_MPI
      if (mpi && mpi->size() > 1) {
        int mine = refused ? mpi->rank() : mpi->size(), first = mpi->size();
        MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (first < mpi->size()) {
          if (mpi->rank() == first) {
            try {
              std::rethrow_exception(refused);
            } catch (const loom::Error& e) {
              fmt::print(stderr, "error: {}\n", e.what());
            }
          }
          return 2;
        }
      }
#endif
      if (refused) std::rethrow_exception(refused);
      if (print_config) {
        fmt::print("{}\n", loom::config_to_toml(cfg));
        return 0;
      }
      loom::stop_signals_install(cfg.fault.grace_s);  // SIGINT / SIGTERM: stop at the next step boundary
      topt.verbose = verbose;
      const loom::TrainResult r = loom::train_run(cfg, topt);
      if (r.stopped_by) return loom::kExitStopped;
    } else if (*eval) {
      loom::eval_run(eopt, topt);
    } else if (*gen) {
      LOOM_CHECK(!env.distributed() || env.world == 1,
                 "loom generate runs in one process; launch it without mpirun/srun (it was given {} ranks)", env.world);
      loom::generate_run(gopt);
    } else if (*cverify) {
      return loom::ckpt_verify(ckpt_dir);
    } else if (*cinspect) {
      loom::ckpt_inspect(ckpt_dir);
    } else if (*cexport) {
      loom::ckpt_export(ckpt_dir, ckpt_out);
    } else if (*report) {
      loom::report_write(report_dirs, report_out);
    } else if (app.got_subcommand("info")) {
      info_print();
    } else if (*data) {
      LOOM_CHECK(data_paths.size() >= 2, "loom data needs INPUT... OUTPUT: text files or directories, then the shard");
      dopt.output = data_paths.back();
      dopt.inputs.assign(data_paths.begin(), data_paths.end() - 1);
      loom::data_run(dopt);
    } else if (*bgemm) {
      int threads = loom::threads_set(bench_threads);
      fmt::print("{:>6} {:>12}\n", "n", "GFLOP/s");
      for (auto& r : loom::bench_gemm(threads)) fmt::print("{:>6} {:>12.1f}\n", r.size, r.flops / 1e9);
      const loom::PeakMeasure m = loom::cpu_peak_measure(8);
      fmt::print("per-core peak (1 thread, best of {} runs): {:.1f} GFLOP/s; median {:.1f}, lowest {:.1f}\n", m.runs,
                 m.per_core / 1e9, m.median / 1e9, m.low / 1e9);
      fmt::print(
          "cached per-core peak (the best measured here): {:.1f} GFLOP/s; MFU divides by it times the "
          "cores a run uses\n",
          loom::cpu_peak_flops(1, true) / 1e9);
    } else if (*btrain) {
      loom::bench_train(config_build(config_path, sets, topt.world_size, topt.world_rank == 0, true), topt);
    } else if (*bcomm) {
      loom::bench_comm(topt, comm_max_mb);
    } else if (*bkernels) {
      loom::bench_kernels(config_build(config_path, sets));
    } else if (*ppipe) {
      // The config's keys, read without the checks that refuse pipeline keys in training.
      loom::Config cfg = loom::config_defaults();
      if (!config_path.empty()) loom::config_load_file(cfg, config_path);
      for (auto& a : sets) loom::config_set(cfg, a);
      const int p = pipe_pp > 0 ? pipe_pp : cfg.parallel.pp;
      const std::string name = pipe_schedule.empty() ? cfg.parallel.pp_schedule : pipe_schedule;
      const int v = pipe_virtual > 0 ? pipe_virtual : loom::pipeline_v_shape(name) ? 2 : cfg.parallel.pp_virtual;
      const int dp = std::max(1, cfg.parallel.dp);
      const int m = pipe_micro > 0 ? pipe_micro : cfg.train.global_batch / (cfg.train.micro_batch * dp);
      LOOM_CHECK(m >= 1, "no micro-batches: train.global_batch {} < train.micro_batch {} x parallel.dp {}",
                 cfg.train.global_batch, cfg.train.micro_batch, dp);
      const loom::PipeSchedule sched = loom::pipeline_schedule(name, p, v, m);
      // Unit costs: F 1 and B 2 (a split B 1 and W 1), as a backward costs about two forwards.
      const loom::PipeTiming t = loom::pipeline_check(sched, 1, 1, 1);
      fmt::print(
          "pipeline {}: {} stages x {} chunks, {} micro-batches; checked (every send has its receive, no "
          "deadlock)\npredicted bubble {:.3f} ({}); simulated: worst stage {:.3f}, mean {:.3f}\n{}",
          name, p, v, m, loom::pipeline_bubble_predicted(sched), loom::pipeline_bubble_formula(sched), t.bubble(),
          t.bubble_mean(), loom::pipeline_timeline(sched, t));
      fmt::print("{}", loom::pipeline_stages_text(cfg, p, v, name, m));
    } else if (*play) {
      const loom::Cluster cluster = loom::cluster_load(cluster_path);
      const loom::Config cfg = config_build(config_path, sets);
      if (layout_predict) {
        const loom::StepPrediction p = loom::step_predict(cfg, cluster);
        fmt::print("{}\n",
                   plan_json ? loom::step_prediction_json(cfg, p) : loom::step_prediction_text(cfg, cluster, p));
      } else {
        const loom::LayoutSearch s = loom::layouts_rank(cfg, cluster);
        fmt::print("{}\n", plan_json ? loom::plan_layout_json(s, layout_top)
                                     : loom::plan_layout_table(s, cfg, cluster, layout_top));
      }
    } else if (*pmem) {
      if (plan_params > 0) {
        LOOM_CHECK(plan_dp > 0, "loom plan memory --params needs --dp");
        const bool mixed = plan_precision == "mixed";
        auto gb = loom::plan_zero_paper(plan_params, plan_dp, mixed ? 2 : 4, mixed ? 2 : 4, mixed ? 12 : 8);
        fmt::print("{:.3g} parameters, dp {}, {} precision (K = {}): GB per rank\n", plan_params, plan_dp,
                   plan_precision, mixed ? 12 : 8);
        for (int s = 0; s < 4; ++s) fmt::print("zero {}: {:>10.1f}\n", s, gb[size_t(s)] / 1e9);
      } else {
        if (plan_dp > 0) sets.push_back(fmt::format("parallel.dp={}", plan_dp));
        loom::Config cfg = config_build(config_path, sets);
#if LOOM_HAVE_CUDA
        const int gpus = loom::cuda_device_count();
#else
        const int gpus = 0;
#endif
        // The device planned for, and why: a plan for a CPU where GPUs were meant must say so.
        std::string device, why;
        if (!mem_cluster.empty()) {
          const loom::Cluster cluster = loom::cluster_load(mem_cluster);
          device = cluster.device;
          if (!cfg.set_keys.count("train.dtype")) cfg.train.dtype = loom::dtype_name(cluster.dtype);
          why = fmt::format("the device of cluster {} (--cluster)", cluster.name);
        } else if (cfg.train.device != "auto") {
          device = cfg.train.device;
          why = "train.device";
        } else {
          std::string no_gpu;
          device = loom::device_resolve(cfg, gpus, &no_gpu);
          why = device == "cpu" ? fmt::format(
                                      "train.device = auto on this machine: {}; --cluster FILE or --set "
                                      "train.device=cuda plans for GPUs",
                                      no_gpu.empty() ? "no GPU here" : no_gpu)
                                : "train.device = auto on this machine";
        }
        const loom::DType dtype = loom::dtype_resolve(cfg, device);
        if (plan_json) {
          fmt::print("{}\n", loom::plan_memory_json(cfg, device, dtype));
        } else {
          fmt::print("planned for {} ({}): {}\n{}\n", device, loom::dtype_name(dtype), why,
                     loom::plan_memory_table(cfg, device, dtype));
        }
      }
    }
    return 0;
  };
  try {
    return dispatch();
  } catch (const std::exception& e) {
#if LOOM_HAVE_MPI
    if (mpi && mpi->size() > 1) {
      // A rank that fails alone would leave its peers waiting in a collective: end the job.
      fmt::print(stderr, "error: rank {}: {}\n", mpi->rank(), e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, dynamic_cast<const loom::IoError*>(&e) ? loom::kExitIo
                                : dynamic_cast<const loom::Error*>(&e) ? 2
                                                                       : 1);
    }
#endif
    throw;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // OpenMP threads that spin while they wait take the cores other processes need: on a busy
  // 2-core machine 2 spinning threads ran 3.6x slower than 1 thread, and 1.2x with passive
  // waits (README: Threads). libgomp reads the policy when it loads, before main, so a loom
  // without one set runs itself again with it; OMP_WAIT_POLICY=active keeps the spinning.
  if (!std::getenv("OMP_WAIT_POLICY") && ::setenv("OMP_WAIT_POLICY", "passive", 1) == 0)
    ::execv("/proc/self/exe", argv);
  spdlog::set_pattern("[%H:%M:%S] %v");
  try {
    return run(argc, argv);
  } catch (const loom::IoError& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return loom::kExitIo;
  } catch (const loom::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
