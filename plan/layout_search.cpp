#include "plan/layout_search.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>

#include "parallel/pipeline.h"
#include "parallel/pipeline_split.h"
#include "plan/memory.h"
#include "runtime/error.h"
#include "runtime/metrics.h"

namespace loom {

namespace {

std::vector<int> divisors(int n, int most) {
  std::vector<int> d;
  for (int i = 1; i <= std::min(n, most); ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// An Error's first clause: "parallel.zero = 3 with parallel.pp > 1 is not supported".
std::string reason(const std::string& what) {
  std::string r = what.substr(0, what.find_first_of(";("));
  while (!r.empty() && r.back() == ' ') r.pop_back();
  return r;
}

}  // namespace

std::string layout_name(const Config& c) {
  const auto& p = c.parallel;
  std::string s = fmt::format("tp {} pp {}", p.tp, p.pp);
  if (p.pp > 1)
    s += p.pp_virtual > 1 && !c.pp_v_shape() ? fmt::format(" {} v{}", p.pp_schedule, p.pp_virtual)
                                             : fmt::format(" {}", p.pp_schedule);
  if (p.cp > 1) s += fmt::format(" cp {}{}", p.cp, p.cp_attention == CpAttentionKind::ring ? "" : " allgather");
  s += fmt::format(" dp {}", p.dp);
  if (p.ep > 1) s += fmt::format(" ep {}", p.ep);
  s += fmt::format(" zero {}", p.zero);
  if (p.zero == 3 && p.zero3_reshard == Zero3Reshard::after_step) s += " kept";  // gathered until the step
  return s + fmt::format(" mb {} rc {}", c.train.micro_batch, c.train.recompute);
}

LayoutSearch layouts_rank(const Config& base, const Cluster& cl) {
  LayoutSearch out;
  const int world = cl.devices(), L = base.model.n_layer;
  const int E = base.model.moe.num_experts;
  struct Candidate {
    int tp, pp, cp, dp, ep, mb, zero;
    PpSchedule schedule;
    int v;
    Zero3Reshard reshard;
  };
  std::vector<Candidate> all;
  for (int tp : divisors(cl.devices_per_node, cl.devices_per_node))
    for (int pp : divisors(L, L))
      for (int cp : {1, 2, 4, 8}) {  // context parallel: each sequence over cp ranks
        if (world % (tp * pp * cp) || base.model.seq_len % (2 * cp)) continue;
        const int dp = world / (tp * pp * cp);
        std::vector<std::pair<PpSchedule, int>> schedules = {{PpSchedule::f1b1, 1}};
        if (pp > 1) {
          schedules.push_back({PpSchedule::zb, 1});
          schedules.push_back({PpSchedule::zbv, 2});  // two chunks a stage, in a V
          schedules.push_back({PpSchedule::dualpipev, 2});
          for (int v : divisors(L / pp, 8))  // Megatron's virtual stages: whole blocks per model chunk
            if (v > 1) schedules.push_back({PpSchedule::interleaved, v});
        }
        for (int ep : E > 0 ? divisors(E, dp * cp) : std::vector<int>{1})
          for (int mb : {1, 2, 4, 8})
            for (int zero = 0; zero <= 3; ++zero)
              for (auto [name, v] : schedules)
                for (Zero3Reshard reshard : {Zero3Reshard::after_forward, Zero3Reshard::after_step})
                  if ((dp * cp) % ep == 0 && E % std::max(ep, 1) == 0 &&
                      (zero == 3 || reshard == Zero3Reshard::after_forward))
                    all.push_back({tp, pp, cp, dp, ep, mb, zero, name, v, reshard});
      }
  // Every candidate is judged on its own (embarrassingly parallel), then merged in order, so
  // the ranking does not depend on the threads.
  struct Verdict {
    bool runnable = false, placed = false;
    std::string refusal;
    LayoutChoice choice;
    std::exception_ptr error;  // raised inside the parallel loop, rethrown after it
  };
  std::vector<Verdict> verdicts(all.size());
  // Progress on stderr in every case: on a terminal one line rewritten, elsewhere (a log, a
  // pipe) a line at each tenth; then how long the search took.
  const bool tty = ::isatty(2);
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const size_t tenth = std::max<size_t>(1, all.size() / 10);
  if (!tty)
    fmt::print(stderr, "plan layout: judging {} on {}\n", plural(all.size(), "layout"),
               plural(omp_get_max_threads(), "thread"));
  std::atomic<size_t> done{0};
#pragma omp parallel for schedule(dynamic, 4)
  for (size_t i = 0; i < all.size(); ++i) {
    const Candidate& k = all[i];
    Verdict& d = verdicts[i];
    // Recompute only adds work: the first policy that fits is the one to rank.
    for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
      Config c = base;
      c.parallel.tp = k.tp, c.parallel.pp = k.pp, c.parallel.cp = k.cp, c.parallel.dp = k.dp, c.parallel.ep = k.ep;
      c.parallel.sp = k.tp > 1;
      c.parallel.zero = k.zero;
      c.parallel.zero3_reshard = k.reshard;
      c.parallel.pp_schedule = k.schedule, c.parallel.pp_virtual = k.v;
      c.train.micro_batch = k.mb;
      c.train.recompute = rc;
      try {
        config_validate(c);
      } catch (const Error& e) {
        if (d.refusal.empty()) d.refusal = reason(e.what());
        continue;
      }
      d.runnable = true;
      try {  // an exception must not leave an OpenMP region
        const StepPrediction pred = step_predict(c, cl);
        if (pred.fits) {
          d.choice = {c, pred};
          d.placed = true;
          break;
        }
      } catch (...) {
        d.error = std::current_exception();
        break;
      }
    }
    const size_t n = ++done;
    if (tty ? n % 100 == 0 : n % tenth == 0 && n < all.size()) {
#pragma omp critical(layout_progress)
      fmt::print(stderr, "{}layouts: {} of {} judged ({:.1f} s){}", tty ? "\r" : "", n, all.size(), seconds(),
                 tty ? "" : "\n");
    }
  }
  if (tty) fmt::print(stderr, "\r{:50}\r", "");
  fmt::print(stderr, "plan layout: {} judged in {:.1f} s on {}\n", plural(all.size(), "layout"), seconds(),
             plural(omp_get_max_threads(), "thread"));
  for (Verdict& d : verdicts)
    if (d.error) std::rethrow_exception(d.error);  // the first in order: the same on any thread count
  for (Verdict& d : verdicts) {
    ++out.tried;
    if (d.placed) {
      out.ranked.push_back(std::move(d.choice));
    } else if (d.runnable) {
      ++out.too_big;
    } else {
      std::string key = d.refusal;  // "global_batch = 128 ... 4 x 64" and "... 8 x 32" are one reason
      std::replace_if(
          key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; }, '#');
      auto& [n, example] = out.refused[key];
      if (!n++) example = d.refusal;
    }
  }
  std::stable_sort(out.ranked.begin(), out.ranked.end(), [](const LayoutChoice& a, const LayoutChoice& b) {
    return a.pred.mfu != b.pred.mfu ? a.pred.mfu > b.pred.mfu : a.pred.memory_bytes < b.pred.memory_bytes;
  });
  return out;
}

namespace {
// Bytes in the unit that shows them: MB below a GB.
std::string bytes_text(double b) {
  return b >= 1e9 ? fmt::format("{:.1f} GB", b / 1e9) : fmt::format("{:.1f} MB", b / 1e6);
}
std::string flops_text(double f) {
  return f >= 1e12 ? fmt::format("{:.3g} TFLOP/s", f / 1e12) : fmt::format("{:.3g} GFLOP/s", f / 1e9);
}
// "2 nodes x 4 cuda devices", or where ranks share fewer physical ones (a CPU's cores), says so.
std::string devices_text(const Cluster& cl) {
  const int physical = cl.physical_devices > 0 ? cl.physical_devices : cl.devices();
  return physical == cl.devices()
             ? fmt::format("{} x {}", plural(cl.nodes, "node"),
                           plural(cl.devices_per_node, fmt::format("{} device", device_name(cl.device))))
             : fmt::format("{} x {} sharing {}", plural(cl.nodes, "node"),
                           plural(cl.devices_per_node, fmt::format("{} rank slot", device_name(cl.device))),
                           plural(physical, "physical device"));
}
}  // namespace

std::string plan_layout_table(const LayoutSearch& s, const Config& base, const Cluster& cl, int top) {
  const auto& m = base.model;
  std::string out = fmt::format(
      "{}: {}, peak {} each, GEMMs at {:.0f}%, {}\n"
      "model: {} L {} d_model {} heads {}/{} d_ff {} vocab {} seq {}, global batch {}\n"
      "{} layouts tried: {} refused by loom, {} do not fit, {} ranked\n",
      cl.name, devices_text(cl), flops_text(cl.peak_flops), 100 * cl.gemm_efficiency,
      cl.memory_bytes > 0 ? bytes_text(cl.memory_bytes) + " each" : std::string("memory not checked (no memory_gb)"),
      m.arch, m.n_layer, m.d_model, m.n_head, base.kv_heads(), m.d_ff, m.vocab_size, m.seq_len,
      plural(base.train.global_batch, "sequence"), s.tried, s.tried - s.too_big - int(s.ranked.size()), s.too_big,
      s.ranked.size());
  for (auto& [key, got] : s.refused)
    out += fmt::format("  refused {:>5}: {}{}\n", got.first, got.second, got.first > 1 ? " (and others like it)" : "");
  out += fmt::format("{:>3}  {:<64} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9}\n", "#", "layout", "MFU", "step s",
                     "compute", "comm", "bubble", "optim", "tok/s/d", "memory");
  for (int i = 0; i < std::min<int>(top, int(s.ranked.size())); ++i) {
    const auto& c = s.ranked[size_t(i)];
    const StepPrediction& p = c.pred;
    const int world = c.cfg.world();
    out += fmt::format("{:>3}  {:<64} {:>5.1f}% {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.0f} {:>9}\n", i + 1,
                       layout_name(c.cfg), 100 * p.mfu, p.step, p.compute, p.comm_exposed, p.bubble, p.optimizer,
                       p.tokens_per_s / world, bytes_text(double(p.memory_bytes)));
  }
  if (s.ranked.empty()) out += "no layout fits: lower the global batch's micro-batches, or add devices\n";
  out += cluster_rates(cl).describe + "\n";
  out +=
      "(mb: micro-batch. The model's GEMM rate does not depend on a GEMM's shape, so layouts that differ only in mb "
      "are predicted alike in compute; mb changes their memory, bubble and communication counts.)\n";
  return out;
}

std::string step_prediction_json(const Config& c, const StepPrediction& p) {
  return fmt::format(
      "{{\"layout\":\"{}\",\"dp\":{},\"tp\":{},\"pp\":{},\"ep\":{},\"cp\":{},\"zero\":{},\"zero3_reshard\":\"{}\","
      "\"micro_batch\":{},"
      "\"schedule\":\"{}\",\"virtual\":{},\"recompute\":\"{}\",\"step_ms\":{:.6g},\"compute_ms\":{:.6g},"
      "\"comm_exposed_ms\":{:.6g},\"bubble_ms\":{:.6g},\"optimizer_ms\":{:.6g},\"tp_ms\":{:.6g},\"ep_ms\":{:.6g},"
      "\"cp_ms\":{:.6g},\"pp_ms\":{:.6g},\"dp_ms\":{:.6g},\"dp_total_ms\":{:.6g},\"tokens_per_s\":{:.6g},\"mfu\":{:.6g}"
      ",\"invariant\":{},\"tree_fold_ms\":{:.6g},\"plain_step_ms\":{:.6g},\"plain_dp_ms\":{:.6g},"
      "\"memory_b\":{},\"fits\":{}}}",
      layout_name(c), c.parallel.dp, c.parallel.tp, c.parallel.pp, c.parallel.ep, c.parallel.cp, c.parallel.zero,
      c.parallel.zero3_reshard, c.train.micro_batch, c.parallel.pp_schedule, c.parallel.pp_virtual, c.train.recompute,
      1e3 * p.step, 1e3 * p.compute, 1e3 * p.comm_exposed, 1e3 * p.bubble, 1e3 * p.optimizer, 1e3 * p.tp, 1e3 * p.ep,
      1e3 * p.cp, 1e3 * p.pp, 1e3 * p.dp, 1e3 * p.dp_total, p.tokens_per_s, p.mfu, c.parallel.invariant,
      1e3 * p.tree_fold, 1e3 * (c.parallel.invariant ? p.plain_step : p.step),
      1e3 * (c.parallel.invariant ? p.plain_dp : p.dp), p.memory_bytes, p.fits);
}

std::string plan_layout_json(const LayoutSearch& s, int top) {
  std::string out = fmt::format("{{\"tried\":{},\"too_big\":{},\"ranked\":[", s.tried, s.too_big);
  for (int i = 0; i < std::min<int>(top, int(s.ranked.size())); ++i)
    out += fmt::format("{}{}", i ? "," : "", step_prediction_json(s.ranked[size_t(i)].cfg, s.ranked[size_t(i)].pred));
  return out + "]}";
}

// parallel.invariant's cost against the same layout without it (plan/step_invariant.h).
std::string invariant_text(const Config& c, const StepPrediction& p) {
  if (!c.parallel.invariant) return "";
  const int dp = c.parallel.dp * c.parallel.cp;
  const char* how = dp <= 2                ? "the library's collectives, as without it"
                    : c.parallel.zero >= 2 ? "tree reduce-scatters, each micro-batch, the first exchanges overlapped"
                                           : "a tree all-reduce a unit, overlapped with the backward";
  return fmt::format(
      "parallel.invariant: {:+.3g} ms a step ({:+.1f}%) against {} ms without it: micro-batch tree {} ms, exposed dp "
      "{} ms (without it {}; {})\n",
      1e3 * (p.step - p.plain_step), 100 * (p.step / p.plain_step - 1), ms_text(1e3 * p.plain_step),
      ms_text(1e3 * p.tree_fold), ms_text(1e3 * p.dp), ms_text(1e3 * p.plain_dp), how);
}

std::string step_prediction_text(const Config& c, const Cluster& cl, const StepPrediction& p) {
  const int world = c.world();
  return fmt::format(
      "{} on {} ({} of {})\npredicted step {} ms: compute {}, exposed comm {} (tp {}, ep "
      "{}, cp {}, pp {}, dp {} of {} moved), bubble {}, optimizer {}{}\n{}"
      "{:.1f} tokens/s, MFU {:.1f}%, memory {} on the fullest rank{}\n{}\n",
      layout_name(c), cl.name, plural(world, "rank"), devices_text(cl), ms_text(1e3 * p.step), ms_text(1e3 * p.compute),
      ms_text(1e3 * p.comm_exposed), ms_text(1e3 * p.tp), ms_text(1e3 * p.ep), ms_text(1e3 * p.cp), ms_text(1e3 * p.pp),
      ms_text(1e3 * p.dp), ms_text(1e3 * p.dp_total), ms_text(1e3 * p.bubble), ms_text(1e3 * p.optimizer),
      c.parallel.invariant ? fmt::format(", micro-batch tree {}", ms_text(1e3 * p.tree_fold)) : "",
      invariant_text(c, p), p.tokens_per_s, 100 * p.mfu, bytes_text(double(p.memory_bytes)),
      p.fits ? "" : fmt::format(" (does not fit in {})", bytes_text(cl.memory_bytes)), cluster_rates(cl).describe);
}

std::string pipeline_stages_text(const Config& given, int p, int v, PpSchedule name, int m) {
  if (p < 2) return "";
  Config c = given;
  c.parallel.pp = p, c.parallel.pp_schedule = name, c.parallel.pp_virtual = v;
  c.set_keys.insert("parallel.pp_virtual");
  c.train.global_batch = m * c.train.micro_batch * std::max(1, c.parallel.dp);
  if (c.train.dtype == DTypeChoice::automatic) c.train.dtype = DTypeChoice::f32;  // the CPU's
  try {
    config_validate(c);
  } catch (const Error& e) {
    return fmt::format("per stage: not predicted: {}\n", e.what());
  }
  const std::vector<int> blocks = pipeline_layers(c);
  std::string out = fmt::format("blocks per model chunk: {}{}\n", fmt::join(blocks, ","),
                                c.parallel.pp_layers == "auto" ? " (parallel.pp_layers = auto)" : "");
  // The step-time model on this machine's cluster file, where it holds the run's ranks.
  std::vector<double> compute;
  const std::string path = cluster_this_machine_path();
  try {
    if (std::filesystem::exists(path))
      compute = step_predict(c, cluster_load(path, "this machine's cluster file")).stage_compute;
  } catch (const Error&) {
    // a layout wider than this machine: memory only
  }
  const DType dtype = c.train.dtype == DTypeChoice::bf16 ? DType::bf16 : DType::f32;
  for (int st = 0; st < p; ++st) {
    const std::vector<int> chunks = pipeline_stage_chunks(c, st);
    int n = 0;
    for (int g : chunks) n += blocks[size_t(g)];
    const int64_t bytes =
        plan_memory(c, DeviceKind::cpu, dtype, st * c.parallel.dp * c.parallel.cp * c.parallel.tp).total();
    out += fmt::format(
        "stage {:>2}: chunks {:<8} {:>3} blocks{}{}, memory {:.1f} MiB (rank {})\n", st,
        fmt::format("{}", fmt::join(chunks, ",")), n,
        std::string(chunks.front() == 0 ? " + embedding" : "") + (chunks.back() == p * v - 1 ? " + head" : ""),
        std::string(compute.empty() ? "" : fmt::format(", compute {:.1f} ms a step", 1e3 * compute[size_t(st)])),
        double(bytes) / 1048576.0, st * c.parallel.dp * c.parallel.cp * c.parallel.tp);
  }
  return out;
}

}  // namespace loom
