// How ZeRO cuts a chunk (parallel/zero_geometry.h) and what a rank holds for it: its parts and
// shards, the slots' sizes, the state runs, the optimizer's table and the plan. The class that
// moves the shards is in zero.cpp; parallel.invariant's additions in zero_invariant.cpp.
#include "parallel/zero_geometry.h"

#include <algorithm>

namespace loom {

namespace zero_detail {

namespace {
// A run of a unit sharded over one group: the whole unit over dp; or its dense part over dp
// and a tail split off its end: a MoE block's experts over expert-dp (expert parallel), or a
// pipeline's tied embedding over dp (see ZeroRanks; on the first stage it opens unit 0, so
// there the embedding is the dense part and what follows it the tail).
std::vector<Part> parts_of(const ModelLayout& layout, const ZeroRanks& z) {
  const ParamSpec* tied = z.tied.empty() ? nullptr : layout.reg.find(z.tied);
  std::vector<Part> parts;
  for (int u = 0; u < layout.num_units(); ++u) {
    const int64_t lo = layout.unit_lo(u), hi = lo + layout.unit_len(u);
    int64_t x = hi;  // where the unit's tail starts
    bool expert = false;
    if (z.edp > 0)
      for (auto& spec : layout.reg.all())
        if (int64_t(spec.offset) >= lo && int64_t(spec.offset) < hi && expert_param(spec.name))
          x = std::min(x, int64_t(spec.offset)), expert = true;
    if (tied && int64_t(tied->offset) >= lo && int64_t(tied->offset) < hi) {
      const int64_t t0 = int64_t(tied->offset), t1 = t0 + tied->numel();
      LOOM_ASSERT(!expert && (t0 == lo || t1 == hi));
      x = t0 == lo ? t1 : t0;
    }
    if (x > lo || x == hi) parts.push_back({lo, x - lo, z.dp, z.rank, false, false});
    if (x < hi) parts.push_back({x, hi - x, expert ? z.edp : z.dp, expert ? z.edp_rank : z.rank, expert, true});
  }
  return parts;
}
}  // namespace

// Parts are the chunk's units unless experts are split off; the first and last are the edges
// (the embedding and the head of a whole model), which keep slots of their own.
Geometry geometry(const ModelLayout& layout, const ZeroRanks& z) {
  Geometry g;
  g.parts = parts_of(layout, z);
  const size_t last = g.parts.size() - 1;
  for (size_t u = 0; u <= last; ++u) {
    const Part& p = g.parts[u];
    int64_t s = (p.len + p.n - 1) / p.n;
    s = (s + z.block - 1) / z.block * z.block;  // whole norm blocks
    g.s.push_back(s);
    g.shard += s;
    g.max_unit = std::max(g.max_unit, s * p.n);
    g.max_s = std::max(g.max_s, s);
  }
  return g;
}

// The four slots' sizes: both edges, then two blocks in turn (each the largest unit it serves).
std::vector<SlotSize> slot_sizes(const ModelLayout& layout, const Geometry& g) {
  std::vector<SlotSize> out(4);
  const int last = layout.num_units() - 1;
  for (size_t i = 0, k = 0; k < g.parts.size(); ++i) {
    const Part& d = g.parts[k];
    const int64_t len = layout.unit_len(int(i));
    LOOM_ASSERT(!d.tail);  // every unit starts with its dense part
    SlotSize z{std::max(len, g.s[k] * d.n), 0, g.s[k]};
    ++k;
    if (k < g.parts.size() && g.parts[k].tail) {  // the same unit's tail
      z.aux = g.s[k] * g.parts[k].n;
      z.result += g.s[k];
      ++k;
    }
    const bool edge0 = i == 0, edge1 = int(i) == last;
    for (size_t c = 0; c < out.size(); ++c) {
      if (c == 0 ? !edge0 : c == 1 ? !edge1 : edge0 || edge1) continue;
      out[c].buf = std::max(out[c].buf, z.buf);
      out[c].aux = std::max(out[c].aux, z.aux);
      out[c].result = std::max(out[c].result, z.result);
    }
  }
  return out;
}

}  // namespace zero_detail

using namespace zero_detail;

ZeroRanks zero_ranks(const DataParallelOptions& o, const ModelDims& dims, int dp, int rank, int edp_rank) {
  const int edp = o.ep > 1 ? dp / o.ep : 0;
  return {dp, rank, edp, edp ? edp_rank : 0, o.tied_across ? head_names(dims).wte : "", norm_block(dims)};
}

std::vector<StateRun> zero_state_runs(const ModelLayout& layout, const ZeroRanks& z) {
  const Geometry g = geometry(layout, z);
  std::vector<StateRun> runs;
  int64_t shard_off = 0;
  for (size_t u = 0; u < g.parts.size(); ++u) {
    const Part& p = g.parts[u];
    const int64_t len = p.len, s = g.s[u];
    const int64_t a = p.lo + std::min(len, p.r * s), b = p.lo + std::min(len, (p.r + 1) * s);
    for (auto& spec : layout.reg.all()) {
      const int64_t lo = std::max(a, int64_t(spec.offset)), hi = std::min(b, int64_t(spec.offset) + spec.numel());
      if (lo < hi) runs.push_back({&spec, lo, shard_off + (lo - a), hi - lo});
    }
    shard_off += s;
  }
  return runs;
}

namespace {
// How far into its unit a run starts (the norm's blocks count from the unit's start).
int64_t unit_offset(const std::vector<int64_t>& units, int64_t flat) {
  return flat - *(std::upper_bound(units.begin(), units.end(), flat) - 1);
}
}  // namespace

std::vector<OptChunk> zero_opt_chunks(const ModelLayout& layout, const ZeroRanks& z, int stage, int tp_rank,
                                      const char* uncounted) {
  std::vector<OptChunk> chunks;
  const std::vector<int64_t> units = unit_starts(layout);
  for (const StateRun& run : zero_state_runs(layout, z))
    opt_chunks_add(chunks, run.state, stage >= 3 ? run.state : run.flat, stage >= 2 ? run.state : run.flat, run.n,
                   run.spec->decay,
                   (!run.spec->replicated() || tp_rank == 0) && !(uncounted && run.spec->name == uncounted),
                   unit_offset(units, run.flat), z.block);
  return chunks;
}

std::vector<PlanItem> zero_plan(const ModelLayout& layout, const ZeroRanks& z, int stage, int /*tp_rank*/, DType dtype,
                                DType reduce, DeviceKind device, bool keep_gathered) {
  const Geometry g = geometry(layout, z);
  const bool low = reduce == DType::bf16;
  std::vector<PlanItem> p;
  if (stage >= 3) p.push_back({"zero_shard_params", g.shard, dtype, Mem::params});
  if (stage >= 3 && keep_gathered) p.push_back({"zero_param_full", int64_t(layout.reg.numel()), dtype, Mem::params});
  if (stage >= 2) p.push_back({"zero_shard_grads", g.shard, DType::f32, Mem::grads});
  if (stage == 1) {  // a padded unit, and the rank's reduced shard after it
    p.push_back({"zero_grad_bounce", g.max_unit + g.max_s, DType::f32, Mem::comm});
    if (low) p.push_back({"zero_grad_bounce_bf16", g.max_unit + g.max_s, DType::bf16, Mem::comm});
  }
  if (stage <= 2) p.push_back({"zero_param_bounce", g.max_unit, dtype, Mem::comm});
  const std::vector<SlotSize> slots = slot_sizes(layout, g);
  if (stage >= 2)  // gradient slots, each with its shard-sized result (and an expert tail's copy)
    for (const SlotSize& e : slots) {
      p.push_back({"zero_grad_slot", e.buf, DType::f32, Mem::comm});
      p.push_back({"zero_grad_result", std::max<int64_t>(1, e.result), DType::f32, Mem::comm});
      if (e.aux && !low) p.push_back({"zero_grad_aux", e.aux, DType::f32, Mem::comm});
      if (low) {
        p.push_back({"zero_grad_slot_bf16", e.buf, DType::bf16, Mem::comm});
        p.push_back({"zero_grad_result_bf16", std::max<int64_t>(1, e.result), DType::bf16, Mem::comm});
        if (e.aux) p.push_back({"zero_grad_aux_bf16", e.aux, DType::bf16, Mem::comm});
      }
    }
  if (stage >= 3)  // gathered weights: one block computing, one prefetched
    for (const SlotSize& e : slots) {
      p.push_back({"zero_param_slot", e.buf, dtype, Mem::comm});
      if (e.aux) p.push_back({"zero_param_aux", e.aux, dtype, Mem::comm});
    }
  size_t n_chunks = 0;
  const std::vector<int64_t> units = unit_starts(layout);
  for (const StateRun& run : zero_state_runs(layout, z))
    n_chunks += opt_chunks_count(run.n, unit_offset(units, run.flat), z.block);
  for (auto& item : AdamW::plan(g.shard, dtype != DType::f32, n_chunks, device)) p.push_back(item);
  return p;
}

}  // namespace loom
