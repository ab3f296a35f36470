// The canonical sum of a step's micro-batch gradients: each micro-batch's gradient arrives
// alone (its buffer zeroed before it) and joins a binary counter that keeps one partial sum per
// level, so micro-batches 0 and 1 are added, then 2 and 3, then the two pairs, and so on. The
// step's gradient is the sum over one fixed binary tree of the global batch's micro-batches: a
// rank's block of 2^k micro-batches is a subtree, so the ranks' sums meet in the same tree
// (tree_all_reduce), and the bits do not depend on how many ranks shared the batch.
// Not here: which micro-batches a rank computes (the data's contiguous blocks), ZeRO's shards.
#pragma once
#include <vector>

#include "model/backend.h"
#include "runtime/comm/process_group.h"

namespace loom {

class GradTree {
 public:
  // Per unit of a flat gradient buffer of `numel` (its units start at unit_starts), the
  // partial sums of `micro_batches` micro-batches a step.
  GradTree(Backend& be, std::vector<int64_t> unit_starts, int64_t numel, int micro_batches);
  // Buffers of `numel` it keeps: one per level a step's micro-batches can fill at once.
  static int levels(int micro_batches) {
    int k = 0;
    while (micro_batches > 1 && (int64_t(1) << k) <= micro_batches - 1) ++k;
    return k;
  }
  // Unit u's gradient of its next micro-batch is in grads[start(u), start(u + 1)): added into
  // the tree. Until the step's last micro-batch the range is zeroed for the next one; after
  // it, the range holds the step's sum (and the unit starts the next step).
  void fold(int u, float* grads, bool last);
  // The same, the last micro-batch told by the count (ZeRO's reductions finish out of the step's
  // order of calls).
  void fold(int u, float* grads) { fold(u, grads, seen_[size_t(u)] == micro_ - 1); }
  bool idle() const;  // every unit between steps (after its last micro-batch, or none yet)
  void reset();       // a step abandoned halfway: every unit starts over

 private:
  Backend& be_;
  std::vector<int64_t> starts_;  // the units' starts, and numel last
  int micro_;
  std::vector<Tensor> level_;
  std::vector<int> seen_;  // per unit: micro-batches folded this step
};

// A reduce-scatter that adds in the canonical tree when rank r holds leaf r (the micro-batches'
// interleaved assignment, data/batches.h): recursive halving from the lowest rank bit up, so
// the first and largest exchanges pair neighbouring ranks (one node's) and the smallest cross
// nodes. Rank r ends with block r of `in` (size x n elements; permuted and summed in place, `in`
// is spoiled) in `out` (n). size must be a power of two; `half` holds size x n / 2.
// Over a sub-group of g: the `size` ranks (0: all g's ranks / stride) that differ from this
// one only in the rank bits [stride, stride x size); rank r is its (r / stride) % size.
// (TreeReduceScatter's start then finish: one implementation.)
void tree_reduce_scatter(ProcessGroup& g, Backend& be, Buf in, Buf out, Buf half, int stride = 1, int size = 0);
// tree_reduce_scatter cut at its exchanges, as TreeAllReduce is: each run's halvings progress
// from poll(), which the backward's hooks call, so a unit's micro-batch is summed while the next
// units' backwards run. A run's bits are tree_reduce_scatter's. The ranks must start the same runs
// and poll and finish in the same order: each poll advances every run in flight one exchange, in
// start order; finish_through(k) only those up to run k, as often as run k needs.
// Every run has its own `half` (size x n / 2, the permutation's swap included) until it finishes.
class TreeReduceScatter {
 public:
  TreeReduceScatter(ProcessGroup& g, Backend& be) : g_(g), be_(be) {}
  // The blocks permuted and the first exchange issued; over a sub-group as tree_reduce_scatter.
  // Returns the run's number (runs started since construction, from 0).
  int64_t start(Buf in, Buf out, Buf half, int stride = 1, int size = 0);
  void poll() { advance(started_); }
  void finish_through(int64_t run);  // runs 0..run summed into their `out`, later ones untouched
  void finish() { finish_through(started_); }
  bool idle() const { return runs_.empty(); }
  int in_flight() const { return int(runs_.size()); }
  int64_t started() const { return started_; }
  // Runs started while another was in flight, since construction (0: nothing overlapped).
  int64_t overlapped() const { return overlapped_; }

