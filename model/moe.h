// The mixture-of-experts layer of a llama block (model/moe.cpp): routing, the permutation to
// the experts and back (over the ep group under expert parallelism), the experts' GEMMs, the
// load-balancing gradient and the statistics the step logs. A DecoderPart holds one and calls
// it for each MoE block with that block's weights and buffers, as it calls ContextParallel.
// Not here: the block's norms and residual (the decoder's), the buffers' sizes (the plan's,
// model/layout.cpp), the reduction of the experts' gradients (parallel/).
#pragma once
#include <cstdint>
#include <vector>

#include "model/backend.h"
#include "runtime/comm/process_group.h"
#include "runtime/step_clock.h"
#include "runtime/trace.h"

namespace loom {

// The shapes of a MoE layer's pass, on the host: the rows of the expert-sorted buffer
// (`rows`), those sent to and received from each ep rank, and the expert-major rows this
// rank's experts compute on (each expert's rows from every source in turn). Padded (a
// capacity): fixed, every expert a slot; dropless: every assignment without ep, and under ep
// from the plan's counts. Each expert's own run stays on the device (the counts).
struct MoeRoute {
  int64_t rows = 0, expert_rows = 0;
  std::vector<int64_t> sent, received;
};

// One MoE block in one micro-batch's pass: its weights and gradients, its saved activations
// (the plan's MOE_* buffers, this block's copy), the chunk's scratch, and where its route is
// kept between forward, a recompute and backward.
struct MoeBlock {
  int layer = 0;                                  // the global block (its statistics' row)
  Ptr gate, experts;                              // router [E, C]; the local experts
  float *g_gate = nullptr, *g_experts = nullptr;  // their gradients (+=), backward
  MoeRoute* route = nullptr;                      // forward writes it, backward reads it
  float* probs = nullptr;                         // [N, E]
  int32_t *idx = nullptr, *row_of = nullptr;      // [N, k]
  float* w = nullptr;                             // [N, k]
  int32_t *token = nullptr, *counts = nullptr;    // the plan's
  Ptr x, fc, act, y;                              // the experts' rows
  int32_t *map_in = nullptr, *map_out = nullptr;  // ep: to and from expert-major order
  Ptr logits, drows, dfc, dact, dx, send, recv;   // scratch
  int32_t *plan = nullptr, *cp_counts = nullptr;  // scratch
  float *dw = nullptr, *aux = nullptr;            // scratch
};

class MoeLayer {
 public:
  // ep: the expert-parallel group (dims.ep > 1, else null), which holds the experts between
  // its ranks and carries the tokens (and, dropless, their counts) to them; cp: the
  // context-parallel group (dims.cp > 1, else null), whose ranks route their own tokens and
  // sum the counts; tp_rank: which rows this rank keeps under sequence parallelism. clock (may
  // be null) is charged with the blocking collectives.
  MoeLayer(const ModelDims& dims, Backend& be, ProcessGroup* ep, ProcessGroup* cp, int tp_rank, Trace& trace,
           StepClock* clock);
  // From the normed input x [N, C] (every row; sp gathers it) to this rank's rows of `out`;
  // recomputing stops before combining (`out` already holds it) and keeps the route; count:
  // add to the statistics.
  void forward(const MoeBlock& b, Ptr x, Ptr out, bool count, bool recomputing);
  // From d(out) over every row [N, C] to dx [N, C] (overwritten); the router's and the
  // experts' weight gradients accumulated.
  void backward(const MoeBlock& b, Ptr x, Ptr dout, Ptr dx);
  // Per MoE layer of the model (dims.moe_layers(); those of other stages stay 0): the sums
  // over the training micro-batches since the last take of moe_row::stats_add's kStats values
  // (kernels/moe_row.h), integers, so that any order of adding them gives the same bits. They
  // add up on the device; a take reads them.
  std::vector<double> stats_take();

 private:
  MoeRoute route_padded() const;
  MoeRoute route_local() const;                   // dropless without ep
  MoeRoute route_counted(const int32_t* counts);  // dropless under ep: the host waits for the counts
  // A micro-batch's first n expert counts (and `sums`, E probability sums, in place, if set)
  // summed over the cp ranks, who each route their own tokens; without cp, counts itself.
  const int32_t* counts_over_cp(const MoeBlock& b, const int32_t* counts, int n, float* sums);
  // The counts of rows per local expert and source (ep rank) that the dropless GEMMs read.
  const int32_t* expert_counts(const MoeBlock& b) const;
  // Expert parallel: local rows [R, C] (sorted by expert, `in`) to the ranks holding their
  // experts, arriving expert-major in `out` (through `recv`), and back (return_rows: from
  // expert-major rows to local order).
  void dispatch(const MoeBlock& b, Ptr in, Ptr recv, Ptr out);
  void return_rows(const MoeBlock& b, Ptr in, Ptr send, Ptr out);
  // The experts' two GEMMs forward, and backward (the weight gradients accumulated): one
  // grouped call each, over padded slots or over runs sized on the device.
  void experts_forward(const MoeBlock& b);
  void experts_backward(const MoeBlock& b, Ptr dye, Ptr dxe);
  Buf rows(Ptr p, int64_t n) const;  // a Buf of n compute-dtype elements at p

  const ModelDims dims_;
  Backend& be_;
  ProcessGroup* ep_;
  ProcessGroup* cp_;
  Trace& trace_;
  StepClock* clock_;
  int N_, C_, P_, El_;  // rows of a micro-batch (every tp rank's), width, ep ranks, local experts
  int Ns_, t0_;         // this rank's rows of the output (sequence parallel keeps its own), the first
  Tensor stats_;        // f64 [kStats per MoE layer] on the device: see stats_take()
};

}  // namespace loom
