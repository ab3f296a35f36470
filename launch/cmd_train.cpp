// `loom train`: a training run of a config (none: the default job), or its keys / resolved config.
#include <spdlog/spdlog.h>

#include <memory>
#include <optional>

#include "data/inputs_check.h"
#include "launch/command.h"
#include "launch/log_dir.h"
#include "runtime/mesh.h"
#include "train/divergence.h"
#include "train/stop.h"
#if LOOM_HAVE_MPI
#include <mpi.h>
#endif

namespace loom {

namespace {
// A config or layout error is found alike by every rank (building the config talks to no peer):
// the ranks agree on it, the first that failed says it once, and all end with status 2 (no
// abort, and no copy of the message per rank): nullopt where another rank said it.
std::optional<Config> config_agreed(const std::string& path, const std::vector<std::string>& sets,
                                    const TrainOptions& topt, bool print_only) {
  Config cfg;
  std::exception_ptr refused;
  try {
    cfg = config_build(path, sets, topt.world_size, topt.world_rank == 0 && !print_only, true);
    if (!print_only)
      mesh_validate({cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.cp, cfg.parallel.tp, cfg.parallel.ep},
                    topt.world_size);
  } catch (const Error&) {
    refused = std::current_exception();
  }
#if LOOM_HAVE_MPI
  if (topt.use_mpi && topt.world_size > 1) {
    int mine = refused ? topt.world_rank : topt.world_size, first = topt.world_size;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first < topt.world_size) {
      if (topt.world_rank == first) {
        try {
          std::rethrow_exception(refused);
        } catch (const Error& e) {
          fmt::print(stderr, "error: {}\n", e.what());
        }
      }
      return std::nullopt;
    }
  }
#endif
  if (refused) std::rethrow_exception(refused);
  return cfg;
}

// One run per log directory (launch/log_dir.h). Rank 0, which writes the metrics, decides, and
// every rank takes its answer: traces and flight records go into the same directory.
LogDirChoice log_dir_agreed(const Config& cfg, const TrainOptions& topt) {
  LogDirChoice choice;
  if (topt.world_rank == 0) choice = log_dir_choose(cfg.log.dir, run_continues(cfg));
#if LOOM_HAVE_MPI
  if (topt.use_mpi && topt.world_size > 1) {
    int n = int(choice.dir.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
    choice.dir.resize(size_t(n));
    MPI_Bcast(choice.dir.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  }
#endif
  return choice;  // the note, rank 0's, is said beside the metrics' path once the run is set up
}
}  // namespace

void cmd_train_add(CLI::App& app, Commands& out) {
  struct Args {
    ConfigArgs config;
    bool list_keys = false, print_config = false, verbose = false;
    std::string fault, hang, kill_in_save;
  };
  auto a = std::make_shared<Args>();
  auto* train = app.add_subcommand("train", "train a model (no config: the default job)");
  a->config.add_to(train);
  train->add_flag("--list-keys", a->list_keys, "list every config key and exit");
  train->add_flag("--print-config", a->print_config, "print the resolved config and exit");
  train->add_flag("--verbose", a->verbose,
                  "also print the activation plan, every rank's memory ledger, FLOPs per token and the step-time "
                  "prediction at the start");
  train->add_option("--fault-exit", a->fault,
                    "fault drill: rank RANK exits with status 3 at step STEP (RANK:STEP; fault.exit)");
  train->add_option("--fault-hang", a->hang,
                    "fault drill: rank RANK stops inside its next collective at step STEP (RANK:STEP; fault.hang)");
  train->add_option("--fault-kill-in-save", a->kill_in_save,
                    "fault drill: rank RANK SIGKILLs itself halfway through writing checkpoint STEP (RANK:STEP; "
                    "fault.kill = RANK:STEP:checkpoint)");
  out.push_back({train, true, [a](const CommandContext& ctx) {
                   const TrainOptions& topt = ctx.topt;
                   if (a->list_keys) {
                     fmt::print("{:<28} {:<7} {:<14} {}\n{}", "key", "type", "default", "meaning", config_keys_table());
                     return 0;
                   }
                   // The drill flags are shorthands for fault.* keys.
                   std::vector<std::string> sets = a->config.sets;
                   if (!a->fault.empty()) sets.push_back("fault.exit=" + a->fault);
                   if (!a->hang.empty()) sets.push_back("fault.hang=" + a->hang);
                   if (!a->kill_in_save.empty()) sets.push_back("fault.kill=" + a->kill_in_save + ":checkpoint");
                   const std::optional<Config> agreed = config_agreed(a->config.path, sets, topt, a->print_config);
                   if (!agreed) return 2;
                   if (a->print_config) {
                     fmt::print("{}\n", config_to_toml(*agreed));
                     return 0;
                   }
                   Config cfg = *agreed;
                   const LogDirChoice logs = log_dir_agreed(cfg, topt);
                   cfg.log.dir = logs.dir;
                   for (const std::string& note : data_inputs_check(cfg))  // (eval reads one file as both on purpose)
                     if (topt.world_rank == 0) spdlog::warn("{}", note);
                   stop_signals_install(cfg.fault.grace_s);  // SIGINT / SIGTERM: stop at the next step boundary
                   TrainOptions run_opt = topt;
                   run_opt.verbose = a->verbose;
                   run_opt.log_note = logs.note;
                   try {
                     const TrainResult r = train_run(cfg, run_opt);
                     return r.stopped_by ? kExitStopped : 0;
                   } catch (const Diverged& e) {  // every rank decided it alike: one says so
                     if (topt.world_rank == 0) fmt::print(stderr, "error: {}\n", e.what());
                     return kExitDiverged;
                   }
                 }});
}

}  // namespace loom
