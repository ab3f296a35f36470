// Compares two training runs: per-step losses from each metrics.jsonl (relative tolerance),
// the gradient norm before clipping at step 1 (relative: a gradient off by a constant factor
// hides behind clipping and Adam in the losses and weights, not here) and exported
// safetensors (absolute tolerance). NaN anywhere fails. With --trace, checks that a
// data-parallel run overlapped its gradient all-reduce with backward.
//   loom_compare_runs RUN_A RUN_B [--loss-rtol X] [--norm-rtol X] [--weight-atol X] [--min-steps N]
//   loom_compare_runs --trace TRACE.json METRICS.jsonl ONE_BUCKET_METRICS.jsonl
//   loom_compare_runs --tree-trace TRACE.json  (parallel.invariant's tree all-reduce overlapped
//                                              the backward)
//   loom_compare_runs --tree-scatter-trace TRACE.json EXCHANGES (ZeRO-2/3's tree reduce-scatters
//                                              polled on from later units' hooks)
//   loom_compare_runs --ledger PLAN.json RUN    (the ledger against `loom plan memory --json`)
//   loom_compare_runs --val RUN_A RUN_B RTOL    (the last validation losses)
//   loom_compare_runs --split RUN               (the step-time split of a tp run)
//   loom_compare_runs --shape FILE.safetensors NAME D0 [D1...]
//   loom_compare_runs --master FILE.safetensors (a bf16 run exported its fp32 master weights)
//   loom_compare_runs --resumed FULL RESUMED [RTOL ATOL] (a resumed run's steps and weights;
//                                              bitwise unless tolerances are given)
//   loom_compare_runs --ckpt-equal DIR_A DIR_B (two checkpoints hold the same tensors, bitwise)
//   loom_compare_runs --weights-equal A.safetensors B.safetensors (the same tensors, bitwise)
//   loom_compare_runs --grad-norms RUN_A RUN_B RTOL (every tensor's step-1 gradient norm, from
//                                              log.grad_norms, within RTOL relative)
// Each RUN is a log.dir holding metrics.jsonl and final.safetensors. Exit 0 when it holds.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>

#include "checkpoint/manifest.h"
#include "checkpoint/pieces.h"
#include "checkpoint/safetensors.h"
#include "runtime/exact_digits.h"

namespace {

// The lines of a metrics file's last run (after its last {"run": ...} header).
std::vector<nlohmann::json> jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    if (j.contains("run")) out.clear();
    out.push_back(std::move(j));
  }
  return out;
}

// Per-step values of `key` (a number, or null for NaN) from a run's metrics.jsonl.
std::vector<double> series(const std::string& dir, const char* key) {
  std::vector<double> out;
  for (auto& j : jsonl(dir + "/metrics.jsonl"))
    if (j.contains("loss")) out.push_back(j[key].is_number() ? j[key].get<double>() : NAN);
  return out;
}
std::vector<double> losses(const std::string& dir) {
  return series(dir, "loss");
}

// |a - b| / |b|, infinite where either is not finite.
double rel_diff(double a, double b) {
  if (!std::isfinite(a) || !std::isfinite(b)) return INFINITY;
  return std::abs(a - b) / std::max(std::abs(b), 1e-30);
}

int compare(const std::string& a, const std::string& b, double rtol, double norm_rtol, double atol, size_t min_steps) {
  auto la = losses(a), lb = losses(b);
  int bad = 0;
  if (la.size() != lb.size() || la.size() < min_steps) {
    fmt::print("step counts differ or are too few: {} vs {} (need {})\n", la.size(), lb.size(), min_steps);
    return 1;
  }
  double worst = 0;
  for (size_t s = 0; s < la.size(); ++s) {
    double rel = rel_diff(la[s], lb[s]);
    worst = std::max(worst, rel);
    if (!(rel <= rtol)) ++bad, fmt::print("step {}: loss {:.9g} vs {:.9g} (rel {:.3g})\n", s + 1, la[s], lb[s], rel);
  }
  const double norm = rel_diff(series(a, "grad_norm").at(0), series(b, "grad_norm").at(0));
  if (!(norm <= norm_rtol)) ++bad;
  auto wa = loom::safetensors_read(a + "/final.safetensors"), wb = loom::safetensors_read(b + "/final.safetensors");
  double worst_w = 0;
  for (auto& [name, t] : wb) {
    auto it = wa.find(name);
    if (it == wa.end() || it->second.shape != t.shape) {
      fmt::print("tensor {} missing or shaped differently\n", name);
      ++bad;
      continue;
    }
    for (size_t i = 0; i < t.data.size(); ++i) {
      const double d = std::abs(double(it->second.data[i]) - double(t.data[i]));
      worst_w = std::isfinite(d) ? std::max(worst_w, d) : INFINITY;
    }
  }
  if (!(worst_w <= atol)) ++bad;
  fmt::print(
      "{} steps: worst loss rel diff {:.3g} (tol {}), step-1 gradient norm rel diff {:.3g} (tol {}), worst weight abs "
      "diff {:.3g} (tol {}): {}\n",
      la.size(), worst, rtol, norm, norm_rtol, worst_w, atol, bad ? "FAIL" : "ok");
  return bad ? 1 : 0;
}

