// `loom compare`: a config's first steps in the layout it names and in the smallest layout with
// the same tp, cp and ep (dp = ep, pp 1, ZeRO 0), each launched as its own job; then every
// step's loss and gradient norm and every exported weight side by side. Under
// parallel.invariant the two must be the same bits, and the first step, tensor and element that
// differ are named; outside it the layouts' sums meet in other orders, so it compares within
// the layout tests' tolerances and says so. Not here: launching on a cluster (the launcher is
// given), comparing optimizer state (the weights carry it forward).
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "checkpoint/safetensors.h"
#include "launch/command.h"
#include "runtime/json_read.h"

namespace loom {

namespace {

struct StepRow {
  double loss = 0, norm = 0;
};

std::map<int64_t, StepRow> steps_read(const std::string& metrics) {
  std::ifstream in(metrics);
  LOOM_CHECK(in, "loom compare: '{}' is missing: the run wrote no metrics", metrics);
  std::map<int64_t, StepRow> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("\"grad_norm\"") == std::string::npos) continue;
    const nlohmann::json j = json_parse(line, "a line of '" + metrics + "'");
    if (!j.contains("step") || !j.contains("loss")) continue;
    out[j["step"].get<int64_t>()] = {j["loss"].get<double>(), j["grad_norm"].get<double>()};
  }
  return out;
}

// Runs LAUNCHER NP LOOM train ARGS..., its output to LOG; its exit status.
int job_run(const std::vector<std::string>& launcher, int np, const std::vector<std::string>& args,
            const std::string& log) {
  std::vector<std::string> argv = launcher;
  argv.push_back(std::to_string(np));
  argv.push_back(std::filesystem::read_symlink("/proc/self/exe").string());
  argv.push_back("train");
  argv.insert(argv.end(), args.begin(), args.end());
  const pid_t pid = ::fork();
  LOOM_CHECK(pid >= 0, "loom compare: fork failed");
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) ::dup2(fd, 1), ::dup2(fd, 2);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    std::vector<char*> p;
    for (auto& a : argv) p.push_back(a.data());
    p.push_back(nullptr);
    ::execvp(p[0], p.data());
    std::fprintf(stderr, "error: loom compare: cannot run '%s'\n", p[0]);
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool close_enough(double a, double b, double rtol) {
  return std::abs(a - b) <= rtol * std::max(std::abs(b), 1e-30);
}

}  // namespace

