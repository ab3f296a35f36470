// `loom train`: a training run of a config (none: the default job), or its keys / resolved config.
#include <memory>

#include "launch/command.h"
#include "train/stop.h"

namespace loom {

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
                   const Config cfg =
                       config_build(a->config.path, sets, topt.world_size, topt.world_rank == 0 && !a->print_config, true);
                   if (a->print_config) {
                     fmt::print("{}\n", config_to_toml(cfg));
                     return 0;
                   }
                   stop_signals_install(cfg.fault.grace_s);  // SIGINT / SIGTERM: stop at the next step boundary
                   TrainOptions run_opt = topt;
                   run_opt.verbose = a->verbose;
                   const TrainResult r = train_run(cfg, run_opt);
                   return r.stopped_by ? kExitStopped : 0;
                 }});
}

}  // namespace loom