// A dp run with small buckets against the same run with one bucket: in the trace, some
// bucket's all-reduce must have completed before its step's backward ended (an op's trace
// event ends when the communication thread saw it finish, not when it was issued), and the
// exposed communication summed over the steps after the first must be below the one-bucket
// run's, whose single all-reduce can start only once backward is over.
struct TraceEvent {
  std::string name;
  double start, end;
};
std::vector<TraceEvent> trace_events(const std::string& trace_path) {
  std::ifstream in(trace_path);
  std::vector<TraceEvent> out;
  const nlohmann::json trace = nlohmann::json::parse(in);
  for (auto& e : trace["traceEvents"])
    if (e["ph"] == "X")
      out.push_back({e["name"], e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()});
  return out;
}

// Per backward (in order), how many `op` events that started in it completed before it ended:
// an op's backward is the first one to end after the last forward that began before the op.
std::vector<int> done_before_backward_end(const std::vector<TraceEvent>& events, const std::string& op) {
  std::vector<TraceEvent> fwd, bwd;
  for (auto& x : events) {
    if (x.name == "embedding_forward") fwd.push_back(x);
    if (x.name == "embedding_backward") bwd.push_back(x);  // the last op of every backward
  }
  std::vector<int> done_early(bwd.size());
  for (auto& c : events) {
    if (c.name != op) continue;
    double f = -1;
    for (auto& x : fwd)
      if (x.start <= c.start) f = std::max(f, x.start);
    for (size_t i = 0; i < bwd.size(); ++i)
      if (bwd[i].start >= f) {
        if (c.end < bwd[i].end) ++done_early[i];
        break;
      }
  }
  return done_early;
}

int trace_check(const std::string& trace_path, const std::string& metrics_path, const std::string& one_bucket) {
  const std::vector<TraceEvent> events = trace_events(trace_path);
  const int comm = int(std::count_if(events.begin(), events.end(), [](auto& e) { return e.name == "all_reduce"; }));
  const std::vector<int> per_backward = done_before_backward_end(events, "all_reduce");
  const int done_early = std::accumulate(per_backward.begin(), per_backward.end(), 0);
  auto exposed = [](const std::string& path) {
    double sum = 0;
    for (auto& j : jsonl(path))
      if (j.contains("time") && j["step"].get<int>() > 1) sum += j["time"]["comm_exposed_ms"].get<double>();
    return sum;
  };
  const double with = exposed(metrics_path), without = exposed(one_bucket);
  fmt::print(
      "{} all-reduces, {} completed before their step's backward ended; exposed {:.3f} ms, one bucket {:.3f} ms\n",
      comm, done_early, with, without);
  return done_early > 0 && with < without ? 0 : 1;
}

// parallel.invariant over more than 2 dp ranks, no pipeline (each step's last backward is
// the one its exchanges start in): in every step, some of the tree all-reduce's exchanges
// (receives) must complete during the backward, not all after it.
int tree_trace_check(const std::string& trace_path) {
  const std::vector<TraceEvent> events = trace_events(trace_path);
  const int recvs = int(std::count_if(events.begin(), events.end(), [](auto& e) { return e.name == "recv"; }));
  const std::vector<int> per_backward = done_before_backward_end(events, "recv");
  fmt::print("{} tree exchanges; completed before the backward they started in ended, per backward: {}\n", recvs,
             fmt::join(per_backward, " "));
  const bool every =
      !per_backward.empty() && std::all_of(per_backward.begin(), per_backward.end(), [](int n) { return n > 0; });
  return recvs > 0 && every ? 0 : 1;
}