void cmd_compare_add(CLI::App& app, Commands& out) {
  struct Args {
    ConfigArgs config;
    int steps = 3;
    std::string launcher = "mpirun -np";
    std::string out;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("compare",
                                 "a config's first steps in its layout and in the smallest one with its tp, cp and "
                                 "ep: the first step, tensor and element that differ, or the same bits");
  a->config.add_to(cmd);
  cmd->add_option("--steps", a->steps, "steps each run trains (default 3)")->check(whole_in(1, 1000));
  cmd->add_option("--launcher", a->launcher,
                  "the launcher up to its rank count (default \"mpirun -np\"; srun: \"srun --mpi=pmix -n\")");
  cmd->add_option("--out", a->out, "where both runs go (default: a new runs/compare-N)");
  out.push_back(
      {cmd, false, [a](const CommandContext&) {
         const Config cfg = config_build(a->config.path, a->config.sets);
         const ParallelConfig& p = cfg.parallel;
         std::vector<std::string> launcher;
         std::istringstream words(a->launcher);
         for (std::string w; words >> w;) launcher.push_back(w);
         LOOM_CHECK(!launcher.empty(), "loom compare: --launcher is empty; give e.g. \"mpirun -np\"");
         std::string dir = a->out;
         if (dir.empty())
           for (int n = 1; dir.empty() || std::filesystem::exists(dir); ++n) dir = fmt::format("runs/compare-{}", n);
         LOOM_CHECK(!std::filesystem::exists(dir) || std::filesystem::is_empty(dir),
                    "loom compare: --out '{}' is not empty; give a new directory", dir);
         std::filesystem::create_directories(dir);
         std::vector<std::string> args;
         if (!a->config.path.empty()) args = {"--config", a->config.path};
         for (const std::string& s : a->config.sets) args.insert(args.end(), {"--set", s});
         const std::string steps = std::to_string(a->steps);
         // The emulated device's GEMMs follow OpenBLAS's thread split (the CPU's do not): both
         // runs get the config's train.threads, or 1 where it leaves the count to the node.
         const std::string threads = std::to_string(std::max(1, cfg.train.threads));
         auto run = [&](const std::string& name, int np, std::vector<std::string> extra) {
           std::vector<std::string> all = args;
           for (const std::string& s :
                {"train.steps=" + steps, "train.threads=" + threads, "log.dir=" + dir + "/" + name,
                 "export.final=" + dir + "/" + name + ".safetensors", std::string("checkpoint.every=0")})
             extra.push_back(s);
           for (const std::string& s : extra) all.insert(all.end(), {"--set", s});
           fmt::print("loom compare: {} on {}, {} each ({})\n", name, plural(np, "rank"),
                      plural(std::stoi(threads), "thread"), dir + "/" + name + ".log");
           std::fflush(stdout);
           const int rc = job_run(launcher, np, all, dir + "/" + name + ".log");
           LOOM_CHECK(rc == 0, "loom compare: the {} run exited {}; see '{}/{}.log'", name, rc, dir, name);
         };
         const int ref_dp = p.ep;  // the experts' group is carved from dp x cp
         run("layout", cfg.world(), {});
         run("reference", ref_dp * p.cp * p.tp,
             {"parallel.dp=" + std::to_string(ref_dp), "parallel.pp=1", "parallel.zero=0", "parallel.pp_schedule=1f1b",
              "parallel.pp_virtual=1", "parallel.pp_layers=", "parallel.zero3_reshard=after_forward"});
         // Bits under the mode; else the layout tests' tolerances (docs/invariant.md).
         const bool bits = p.invariant;
         const double rtol = bits ? 0 : 1e-4, wtol = bits ? 0 : 1e-4;
         if (!bits)
           fmt::print(
               "loom compare: parallel.invariant is off, so the layouts' sums meet in other orders: "
               "comparing within {} (losses and norms, relative) and {} (weights)\n",
               rtol, wtol);
         const auto A = steps_read(dir + "/layout/metrics.jsonl"), B = steps_read(dir + "/reference/metrics.jsonl");
         int bad = 0;
         int64_t first_bits = 0;  // outside the mode: the first step whose bits differ
         for (const auto& [step, r] : B) {
           const auto it = A.find(step);
           LOOM_CHECK(it != A.end(), "loom compare: the layout's run has no step {}", step);
           if (!first_bits && (it->second.loss != r.loss || it->second.norm != r.norm)) first_bits = step;
           if (!close_enough(it->second.loss, r.loss, rtol) || !close_enough(it->second.norm, r.norm, rtol)) {
             fmt::print(
                 "first step that differs: {}: loss {:.17g} against {:.17g}, gradient norm {:.17g} "
                 "against {:.17g}\n",
                 step, it->second.loss, r.loss, it->second.norm, r.norm);
             ++bad;
             break;
           }
         }
         const auto wa = safetensors_read(dir + "/layout.safetensors"),
                    wb = safetensors_read(dir + "/reference.safetensors");
         int64_t tensors = 0, differ = 0;
         for (const auto& [name, t] : wb) {
           const auto it = wa.find(name);
           LOOM_CHECK(it != wa.end() && it->second.data.size() == t.data.size(),
                      "loom compare: the layout's weights lack '{}' or shape it otherwise", name);
           ++tensors;
           for (size_t i = 0; i < t.data.size(); ++i) {
             const float x = it->second.data[i], y = t.data[i];
             const bool same = bits ? std::memcmp(&x, &y, sizeof x) == 0 : std::abs(x - y) <= wtol;
             if (same) continue;
             if (!differ++)
               fmt::print("first weight that differs: {} element {}: {:.9g} against {:.9g}\n", name, i, x, y);
             break;
           }
         }
         if (differ) fmt::print("{} of {} differ\n", plural(differ, "tensor"), tensors);
         if (bad || differ) return 1;
         fmt::print("{}: the losses and gradient norms of {}, and all {} of the final weights\n",
                    bits ? "the same bits" : "within the tolerances", plural(int64_t(B.size()), "step"),
                    plural(tensors, "tensor"));
         if (!bits && first_bits)
           fmt::print("(the bits differ from step {} on; parallel.invariant = true makes them the same)\n", first_bits);
         return 0;
       }});
}

}  // namespace loom
