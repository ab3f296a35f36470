// The `loom` command: parse, build, run. Each subcommand lives in launch/cmd_<name>.cpp; this
// file lists them, brings MPI up for those every rank runs, and turns every error into one line
// on stderr and an exit status (2: fix the command or config; 74: I/O, retryable; 70: a bug in
// loom, LOOM_ASSERT's; 1: anything else, such as memory that ran out).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "launch/command.h"
#include "runtime/error.h"
#if LOOM_HAVE_MPI
#include "runtime/comm/mpi_group.h"
#endif
#if LOOM_HAVE_CUDA
#include "runtime/comm/nccl_group.h"
#endif

namespace loom {
// A path the OS refused, in one line: the path's fault (too long, not a directory, a loop of
// links, missing) is a user's error (2), anything else the machine's (74).
[[noreturn]] void fail_filesystem(const std::filesystem::filesystem_error& e) {
  const std::errc code = std::errc(e.code().value());
  const std::string path = e.path1().string();
  const std::string shown = path.size() > 80 ? path.substr(0, 40) + "..." + path.substr(path.size() - 30) : path;
  if (code == std::errc::filename_too_long)
    fail(
        "'{}' cannot be used: a name in it is longer than the file system allows ({} bytes in all); choose a "
        "shorter one",
        shown, path.size());
  if (code == std::errc::not_a_directory || code == std::errc::too_many_symbolic_link_levels ||
      code == std::errc::no_such_file_or_directory || code == std::errc::permission_denied ||
      code == std::errc::read_only_file_system)
    fail("'{}' cannot be used: {}", shown, e.code().message());
  fail_io("'{}': {}", shown, e.code().message());
}
}  // namespace loom

namespace {

// The command line as a shell would read it back, for log.dir/run.json.
std::string command_line(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    const bool plain =
        !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") ==
                          std::string::npos;
    if (!plain) {
      std::string q = "'";
      for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
      a = q + "'";
    }
    out += (i ? " " : "") + a;
  }
  return out;
}

int run(int argc, char** argv) {
  CLI::App app{"loom: train decoder-only transformers"};
  app.require_subcommand(1);
  loom::Commands commands;
  loom::cmd_train_add(app, commands);
  loom::cmd_ckpt_add(app, commands);
  loom::cmd_info_add(app, commands);
  loom::cmd_report_add(app, commands);
  loom::cmd_data_add(app, commands);
  loom::cmd_infer_add(app, commands);
  loom::cmd_bench_add(app, commands);
  loom::cmd_plan_add(app, commands);
  loom::cmd_compare_add(app, commands);
  app.add_subcommand("supervise",
                     "run COMMAND and restart it when it fails curably: loom supervise [--max-restarts N] "
                     "[--backoff-s S] [--log-dir DIR] -- COMMAND...");
  if (argc > 1 && std::string(argv[1]) == "supervise") return loom::cmd_supervise_main(argc, argv);

  try {
    std::vector<std::string> args = loom::args_expand_sections(argc, argv);
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
  const auto chosen =
      std::find_if(commands.begin(), commands.end(), [](const loom::Command& c) { return c.app->parsed(); });
  LOOM_CHECK(chosen != commands.end(), "no command given; see `loom --help`");

  // Under mpirun or srun, MPI comes up before anything else and goes down last.
  loom::CommandContext ctx;
  ctx.env = loom::launch_env_read();
  ctx.topt.command = command_line(argc, argv);
#if LOOM_HAVE_MPI
  std::unique_ptr<loom::MpiWorld> mpi;
  if (ctx.env.distributed() && chosen->ranks) mpi = std::make_unique<loom::MpiWorld>(&argc, &argv);
  if (mpi) ctx.topt.world_rank = mpi->rank(), ctx.topt.world_size = mpi->size(), ctx.topt.use_mpi = true;
#else
  LOOM_CHECK(!ctx.env.distributed() || ctx.env.world == 1,
             "launched as one of {} ranks, but this build has no MPI (LOOM_MPI=OFF); rebuild with MPI", ctx.env.world);
#endif
#if LOOM_HAVE_CUDA
  if (ctx.env.distributed()) loom::cuda_device_select(ctx.env.local_rank);  // local rank picks the GPU
#endif
  try {
    try {
      return chosen->run(ctx);
    } catch (const std::filesystem::filesystem_error& e) {
      loom::fail_filesystem(e);
    }
  } catch (const std::exception& e) {
#if LOOM_HAVE_MPI
    if (mpi && mpi->size() > 1) {
      // A rank that fails alone would leave its peers waiting in a collective: end the job.
      fmt::print(stderr, "error: rank {}: {}\n", mpi->rank(), e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, loom::exit_status_of(e));
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
  } catch (const std::exception& e) {
    const int status = loom::exit_status_of(e);
    fmt::print(stderr, "error: {}{}\n", e.what(),
               status == loom::kExitBug ? " (a bug in loom, not in the command or config)" : "");
    return status;
  }
}
