// What parallel.invariant adds to a step, for the step-time model: the micro-batch counter's
// element-wise traffic (parallel/grad_tree.cpp's fold) and loom's own tree collectives over
// point-to-point exchanges, each step on the link its pair of ranks crosses. Not here: where
// these sit in the schedule and what overlaps them (plan/step_model.cpp).
#pragma once
#include "model/layout.h"
#include "plan/step_model.h"

namespace loom {

// Bytes of fp32 element-wise traffic GradTree::fold moves in a step of `micro_batches` over
// `n` elements: per micro-batch i, an add (read two, write one) for each trailing one bit of i,
// and before the last a copy up a level (read, write) and the zeroing of the gradient (write);
// the last adds the levels still open. 0 at one micro-batch.
double grad_tree_fold_bytes(int micro_batches, double n);

// tree_all_reduce (2 log2(n) exchanges: halving from the lowest bit, then doubling back) and
// tree_reduce_scatter (its blocks permuted, then log2(n) exchanges from the lowest bit) of `bytes` over n ranks
// `stride` apart: each exchange pays its link's latency and its half's bytes on the link its
// pair crosses (group_link of the pair), and the halving steps' adds at `add_rate` bytes/s (three
// fp32 accesses an element). n must be a power of two.
double tree_collective_time(const char* op, int n, int stride, double bytes, const Cluster& cl, double add_rate);

// The first exchange of tree_reduce_scatter's (half of `bytes` over the pair of rank bit 1, `stride`
// apart): what of a unit's run goes on behind the next unit's backward (parallel/grad_tree.h's
// TreeReduceScatter under ZeRO-2/3, whose slot is drained at the hook after).
double tree_first_exchange_time(int n, int stride, double bytes, const Cluster& cl);

// The elements whose tree all-reduce over n ranks is left when a chunk of `layout`'s backward
// ends (DDP and ZeRO-1, parallel/grad_tree.h's TreeAllReduce): each unit's starts as its last
// backward ends and advances one of its 2 log2(n) exchanges at each later unit's hook, so
// local unit k (k units before the end) has k done: the first unit's whole and the rest's part.
double tree_all_reduce_tail(const ModelLayout& layout, int n);

// A pipeline stage's dp terms as step_predict prices them: per micro-batch (dp_b, and the
// micro-batch tree's `fold`) and per step.
struct StageDpTerms {
  double dp_b = 0, dp_end = 0, dp_total = 0, fold = 0;
};
// What parallel.invariant makes of them (`cl` with the shared devices' rates, `share` of a
// device a rank has; `window`, `ag` and `rs`: the plain path's backward window, all-gathers and
// reduce-scatters of the stage, which has `units` ZeRO units).
void invariant_terms(const Config& cfg, const Cluster& cl, double share, const ModelLayout& layout, int units,
                     double window, double ag, double rs, StageDpTerms& s);

}  // namespace loom