// ZeRO-2/3 under parallel.invariant, one micro-batch a step: each unit's tree reduce-scatter is
// polled on from the next unit's hook, so after the step's last backward op (the embeddings')
// exchanges start for the unit before it as well as the embeddings' own `per_run`. Run to its end
// inside the hook that started it, a unit's reduce-scatter leaves only the embeddings' there.
int tree_scatter_trace_check(const std::string& trace_path, int per_run) {
  const std::vector<TraceEvent> events = trace_events(trace_path);
  std::vector<double> fwd, bwd_end;
  for (auto& x : events) {
    if (x.name == "embedding_forward") fwd.push_back(x.start);
    if (x.name == "embedding_backward") bwd_end.push_back(x.end);  // the last op of every backward
  }
  std::sort(fwd.begin(), fwd.end());
  std::sort(bwd_end.begin(), bwd_end.end());
  std::vector<int> after(bwd_end.size());
  for (auto& c : events) {
    if (c.name != "recv") continue;
    for (size_t i = 0; i < bwd_end.size(); ++i) {
      const auto next = std::upper_bound(fwd.begin(), fwd.end(), bwd_end[i]);
      if (c.start > bwd_end[i] && (next == fwd.end() || c.start < *next)) ++after[i];
    }
  }
  fmt::print(
      "tree reduce-scatter exchanges started after the last backward op, per step: {} (the embeddings' "
      "own: {})\n",
      fmt::join(after, " "), per_run);
  return !after.empty() && std::all_of(after.begin(), after.end(), [&](int n) { return n > per_run; }) ? 0 : 1;
}

std::vector<nlohmann::json> jsonl_mem(const std::string& dir, nlohmann::json* comm = nullptr) {
  nlohmann::json last;
  for (auto& j : jsonl(dir + "/metrics.jsonl"))
    if (j.contains("mem")) last = j;
  if (comm) *comm = last["dp_comm"];
  return {last["mem"]};
}

// A run's ledger (rank 0, the last step) against `loom plan memory --json`, every category to
// the byte: the README says the plan equals the ledger.
int ledger_check(const std::string& plan_path, const std::string& run) {
  std::ifstream in(plan_path);
  auto plan = nlohmann::json::parse(in);
  const auto mem = jsonl_mem(run)[0];
  int bad = 0;
  for (auto* key : {"params_b", "grads_b", "master_b", "optim_b", "comm_b", "act_b", "workspace_b"}) {
    const int64_t want = plan["ranks"][0][key].get<int64_t>(), got = mem[key].get<int64_t>();
    bad += got != want;
    fmt::print("{} zero {} {:<12} measured {:>12} planned {:>12} {}\n", plan["dtype"].get<std::string>(),
               plan["zero"].get<int>(), key, got, want, got == want ? "" : "MISMATCH");
  }
  return bad ? 1 : 0;
}

