#include "plan/step_invariant.h"

#include <algorithm>
#include <cstring>

#include "model/registry.h"
#include "parallel/tied_head.h"
#include "runtime/error.h"

namespace loom {

double grad_tree_fold_bytes(int micro_batches, double n) {
  // m leaves meet in m - 1 adds; every micro-batch but the last is copied up and zeroed once.
  return micro_batches > 1 ? (12.0 + 8 + 4) * (micro_batches - 1) * n : 0;
}

double tree_collective_time(const char* op, int n, int stride, double bytes, const Cluster& cl, double add_rate) {
  if (n <= 1 || bytes <= 0) return 0;
  LOOM_ASSERT((n & (n - 1)) == 0 && add_rate > 0);
  const bool all_reduce = !std::strcmp(op, "all_reduce");
  LOOM_ASSERT(all_reduce || !std::strcmp(op, "reduce_scatter"));
  double t = 0, part = bytes;
  if (!all_reduce) {  // the blocks moved to bit-reversed positions first: a swapped pair of
    // blocks is 3 copies, each reading and writing a block (the palindromic positions stay)
    int bits = 0;
    while ((1 << bits) < n) ++bits;
    const int fixed = 1 << ((bits + 1) / 2);
    t += 3.0 * (n - fixed) / n * bytes / add_rate;
  }
  // The halving pairs the lowest bit first (the largest halves inside a node); each step sends
  // half of what the pair still holds and adds the half it keeps.
  for (int bit = 1; bit < n; bit <<= 1) {
    part /= 2;
    const double exchange = collective_time("send", 2, part, group_link(cl, 2, bit * stride), false);
    t += exchange + 12.0 / 4 * part / add_rate;
    if (all_reduce) t += exchange;  // doubling sends the same half back over the same pair
  }
  return t;
}

double tree_first_exchange_time(int n, int stride, double bytes, const Cluster& cl) {
  return n > 1 && bytes > 0 ? collective_time("send", 2, bytes / 2, group_link(cl, 2, stride), false) : 0;
}

double tree_all_reduce_tail(const ModelLayout& layout, int n) {
  int exchanges = 0;
  for (int b = 1; b < n; b <<= 1) exchanges += 2;
  const int units = layout.num_units();
  double tail = 0;
  for (int k = 0; k < std::min(exchanges, units); ++k) {  // local unit k ends the backward k units early
    const double hi = k + 1 < units ? double(layout.unit_lo(k + 1)) : double(layout.reg.numel());
    tail += (hi - double(layout.unit_lo(k))) * (exchanges - k) / exchanges;
  }
  return tail;
}

// The stage's dp terms, priced for the plain path, become the canonical tree's. Over 2 ranks any all-reduce and
// reduce-scatter adds a + b, so the library's overlapped collectives stay; over more, DDP and ZeRO-1 sum each unit
// in TreeAllReduce as its last backward ends, behind the backward's window but for the tail the hooks leave
// (tree_all_reduce_tail), and ZeRO-2/3 reduce-scatter each unit's micro-batch in TreeReduceScatter from its
// backward's end: its first (and largest) exchange goes on behind the next unit's backward, the rest show, for
// the unit's slot is drained the hook after (two slots take turns); with cp > 1 over the dp ranks only, then once
// a step over the cp ranks after the backward. ep is refused.
void invariant_terms(const Config& cfg, const Cluster& cl, double share, const ModelLayout& layout, int units,
                     double window, double ag, double rs, StageDpTerms& s) {
  const ParallelConfig& p = cfg.parallel;
  const int dp = p.dp * p.cp, m = cfg.accum_steps();
  const double n = double(layout.reg.numel()), rate = cluster_rates(cl).elementwise * share;
  const LinkTier dl = group_link(cl, dp, p.tp);
  const bool split = p.zero >= 2 && p.cp > 1;  // the dp ranks each micro-batch, the cp ranks once a step
  const bool tree = dp > 2 || split;
  auto reduce = [&](const char* op, double bytes) {
    return tree ? tree_collective_time(op, dp, p.tp, bytes, cl, rate) : collective_time(op, dp, bytes, dl, cl.tree);
  };
  double fold = grad_tree_fold_bytes(m, p.zero >= 2 ? n / p.dp : n), tied_micro = 0, tied_end = 0;  // cp-fold shards
  const ModelDims dims = model_dims(cfg);
  if (tied_head_apart(layout, dims, true)) {  // the head's part of the matrix in a tree of its own, added once
    const double w = double(layout.reg.at(head_names(dims).wte).numel());
    if (p.zero >= 2) {  // reduce-scattered each micro-batch (its buffer zeroed), the shard folded
      fold += grad_tree_fold_bytes(m, w / p.dp) + m * 4 * w + 16 * w / dp;  // (a cp-fold shard)
      if (split) {  // as the units: over the dp ranks each micro-batch, the cp parts once a step
        tied_micro = tree_collective_time("reduce_scatter", p.dp, p.tp * p.cp, 4 * w, cl, rate);
        tied_end = tree_collective_time("reduce_scatter", p.cp, p.tp, 4 * w / p.dp, cl, rate);
      } else {
        tied_micro = reduce("reduce_scatter", 4 * w);
      }
    } else {  // folded whole, all-reduced (over more than 2 ranks from the head's hook), added and zeroed
      fold += grad_tree_fold_bytes(m, w) + 16 * w;
      tied_end = reduce("all_reduce", 4 * w);
    }
  }
  s.fold = fold / rate / m;
  if (tree && p.zero <= 1) {  // the head's H in flight from the head's hook, hidden as the units are
    const double all = reduce("all_reduce", 4 * n) + tied_end;
    tied_end = 0;
    s.dp_end =
        std::max(all - window, reduce("all_reduce", 4 * tree_all_reduce_tail(layout, dp))) + (p.zero == 1 ? ag : 0);
    s.dp_total = all + (p.zero == 1 ? ag : 0);
  } else if (tree) {
    auto over = [&](int ranks, int stride, double bytes) {
      return ranks > 1 ? units * tree_collective_time("reduce_scatter", ranks, stride, bytes / units, cl, rate) : 0.0;
    };
    const double trs = split ? over(p.dp, p.tp * p.cp, 4 * n) : units * reduce("reduce_scatter", 4 * n / units);
    // the units' first exchanges, which the backward's window can hide (the last unit's cannot)
    const double first =
        units * tree_first_exchange_time(split ? p.dp : dp, split ? p.tp * p.cp : p.tp, 4 * n / units, cl);
    if (split) {  // the cp parts, after the step's last micro-batch
      const double cp_rs = over(p.cp, p.tp, 4 * n / p.dp);
      s.dp_end += cp_rs, s.dp_total += cp_rs;
    }
    const bool gathers = p.zero == 3 && p.zero3_reshard != Zero3Reshard::after_step;  // still behind the backward
    const double hideable = first + (gathers ? ag : 0);
    s.dp_b = trs - first + std::max(hideable - window, hideable / units);
    s.dp_total += m * (trs - rs);
  }
  s.dp_b += tied_micro, s.dp_end += tied_end, s.dp_total += m * tied_micro + tied_end;
}

}  // namespace loom
