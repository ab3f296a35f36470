#include "parallel/pipeline_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "runtime/error.h"

namespace loom {

const char* pipe_op_name(PipeOp::Kind k) {
  static const char* names[] = {"F", "B", "W", "send_act", "recv_act", "send_grad", "recv_grad"};
  return names[int(k)];
}

namespace {

using Compute = std::vector<std::vector<PipeOp>>;  // per stage, compute ops only

// 1F1B's order on one stage: `warm` forwards, then forward/backward pairs, then the rest of
// the backwards; fwd(k) and bwd(k) give the k-th forward and backward (micro, chunk).
template <class Fwd, class Bwd>
std::vector<PipeOp> one_f_one_b(int total, int warm, Fwd fwd, Bwd bwd) {
  std::vector<PipeOp> ops;
  warm = std::min(warm, total);
  for (int k = 0; k < warm; ++k) ops.push_back(fwd(k));
  for (int i = 0; i < total - warm; ++i) {
    ops.push_back(fwd(warm + i));
    ops.push_back(bwd(i));
  }
  for (int k = total - warm; k < total; ++k) ops.push_back(bwd(k));
  return ops;
}

// 1F1B on every stage of p, one chunk each: stage s warms up with p - s - 1 forwards.
Compute one_f_one_b_stages(int p, int m) {
  Compute out(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s)
    out[size_t(s)] = one_f_one_b(
        m, p - s - 1,
        [&](int k) {
          return PipeOp{PipeOp::F, k, s};
        },
        [&](int k) {
          return PipeOp{PipeOp::B, k, s};
        });
  return out;
}

// ZB-H1: 1F1B's order of forwards and input-gradient backwards on every stage, with each
// weight gradient W deferred into the time the stage would otherwise wait for a receive (on
// a clock with unit costs): a W runs when the next F or B cannot start yet and the W fits
// before it can, or when the next F needs its activations room (a stage keeps at most p
// micro-batches from F until W: 1F1B's peak, stage 0's). The rest of the W's run at the end.
Compute zb_h1(int p, int m) {
  const size_t P = static_cast<size_t>(p), M = static_cast<size_t>(m);
  Compute out(P);
  const Compute fb = one_f_one_b_stages(p, m);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> f_done(P, std::vector<double>(M, inf)), b_done(P, std::vector<double>(M, inf));
  std::vector<size_t> next(P, 0);
  std::vector<int> held(P, 0);
  std::vector<std::vector<int>> w_pending(P);
  std::vector<double> free_at(P, 0);
  auto ready_at = [&](int s, const PipeOp& op) {
    if (op.kind == PipeOp::F) return s == 0 ? 0.0 : f_done[size_t(s - 1)][size_t(op.micro)];
    const double own = f_done[size_t(s)][size_t(op.micro)];
    return std::max(own, s == p - 1 ? own : b_done[size_t(s + 1)][size_t(op.micro)]);
  };
  for (size_t left = 3 * P * M; left > 0; --left) {
    double best_t = inf;
    int best_s = -1;
    PipeOp best{PipeOp::F, 0, 0};
    for (int s = 0; s < p; ++s) {
      const double now = free_at[size_t(s)];
      const bool has_next = next[size_t(s)] < fb[size_t(s)].size();
      const bool has_w = !w_pending[size_t(s)].empty();
      if (!has_next && !has_w) continue;
      double t = inf;
      PipeOp op{PipeOp::W, has_w ? w_pending[size_t(s)].front() : 0, s};
      if (has_next) {
        const PipeOp& n = fb[size_t(s)][next[size_t(s)]];
        const double r = ready_at(s, n);
        const bool room = n.kind != PipeOp::F || held[size_t(s)] < p;
        if (room && r <= now) {
          t = now, op = n;
        } else if (has_w && (!room || r >= now + 1.0)) {
          t = now;  // op stays the W
        } else if (room && r < inf) {
          t = r, op = n;
        }
      } else {
        t = now;
      }
      if (t < best_t) best_t = t, best_s = s, best = op;
    }
    LOOM_ASSERT(best_s >= 0);
    const size_t s = size_t(best_s);
    const double end = best_t + 1.0;
    free_at[s] = end;
    out[s].push_back(best);
    if (best.kind == PipeOp::W) {
      w_pending[s].erase(w_pending[s].begin());
      --held[s];
      continue;
    }
    ++next[s];
    if (best.kind == PipeOp::F) {
      f_done[s][size_t(best.micro)] = end;
      ++held[s];
    } else {
      b_done[s][size_t(best.micro)] = end;
      w_pending[s].push_back(best.micro);
    }
  }
  return out;
}

// ZB-V (the zero-bubble paper's V schedule, in the order torch's pipelining lays it out):
// stage s holds chunks s (down the V) and 2p-1-s (back up), every backward split. Warm-up:
// 2(p-s)-1 forwards of the first chunk, then s pairs (F1, F0), then p-s triples (F1, B1, W1);
// steady: (F0, B0, W0, F1, B1, W1) until every forward has run; cool-down: s pairs (B0, B1),
// p-s pairs (B0, W0), then the remaining W's of the second chunk and of the first. Laid out for
// at least 2p-1 micro-batches; the ops of micro-batches beyond m are dropped. Activations peak
// at 2p of the V's half-size chunks, 1F1B's p micro-batches of a stage.
Compute zb_v(int p, int m) {
  const int n = std::max(2 * p - 1, m), G = 2 * p;
  Compute out(static_cast<size_t>(p));
  for (int st = 0; st < p; ++st) {
    std::vector<PipeOp> o;
    const int c0 = st, c1 = G - 1 - st;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    auto add = [&](PipeOp::Kind k, int micro, int chunk) { o.push_back({k, micro, chunk}); };
    for (int i = 0; i < 2 * (p - st) - 1; ++i) add(PipeOp::F, f0++, c0);
    for (int i = 0; i < st; ++i) add(PipeOp::F, f1++, c1), add(PipeOp::F, f0++, c0);
    for (int i = 0; i < p - st; ++i) add(PipeOp::F, f1++, c1), add(PipeOp::B, b1, c1), add(PipeOp::W, b1++, c1);
    while (f1 < f0 || f0 < n) {
      if (f0 < n) add(PipeOp::F, f0++, c0);
      add(PipeOp::B, b0, c0), add(PipeOp::W, b0++, c0);
      add(PipeOp::F, f1++, c1), add(PipeOp::B, b1, c1), add(PipeOp::W, b1++, c1);
    }
    int w0 = b0, w1 = b1;
    for (int i = 0; i < st; ++i) add(PipeOp::B, b0++, c0), add(PipeOp::B, b1++, c1);
    for (int i = 0; i < p - st; ++i) add(PipeOp::B, b0++, c0), add(PipeOp::W, w0++, c0);
    while (w1 < b1) add(PipeOp::W, w1++, c1);
    while (w0 < b0) add(PipeOp::W, w0++, c0);
    LOOM_ASSERT(f0 == n && f1 == n && b0 == n && b1 == n && w0 == n && w1 == n);
    for (const PipeOp& op : o)
      if (op.micro < m) out[size_t(st)].push_back(op);
  }
  return out;
}

// DualPipeV (DeepSeek's DualPipe folded into a V, as its reference implementation orders it):
// stage s holds chunk s (phase 0, down) and 2p-1-s (phase 1, up); each phase takes its
// micro-batches in order. Eight runs per stage: F0 x 2(p-s-1); (F0 F1) x (s+1); (B1 W F1) x
// (p-s-1); (F0 B1 F1 B0) x (m-2p+s+1), each F and B a pair the reference overlaps (one's
// communication behind the other's compute); (B1 F1 B0) x (p-s-1); (B1 B0) x (s+1), from the
// middle on with W deferred; (W B0) x (p-s-1); W x (s+1). A B whose W is not deferred is
// followed by it at once; deferred W's run oldest first. Needs m >= 2p.
Compute dual_pipe_v(int p, int m) {
  const int G = 2 * p;
  Compute out(static_cast<size_t>(p));
  for (int st = 0; st < p; ++st) {
    std::vector<PipeOp>& o = out[size_t(st)];
    const int c[2] = {st, G - 1 - st};
    int nf[2] = {0, 0}, nb[2] = {0, 0};
    std::deque<PipeOp> w;
    auto F = [&](int ph) { o.push_back({PipeOp::F, nf[ph]++, c[ph]}); };
    auto B = [&](int ph, bool defer) {
      o.push_back({PipeOp::B, nb[ph], c[ph]});
      const PipeOp wop{PipeOp::W, nb[ph]++, c[ph]};
      if (defer)
        w.push_back(wop);
      else
        o.push_back(wop);
    };
    auto W = [&] {
      o.push_back(w.front());
      w.pop_front();
    };
    const int rest = p - st - 1;
    for (int i = 0; i < 2 * rest; ++i) F(0);
    for (int i = 0; i < st + 1; ++i) F(0), F(1);
    for (int i = 0; i < rest; ++i) B(1, true), W(), F(1);
    for (int i = 0; i < m - 2 * p + st + 1; ++i) F(0), B(1, false), F(1), B(0, false);
    for (int i = 0; i < rest; ++i) B(1, false), F(1), B(0, false);
    bool defer = false;
    for (int i = 0; i < st + 1; ++i) {
      if (i == (st + 1) / 2 && st % 2 == 1) defer = true;
      B(1, defer);
      if (i == (st + 1) / 2 && st % 2 == 0) defer = true;
      B(0, defer);
    }
    for (int i = 0; i < rest; ++i) W(), B(0, true);
    for (int i = 0; i < st + 1; ++i) W();
    LOOM_ASSERT(w.empty() && nf[0] == m && nf[1] == m && nb[0] == m && nb[1] == m);
  }
  return out;
}

// The compute lists with the sends and receives they need.
std::vector<std::vector<PipeOp>> with_comm(const PipeSchedule& s, const Compute& compute) {
  const int G = s.chunks();
  std::vector<std::vector<PipeOp>> out(compute.size());
  for (size_t st = 0; st < compute.size(); ++st)
    for (const PipeOp& op : compute[st]) {
      const int g = op.chunk, here = int(st);
      auto& o = out[st];
      if (op.kind == PipeOp::F) {
        if (g > 0 && s.stage_of(g - 1) != here) o.push_back({PipeOp::recv_act, op.micro, g, s.stage_of(g - 1)});
        o.push_back(op);
        if (g + 1 < G && s.stage_of(g + 1) != here) o.push_back({PipeOp::send_act, op.micro, g + 1, s.stage_of(g + 1)});
      } else if (op.kind == PipeOp::B) {
        if (g + 1 < G && s.stage_of(g + 1) != here) o.push_back({PipeOp::recv_grad, op.micro, g, s.stage_of(g + 1)});
        o.push_back(op);
        if (g > 0 && s.stage_of(g - 1) != here) o.push_back({PipeOp::send_grad, op.micro, g - 1, s.stage_of(g - 1)});
      } else {
        o.push_back(op);
      }
    }
  return out;
}

}  // namespace

bool pipeline_v_shape(PpSchedule kind) {
  return kind == PpSchedule::zbv || kind == PpSchedule::dualpipev;
}

PipeSchedule pipeline_schedule(PpSchedule name, int p, int v, int m) {
  LOOM_CHECK(p >= 1 && v >= 1 && m >= 1, "pipeline schedule: stages {}, chunks per stage {}, micro-batches {}", p, v,
             m);
  LOOM_CHECK(v == 1 || name == PpSchedule::interleaved || pipeline_v_shape(name),
             "parallel.pp_virtual = {} needs parallel.pp_schedule = \"interleaved\" (it is \"{}\"); set pp_virtual = 1",
             v, name);
  LOOM_CHECK(
      v == 2 || !pipeline_v_shape(name),
      "parallel.pp_schedule = \"{}\" places two model chunks on each stage; set pp_virtual = 2 (or leave it unset)",
      name);
  LOOM_CHECK(
      name != PpSchedule::dualpipev || m >= 2 * p,
      "parallel.pp_schedule = \"dualpipev\" needs at least 2 x pp = {} micro-batches per step (it has {}); raise "
      "train.global_batch or lower train.micro_batch",
      2 * p, m);
  PipeSchedule s;
  s.name = name;
  s.stages = p;
  s.virtual_chunks = v;
  s.micro = m;
  s.split_backward = name == PpSchedule::zb || pipeline_v_shape(name);
  s.v_shape = pipeline_v_shape(name);
  Compute compute(static_cast<size_t>(p));
  if (name == PpSchedule::gpipe) {
    for (int st = 0; st < p; ++st) {
      for (int i = 0; i < m; ++i) compute[size_t(st)].push_back({PipeOp::F, i, st});
      for (int i = 0; i < m; ++i) compute[size_t(st)].push_back({PipeOp::B, i, st});
    }
  } else if (name == PpSchedule::f1b1) {
    compute = one_f_one_b_stages(p, m);
  } else if (name == PpSchedule::interleaved) {
    LOOM_CHECK(p > 1, "parallel.pp_schedule = \"interleaved\" needs parallel.pp > 1");
    LOOM_CHECK(m % p == 0,
               "parallel.pp_schedule = \"interleaved\" needs a multiple of parallel.pp = {} micro-batches per step, "
               "not {}; change train.global_batch or train.micro_batch",
               p, m);
    const int total = m * v;
    for (int st = 0; st < p; ++st) {
      auto micro = [&](int k) { return (k / (p * v)) * p + k % p; };
      compute[size_t(st)] = one_f_one_b(
          total, (p - st - 1) * 2 + (v - 1) * p,
          [&](int k) {
            return PipeOp{PipeOp::F, micro(k), ((k / p) % v) * p + st};
          },
          [&](int k) {
            return PipeOp{PipeOp::B, micro(k), (v - 1 - (k / p) % v) * p + st};
          });
    }
  } else if (name == PpSchedule::zb) {
    compute = zb_h1(p, m);
  } else if (name == PpSchedule::zbv) {
    compute = zb_v(p, m);
  } else {
    compute = dual_pipe_v(p, m);
  }
  s.ops = with_comm(s, compute);
  return s;
}

double PipeTiming::bubble() const {
  double worst = 0;
  for (double b : busy) worst = std::max(worst, makespan > 0 ? (makespan - b) / makespan : 0.0);
  return worst;
}

double PipeTiming::bubble_mean() const {
  double sum = 0;
  for (double b : busy) sum += makespan > 0 ? (makespan - b) / makespan : 0.0;
  return busy.empty() ? 0.0 : sum / double(busy.size());
}

PipeTiming pipeline_check(const PipeSchedule& s, double tf, double tb, double tw) {
  const size_t G = size_t(s.chunks());
  return pipeline_check(s, std::vector<double>(G, tf), std::vector<double>(G, tb), std::vector<double>(G, tw));
}

PipeTiming pipeline_check(const PipeSchedule& s, const std::vector<double>& tf, const std::vector<double>& tb,
                          const std::vector<double>& tw, const std::vector<double>& hop) {
  const int p = s.stages, G = s.chunks(), m = s.micro;
  LOOM_CHECK(tf.size() == size_t(G) && tb.size() == size_t(G) && tw.size() == size_t(G),
             "schedule {}: costs for {} chunks, {} expected", s.name, tf.size(), G);
  LOOM_CHECK(hop.empty() || hop.size() == size_t(p), "schedule {}: hand-off times for {} boundaries, {} expected",
             s.name, hop.size(), p);
  LOOM_CHECK(int(s.ops.size()) == p, "schedule {}: {} op lists for {} stages", s.name, s.ops.size(), p);
  // Flat tables indexed by (kind, micro, chunk): the planner checks schedules of thousands of
  // micro-batches for every layout it tries.
  auto key = [&](int kind, int micro, int chunk) { return (size_t(kind) * size_t(m) + size_t(micro)) * G + chunk; };
  const size_t keys = size_t(PipeOp::recv_grad + 1) * size_t(m) * size_t(G);
  // Every compute op once, on its chunk's stage; W exactly when the backward is split.
  std::vector<int> seen(keys, 0);
  for (int st = 0; st < p; ++st)
    for (const PipeOp& op : s.ops[size_t(st)]) {
      LOOM_CHECK(op.micro >= 0 && op.micro < m && op.chunk >= 0 && op.chunk < G,
                 "schedule {}: stage {}: {} of micro-batch {} chunk {} is out of range", s.name, st,
                 pipe_op_name(op.kind), op.micro, op.chunk);
      if (op.kind <= PipeOp::W) {
        LOOM_CHECK(s.stage_of(op.chunk) == st, "schedule {}: {} of chunk {} on stage {}, not its stage {}", s.name,
                   pipe_op_name(op.kind), op.chunk, st, s.stage_of(op.chunk));
        LOOM_CHECK(op.kind != PipeOp::W || s.split_backward, "schedule {}: W without a split backward", s.name);
        ++seen[key(int(op.kind), op.micro, op.chunk)];
      }
    }
  for (int k = 0; k < (s.split_backward ? 3 : 2); ++k)
    for (int i = 0; i < m; ++i)
      for (int g = 0; g < G; ++g) {
        const int n = seen[key(k, i, g)];
        LOOM_CHECK(n == 1, "schedule {}: {} of micro-batch {} chunk {} appears {} times", s.name,
                   pipe_op_name(PipeOp::Kind(k)), i, g, n);
      }
  // Simulate: each stage runs its list in order; a compute op needs its inputs (the previous
  // chunk's F, the next chunk's B, its own F before B before W), local or received; a
  // receive needs its send to have run. Sends do not block.
  PipeTiming t;
  t.busy.assign(size_t(p), 0);
  t.peak_in_flight.assign(size_t(p), 0);
  t.start.resize(size_t(p));
  t.end.resize(size_t(p));
  std::vector<double> done(keys, -1);  // compute ops: end time (-1: not yet)
  std::vector<double> sent(keys, -1);  // sends: when the value arrives at sent_to
  std::vector<int> sent_to(keys, -1), received_at(keys, -1);
  size_t sends = 0, receives = 0;
  const size_t P = static_cast<size_t>(p);
  std::vector<size_t> pc(P, 0);
  std::vector<double> clock(P, 0);
  std::vector<int> in_flight(P, 0), in_flight_chunk(size_t(G), 0);
  t.peak_in_flight_chunk.assign(size_t(G), 0);
  for (int st = 0; st < p; ++st) {
    t.start[size_t(st)].assign(s.ops[size_t(st)].size(), 0);
    t.end[size_t(st)].assign(s.ops[size_t(st)].size(), 0);
  }
  auto ready = [&](int st, const PipeOp& op, double* at) {
    auto need = [&](int kind, int micro, int chunk) {
      const double end = done[key(kind, micro, chunk)];
      if (end < 0) return false;
      // Across stages the value must have been received here.
      *at = std::max(*at, end);
      return true;
    };
    auto got = [&](int kind, int micro, int chunk) { return received_at[key(kind, micro, chunk)] == st; };
    *at = clock[size_t(st)];
    switch (op.kind) {
      case PipeOp::F:
        if (op.chunk == 0) return true;
        return s.stage_of(op.chunk - 1) == st ? need(PipeOp::F, op.micro, op.chunk - 1)
                                              : got(PipeOp::send_act, op.micro, op.chunk);
      case PipeOp::B:
        if (!need(PipeOp::F, op.micro, op.chunk)) return false;
        if (op.chunk == G - 1) return true;
        return s.stage_of(op.chunk + 1) == st ? need(PipeOp::B, op.micro, op.chunk + 1)
                                              : got(PipeOp::send_grad, op.micro, op.chunk);
      case PipeOp::W:
        return need(PipeOp::B, op.micro, op.chunk);
      case PipeOp::send_act:
        return need(PipeOp::F, op.micro, op.chunk - 1);
      case PipeOp::send_grad:
        return need(PipeOp::B, op.micro, op.chunk + 1);
      case PipeOp::recv_act:
      case PipeOp::recv_grad: {
        const int kind = op.kind == PipeOp::recv_act ? PipeOp::send_act : PipeOp::send_grad;
        const size_t k = key(kind, op.micro, op.chunk);
        if (sent[k] < 0 || sent_to[k] != st) return false;
        *at = std::max(*at, sent[k]);
        return true;
      }
    }
    return false;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int st = 0; st < p; ++st) {
      auto& ops = s.ops[size_t(st)];
      while (pc[size_t(st)] < ops.size()) {
        const PipeOp& op = ops[pc[size_t(st)]];
        double at = 0;
        if (!ready(st, op, &at)) break;
        double cost = 0;
        const size_t g = size_t(op.chunk);
        if (op.kind == PipeOp::F) cost = tf[g];
        if (op.kind == PipeOp::B) cost = s.split_backward ? tb[g] : tb[g] + tw[g];
        if (op.kind == PipeOp::W) cost = tw[g];
        const double end = at + cost;
        t.start[size_t(st)][pc[size_t(st)]] = at;
        t.end[size_t(st)][pc[size_t(st)]] = end;
        clock[size_t(st)] = end;
        t.busy[size_t(st)] += cost;
        if (op.kind <= PipeOp::W) done[key(int(op.kind), op.micro, op.chunk)] = end;
        if (op.kind == PipeOp::F) {
          t.peak_in_flight[size_t(st)] = std::max(t.peak_in_flight[size_t(st)], ++in_flight[size_t(st)]);
          int& c = t.peak_in_flight_chunk[size_t(op.chunk)];
          c = std::max(c, ++in_flight_chunk[size_t(op.chunk)]);
        }
        if ((op.kind == PipeOp::B && !s.split_backward) || op.kind == PipeOp::W)
          --in_flight[size_t(st)], --in_flight_chunk[size_t(op.chunk)];
        if (op.kind == PipeOp::send_act || op.kind == PipeOp::send_grad) {
          LOOM_CHECK(op.peer >= 0 && op.peer < p && op.peer != st, "schedule {}: stage {}: {} to stage {}", s.name, st,
                     pipe_op_name(op.kind), op.peer);
          const int consumer = op.kind == PipeOp::send_act ? op.chunk : op.chunk;
          LOOM_CHECK(s.stage_of(consumer) == op.peer, "schedule {}: stage {} sends {} of chunk {} to stage {}, not {}",
                     s.name, st, pipe_op_name(op.kind), op.chunk, op.peer, s.stage_of(consumer));
          const int boundary = s.v_shape ? std::min(st, op.peer) : op.kind == PipeOp::send_act ? st : op.peer;
          const double delay = hop.empty() ? 0 : hop[size_t(boundary)];
          const size_t k = key(int(op.kind), op.micro, op.chunk);
          LOOM_CHECK(sent_to[k] < 0, "schedule {}: stage {} sends {} of micro-batch {} chunk {} twice", s.name, st,
                     pipe_op_name(op.kind), op.micro, op.chunk);
          sent[k] = end + delay, sent_to[k] = op.peer, ++sends;
        }
        if (op.kind == PipeOp::recv_act || op.kind == PipeOp::recv_grad) {
          int& r =
              received_at[key(op.kind == PipeOp::recv_act ? PipeOp::send_act : PipeOp::send_grad, op.micro, op.chunk)];
          if (r < 0) r = st, ++receives;
        }
        ++pc[size_t(st)];
        progress = true;
      }
    }
  }
  for (int st = 0; st < p; ++st)
    if (pc[size_t(st)] < s.ops[size_t(st)].size()) {
      const PipeOp& op = s.ops[size_t(st)][pc[size_t(st)]];
      fail("schedule {} deadlocks: stage {} waits forever at op {} ({} of micro-batch {} chunk {})", s.name, st,
           pc[size_t(st)], pipe_op_name(op.kind), op.micro, op.chunk);
    }
  LOOM_CHECK(receives == sends, "schedule {}: {} sends but {} receives", s.name, sends, receives);
  for (double c : clock) t.makespan = std::max(t.makespan, c);
  return t;
}

