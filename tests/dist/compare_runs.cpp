// Compares two training runs: per-step losses from each metrics.jsonl (relative tolerance)
// and exported safetensors (absolute tolerance); with --trace, checks that a data-parallel
// run overlapped its gradient all-reduce with backward and exposed less than it spent.
//   loom_compare_runs RUN_A RUN_B [--loss-rtol X] [--weight-atol X] [--min-steps N]
//   loom_compare_runs --trace TRACE.json METRICS.jsonl
// Each RUN is a log.dir holding metrics.jsonl and final.safetensors. Exit 0 when it holds.
#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"

namespace {

std::vector<nlohmann::json> jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::vector<double> losses(const std::string& dir) {
  std::vector<double> out;
  for (auto& j : jsonl(dir + "/metrics.jsonl"))
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  return out;
}

int compare(const std::string& a, const std::string& b, double rtol, double atol, size_t min_steps) {
  auto la = losses(a), lb = losses(b);
  int bad = 0;
  if (la.size() != lb.size() || la.size() < min_steps) {
    fmt::print("step counts differ or are too few: {} vs {} (need {})\n", la.size(), lb.size(), min_steps);
    return 1;
  }
  double worst = 0;
  for (size_t s = 0; s < la.size(); ++s) {
    double rel = std::abs(la[s] - lb[s]) / std::abs(lb[s]);
    worst = std::max(worst, rel);
    if (rel > rtol) ++bad, fmt::print("step {}: loss {:.9g} vs {:.9g} (rel {:.3g})\n", s + 1, la[s], lb[s], rel);
  }
  auto wa = loom::safetensors_read(a + "/final.safetensors"), wb = loom::safetensors_read(b + "/final.safetensors");
  double worst_w = 0;
  for (auto& [name, t] : wb) {
    auto it = wa.find(name);
    if (it == wa.end() || it->second.shape != t.shape) {
      fmt::print("tensor {} missing or shaped differently\n", name);
      ++bad;
      continue;
    }
    for (size_t i = 0; i < t.data.size(); ++i) worst_w = std::max(worst_w, double(std::abs(it->second.data[i] - t.data[i])));
  }
  if (worst_w > atol) ++bad;
  fmt::print("{} steps: worst loss rel diff {:.3g} (tol {}), worst weight abs diff {:.3g} (tol {}): {}\n", la.size(),
             worst, rtol, worst_w, atol, bad ? "FAIL" : "ok");
  return bad ? 1 : 0;
}

int trace_check(const std::string& trace_path, const std::string& metrics_path) {
  std::ifstream in(trace_path);
  auto events = nlohmann::json::parse(in)["traceEvents"];
  struct E {
    std::string name;
    double start, end;
  };
  std::vector<E> fwd, bwd, comm;
  double comm_total_ms = 0;
  for (auto& e : events) {
    if (e["ph"] != "X") continue;
    E x{e["name"], e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()};
    if (x.name == "embedding_forward") fwd.push_back(x);
    if (x.name == "embedding_backward") bwd.push_back(x);  // the last op of every backward
    if (x.name == "all_reduce") comm.push_back(x), comm_total_ms += (x.end - x.start) / 1e3;
  }
  int overlapped = 0;
  for (auto& c : comm) {
    // The backward of the micro-batch this all-reduce started in: the first one to end after
    // the last forward that began before it.
    double f = -1;
    for (auto& x : fwd)
      if (x.start <= c.start) f = std::max(f, x.start);
    for (auto& x : bwd)
      if (x.start >= f) {
        if (c.start < x.end) ++overlapped;
        break;
      }
  }
  double exposed = 0;
  for (auto& j : jsonl(metrics_path))
    if (j.contains("time")) exposed += j["time"]["comm_exposed_ms"].get<double>();
  fmt::print("{} all-reduces, {} started before their step's backward ended; exposed {:.3f} ms of {:.3f} ms\n",
             comm.size(), overlapped, exposed, comm_total_ms);
  return overlapped > 0 && exposed < comm_total_ms ? 0 : 1;
}

// Checks the ledger of runs at ZeRO stages 0..3 (one log dir each, same model and dp)
// against `loom plan memory --json`, the sharding ratios, and the per-step communication.
int memory_check(const std::string& plan_path, const std::vector<std::string>& runs) {
  std::ifstream in(plan_path);
  auto plan = nlohmann::json::parse(in);
  int bad = 0;
  std::vector<nlohmann::json> mem, comm;
  for (auto& dir : runs) {
    auto lines = jsonl(dir + "/metrics.jsonl");
    nlohmann::json last;
    for (auto& j : lines)
      if (j.contains("mem")) last = j;
    mem.push_back(last["mem"]);
    comm.push_back(last["dp_comm"]);
  }
  const double N = plan[0]["n_params"].get<double>(), dp = plan[0]["dp"].get<double>();
  for (size_t s = 0; s < runs.size(); ++s) {
    for (auto* key : {"params_b", "grads_b", "optim_b", "comm_b", "act_b", "workspace_b"}) {
      double want = plan[s][key].get<double>(), got = mem[s][key].get<double>();
      bool ok = std::abs(got - want) <= 0.10 * want + 1024;
      bad += !ok;
      fmt::print("zero {} {:<12} measured {:>12.0f} planned {:>12.0f} {}\n", s, key, got, want, ok ? "" : "MISMATCH");
    }
    // Sharded state is the stage-0 figure / dp, plus padding (one element per unit per rank).
    auto sharded = [&](const char* key, int from) {
      if (int(s) < from) return;
      double full = mem[0][key].get<double>(), got = mem[s][key].get<double>();
      bool ok = std::abs(got - full / dp) <= 0.01 * full / dp + 4096;
      bad += !ok;
      fmt::print("zero {} {:<12} {:.0f} vs stage-0 / {} = {:.0f} {}\n", s, key, got, dp, full / dp, ok ? "" : "NOT SHARDED");
    };
    sharded("optim_b", 1);
    sharded("grads_b", 2);
    sharded("params_b", 3);
    // Communication volume per rank, in elements: an all-reduce moves its payload twice
    // (reduce-scatter + all-gather), so theory is 2N for stages 0-2 and 3N for stage 3.
    double moved = (2 * comm[s]["all_reduce_b"].get<double>() + comm[s]["reduce_scatter_b"].get<double>() +
                    comm[s]["all_gather_b"].get<double>()) / 4;
    double theory = (s == 3 ? 3 : 2) * N;
    bool ok = std::abs(moved - theory) <= 0.02 * theory;
    bad += !ok;
    fmt::print("zero {} communication {:.0f} elements per step vs {}N = {:.0f} {}\n", s, moved, s == 3 ? 3 : 2, theory,
               ok ? "" : "MISMATCH");
  }
  return bad ? 1 : 0;
}

// Stage-3 trace: parameter all-gathers in flight while compute ops run.
int gather_overlap_check(const std::string& trace_path) {
  std::ifstream in(trace_path);
  auto events = nlohmann::json::parse(in)["traceEvents"];
  std::vector<std::pair<double, double>> gathers, compute;
  for (auto& e : events) {
    if (e["ph"] != "X") continue;
    double a = e["ts"].get<double>(), b = a + e["dur"].get<double>();
    if (e["name"] == "all_gather") gathers.push_back({a, b});
    else if (e["tid"] == 0) compute.push_back({a, b});
  }
  int overlapped = 0;
  for (auto& g : gathers)
    for (auto& c : compute)
      if (c.first < g.second && g.first < c.second) {
        ++overlapped;
        break;
      }
  fmt::print("{} parameter all-gathers, {} of them overlap compute\n", gathers.size(), overlapped);
  return overlapped > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 3 && args[0] == "--trace") return trace_check(args[1], args[2]);
    if (args.size() == 2 && args[0] == "--gather-trace") return gather_overlap_check(args[1]);
    if (args.size() >= 3 && args[0] == "--memory")
      return memory_check(args[1], std::vector<std::string>(args.begin() + 2, args.end()));
    if (args.size() < 2) throw std::runtime_error("usage: loom_compare_runs RUN_A RUN_B [options]");
    double rtol = 1e-4, atol = 1e-4;
    size_t min_steps = 20;
    for (size_t i = 2; i + 1 < args.size(); i += 2) {
      if (args[i] == "--loss-rtol") rtol = std::stod(args[i + 1]);
      else if (args[i] == "--weight-atol") atol = std::stod(args[i + 1]);
      else if (args[i] == "--min-steps") min_steps = std::stoul(args[i + 1]);
      else throw std::runtime_error("unknown option " + args[i]);
    }
    return compare(args[0], args[1], rtol, atol, min_steps);
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
}
