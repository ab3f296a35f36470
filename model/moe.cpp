// The mixture-of-experts layer of a llama block (Mixtral's): a router [E, C], softmax over the
// experts, the top k renormalized; each expert a SwiGLU MLP (w1, w3 [F, C] as one [2F, C]
// matrix, w2 [C, F]). Assignments are sorted by expert on the host, so every expert computes
// on a contiguous run of rows with the plain GEMMs; a capacity drops an expert's later
// assignments in token order. That costs host syncs per layer and micro-batch: the router's
// choices come down and the permutation goes up (with the metrics' probability sums, and in
// backward the load-balancing gradient per expert); under ep also the counts' exchange on the
// host and the row maps. Full recompute repeats the forward's.
// Under tensor parallelism the experts are whole on every tp rank, which runs the layer on
// every row of the micro-batch (sequence parallel gathers them) and keeps its own rows.
#include <algorithm>

#include "model/chunk_bufs.h"

namespace loom {

namespace {
// Calls f(e, r0, n) for each local expert e with rows, [r0, r0 + n) of the expert-major buffers
// (runs: the experts' row offsets, one more than the experts).
template <class F>
void each_expert(const std::vector<int64_t>& runs, F&& f) {
  for (size_t e = 0; e + 1 < runs.size(); ++e)
    if (const int64_t n = runs[e + 1] - runs[e]; n > 0) f(int64_t(e), runs[e], n);
}
// Where local expert e's weights (or gradients) start in its block's: w1 | w3 [2F, C], then w2.
int64_t w13_at(int64_t e, int64_t F, int64_t C) {
  return e * 3 * F * C;
}
int64_t w2_at(int64_t e, int64_t F, int64_t C) {
  return w13_at(e, F, C) + 2 * F * C;
}
}  // namespace

const std::vector<int64_t>& Chunk::moe_runs(const MoeRoute& r) const {
  return ep_size_ > 1 ? r.local : r.offsets;
}

void Chunk::moe_forward(const LayerW& lw, const LayerA& a, Ptr x, Ptr out, bool count, bool recomputing) {
  const int N = B_ * T_, C = C_;
  const auto& mc = cfg_.model.moe;
  const int E = mc.num_experts, k = mc.top_k, Fe = cfg_.model.d_ff;
  const int mi = a.moe;
  const DeviceKind dev = be_.device();
  float* probs = actf(MOE_PROBS, mi);
  int32_t* idx = act(MOE_IDX, mi).as<int32_t>();
  float* w = actf(MOE_W, mi);
  int32_t* row_of = act(MOE_ROW_OF, mi).as<int32_t>();
  int32_t* token = act(MOE_TOKEN, mi).as<int32_t>();
  const Ptr xr = act(MOE_X, mi), fc = act(MOE_FC, mi), ac = act(MOE_ACT, mi), y = act(MOE_Y, mi);
  {
    auto s = trace_.scope("moe_router_forward");
    be_.linear_forward(scr(MOE_LOGITS), x, lw.w[MOE_GATE], Ptr(), N, C, E, WLayout::out_in);
    be_.moe_route(probs, idx, w, scr(MOE_LOGITS), N, E, k);
  }
  // The permutation: assignments in token order, each expert taking at most `cap`.
  const int64_t A = int64_t(N) * k, cap = moe_capacity(cfg_, N);
  moe_host_.resize(size_t(2 * A));
  int32_t* choice = moe_host_.data();
  int32_t* rows_of = choice + A;
  be_.download(choice, Buf(idx, A, DType::i32, dev));
  MoeRoute& route = pieces_[size_t(piece_)].routes[size_t(slot_ * pieces_[size_t(piece_)].moe + mi)];
  std::vector<int64_t> routed(size_t(E), 0), kept(size_t(E), 0);
  for (int64_t i = 0; i < A; ++i) {
    const int e = choice[i];
    ++routed[size_t(e)];
    rows_of[i] = kept[size_t(e)] < cap ? int32_t(kept[size_t(e)]++) : -1;  // its place in expert e's run
  }
  route.offsets.assign(size_t(E) + 1, 0);
  route.share.assign(size_t(E), 0.0f);
  for (int e = 0; e < E; ++e) {
    route.offsets[size_t(e) + 1] = route.offsets[size_t(e)] + kept[size_t(e)];
    route.share[size_t(e)] = float(double(routed[size_t(e)]) / double(A));
  }
  const int64_t R = route.offsets[size_t(E)];
  std::vector<int32_t> token_of(static_cast<size_t>(R));
  for (int64_t i = 0; i < A; ++i)
    if (rows_of[i] >= 0) {
      rows_of[i] += int32_t(route.offsets[size_t(choice[i])]);
      token_of[size_t(rows_of[i])] = int32_t(i / k);
    }
  be_.upload(Buf(row_of, A, DType::i32, dev), rows_of);
  if (R) be_.upload(Buf(token, R, DType::i32, dev), token_of.data());
  if (ep_size_ > 1) moe_exchange_plan(route, a, kept);
  {
    auto s = trace_.scope("moe_experts_forward");
    // Without expert parallelism the local rows are the experts' rows; with it they travel to
    // the experts' ranks and come back.
    const bool ep = ep_size_ > 1;
    const Ptr local = ep ? scr(MOE_SEND) : xr, ye = ep ? scr(MOE_RECV) : y;
    be_.moe_gather(local, x, token, int(R), C);
    if (ep) moe_dispatch(route, a, local, scr(MOE_RECV), xr);
    const std::vector<int64_t>& runs = moe_runs(route);
    const int64_t Rr = runs.back();
    each_expert(runs, [&](int64_t e, int64_t r0, int64_t n) {
      be_.linear_forward(fc + r0 * 2 * Fe, xr + r0 * C, lw.w[MOE_EXPERTS] + w13_at(e, Fe, C), Ptr(), int(n), C, 2 * Fe,
                         WLayout::out_in);
    });
    if (Rr) be_.act_forward(true, ac, fc, int(Rr), Fe);
    each_expert(runs, [&](int64_t e, int64_t r0, int64_t n) {
      be_.linear_forward(ye + r0 * C, ac + r0 * Fe, lw.w[MOE_EXPERTS] + w2_at(e, Fe, C), Ptr(), int(n), Fe, C,
                         WLayout::out_in);
    });
    if (ep) moe_return(route, a, ye, scr(MOE_SEND), y);
  }
  if (recomputing) return;
  {
    auto s = trace_.scope("moe_combine");
    const int64_t t0 = sp_ ? int64_t(tp_rank_) * Ns_ : 0;
    be_.moe_combine(out, y, row_of + t0 * k, w + t0 * k, Ns_, k, C);
  }
  if (!count) return;
  // Statistics: the load-balancing loss E sum_e f_e P_e, the busiest expert over the mean,
  // and the dropped fraction.
  float* sums = scrf(MOE_AUX) + E;
  be_.column_sums(sums, probs, N, E);
  std::vector<float> P(static_cast<size_t>(E));
  be_.download(P.data(), Buf(sums, E, DType::f32, dev));
  double aux = 0.0;
  int64_t busiest = 0;
  for (int e = 0; e < E; ++e) {
    aux += double(route.share[size_t(e)]) * double(P[size_t(e)]) / N;
    busiest = std::max(busiest, routed[size_t(e)]);
  }
  double* st = moe_stats_.data() + 4 * ((a.layer + 1) / mc.every - 1);
  st[0] += E * aux;
  st[1] += double(busiest) / (double(A) / E);
  st[2] += double(A - R) / double(A);
  st[3] += 1;
}

void Chunk::moe_backward(const LayerW& lw, const LayerW& lg, const LayerA& a, Ptr x, Ptr dout, Ptr dx) {
  const int N = B_ * T_, C = C_;
  const auto& mc = cfg_.model.moe;
  const int E = mc.num_experts, k = mc.top_k, Fe = cfg_.model.d_ff;
  const int mi = a.moe;
  const DeviceKind dev = be_.device();
  const MoeRoute& route = pieces_[size_t(piece_)].routes[size_t(slot_ * pieces_[size_t(piece_)].moe + mi)];
  const int64_t R = route.offsets[size_t(E)];
  float* probs = actf(MOE_PROBS, mi);
  const int32_t* idx = act(MOE_IDX, mi).as<int32_t>();
  const float* w = actf(MOE_W, mi);
  const int32_t* row_of = act(MOE_ROW_OF, mi).as<int32_t>();
  const Ptr xr = act(MOE_X, mi), fc = act(MOE_FC, mi), ac = act(MOE_ACT, mi), y = act(MOE_Y, mi);
  const Ptr drows = scr(MOE_DROWS), dfc = scr(MOE_DFC), dact = scr(MOE_DACT);
  float* dw = scrf(MOE_DW);
  {
    auto s = trace_.scope("moe_experts_backward");
    const bool ep = ep_size_ > 1;
    const std::vector<int64_t>& runs = moe_runs(route);
    const int64_t Rr = runs.back();
    if (policy_ == Recompute::selective && Rr) be_.act_forward(true, ac, fc, int(Rr), Fe);
    be_.moe_combine_backward(drows, dw, dout, y, row_of, w, N, k, C);
    // The experts' output gradients, expert-major (sent to the experts' ranks under ep).
    const Ptr dye = ep ? scr(MOE_SEND) : drows, dxe = ep ? scr(MOE_RECV) : drows;
    if (ep) moe_dispatch(route, a, drows, scr(MOE_RECV), dye);
    each_expert(runs, [&](int64_t e, int64_t r0, int64_t n) {
      const int64_t at = w2_at(e, Fe, C);
      be_.linear_backward(dact + r0 * Fe, lg.g[MOE_EXPERTS] + at, nullptr, dye + r0 * C, ac + r0 * Fe,
                          lw.w[MOE_EXPERTS] + at, int(n), Fe, C, WLayout::out_in);
    });
    if (Rr) be_.act_backward(true, dfc, fc, dact, int(Rr), Fe);
    each_expert(runs, [&](int64_t e, int64_t r0, int64_t n) {  // the rows' input gradients
      const int64_t at = w13_at(e, Fe, C);
      be_.linear_backward(dxe + r0 * C, lg.g[MOE_EXPERTS] + at, nullptr, dfc + r0 * 2 * Fe, xr + r0 * C,
                          lw.w[MOE_EXPERTS] + at, int(n), C, 2 * Fe, WLayout::out_in);
    });
    if (ep) moe_return(route, a, dxe, scr(MOE_SEND), drows);
    be_.zero(rows(dx, int64_t(N) * C));
    be_.moe_scatter_add(dx, drows, row_of, N, k, C);
  }
  {
    auto s = trace_.scope("moe_router_backward");
    // The load-balancing term: coef times the mean over MoE layers and over the step's
    // micro-batches (all dp ranks) of E sum_e f_e P_e, P_e the mean of probs[:, e].
    const double scale = mc.aux_loss_coef / (double(cfg_.moe_layers()) * cfg_.accum_steps() * cfg_.parallel.dp) * E / N;
    std::vector<float> aux_g(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) aux_g[size_t(e)] = float(scale * route.share[size_t(e)]);
    float* g_aux = scrf(MOE_AUX);
    be_.upload(Buf(g_aux, E, DType::f32, dev), aux_g.data());
    be_.moe_router_backward(scr(MOE_LOGITS), probs, idx, w, dw, g_aux, N, E, k);
    be_.linear_backward(scr(MOE_DX), lg.g[MOE_GATE], nullptr, scr(MOE_LOGITS), x, lw.w[MOE_GATE], N, C, E,
                        WLayout::out_in);
    be_.add_act(dx, scr(MOE_DX), int64_t(N) * C);
  }
}

void Chunk::moe_exchange_plan(MoeRoute& route, const LayerA& a, const std::vector<int64_t>& kept) {
  const int P = ep_size_, El = cfg_.model.moe.num_experts / P;
  const DeviceKind dev = be_.device();
  // Rows per expert to every rank, for its El experts; back, the rows every rank sends for mine.
  std::vector<int32_t> to(kept.begin(), kept.end()), from(to.size());
  const std::vector<int64_t> each(static_cast<size_t>(P), El);
  {
    StepClock::Scope c(clock_, Phase::comm);
    ep_host_->all_to_all_v(Buf(to.data(), int64_t(to.size())), each, Buf(from.data(), int64_t(from.size())), each)
        .wait();
  }
  route.sent.assign(size_t(P), 0);
  route.received.assign(size_t(P), 0);
  route.local.assign(size_t(El) + 1, 0);
  for (int r = 0; r < P; ++r)
    for (int j = 0; j < El; ++j) {
      route.sent[size_t(r)] += kept[size_t(r * El + j)];
      route.received[size_t(r)] += from[size_t(r * El + j)];
      route.local[size_t(j) + 1] += from[size_t(r * El + j)];
    }
  for (int j = 0; j < El; ++j) route.local[size_t(j) + 1] += route.local[size_t(j)];
  // The received rows come source by source, each source's by expert; expert-major row q of
  // expert j from source r takes received row p.
  const int64_t Rr = route.local[size_t(El)];
  std::vector<int32_t> in(static_cast<size_t>(Rr)), out(static_cast<size_t>(Rr));
  std::vector<int64_t> next(route.local.begin(), route.local.end() - 1);
  for (int64_t r = 0, p = 0; r < P; ++r)
    for (int j = 0; j < El; ++j)
      for (int64_t i = 0; i < from[size_t(r * El + j)]; ++i, ++p) {
        const int64_t q = next[size_t(j)]++;
        in[size_t(q)] = int32_t(p);
        out[size_t(p)] = int32_t(q);
      }
  if (Rr) {
    be_.upload(Buf(act(MOE_MAP_IN, a.moe).p, Rr, DType::i32, dev), in.data());
    be_.upload(Buf(act(MOE_MAP_OUT, a.moe).p, Rr, DType::i32, dev), out.data());
  }
}

void Chunk::moe_dispatch(const MoeRoute& r, const LayerA& a, Ptr in, Ptr recv, Ptr out) {
  const int C = C_;
  const int64_t Rr = r.local.back();
  std::vector<int64_t> sc(r.sent), rc(r.received);
  int64_t R = 0;
  for (auto& v : sc) R += v, v *= C;
  for (auto& v : rc) v *= C;
  {
    auto s = trace_.scope("moe_all_to_all");
    StepClock::Scope c(clock_, Phase::comm);
    ep_->all_to_all_v(rows(in, R * C), sc, rows(recv, Rr * C), rc, be_.stream()).wait_on(be_.stream());
  }
  be_.moe_gather(out, recv, act(MOE_MAP_IN, a.moe).as<int32_t>(), int(Rr), C);
}

void Chunk::moe_return(const MoeRoute& r, const LayerA& a, Ptr in, Ptr send, Ptr out) {
  const int C = C_;
  const int64_t Rr = r.local.back();
  be_.moe_gather(send, in, act(MOE_MAP_OUT, a.moe).as<int32_t>(), int(Rr), C);
  std::vector<int64_t> sc(r.received), rc(r.sent);
  int64_t R = 0;
  for (auto& v : sc) v *= C;
  for (auto& v : rc) R += v, v *= C;
  auto s = trace_.scope("moe_all_to_all");
  StepClock::Scope c(clock_, Phase::comm);
  ep_->all_to_all_v(rows(send, Rr * C), sc, rows(out, R * C), rc, be_.stream()).wait_on(be_.stream());
}

std::vector<double> Chunk::moe_stats_take() {
  std::vector<double> out = moe_stats_;
  std::fill(moe_stats_.begin(), moe_stats_.end(), 0.0);
  return out;
}

}  // namespace loom
