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
#include <algorithm>

#include "model/decoder_part_bufs.h"

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

DecoderPart::MoeRoute DecoderPart::moe_route_padded() const {
  const int P = ep_size_, El = dims_.moe.num_experts / P;
  const int64_t slot = moe_slot(dims_, int64_t(B_) * T_);
  MoeRoute r;
  r.rows = int64_t(P) * El * slot;
  r.sent.assign(size_t(P), El * slot);
  r.received = r.sent;
  r.expert_rows = r.rows;
  return r;
}

DecoderPart::MoeRoute DecoderPart::moe_route_local() const {
  MoeRoute r;
  r.rows = moe_rows(dims_, int64_t(B_) * T_);  // dropless: every assignment
  r.sent = r.received = {r.rows};
  r.expert_rows = r.rows;
  return r;
}

DecoderPart::MoeRoute DecoderPart::moe_route_counted(const int32_t* counts) {
  const int P = ep_size_, E = dims_.moe.num_experts, El = E / P;
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

void DecoderPart::moe_forward(const LayerW& lw, const LayerA& a, Ptr x, Ptr out, bool count, bool recomputing) {
  const int N = B_ * T_, C = C_;
  const auto& mc = dims_.moe;
  const int E = mc.num_experts, k = mc.top_k, mi = a.moe, P = ep_size_, El = E / P;
  const int64_t slot = moe_slot(dims_, N);
  const DeviceKind dev = be_.device();
  float* probs = actf(MOE_PROBS, mi);
  int32_t* idx = act(MOE_IDX, mi).as<int32_t>();
  float* w = actf(MOE_W, mi);
  int32_t* row_of = act(MOE_ROW_OF, mi).as<int32_t>();
  int32_t* token = act(MOE_TOKEN, mi).as<int32_t>();
  int32_t* counts = act(MOE_COUNTS, mi).as<int32_t>();
  const Ptr xr = act(MOE_X, mi), y = act(MOE_Y, mi);
  {
    auto s = trace_.scope("moe_router_forward");
    be_.linear_forward(scr(MOE_LOGITS), x, lw.w[MOE_GATE], Ptr(), N, C, E, WLayout::out_in);
    be_.moe_route(probs, idx, w, scr(MOE_LOGITS), N, E, k);
    // A capacity past the slot's N rows takes every assignment all the same (a token picks an
    // expert once).
    const int64_t cap = slot ? std::min(moe_capacity(dims_, N), slot) : moe_capacity(dims_, N);
    be_.moe_plan(row_of, token, counts, idx, N, E, k, int(cap), int(slot), int(moe_rows(dims_, N)),
                 scr(MOE_PLAN).as<int32_t>());
  }
  if (P > 1 && !slot) {  // dropless: the rows each rank sends each of my experts, device to device
    auto s = trace_.scope("moe_all_to_all");
    StepClock::Scope c(clock_, Phase::comm);
    const std::vector<int64_t> each(static_cast<size_t>(P), El);
    ep_->all_to_all_v(Buf(counts + E, E, DType::i32, dev), each, Buf(counts + 2 * E, E, DType::i32, dev), each,
                      be_.stream())
        .wait_on(be_.stream());
  }
  MoeRoute& route = pieces_[size_t(piece_)].routes[size_t(slot_ * pieces_[size_t(piece_)].moe + mi)];
  if (!recomputing)  // a recompute's are the same
    route = slot ? moe_route_padded() : P > 1 ? moe_route_counted(counts) : moe_route_local();
  if (P > 1)
    be_.moe_ep_maps(act(MOE_MAP_IN, mi).as<int32_t>(), act(MOE_MAP_OUT, mi).as<int32_t>(),
                    slot ? nullptr : counts + 2 * E, P, El, int(slot));
  {
    auto s = trace_.scope("moe_experts_forward");
    // Without expert parallelism the local rows are the experts' rows; with it they travel to
    // the experts' ranks and come back.
    const bool ep = P > 1;
    const Ptr local = ep ? scr(MOE_SEND) : xr;
    be_.moe_gather(local, x, token, int(route.rows), C);
    if (ep) moe_dispatch(route, a, local, scr(MOE_RECV), xr);
    moe_experts_forward(route, lw, a);
    if (ep) moe_return(route, a, scr(MOE_RECV), scr(MOE_SEND), y);
  }
  if (recomputing) return;
  {
    auto s = trace_.scope("moe_combine");
    const int64_t t0 = sp_ ? int64_t(tp_rank_) * Ns_ : 0;
    be_.moe_combine(out, y, row_of + t0 * k, w + t0 * k, Ns_, k, C);
  }
  if (!count) return;
  float* sums = scrf(MOE_AUX) + E;
  be_.column_sums(sums, probs, N, E);
  const int32_t* all = moe_counts_over_cp(counts, 2 * E, sums);
  be_.moe_stats_add(moe_stats_.data<double>() + 4 * ((a.layer + 1) / mc.every - 1), all, sums, N * dims_.cp, E, k);
}

const int32_t* DecoderPart::moe_counts_over_cp(const int32_t* counts, int n, float* sums) {
  if (!cp_) return counts;
  const DeviceKind d = be_.device();
  const Stream& st = be_.stream();
  int32_t* c = scr(MOE_CP_COUNTS).as<int32_t>();
  be_.copy(Buf(c, n, DType::i32, d), Buf(const_cast<int32_t*>(counts), n, DType::i32, d));
  auto s = trace_.scope("moe_cp_all_reduce");
  StepClock::Scope sc(clock_, Phase::comm);
  cp_->group().all_reduce(Buf(c, n, DType::i32, d), ReduceOp::sum, st).wait_on(st);
  if (sums) cp_->group().all_reduce(Buf(sums, dims_.moe.num_experts, DType::f32, d), ReduceOp::sum, st).wait_on(st);
  return c;
}

const int32_t* DecoderPart::moe_expert_counts(int mi) {
  const int E = dims_.moe.num_experts;
  // kept [E] per expert without ep; with it, what each rank sends each of my experts [P x El]
  return act(MOE_COUNTS, mi).as<int32_t>() + (ep_size_ > 1 ? 2 * E : E);
}

void DecoderPart::moe_experts_forward(const MoeRoute& r, const LayerW& lw, const LayerA& a) {
  const int C = C_, Fe = dims_.F, P = ep_size_, El = dims_.moe.num_experts / P;
  const Ptr xr = act(MOE_X, a.moe), fc = act(MOE_FC, a.moe), ac = act(MOE_ACT, a.moe);
  const Ptr ye = P > 1 ? scr(MOE_RECV) : act(MOE_Y, a.moe);
  const Ptr w = lw.w[MOE_EXPERTS];
  const int64_t Rr = r.expert_rows, stride = w13_at(1, Fe, C);
  if (const int64_t slot = moe_slot(dims_, int64_t(B_) * T_)) {
    const int M = int(P * slot);
    be_.linear_forward_grouped(fc, xr, w, El, stride, M, C, 2 * Fe, WLayout::out_in);
    be_.act_forward(true, ac, fc, int(Rr), Fe);
    be_.linear_forward_grouped(ye, ac, w + w2_at(0, Fe, C), El, stride, M, Fe, C, WLayout::out_in);
    return;
  }
  const int32_t* counts = moe_expert_counts(a.moe);
  be_.linear_forward_ragged(fc, xr, w, El, stride, counts, P, Rr, C, 2 * Fe);
  if (Rr) be_.act_forward(true, ac, fc, int(Rr), Fe);
  be_.linear_forward_ragged(ye, ac, w + w2_at(0, Fe, C), El, stride, counts, P, Rr, Fe, C);
}

void DecoderPart::moe_experts_backward(const MoeRoute& r, const LayerW& lw, const LayerW& lg, const LayerA& a, Ptr dye,
                                       Ptr dxe) {
  const int C = C_, Fe = dims_.F, P = ep_size_, El = dims_.moe.num_experts / P;
  const Ptr xr = act(MOE_X, a.moe), fc = act(MOE_FC, a.moe), ac = act(MOE_ACT, a.moe);
  const Ptr dfc = scr(MOE_DFC), dact = scr(MOE_DACT), w = lw.w[MOE_EXPERTS];
  float* g = lg.g[MOE_EXPERTS];
  const int64_t Rr = r.expert_rows, stride = w13_at(1, Fe, C);
  if (policy_ == Recompute::selective && Rr) be_.act_forward(true, ac, fc, int(Rr), Fe);
  if (const int64_t slot = moe_slot(dims_, int64_t(B_) * T_)) {
    const int M = int(P * slot);
    be_.linear_backward_grouped(dact, g + w2_at(0, Fe, C), dye, ac, w + w2_at(0, Fe, C), El, stride, M, Fe, C,
                                WLayout::out_in);
    be_.act_backward(true, dfc, fc, dact, int(Rr), Fe);
    be_.linear_backward_grouped(dxe, g, dfc, xr, w, El, stride, M, C, 2 * Fe, WLayout::out_in);
    return;
  }
  const int32_t* counts = moe_expert_counts(a.moe);
  be_.linear_backward_ragged(dact, g + w2_at(0, Fe, C), dye, ac, w + w2_at(0, Fe, C), El, stride, counts, P, Rr, Fe, C);
  if (Rr) be_.act_backward(true, dfc, fc, dact, int(Rr), Fe);
  be_.linear_backward_ragged(dxe, g, dfc, xr, w, El, stride, counts, P, Rr, C, 2 * Fe);  // the rows' input gradients
}

void DecoderPart::moe_backward(const LayerW& lw, const LayerW& lg, const LayerA& a, Ptr x, Ptr dout, Ptr dx) {
  const int N = B_ * T_, C = C_;
  const auto& mc = dims_.moe;
  const int E = mc.num_experts, k = mc.top_k, mi = a.moe;
  const MoeRoute& route = pieces_[size_t(piece_)].routes[size_t(slot_ * pieces_[size_t(piece_)].moe + mi)];
  float* probs = actf(MOE_PROBS, mi);
  const int32_t* idx = act(MOE_IDX, mi).as<int32_t>();
  const float* w = actf(MOE_W, mi);
  const int32_t* row_of = act(MOE_ROW_OF, mi).as<int32_t>();
  const int32_t* counts = act(MOE_COUNTS, mi).as<int32_t>();
  const Ptr y = act(MOE_Y, mi), drows = scr(MOE_DROWS);
  float* dw = scrf(MOE_DW);
  {
    auto s = trace_.scope("moe_experts_backward");
    const bool ep = ep_size_ > 1;
    // A padded slot's rows past its kept ones get no gradient: zero, so they add nothing to
    // the experts' weight gradients.
    if (moe_slot(dims_, N)) be_.zero(rows(drows, route.rows * C));
    be_.moe_combine_backward(drows, dw, dout, y, row_of, w, N, k, C);
    // The experts' output gradients, expert-major (sent to the experts' ranks under ep).
    const Ptr dye = ep ? scr(MOE_SEND) : drows, dxe = ep ? scr(MOE_RECV) : drows;
    if (ep) moe_dispatch(route, a, drows, scr(MOE_RECV), dye);
    moe_experts_backward(route, lw, lg, a, dye, dxe);
    if (ep) moe_return(route, a, dxe, scr(MOE_SEND), drows);
    be_.zero(rows(dx, int64_t(N) * C));
    be_.moe_scatter_add(dx, drows, row_of, N, k, C);
  }
  {
    auto s = trace_.scope("moe_router_backward");
    // The load-balancing term: coef times the mean over MoE layers and over the step's
    // micro-batches (all dp ranks) of E sum_e f_e P_e, P_e the mean of probs[:, e]; under cp
    // over the whole sequences' Nt tokens, of which this rank holds N.
    const int Nt = N * dims_.cp;
    const double scale = mc.aux_loss_coef / (double(dims_.moe_layers()) * dims_.accum * dims_.dp) * E / Nt;
    float* g_aux = scrf(MOE_AUX);
    be_.moe_aux_grad(g_aux, moe_counts_over_cp(counts, E, nullptr), scale, Nt, E, k);
    be_.moe_router_backward(scr(MOE_LOGITS), probs, idx, w, dw, g_aux, N, E, k);
    be_.linear_backward(scr(MOE_DX), lg.g[MOE_GATE], nullptr, scr(MOE_LOGITS), x, lw.w[MOE_GATE], N, C, E,
                        WLayout::out_in);
    be_.add_act(dx, scr(MOE_DX), int64_t(N) * C);
  }
}

void DecoderPart::moe_dispatch(const MoeRoute& r, const LayerA& a, Ptr in, Ptr recv, Ptr out) {
  const int C = C_;
  const int64_t Rr = r.expert_rows;
  std::vector<int64_t> sc(r.sent), rc(r.received);
  for (auto& v : sc) v *= C;
  for (auto& v : rc) v *= C;
  {
    auto s = trace_.scope("moe_all_to_all");
    StepClock::Scope c(clock_, Phase::comm);
    ep_->all_to_all_v(rows(in, r.rows * C), sc, rows(recv, Rr * C), rc, be_.stream()).wait_on(be_.stream());
  }
  be_.moe_gather(out, recv, act(MOE_MAP_IN, a.moe).as<int32_t>(), int(Rr), C);
}

void DecoderPart::moe_return(const MoeRoute& r, const LayerA& a, Ptr in, Ptr send, Ptr out) {
  const int C = C_;
  const int64_t Rr = r.expert_rows;
  be_.moe_gather(send, in, act(MOE_MAP_OUT, a.moe).as<int32_t>(), int(Rr), C);
  std::vector<int64_t> sc(r.received), rc(r.sent);
  for (auto& v : sc) v *= C;
  for (auto& v : rc) v *= C;
  auto s = trace_.scope("moe_all_to_all");
  StepClock::Scope c(clock_, Phase::comm);
  ep_->all_to_all_v(rows(send, Rr * C), sc, rows(out, r.rows * C), rc, be_.stream()).wait_on(be_.stream());
}

std::vector<double> DecoderPart::moe_stats_take() {
  if (!moe_stats_.defined()) return {};
  std::vector<double> out(static_cast<size_t>(moe_stats_.numel()));
  be_.download(out.data(), Buf(moe_stats_));
  be_.zero(Buf(moe_stats_));
  return out;
}

}  // namespace loom