 private:
  // Built by name only (start()): most fields are ints, which a positional list would swap silently.
  struct Run {
    int64_t id;
    Buf in, out, half;
    int64_t n;        // elements a block
    int p;            // the sub-group's ranks
    int v;            // this rank's position: bit_reverse of its place in the sub-group
    int base;         // the group rank of the sub-group's place 0
    int stride;       // between the sub-group's places, in group ranks
    int bit, lo, hi;  // the exchange in flight pairs `bit` of positions [lo, hi)
    int keep_lo = 0, keep_hi = 0;
    Work sent, got;
  };
  void advance(int64_t through);  // every run in flight up to `through`, one exchange
  void issue(Run& r);
  bool complete(Run& r);  // false while halvings are left

  ProcessGroup& g_;
  Backend& be_;
  std::vector<Run> runs_;  // in flight, in start order
  int64_t started_ = 0, overlapped_ = 0;
};

// The bits of r (below size, a power of two) in reverse order.
int bit_reverse(int r, int size);

// What parallel.invariant adds for a rank's flat gradient buffer of n elements in `units`
// ranges: the tree's levels (`grad_tree`) and, over more than 2 ranks, the halves of the tree
// all-reduces of every range at once (`grad_tree_half`: ceil(len / 2) each).
std::vector<PlanItem> grad_tree_plan(int micro_batches, int ranks, int64_t n, int units = 1);

// An in-place sum over `g` that adds in the canonical tree over its ranks (rank r's buffer is
// leaf r): recursive halving (at step s, ranks r and r ^ 2^s exchange halves of their range
// and each adds the half it keeps) then recursive doubling gathers the sums back. It moves the
// ring's bytes in 2 log2(size) steps. size must be a power of two; `half` holds ceil(n / 2).
// The bits pair from `first_bit` up, wrapping round: over dp x cp (cp innermost, 2^first_bit
// ranks) the dp ranks' subtrees meet first, then the cp ranks' parts of each sequence, in the
// order they meet over the cp ranks alone.
void tree_all_reduce(ProcessGroup& g, Backend& be, Buf buf, Buf half, int first_bit = 0);

// tree_all_reduce cut at its exchanges, so that the sums of several ranges (a backward's
// units, each started once its step sum is final) progress while other work runs: the host
// drives them from poll(), which the backward's hooks call. A range's bits are tree_all_reduce's
// (each element is paired by the same bits whatever range holds it). The ranks must start the
// same ranges and poll in the same order: every poll advances every started range exactly one
// exchange (waiting for the one in flight), so the ranks issue the same sends and receives in
// the same order whatever finished first, which groups that pair them by order (NCCL) need.
class TreeAllReduce {
 public:
  // `half`: room for ceil(len / 2) of every range in flight at once.
  TreeAllReduce(ProcessGroup& g, Backend& be, Buf half, int first_bit = 0);
  void start(Buf buf);  // its first exchange is issued
  void poll();
  void finish();  // every started range summed (a step's end)
  bool idle() const { return runs_.empty(); }
  int64_t started() const { return started_; }  // ranges started since construction

 private:
  struct Range {
    int64_t lo, hi;
  };
  struct Run {
    Buf buf, half;
    size_t step = 0;          // the exchange in flight: halvings, then the doublings back
    Range at{};               // the range this rank holds summed so far
    std::vector<Range> kept;  // before each halving, the range both partners held
    Work sent, got;
    Buf add_to, add_from;  // a halving's add, once its exchange is done
    Range next{};          // `at` once it is done
  };
  void issue(Run& r);
  void complete(Run& r);

  ProcessGroup& g_;
  Backend& be_;
  Buf half_;
  std::vector<int> bits_;  // in the order they pair
  std::vector<Run> runs_;  // started and not summed, in start order
  int64_t half_used_ = 0, started_ = 0;
};

}  // namespace loom
