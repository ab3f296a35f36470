// The mixture-of-experts layer of a llama block (Mixtral's): a router [E, C], softmax over the
// experts, the top k renormalized; each expert a SwiGLU MLP (w1, w3 [F, C] as one [2F, C]
// matrix, w2 [C, F]). The backend plans the permutation on its own device (moe_plan): each
// expert's assignments in token order, a capacity dropping the later ones, the rows sorted by
// expert. Nothing comes back to the host but what a shape needs:
//  - with a capacity (capacity_factor > 0) every expert owns a slot of min(capacity, N) rows,
//    padded with zero rows, so every GEMM, gather and all-to-all has a fixed shape: the layer
//    never waits for its device (the experts' GEMMs run as one batched call each);
//  - dropless, the experts' rows are packed, N * top_k of them, and the experts' GEMMs find
//    their runs from the counts on the device (Backend::linear_forward_ragged): the layer never
//    waits either. Under ep the all-to-all's sizes are host arguments (NCCL's and MPI's), so
//    the counts, exchanged over the ep group on the device first, come to the host once per
//    layer and forward; backward and a recompute reuse them.
// The statistics (load-balancing loss, load, dropped fraction) add up on the device until the
// step reads them. Full recompute repeats the forward's plan, bitwise.
// Under tensor parallelism the experts are whole on every tp rank, which runs the layer on
// every row of the micro-batch (sequence parallel gathers them) and keeps its own rows.
#include "model/moe.h"

#include <algorithm>

#include "kernels/moe_row.h"
#include "model/layout.h"

