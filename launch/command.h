// One `loom` subcommand: its options on the parser, whether it runs as one of many ranks under
// mpirun/srun (MPI comes up first for those), and what it does. main.cpp lists the commands and
// dispatches to the one given; each lives in launch/cmd_<name>.cpp.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "runtime/launch_env.h"
#include "train/trainer.h"

namespace loom {

// Where a command runs: the launcher's view (env) and, for commands that run on every rank,
// this rank's place once MPI is up (topt.world_rank, world_size, use_mpi) and the command line.
struct CommandContext {
  LaunchEnv env;
  TrainOptions topt;
};

struct Command {
  CLI::App* app = nullptr;  // the subcommand (or a leaf of it) this entry runs
  bool ranks = false;       // launched under mpirun/srun, every rank runs it (MPI comes up first)
  std::function<int(const CommandContext& ctx)> run;
};
using Commands = std::vector<Command>;

// Each adds its subcommand(s) to `app` and their entries to `out`.
void cmd_train_add(CLI::App& app, Commands& out);
void cmd_infer_add(CLI::App& app, Commands& out);  // eval, generate
void cmd_ckpt_add(CLI::App& app, Commands& out);
void cmd_info_add(CLI::App& app, Commands& out);
void cmd_report_add(CLI::App& app, Commands& out);
void cmd_data_add(CLI::App& app, Commands& out);
void cmd_bench_add(CLI::App& app, Commands& out);
void cmd_plan_add(CLI::App& app, Commands& out);
void cmd_compare_add(CLI::App& app, Commands& out);
// Parsed by hand, before CLI11 sees the line: everything after "--" is the command.
int cmd_supervise_main(int argc, char** argv);

// The options every config-reading command shares: --config FILE and repeatable --set.
struct ConfigArgs {
  std::string path;
  std::vector<std::string> sets;
  void add_to(CLI::App* app, const std::string& config_help = "TOML config file");
};
// The config of a file and --set overrides. Launched as `world` ranks without parallel.dp, the
// ranks the other axes leave are data parallel (torchtitan's -1, Megatron's implicit dp); rank
// 0 says so (`lead`). Commands that read the data (`reads_data`) take data.source from the files
// the config names when it does not set it.
Config config_build(const std::string& path, const std::vector<std::string>& sets, int world = 1, bool lead = false,
                    bool reads_data = false);
// Checks for numeric options that refuse in a short message (CLI::Range, PositiveNumber and
// NonNegativeNumber write DBL_MAX out in 300 digits when they refuse): a whole decimal number
// from lo to hi (no sign unless lo < 0, no fraction, no hexadecimal) ...
CLI::Validator whole_in(int64_t lo, int64_t hi);
// ... and a finite decimal number above 0 and at most hi (nan, inf and hexadecimal refused).
CLI::Validator positive_up_to(double hi);

// `--section.key=value` and `--section.key value` (torchtitan's form) as `--set section.key=value`,
// for the sections loom's config has; anything else is left for the parser to judge.
std::vector<std::string> args_expand_sections(int argc, char** argv);

}  // namespace loom