double pipeline_bubble_predicted(const PipeSchedule& s) {
  const double p = s.stages, m = s.micro, v = s.virtual_chunks;
  if (s.name == PpSchedule::gpipe || s.name == PpSchedule::f1b1) return (p - 1) / (m + p - 1);
  if (s.name == PpSchedule::interleaved) return (p - 1) / (v * m + p - 1);
  return pipeline_check(s, 1, 1, 1).bubble_mean();
}

const char* pipeline_bubble_formula(const PipeSchedule& s) {
  if (s.name == PpSchedule::interleaved) return "(p-1)/(v*m+p-1)";
  if (s.split_backward) return "simulated, F = B = W";
  return "(p-1)/(m+p-1)";
}

std::string pipeline_timeline(const PipeSchedule& s, const PipeTiming& t) {
  const int width = int(t.makespan + 0.5);
  std::string out;
  for (int st = 0; st < s.stages; ++st) {
    std::string kinds(size_t(width), '.'), micros(size_t(width), ' ');
    for (size_t i = 0; i < s.ops[size_t(st)].size(); ++i) {
      const PipeOp& op = s.ops[size_t(st)][i];
      if (op.kind > PipeOp::W) continue;
      for (int x = int(t.start[size_t(st)][i] + 0.5); x < int(t.end[size_t(st)][i] + 0.5) && x < width; ++x) {
        kinds[size_t(x)] = "FBW"[op.kind];
        micros[size_t(x)] = char('0' + op.micro % 10);
      }
    }
    out += fmt::format("stage {:>2} |{}| busy {:.0f} of {:.0f}, peak {} in flight\n         |{}|\n", st, kinds,
                       t.busy[size_t(st)], t.makespan, t.peak_in_flight[size_t(st)], micros);
  }
  return out;
}

}  // namespace loom
