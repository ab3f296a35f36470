// Pipeline schedules as data (pure: no communication, no model). For p stages, each holding
// v model chunks (v > 1 only for the interleaved schedule) and m micro-batches, a schedule is
// an ordered list of ops per stage: F (forward of one micro-batch through one chunk), B (its
// backward; with a split backward only the input gradient), W (the weight gradient of a
// split backward), and the sends and receives of activations and gradients between stages.
// Model chunk g (0 .. p*v-1, in layer order) lives on stage g % p as its local chunk g / p
// (Megatron's interleaving; with v = 1, chunk g is stage g); under the V-shaped schedules (zbv,
// dualpipev: v = 2) the chunks fold back, chunk g on stage g for g < p and 2p-1-g after, so the
// first stage holds the embedding and the head, and the last stage hands chunk p-1's output
// to chunk p itself (the local chunk is still g / p).
//
// pipeline_check() proves a table sound before anything runs: every op once, on the right
// stage, in dependency order, every send paired with the receive that consumes it, and no
// deadlock (a simulation in which each stage runs its list in order, a receive waits for its
// send, and sends never block); it also times the table with unit costs, which gives the
// predicted bubble and the micro-batches in flight per stage.
#pragma once
#include <string>
#include <vector>

#include "runtime/config.h"

namespace loom {

struct PipeOp {
  enum Kind { F, B, W, send_act, recv_act, send_grad, recv_grad };
  Kind kind;
  int micro;
  int chunk;      // the model chunk g (global, 0 .. p*v-1) it computes or whose tensor moves
  int peer = -1;  // sends and receives: the other stage
};
const char* pipe_op_name(PipeOp::Kind k);
inline bool pipe_op_is_comm(PipeOp::Kind k) {
  return k > PipeOp::W;
}

// Where model chunk g of a schedule lives: pipe_stage_of (runtime/config.h; see the file comment).
// zbv and dualpipev: two chunks per stage, placed in a V.
bool pipeline_v_shape(PpSchedule kind);

struct PipeSchedule {
  PpSchedule name = PpSchedule::f1b1;
  int stages = 1, virtual_chunks = 1, micro = 1;
  bool split_backward = false;           // B is the input gradient and W the weight gradient (zb, V)
  bool v_shape = false;                  // chunks placed in a V (zbv, dualpipev)
  std::vector<std::vector<PipeOp>> ops;  // per stage
  int chunks() const { return stages * virtual_chunks; }
  int stage_of(int chunk) const { return pipe_stage_of(chunk, stages, v_shape); }
};

// The schedule `name` for p stages, v chunks per stage and m micro-batches. An Error names
// what does not fit (interleaved needs m a multiple of p; v > 1 only with interleaved, where
// the V-shaped schedules need v = 2; dualpipev needs m >= 2p).
PipeSchedule pipeline_schedule(PpSchedule name, int p, int v, int m);

struct PipeTiming {
  double makespan = 0;
  std::vector<double> busy;                     // per stage: time computing
  std::vector<int> peak_in_flight;              // per stage: micro-batch chunks forwarded, not yet done backward
  std::vector<int> peak_in_flight_chunk;        // the same per model chunk
  std::vector<std::vector<double>> start, end;  // per stage, per op (sends and receives take no time)
  double bubble() const;                        // idle over makespan, worst stage
  double bubble_mean() const;                   // idle over makespan, mean over stages
};
// Checks `s` (see the file comment) and times it with costs tf, tb, tw per chunk and
// micro-batch (an unsplit B costs tb + tw). Throws an Error naming the first problem.
PipeTiming pipeline_check(const PipeSchedule& s, double tf = 1.0, double tb = 1.0, double tw = 1.0);
// The same with costs per model chunk (s.chunks() each), and hop[b] between a send and the
// earliest receive of it across boundary b (stage b to b + 1 mod p, either way): the
// step-time model's hand-off times (empty: none).
PipeTiming pipeline_check(const PipeSchedule& s, const std::vector<double>& tf, const std::vector<double>& tb,
                          const std::vector<double>& tw, const std::vector<double>& hop = {});

// The table as the executor issues it: each receive moved ahead to the first op boundary at or
// after its send (on unit costs), where it joins the sends issued there in one group. Posted
// there, every group meets its partners at about the same time on both stages; left just ahead
// of its consumer, a receive can sit behind a group its peer reaches only after sending it
// (interleaved schedules deadlock so under NCCL). Timing is the table's: a receive takes none.
PipeSchedule pipeline_in_order(const PipeSchedule& s);
// The ops one stage issues, in order: its row of pipeline_in_order(s); with no table (pp 1), the
// accumulation loop F0 B0 F1 B1 ... over m micro-batches (1F1B on one stage).
std::vector<PipeOp> pipeline_stage_ops(const PipeSchedule& s, int stage, int m);
// The table under NCCL's rules, as the executor issues it: each run of consecutive sends and
// receives of a stage goes out as one group, and a stage's groups run one at a time in order;
// a group completes once each of its ops has met its partner in the partner stage's current
// group; sends and receives between two stages match in issue order (NCCL has no tags), so the
// k-th send from a to b must carry the tensor b's k-th receive from a expects. Throws an Error
// naming the mismatch, or the stages and groups of a deadlock.
void pipeline_check_in_order(const PipeSchedule& s);
// A stage's op list cut into its runs: per item, the op indices of one compute op or of a
// run of consecutive sends and receives.
std::vector<std::vector<size_t>> pipeline_comm_batches(const std::vector<PipeOp>& ops);

// The closed forms: (p-1)/(m+p-1) (gpipe, 1f1b), (p-1)/(v*m+p-1) (interleaved); zb, zbv and
// dualpipev: the simulated value at tf = tb = tw.
double pipeline_bubble_predicted(const PipeSchedule& s);
const char* pipeline_bubble_formula(const PipeSchedule& s);  // which of them, in words

// A per-stage text timeline (one character per unit of time: F, B, W as the micro-batch's
// last digit under their letter row, '.' idle) with the bubble and peaks.
std::string pipeline_timeline(const PipeSchedule& s, const PipeTiming& t);

}  // namespace loom