namespace loom {

namespace {
// Where local expert e's weights (or gradients) start in its block's: w1 | w3 [2F, C], then w2.
int64_t w13_at(int64_t e, int64_t F, int64_t C) {
  return e * 3 * F * C;
}
int64_t w2_at(int64_t e, int64_t F, int64_t C) {
  return w13_at(e, F, C) + 2 * F * C;
}
}  // namespace

MoeLayer::MoeLayer(const ModelDims& dims, Backend& be, ProcessGroup* ep, ProcessGroup* cp, int tp_rank, Trace& trace,
                   StepClock* clock)
    : dims_(dims),
      be_(be),
      ep_(ep),
      cp_(cp),
      trace_(trace),
      clock_(clock),
      N_(dims.B * dims.T_local()),
      C_(dims.C),
      P_(ep ? ep->size() : 1),
      El_(dims.moe.num_experts / P_) {
  const bool sp = dims.sp && dims.tp > 1;
  Ns_ = sp ? N_ / dims.tp : N_;
  t0_ = sp ? tp_rank * Ns_ : 0;
  stats_ = be_.alloc().empty({moe_row::kStats * dims.moe_layers()}, DType::f64, Mem::workspace);
  be_.zero(Buf(stats_));
}

Buf MoeLayer::rows(Ptr p, int64_t n) const {
  return Buf(p.p, n, be_.dtype(), be_.device());
}

MoeRoute MoeLayer::route_padded() const {
  const int64_t slot = moe_slot(dims_, N_);
  MoeRoute r;
  r.rows = int64_t(P_) * El_ * slot;
  r.sent.assign(size_t(P_), El_ * slot);
  r.received = r.sent;
  r.expert_rows = r.rows;
  return r;
}

MoeRoute MoeLayer::route_local() const {
  MoeRoute r;
  r.rows = moe_rows(dims_, N_);  // dropless: every assignment
  r.sent = r.received = {r.rows};
  r.expert_rows = r.rows;
  return r;
}

MoeRoute MoeLayer::route_counted(const int32_t* counts) {
  const int P = P_, E = dims_.moe.num_experts, El = El_;
  // routed [E], kept [E] and (ep) the rows each rank sends my experts [P x El]: the one wait.
  std::vector<int32_t> h(size_t((P > 1 ? 3 : 2) * E));
  be_.download(h.data(), Buf(const_cast<int32_t*>(counts), int64_t(h.size()), DType::i32, be_.device()));
  const int32_t *kept = h.data() + E, *from = P > 1 ? h.data() + 2 * E : kept;
  MoeRoute r;
  r.sent.assign(size_t(P), 0);
  r.received.assign(size_t(P), 0);
  for (int s = 0; s < P; ++s)
    for (int j = 0; j < El; ++j) {
      r.sent[size_t(s)] += kept[s * El + j];
      r.received[size_t(s)] += from[s * El + j];
    }
  for (int64_t n : r.sent) r.rows += n;
  for (int64_t n : r.received) r.expert_rows += n;
  return r;
}

void MoeLayer::forward(const MoeBlock& b, Ptr x, Ptr out, bool count, bool recomputing) {
  const int N = N_, C = C_;
  const auto& mc = dims_.moe;
  const int E = mc.num_experts, k = mc.top_k, P = P_, El = El_;
  const int64_t slot = moe_slot(dims_, N);
  const DeviceKind dev = be_.device();
  {
    auto s = trace_.scope("moe_router_forward");
    be_.linear_forward(b.logits, x, b.gate, Ptr(), N, C, E, WLayout::out_in);
    be_.moe_route(b.probs, b.idx, b.w, b.logits, N, E, k);
    // A capacity past the slot's N rows takes every assignment all the same (a token picks an
    // expert once).
    const int64_t cap = slot ? std::min(moe_capacity(dims_, N), slot) : moe_capacity(dims_, N);
    be_.moe_plan(b.row_of, b.token, b.counts, b.idx, N, E, k, int(cap), int(slot), int(moe_rows(dims_, N)), b.plan);
  }
  if (P > 1 && !slot) {  // dropless: the rows each rank sends each of my experts, device to device
    auto s = trace_.scope("moe_all_to_all");
    StepClock::Scope c(clock_, Phase::comm);
    const std::vector<int64_t> each(static_cast<size_t>(P), El);
    ep_->all_to_all_v(Buf(b.counts + E, E, DType::i32, dev), each, Buf(b.counts + 2 * E, E, DType::i32, dev), each,
                      be_.stream())
        .wait_on(be_.stream());
  }
  MoeRoute& route = *b.route;
  if (!recomputing)  // a recompute's are the same
    route = slot ? route_padded() : P > 1 ? route_counted(b.counts) : route_local();
  if (P > 1) be_.moe_ep_maps(b.map_in, b.map_out, slot ? nullptr : b.counts + 2 * E, P, El, int(slot));
  {
    auto s = trace_.scope("moe_experts_forward");
    // Without expert parallelism the local rows are the experts' rows; with it they travel to
    // the experts' ranks and come back.
    const bool ep = P > 1;
    const Ptr local = ep ? b.send : b.x;
    be_.moe_gather(local, x, b.token, int(route.rows), C);
    if (ep) dispatch(b, local, b.recv, b.x);
    experts_forward(b);
    if (ep) return_rows(b, b.recv, b.send, b.y);
  }
  if (recomputing) return;
  {
    auto s = trace_.scope("moe_combine");
    be_.moe_combine(out, b.y, b.row_of + int64_t(t0_) * k, b.w + int64_t(t0_) * k, Ns_, k, C);
  }
  if (!count) return;
  float* sums = b.aux + E;
  be_.column_sums(sums, b.probs, N, E);
  const int32_t* all = counts_over_cp(b, b.counts, 2 * E, sums);
  be_.moe_stats_add(stats_.data<double>() + moe_row::kStats * ((b.layer + 1) / mc.every - 1), all, sums, N * dims_.cp,
                    E, k);
}

const int32_t* MoeLayer::counts_over_cp(const MoeBlock& b, const int32_t* counts, int n, float* sums) {
  if (!cp_) return counts;
  const DeviceKind d = be_.device();
  const Stream& st = be_.stream();
  int32_t* c = b.cp_counts;
  be_.copy(Buf(c, n, DType::i32, d), Buf(const_cast<int32_t*>(counts), n, DType::i32, d));
  auto s = trace_.scope("moe_cp_all_reduce");
  StepClock::Scope sc(clock_, Phase::comm);
  cp_->all_reduce(Buf(c, n, DType::i32, d), ReduceOp::sum, st).wait_on(st);
  if (sums) cp_->all_reduce(Buf(sums, dims_.moe.num_experts, DType::f32, d), ReduceOp::sum, st).wait_on(st);
  return c;
}

const int32_t* MoeLayer::expert_counts(const MoeBlock& b) const {
  const int E = dims_.moe.num_experts;
  // kept [E] per expert without ep; with it, what each rank sends each of my experts [P x El]
  return b.counts + (P_ > 1 ? 2 * E : E);
}

void MoeLayer::experts_forward(const MoeBlock& b) {
  const int C = C_, Fe = dims_.F, P = P_, El = El_;
  const Ptr ye = P > 1 ? b.recv : b.y;
  const Ptr w = b.experts;
  const int64_t Rr = b.route->expert_rows, stride = w13_at(1, Fe, C);
  if (const int64_t slot = moe_slot(dims_, N_)) {
    const int M = int(P * slot);
    be_.linear_forward_grouped(b.fc, b.x, w, El, stride, M, C, 2 * Fe, WLayout::out_in);
    be_.act_forward(true, b.act, b.fc, int(Rr), Fe);
    be_.linear_forward_grouped(ye, b.act, w + w2_at(0, Fe, C), El, stride, M, Fe, C, WLayout::out_in);
    return;
  }
  const int32_t* counts = expert_counts(b);
  be_.linear_forward_ragged(b.fc, b.x, w, El, stride, counts, P, Rr, C, 2 * Fe);
  if (Rr) be_.act_forward(true, b.act, b.fc, int(Rr), Fe);
  be_.linear_forward_ragged(ye, b.act, w + w2_at(0, Fe, C), El, stride, counts, P, Rr, Fe, C);
}

void MoeLayer::experts_backward(const MoeBlock& b, Ptr dye, Ptr dxe) {
  const int C = C_, Fe = dims_.F, P = P_, El = El_;
  const Ptr w = b.experts;
  float* g = b.g_experts;
  const int64_t Rr = b.route->expert_rows, stride = w13_at(1, Fe, C);
  if (dims_.recompute == Recompute::selective && Rr) be_.act_forward(true, b.act, b.fc, int(Rr), Fe);
  if (const int64_t slot = moe_slot(dims_, N_)) {
    const int M = int(P * slot);
    be_.linear_backward_grouped(b.dact, g + w2_at(0, Fe, C), dye, b.act, w + w2_at(0, Fe, C), El, stride, M, Fe, C,
                                WLayout::out_in);
    be_.act_backward(true, b.dfc, b.fc, b.dact, int(Rr), Fe);
    be_.linear_backward_grouped(dxe, g, b.dfc, b.x, w, El, stride, M, C, 2 * Fe, WLayout::out_in);
    return;
  }
  const int32_t* counts = expert_counts(b);
  be_.linear_backward_ragged(b.dact, g + w2_at(0, Fe, C), dye, b.act, w + w2_at(0, Fe, C), El, stride, counts, P, Rr,
                             Fe, C);
  if (Rr) be_.act_backward(true, b.dfc, b.fc, b.dact, int(Rr), Fe);
  be_.linear_backward_ragged(dxe, g, b.dfc, b.x, w, El, stride, counts, P, Rr, C, 2 * Fe);  // the rows' input gradients
}

void MoeLayer::backward(const MoeBlock& b, Ptr x, Ptr dout, Ptr dx) {
  const int N = N_, C = C_;
  const auto& mc = dims_.moe;
  const int E = mc.num_experts, k = mc.top_k;
  const MoeRoute& route = *b.route;
  {
    auto s = trace_.scope("moe_experts_backward");
    const bool ep = P_ > 1;
    // A padded slot's rows past its kept ones get no gradient: zero, so they add nothing to
    // the experts' weight gradients.
    if (moe_slot(dims_, N)) be_.zero(rows(b.drows, route.rows * C));
    be_.moe_combine_backward(b.drows, b.dw, dout, b.y, b.row_of, b.w, N, k, C);
    // The experts' output gradients, expert-major (sent to the experts' ranks under ep).
    const Ptr dye = ep ? b.send : b.drows, dxe = ep ? b.recv : b.drows;
    if (ep) dispatch(b, b.drows, b.recv, dye);
    experts_backward(b, dye, dxe);
    if (ep) return_rows(b, dxe, b.send, b.drows);
    be_.zero(rows(dx, int64_t(N) * C));
    be_.moe_scatter_add(dx, b.drows, b.row_of, N, k, C);
  }
  {
    auto s = trace_.scope("moe_router_backward");
    // The load-balancing term: coef times the mean over MoE layers and over the step's
    // micro-batches (all dp ranks) of E sum_e f_e P_e, P_e the mean of probs[:, e]; under cp
    // over the whole sequences' Nt tokens, of which this rank holds N.
    const int Nt = N * dims_.cp;
    const double scale = mc.aux_loss_coef / (double(dims_.moe_layers()) * dims_.accum * dims_.dp) * E / Nt;
    be_.moe_aux_grad(b.aux, counts_over_cp(b, b.counts, E, nullptr), scale, Nt, E, k);
    be_.moe_router_backward(b.logits, b.probs, b.idx, b.w, b.dw, b.aux, N, E, k);
    be_.linear_backward(b.dx, b.g_gate, nullptr, b.logits, x, b.gate, N, C, E, WLayout::out_in);
    be_.add_act(dx, b.dx, int64_t(N) * C);
  }
}

void MoeLayer::dispatch(const MoeBlock& b, Ptr in, Ptr recv, Ptr out) {
  const int C = C_;
  const MoeRoute& r = *b.route;
  const int64_t Rr = r.expert_rows;
  std::vector<int64_t> sc(r.sent), rc(r.received);
  for (auto& v : sc) v *= C;
  for (auto& v : rc) v *= C;
  {
    auto s = trace_.scope("moe_all_to_all");
    StepClock::Scope c(clock_, Phase::comm);
    ep_->all_to_all_v(rows(in, r.rows * C), sc, rows(recv, Rr * C), rc, be_.stream()).wait_on(be_.stream());
  }
  be_.moe_gather(out, recv, b.map_in, int(Rr), C);
}

void MoeLayer::return_rows(const MoeBlock& b, Ptr in, Ptr send, Ptr out) {
  const int C = C_;
  const MoeRoute& r = *b.route;
  const int64_t Rr = r.expert_rows;
  be_.moe_gather(send, in, b.map_out, int(Rr), C);
  std::vector<int64_t> sc(r.received), rc(r.sent);
  for (auto& v : sc) v *= C;
  for (auto& v : rc) v *= C;
  auto s = trace_.scope("moe_all_to_all");
  StepClock::Scope c(clock_, Phase::comm);
  ep_->all_to_all_v(rows(send, Rr * C), sc, rows(out, r.rows * C), rc, be_.stream()).wait_on(be_.stream());
}

std::vector<double> MoeLayer::stats_take() {
  std::vector<double> out(static_cast<size_t>(stats_.numel()));
  be_.download(out.data(), Buf(stats_));
  be_.zero(Buf(stats_));
  return out;
}

}  // namespace loom