// Runs at ZeRO stages 0..3 (one log dir each, same model, dp and dtype): the sharded parts are
// stage 0's divided by dp, and the per-step communication is what theory says.
int memory_check(const std::string& plan_path, const std::vector<std::string>& runs) {
  std::ifstream in(plan_path);
  auto plan = nlohmann::json::parse(in);
  int bad = 0;
  std::vector<nlohmann::json> mem, comm;
  for (auto& dir : runs) {
    nlohmann::json c;
    mem.push_back(jsonl_mem(dir, &c)[0]);
    comm.push_back(c);
  }
  const double N = plan["n_params"].get<double>(), dp = plan["dp"].get<double>();
  const bool bf16 = plan["dtype"] == "bf16";
  // A shard starts at a multiple of the norm's block from its unit's start: up to a block of
  // padding per unit and rank.
  const double pad = plan.value("units", 0.0) * plan.value("norm_block", 1.0);
  for (size_t s = 0; s < runs.size(); ++s) {
    // Sharded state is the stage-0 figure / dp, plus padding (up to a block per unit, at most 8
    // bytes an element: the two moments).
    auto sharded = [&](const char* key, int from) {
      if (int(s) < from) return;
      double full = mem[0][key].get<double>(), got = mem[s][key].get<double>();
      bool ok = std::abs(got - full / dp) <= 0.01 * full / dp + 4096 + 8 * pad;
      bad += !ok;
      fmt::print("zero {} {:<12} {:.0f} vs stage-0 / {} = {:.0f} {}\n", s, key, got, dp, full / dp,
                 ok ? "" : "NOT SHARDED");
    };
    sharded("optim_b", 1);
    if (bf16) sharded("master_b", 1);
    sharded("grads_b", 2);
    sharded("params_b", 3);
    // Communication volume per rank, in elements: an all-reduce moves its payload twice
    // (reduce-scatter + all-gather), so theory is 2N for stages 0-2 and 3N for stage 3.
    // Gradients travel in fp32, weights (the all-gathers) in the compute dtype.
    // parallel.invariant's tree collectives are point-to-point: a rank sends (dp - 1) / dp of
    // a reduce-scatter's payload, twice that of an all-reduce's (send_b, counted as payload
    // here); at stage 1 the tree sums the whole buffer (an all-reduce's 2N, not N).
    const double sent = comm[s].value("send_b", 0.0), tree = dp > 1 ? sent * dp / (dp - 1) : 0;
    double moved = (2 * comm[s]["all_reduce_b"].get<double>() + comm[s]["reduce_scatter_b"].get<double>() + tree) / 4 +
                   comm[s]["all_gather_b"].get<double>() / (bf16 ? 2 : 4);
    double theory = (s == 3 || (s == 1 && sent > 0) ? 3 : 2) * N;
    bool ok = std::abs(moved - theory) <= 0.02 * theory + (s ? (s == 3 ? 3 : 2) * pad * dp : 0);
    bad += !ok;
    fmt::print("zero {} communication {:.0f} elements per step vs {:.0f}N = {:.0f} {}\n", s, moved, theory / N, theory,
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
    if (e["name"] == "all_gather")
      gathers.push_back({a, b});
    else if (e["tid"] == 0)
      compute.push_back({a, b});
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

nlohmann::json last_step(const std::string& dir) {
  nlohmann::json last;
  for (auto& j : jsonl(dir + "/metrics.jsonl"))
    if (j.contains("mem")) last = j;
  return last;
}

// Tensor-parallel accounting of two runs (sp off, sp on) of the same model at tp > 1.
//  1. Communication per step from the tp group's counters against the analytic count, in
//     bytes, with N = B*T tokens per micro-batch, NC = N*C, A micro-batches, L blocks:
//       without sp: all-reduce  A*(NC*(2 + 4L) + 3N) (embedding, 2 row exits and 2 column
//                   gradients per block, lm_head gradient; cross-entropy max, sum, target)
//       with sp:    reduce-scatter A*NC*(2 + 4L); all-gather A*NC*(2 + 6L);
//                   all-reduce A*(3N + L*4C + 2C) (the sequence-parallel norm gradients)
//     (fp32 elements; x 4 for bytes), plus the squared norm of the gradients once per step, an
//     exact sum's 68 digits as doubles (544 bytes; runtime/exact_sum.h).
//  2. Activation bytes: sequence parallelism shards the norm and residual regions. Korthikanti
//     et al. (2022) count them as 10sbh of the 34sbh per layer in fp16 with dropout (two norm
//     inputs, the residual, dropout masks) and show they drop to 10sbh/t. In loom (fp32,
//     no dropout, pre-norm) the region per block is the block input, ln1, the mid residual
//     and ln2 (4NC) plus per-row norm statistics (sN, s = 4 for gpt2, 2 for llama); the final
//     norm region is 2NC + sN/2. All of it shrinks by (1 - 1/t), less the gathered final norm
//     (NC) that the lm_head reads:  saved = 4 * [(L(4NC + sN) + 2NC + sN/2)(1 - 1/t) - NC].
int tp_check(const std::string& off, const std::string& on, const std::vector<double>& v, const std::string& arch) {
  const double B = v[0], T = v[1], C = v[2], L = v[3], t = v[4], A = v[5], N = B * T, NC = N * C;
  const double s = arch == "llama" ? 2 : 4;
  auto j_off = last_step(off), j_on = last_step(on);
  int bad = 0;
  auto check = [&](const char* what, double got, double want, double tol) {
    bool ok = std::abs(got - want) <= tol;
    bad += !ok;
    fmt::print("{:<40} measured {:>14.0f} analytic {:>14.0f} {}\n", what, got, want, ok ? "" : "MISMATCH");
  };
  check("no sp: tp all-reduce bytes/step", j_off["tp_comm"]["all_reduce_b"].get<double>(),
        4 * A * (NC * (2 + 4 * L) + 3 * N) + 8 * loom::kExactDigits, 0);
  check("no sp: tp reduce-scatter + all-gather bytes",
        j_off["tp_comm"]["reduce_scatter_b"].get<double>() + j_off["tp_comm"]["all_gather_b"].get<double>(), 0, 0);
  check("sp: tp reduce-scatter bytes/step", j_on["tp_comm"]["reduce_scatter_b"].get<double>(), 4 * A * NC * (2 + 4 * L),
        0);
  check("sp: tp all-gather bytes/step", j_on["tp_comm"]["all_gather_b"].get<double>(), 4 * A * NC * (2 + 6 * L), 0);
  const double norm_params = arch == "llama" ? 1 : 2;  // RMSNorm: a gain; LayerNorm: gain and bias
  check("sp: tp all-reduce bytes/step", j_on["tp_comm"]["all_reduce_b"].get<double>(),
        4 * A * (3 * N + L * 2 * norm_params * C + norm_params * C) + 8 * loom::kExactDigits, 0);
  const double saved = 4 * ((L * (4 * NC + s * N) + 2 * NC + s * N / 2) * (1 - 1 / t) - NC);
  const double measured = j_off["mem"]["act_b"].get<double>() - j_on["mem"]["act_b"].get<double>();
  check("activation bytes saved by sp", measured, saved, 0.01 * saved + 64 * 20);
  return bad ? 1 : 0;
}

// A run against the PyTorch fixture (tests/fixtures/parity_*): losses.json and final.safetensors.
int fixture_check(const std::string& run, const std::string& fixture) {
  std::ifstream in(fixture + "/losses.json");
  auto fix = nlohmann::json::parse(in);
  auto ref = fix["losses"].get<std::vector<double>>();
  auto got = losses(run);
  int bad = got.size() != ref.size();
  double worst = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) worst = std::max(worst, rel_diff(got[i], ref[i]));
  bad += !(worst <= 1e-4);
  const double norm = rel_diff(series(run, "grad_norm").at(0), fix["grad_norms"][0].get<double>());
  bad += !(norm <= 1e-5);
  auto want = loom::safetensors_read(fixture + "/final.safetensors"),
       have = loom::safetensors_read(run + "/final.safetensors");
  double worst_w = 0;
  for (auto& [name, t] : want) {
    if (!have.count(name) || have[name].shape != t.shape) {
      ++bad;
      continue;
    }
    for (size_t i = 0; i < t.data.size(); ++i) {
      const double d = std::abs(double(have[name].data[i]) - double(t.data[i]));
      worst_w = std::isfinite(d) ? std::max(worst_w, d) : INFINITY;
    }
  }
  bad += !(worst_w <= 1e-4);
  fmt::print(
      "against PyTorch: {} steps, worst loss rel diff {:.3g}, step-1 gradient norm rel diff {:.3g}, worst weight abs "
      "diff {:.3g}: {}\n",
      got.size(), worst, norm, worst_w, bad ? "FAIL" : "ok");
  return bad ? 1 : 0;
}

// The step-time split: every step's phases, cut from the step's own timeline, add up to its
// step_ms, which the host's clock measures apart from them (within 1% and 50 us: a step whose
// marks missed part of it falls short), and, in a run with blocking collectives (tensor
// parallel), exposed communication is charged on every step rather than hidden in compute.
int split_check(const std::string& run) {
  int bad = 0, steps = 0;
  double comm = 0, total = 0;
  for (auto& j : jsonl(run + "/metrics.jsonl")) {
    if (!j.contains("time")) continue;
    ++steps;
    double sum = 0;
    for (auto& [k, v] : j["time"].items()) sum += v.get<double>();
    const double ms = j["step_ms"].get<double>(), c = j["time"]["comm_exposed_ms"].get<double>();
    bad += !(std::abs(sum - ms) <= 0.01 * ms + 0.05) || !(c > 0);
    comm += c, total += ms;
  }
  fmt::print("{} steps: the phases add up to step_ms, exposed communication {:.3f} of {:.3f} ms: {}\n", steps, comm,
             total, bad ? "FAIL" : "ok");
  return bad || steps == 0 ? 1 : 0;
}

// The last validation loss of two runs, within rtol relative.
int val_check(const std::string& a, const std::string& b, double rtol) {
  auto last = [](const std::string& dir) {
    double v = NAN;
    for (auto& j : jsonl(dir + "/metrics.jsonl"))
      if (j.contains("val_loss")) v = j["val_loss"].is_number() ? j["val_loss"].get<double>() : NAN;
    return v;
  };
  const double va = last(a), vb = last(b), rel = rel_diff(va, vb);
  fmt::print("validation loss {:.9g} vs {:.9g}: rel diff {:.3g} (tol {}): {}\n", va, vb, rel, rtol,
             rel <= rtol ? "ok" : "FAIL");
  return rel <= rtol ? 0 : 1;
}

// Every tensor's step-1 gradient norm (grad_norms.json, log.grad_norms) within rtol relative:
// a tensor whose gradient is zero, or far off, fails here though the weights, a few steps of
// Adam later, would pass their tolerance. The same tensors in both, each norm finite.
int grad_norms_check(const std::string& a, const std::string& b, double rtol) {
  auto read = [](const std::string& dir) {
    std::ifstream in(dir + "/grad_norms.json");
    if (!in) throw std::runtime_error(dir + "/grad_norms.json: missing (run with --set log.grad_norms=true)");
    return nlohmann::json::parse(in);
  };
  const nlohmann::json ja = read(a), jb = read(b);
  int bad = 0;
  double worst = 0;
  std::string worst_name;
  for (auto it = ja.begin(); it != ja.end(); ++it) {
    if (!jb.contains(it.key())) {
      fmt::print("{}: in {} only\n", it.key(), a), ++bad;
      continue;
    }
    const double x = it.value().get<double>(), y = jb[it.key()].get<double>(), rel = rel_diff(x, y);
    if (!(rel <= rtol)) fmt::print("{}: gradient norm {:.9g} vs {:.9g} (rel {:.3g})\n", it.key(), x, y, rel), ++bad;
    if (rel > worst || std::isnan(rel)) worst = rel, worst_name = it.key();
  }
  if (ja.size() != jb.size()) fmt::print("{} tensors against {}\n", ja.size(), jb.size()), ++bad;
  fmt::print("{} tensors' step-1 gradient norms: worst rel diff {:.3g} ({}) (tol {}): {}\n", ja.size(), worst,
             worst_name, rtol, bad || ja.empty() ? "FAIL" : "ok");
  return bad || ja.empty() ? 1 : 0;
}

// A tensor of a safetensors file has the given shape (the Hugging Face one, not loom's padded).
int shape_check(const std::string& file, const std::string& name, const std::vector<int64_t>& shape) {
  auto t = loom::safetensors_read(file);
  const bool ok = t.count(name) && t.at(name).shape == shape;
  fmt::print("{} in {}: shape {} (want {}): {}\n", name, file,
             t.count(name) ? loom::shape_str(t.at(name).shape) : "none", loom::shape_str(shape), ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}

// A bf16 run exports its fp32 master weights, not the bf16 copy it computes with: most values
// are not bf16 numbers (a bf16 export would have none that are not).
int master_check(const std::string& file) {
  int64_t n = 0, wide = 0;
  for (auto& [name, t] : loom::safetensors_read(file))
    for (float x : t.data) {
      ++n;
      wide += loom::bf16_to_f32(loom::f32_to_bf16(x)) != x;
    }
  const double frac = n ? double(wide) / double(n) : 0.0;
  const bool ok = frac > 0.5;
  fmt::print("{}: {:.1f}% of {} weights are not bf16 numbers (fp32 master weights: most): {}\n", file, 100 * frac, n,
             ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}

// A run resumed from a checkpoint of FULL against FULL itself: every step it ran has FULL's
// loss and gradient norm to the bit, and its final weights are FULL's, bitwise.
int resumed_check(const std::string& full, const std::string& resumed, double rtol, double atol, double norm_rtol) {
  auto by_step = [](const std::string& dir) {
    std::map<int64_t, std::pair<double, double>> out;
    for (auto& j : jsonl(dir + "/metrics.jsonl"))
      if (j.contains("loss")) out[j["step"].get<int64_t>()] = {j["loss"].get<double>(), j["grad_norm"].get<double>()};
    return out;
  };
  const auto a = by_step(full), b = by_step(resumed);
  int bad = b.empty() || a.empty() || b.rbegin()->first != a.rbegin()->first;
  for (auto& [step, v] : b) {
    auto it = a.find(step);
    const bool same = it != a.end() && (rtol == 0 ? it->second == v
                                                  : rel_diff(v.first, it->second.first) <= rtol &&
                                                        rel_diff(v.second, it->second.second) <= norm_rtol);
    if (!same) {
      ++bad;
      fmt::print("step {}: resumed loss {:.9g} norm {:.9g}, uninterrupted {}\n", step, v.first, v.second,
                 it == a.end() ? "missing" : fmt::format("{:.9g} norm {:.9g}", it->second.first, it->second.second));
    }
  }
  const auto wa = loom::safetensors_read(full + "/final.safetensors"),
             wb = loom::safetensors_read(resumed + "/final.safetensors");
  size_t differ = 0;
  for (auto& [name, t] : wa) {
    auto it = wb.find(name);
    if (it == wb.end() || it->second.shape != t.shape) {
      ++differ;
      continue;
    }
    double worst = 0;
    for (size_t i = 0; i < t.data.size(); ++i)
      worst = std::max(worst, std::abs(double(it->second.data[i]) - double(t.data[i])));
    if (atol == 0 ? std::memcmp(it->second.data.data(), t.data.data(), t.data.size() * 4) != 0 : !(worst <= atol))
      ++differ;
  }
  bad += differ != 0 || wa.size() != wb.size();
  fmt::print("resumed steps {}..{} against the uninterrupted run ({}): {} tensors differ: {}\n",
             b.empty() ? 0 : b.begin()->first, b.empty() ? 0 : b.rbegin()->first,
             rtol == 0 ? std::string("bitwise")
                       : fmt::format("loss rtol {}, norm rtol {}, weights atol {}", rtol, norm_rtol, atol),
             differ, bad ? "FAIL" : "ok");
  return bad ? 1 : 0;
}

// Every tensor of a checkpoint, assembled whole from its shards.
std::map<std::string, std::vector<float>> ckpt_tensors(const std::string& dir) {
  const loom::Manifest m = loom::manifest_read(dir);
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, t] : m.tensors) {
    auto& whole = out[name];
    whole.assign(size_t(loom::shape_numel(t.shape)), NAN);
    for (auto& s : t.shards) {
      const loom::Box b = loom::box_of(s.offset, s.shape);
      const auto data = loom::ckpt_shard_read(dir, name, s);
      for (int64_t r = 0; r < b.rows; ++r)
        std::copy_n(data.data() + r * b.cols, b.cols, whole.data() + (b.r0 + r) * t.shape.back() + b.c0);
    }
  }
  return out;
}

// Two checkpoints (of different layouts, say) hold the same tensors, bitwise.
int ckpt_equal_check(const std::string& a, const std::string& b) {
  const auto ta = ckpt_tensors(a), tb = ckpt_tensors(b);
  size_t differ = 0;
  size_t holes = 0;  // elements no shard covers (left NaN by ckpt_tensors)
  for (auto* t : {&ta, &tb})
    for (auto& [name, v] : *t)
      for (float x : v) holes += std::isnan(x);
  if (holes) fmt::print("{} elements are NaN (not covered by any shard, or saved as NaN)\n", holes);
  for (auto& [name, v] : ta) {
    auto it = tb.find(name);
    if (it == tb.end() || it->second.size() != v.size() || std::memcmp(it->second.data(), v.data(), v.size() * 4)) {
      ++differ;
      if (differ <= 5) fmt::print("tensor {} differs\n", name);
    }
  }
  const bool ok = differ == 0 && holes == 0 && ta.size() == tb.size();
  fmt::print("{} and {}: {} tensors, {} differ: {}\n", a, b, ta.size(), differ, ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}

// Two safetensors files hold the same tensors (names, shapes), bitwise.
int weights_equal_check(const std::string& a, const std::string& b) {
  const auto wa = loom::safetensors_read(a), wb = loom::safetensors_read(b);
  size_t differ = 0;
  for (auto& [name, t] : wa) {
    auto it = wb.find(name);
    if (it == wb.end() || it->second.shape != t.shape ||
        std::memcmp(it->second.data.data(), t.data.data(), t.data.size() * 4) != 0) {
      ++differ;
      if (differ <= 5) fmt::print("tensor {} differs\n", name);
    }
  }
  const bool ok = differ == 0 && wa.size() == wb.size() && !wa.empty();
  fmt::print("{} and {}: {} and {} tensors, {} differ: {}\n", a, b, wa.size(), wb.size(), differ, ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 4 && args[0] == "--trace") return trace_check(args[1], args[2], args[3]);
    if (args.size() == 2 && args[0] == "--gather-trace") return gather_overlap_check(args[1]);
    if (args.size() == 2 && args[0] == "--tree-trace") return tree_trace_check(args[1]);
    if (args.size() == 3 && args[0] == "--tree-scatter-trace")
      return tree_scatter_trace_check(args[1], std::stoi(args[2]));
    if (args.size() == 3 && args[0] == "--fixture") return fixture_check(args[1], args[2]);
    if (args.size() == 10 && args[0] == "--tp") {
      std::vector<double> v;
      for (size_t i = 3; i < 9; ++i) v.push_back(std::stod(args[i]));
      return tp_check(args[1], args[2], v, args[9]);
    }
    if (args.size() == 3 && args[0] == "--ledger") return ledger_check(args[1], args[2]);
    if (args.size() == 2 && args[0] == "--split") return split_check(args[1]);
    if (args.size() == 2 && args[0] == "--master") return master_check(args[1]);
    if (args.size() == 3 && args[0] == "--resumed") return resumed_check(args[1], args[2], 0, 0, 0);
    if ((args.size() == 5 || args.size() == 6) && args[0] == "--resumed")
      return resumed_check(args[1], args[2], std::stod(args[3]), std::stod(args[4]),
                           std::stod(args[args.size() == 6 ? 5 : 3]));
    if (args.size() == 3 && args[0] == "--weights-equal") return weights_equal_check(args[1], args[2]);
    if (args.size() == 3 && args[0] == "--ckpt-equal") return ckpt_equal_check(args[1], args[2]);
    if (args.size() == 4 && args[0] == "--val") return val_check(args[1], args[2], std::stod(args[3]));
    if (args.size() == 4 && args[0] == "--grad-norms") return grad_norms_check(args[1], args[2], std::stod(args[3]));
    if (args.size() >= 4 && args[0] == "--shape") {
      std::vector<int64_t> shape;
      for (size_t i = 3; i < args.size(); ++i) shape.push_back(std::stoll(args[i]));
      return shape_check(args[1], args[2], shape);
    }
    if (args.size() >= 3 && args[0] == "--memory")
      return memory_check(args[1], std::vector<std::string>(args.begin() + 2, args.end()));
    if (args.size() < 2) throw std::runtime_error("usage: loom_compare_runs RUN_A RUN_B [options]");
    double rtol = 1e-4, norm_rtol = 1e-5, atol = 1e-4;
    size_t min_steps = 20;
    for (size_t i = 2; i + 1 < args.size(); i += 2) {
      if (args[i] == "--loss-rtol")
        rtol = std::stod(args[i + 1]);
      else if (args[i] == "--norm-rtol")
        norm_rtol = std::stod(args[i + 1]);
      else if (args[i] == "--weight-atol")
        atol = std::stod(args[i + 1]);
      else if (args[i] == "--min-steps")
        min_steps = std::stoul(args[i + 1]);
      else
        throw std::runtime_error("unknown option " + args[i]);
    }
    return compare(args[0], args[1], rtol, norm_rtol, atol, min_steps);
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
}
