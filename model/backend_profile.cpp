#include "model/backend_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "runtime/exact_digits.h"

namespace loom {

namespace {

double d(int64_t x) {
  return double(x);
}

// A linear's GEMMs: out = inp W (+ bias) forward; dinp = dout W^T and dW += inp^T dout (an
// fp32 read and write) backward, and the bias gradient's column sums of dout.
OpCost linear_fwd_cost(int64_t M, int64_t K, int64_t N, bool bias, int es) {
  return {d(M * K + K * N + M * N + (bias ? N : 0)) * es, 2.0 * d(M) * d(K) * d(N)};
}
OpCost linear_bwd_cost(int64_t M, int64_t K, int64_t N, bool dinp, bool dw, bool dbias, int es) {
  OpCost c;
  const double gemm = 2.0 * d(M) * d(K) * d(N);
  if (dinp) c.bytes += d(M * N + K * N + M * K) * es, c.flops += gemm;
  if (dw) c.bytes += d(M * N + M * K) * es + 8.0 * d(K * N), c.flops += gemm;
  if (dbias) c.bytes += d(M * N) * es + 8.0 * d(N);
  return c;
}
// GELU reads its input and writes its output; SwiGLU reads both halves of fc [N, 2F].
OpCost act_fwd_cost(bool swiglu, int64_t N, int64_t F, int es) {
  return {d(N * F) * es * (swiglu ? 3 : 2), 0};
}
OpCost act_bwd_cost(bool swiglu, int64_t N, int64_t F, int es) {
  return {d(N * F) * es * (swiglu ? 5 : 3), 0};
}
OpCost operator+(OpCost a, OpCost b) {
  return {a.bytes + b.bytes, a.flops + b.flops};
}

}  // namespace

double OpProfile::ops_ms() const {
  double s = 0;
  for (const ProfileRow& r : rows) s += r.ms;
  return s;
}

const ProfileRow* OpProfile::find(const std::string& family) const {
  for (const ProfileRow& r : rows)
    if (r.family == family) return &r;
  return nullptr;
}

ProfiledBackend::ProfiledBackend(std::unique_ptr<Backend> inner)
    : in_(std::move(inner)), origin_(in_->device()), last_(in_->device()) {}

ProfiledBackend::~ProfiledBackend() = default;

void ProfiledBackend::step_begin(Trace* trace) {
  on_ = true;
  trace_ = trace;
  issued_.clear();
  origin_.record(stream());
  origin_us_ = trace ? trace->now_us() : 0.0;
}

void ProfiledBackend::step_end() {
  if (!on_) return;
  on_ = false;
  last_.record(stream());
  // The step's end synchronized the stream: these events have passed (only ops issued after
  // that sync, none in a step, would be waited for here).
  const double window = Event::elapsed_ms(origin_, last_);
  profile_.step_ms += window;
  profile_.steps += 1;
  const bool traced = trace_ && trace_->recording();
  for (size_t i = 0; i < issued_.size(); ++i) {
    const Issued& op = issued_[i];
    const double ms = Event::elapsed_ms(events_[2 * i], events_[2 * i + 1]);
    auto it = std::find_if(profile_.rows.begin(), profile_.rows.end(),
                           [&](const ProfileRow& r) { return r.family == op.family; });
    if (it == profile_.rows.end()) it = profile_.rows.insert(it, ProfileRow{op.family});
    it->calls += 1, it->ms += ms, it->bytes += op.cost.bytes, it->flops += op.cost.flops;
    if (traced)
      trace_->add(op.family, Trace::gpu, origin_us_ + 1e3 * Event::elapsed_ms(origin_, events_[2 * i]), 1e3 * ms);
  }
  issued_.clear();
}

template <class F>
void ProfiledBackend::timed(const char* family, OpCost cost, F&& f) {
  if (!on_) return f();
  const size_t i = issued_.size();
  while (events_.size() < 2 * i + 2) events_.emplace_back(in_->device());
  events_[2 * i].record(stream());
  f();
  events_[2 * i + 1].record(stream());
  issued_.push_back({family, cost});
}

void ProfiledBackend::copy(Buf dst, Buf src) {
  timed("copy", {double(dst.bytes() + src.bytes()), 0}, [&] { in_->copy(dst, src); });
}
void ProfiledBackend::zero(Buf b) {
  timed("zero", {double(b.bytes()), 0}, [&] { in_->zero(b); });
}
void ProfiledBackend::add(Buf acc, Buf x) {
  timed("add f32", {3.0 * double(acc.bytes()), 0}, [&] { in_->add(acc, x); });
}
void ProfiledBackend::upload(Buf dst, const void* host) {
  timed("upload", {double(dst.bytes()), 0}, [&] { in_->upload(dst, host); });
}
void ProfiledBackend::download(void* host, Buf src) {
  timed("download", {double(src.bytes()), 0}, [&] { in_->download(host, src); });
}
Inputs ProfiledBackend::stage_inputs(const int32_t* tokens, const int32_t* targets, const int32_t* pos, int N, int T,
                                     int v0, int Vl) {
  Inputs r;
  // tokens, targets and the embedding gradient's index; positions and their index with pos
  timed("inputs", {4.0 * N * (pos ? 5 : 3), 0}, [&] { r = in_->stage_inputs(tokens, targets, pos, N, T, v0, Vl); });
  return r;
}

void ProfiledBackend::grad_sum_squares(double* out, const float* grads, const OptTable& t) {
  double n = 0;
  for (const OptChunk& c : t.host) n += c.norm ? c.n : 0;
  timed("grad norm", {4.0 * n, 0}, [&] { in_->grad_sum_squares(out, grads, t); });
}
void ProfiledBackend::clip_scale(float* scale, const double* sum_squares, double max_norm) {
  timed("grad norm", {8.0 * kExactDigits, 0}, [&] { in_->clip_scale(scale, sum_squares, max_norm); });
}
void ProfiledBackend::adamw(float* master, Ptr params, const float* grads, float* m, float* v, const OptTable& t,
                            const AdamScalars& a, const float* grad_scale) {
  double n = 0;
  for (const OptChunk& c : t.host) n += c.n;
  // gradient, moments and master read (16 bytes), moments and master written (12), and the
  // compute-dtype copy of the weights written where a master copy is kept
  timed("adamw", {n * (28.0 + (master ? params.es : 0)), 0},
        [&] { in_->adamw(master, params, grads, m, v, t, a, grad_scale); });
}
void ProfiledBackend::loss_accumulate(double* acc, const float* losses, int N) {
  timed("loss sum", {4.0 * N + 16, 0}, [&] { in_->loss_accumulate(acc, losses, N); });
}

void ProfiledBackend::embedding_forward(Ptr out, const Inputs& in, Ptr wte, int v0, int Vl, Ptr wpe, int B, int T,
                                        int C) {
  const int64_t N = int64_t(B) * T;
  const OpCost c{d(2 * N * C + (wpe ? int64_t(T) * C : 0)) * es() + 4.0 * N, 0};
  timed("embedding fwd", c, [&] { in_->embedding_forward(out, in, wte, v0, Vl, wpe, B, T, C); });
}
void ProfiledBackend::embedding_backward(float* dwte, float* dwpe, Ptr dout, const Inputs& in, int v0, int Vl, int B,
                                         int T, int C) {
  const int64_t N = int64_t(B) * T, rows = in.unique > 0 ? in.unique : N;
  // dout read; the rows of the tokens seen (and the position table) read and written in fp32
  const OpCost c{d(N * C) * es() + 8.0 * d(rows * C + (dwpe ? int64_t(T) * C : 0)) + 4.0 * N, 0};
  timed("embedding bwd", c, [&] { in_->embedding_backward(dwte, dwpe, dout, in, v0, Vl, B, T, C); });
}
void ProfiledBackend::norm_forward(bool rms, Ptr out, float* mean, float* rstd, Ptr inout, Ptr add, Ptr w, Ptr b, int N,
                                   int C, float eps) {
  // the rows read (with add: both read and the sum written back), the output written, the
  // weights (and bias) read, the statistics written
  const int64_t NC = int64_t(N) * C;
  const OpCost c{d((add ? 4 : 2) * NC + (rms ? 1 : 2) * int64_t(C)) * es() + 4.0 * N * (rms ? 1 : 2), 0};
  timed(rms ? "rmsnorm fwd" : "layernorm fwd", c,
        [&] { in_->norm_forward(rms, out, mean, rstd, inout, add, w, b, N, C, eps); });
}
void ProfiledBackend::norm_backward(bool rms, Ptr dinp, float* dw, float* db, Ptr dout, Ptr inp, Ptr w,
                                    const float* mean, const float* rstd, int N, int C) {
  // dout and the input read, the input gradient read and written (+=), the weights read, the
  // statistics read, the weight (and bias) gradients read and written in fp32
  const int64_t NC = int64_t(N) * C;
  const OpCost c{d(4 * NC + C) * es() + 4.0 * N * (rms ? 1 : 2) + 8.0 * C * ((dw ? 1 : 0) + (db ? 1 : 0)), 0};
  timed(rms ? "rmsnorm bwd" : "layernorm bwd", c,
        [&] { in_->norm_backward(rms, dinp, dw, db, dout, inp, w, mean, rstd, N, C); });
}
void ProfiledBackend::add_act(Ptr inout, Ptr x, int64_t n) {
  timed("residual add", {3.0 * d(n) * es(), 0}, [&] { in_->add_act(inout, x, n); });
}
void ProfiledBackend::linear_forward(Ptr out, Ptr inp, Ptr w, Ptr bias, int M, int K, int N, WLayout layout) {
  timed("linear fwd", linear_fwd_cost(M, K, N, bool(bias), es()),
        [&] { in_->linear_forward(out, inp, w, bias, M, K, N, layout); });
}
void ProfiledBackend::linear_backward(Ptr dinp, float* dw, float* dbias, Ptr dout, Ptr inp, Ptr w, int M, int K, int N,
                                      WLayout layout) {
  timed("linear bwd", linear_bwd_cost(M, K, N, bool(dinp), dw, dbias, es()),
        [&] { in_->linear_backward(dinp, dw, dbias, dout, inp, w, M, K, N, layout); });
}
void ProfiledBackend::linear_forward_grouped(Ptr out, Ptr inp, Ptr w, int G, int64_t w_stride, int M, int K, int N,
                                             WLayout layout) {
  OpCost c = linear_fwd_cost(M, K, N, false, es());
  c.bytes *= G, c.flops *= G;
  timed("linear fwd", c, [&] { in_->linear_forward_grouped(out, inp, w, G, w_stride, M, K, N, layout); });
}
void ProfiledBackend::linear_backward_grouped(Ptr dinp, float* dw, Ptr dout, Ptr inp, Ptr w, int G, int64_t w_stride,
                                              int M, int K, int N, WLayout layout) {
  OpCost c = linear_bwd_cost(M, K, N, bool(dinp), dw, false, es());
  c.bytes *= G, c.flops *= G;
  timed("linear bwd", c, [&] { in_->linear_backward_grouped(dinp, dw, dout, inp, w, G, w_stride, M, K, N, layout); });
}
void ProfiledBackend::linear_forward_ragged(Ptr out, Ptr inp, Ptr w, int G, int64_t w_stride, const int32_t* counts,
                                            int sources, int64_t R, int K, int N) {
  // R rows in all (the runs' lengths stay on the device), G weight matrices
  const OpCost c{d(R * K + int64_t(G) * K * N + R * N) * es(), 2.0 * d(R) * K * N};
  timed("linear fwd", c, [&] { in_->linear_forward_ragged(out, inp, w, G, w_stride, counts, sources, R, K, N); });
}
void ProfiledBackend::linear_backward_ragged(Ptr dinp, float* dw, Ptr dout, Ptr inp, Ptr w, int G, int64_t w_stride,
                                             const int32_t* counts, int sources, int64_t R, int K, int N) {
  OpCost c;
  const int64_t W = int64_t(G) * K * N;
  if (dinp) c = c + OpCost{d(R * N + W + R * K) * es(), 2.0 * d(R) * K * N};
  if (dw) c = c + OpCost{d(R * N + R * K) * es() + 8.0 * d(W), 2.0 * d(R) * K * N};
  timed("linear bwd", c,
        [&] { in_->linear_backward_ragged(dinp, dw, dout, inp, w, G, w_stride, counts, sources, R, K, N); });
}
void ProfiledBackend::act_forward(bool swiglu, Ptr act, Ptr fc, int N, int F) {
  timed(swiglu ? "swiglu fwd" : "gelu fwd", act_fwd_cost(swiglu, N, F, es()),
        [&] { in_->act_forward(swiglu, act, fc, N, F); });
}
void ProfiledBackend::act_backward(bool swiglu, Ptr dfc, Ptr fc, Ptr dact, int N, int F) {
  timed(swiglu ? "swiglu bwd" : "gelu bwd", act_bwd_cost(swiglu, N, F, es()),
        [&] { in_->act_backward(swiglu, dfc, fc, dact, N, F); });
}
void ProfiledBackend::down_act_backward(bool swiglu, Ptr dfc, float* dw, float* db, Ptr dout, Ptr act, Ptr fc, Ptr w,
                                        Ptr dact, int N, int F, int C, WLayout layout) {
  // The down projection's backward and the activation's, as the interface defines them
  // (a backend that fuses them moves less: its share of the roofline shows it).
  const OpCost c = linear_bwd_cost(N, F, C, true, dw, db, es()) + act_bwd_cost(swiglu, N, F, es());
  timed(swiglu ? "down+swiglu bwd" : "down+gelu bwd", c,
        [&] { in_->down_act_backward(swiglu, dfc, dw, db, dout, act, fc, w, dact, N, F, C, layout); });
}
void ProfiledBackend::rope(bool inverse, Ptr qkv, const float* cos, const float* sin, int B, int T, int H, int KV,
                           int D, const int32_t* pos) {
  // q and k read and written in place, the cos and sin tables [T, D/2] read
  const OpCost c{2.0 * d(int64_t(B) * T * (H + KV) * D) * es() + 4.0 * T * D, 0};
  timed(inverse ? "rope bwd" : "rope fwd", c, [&] { in_->rope(inverse, qkv, cos, sin, B, T, H, KV, D, pos); });
}

namespace {
// Causal attention's matmuls: QK^T and PV over the lower triangle, 2 x 2 B H T^2 D / 2 forward;
// backward dP, dV, dQ and dK, twice that (a recomputation of P is the kernel's choice, not
// counted).
double causal_flops(int B, int T, int H, int D) {
  return 2.0 * B * H * double(T) * T * D;
}
}  // namespace

void ProfiledBackend::attention_forward(Ptr out, Ptr stats, Ptr qkv, const AttentionShape& shape) {
  const int B = shape.B, T = shape.T, H = shape.H, KV = shape.KV, D = shape.D;
  const int64_t BT = int64_t(B) * T;
  const double st = d(traits().attention_stats(B, T, H)) * dtype_size(traits().attention_stats_dtype());
  const OpCost c{d(BT * (H + 2 * KV) * D + BT * H * D) * es() + st, causal_flops(B, T, H, D)};
  timed("attention fwd", c, [&] { in_->attention_forward(out, stats, qkv, shape); });
}
void ProfiledBackend::attention_backward(Ptr dqkv, Ptr dout, Ptr out, Ptr qkv, Ptr stats, float* scratch,
                                         const AttentionShape& shape) {
  const int B = shape.B, T = shape.T, H = shape.H, KV = shape.KV, D = shape.D;
  const int64_t BT = int64_t(B) * T;
  const double st = d(traits().attention_stats(B, T, H)) * dtype_size(traits().attention_stats_dtype());
  // dout, out and qkv read, dqkv written, the statistics read
  const OpCost c{d(2 * BT * H * D + 2 * BT * (H + 2 * KV) * D) * es() + st, 2 * causal_flops(B, T, H, D)};
  timed("attention bwd", c, [&] { in_->attention_backward(dqkv, dout, out, qkv, stats, scratch, shape); });
}
void ProfiledBackend::attention_kv_extract(Ptr kv, Ptr qkv, int B, int T, int H, int KV, int D) {
  const OpCost c{4.0 * d(int64_t(B) * T * KV * D) * es(), 0};
  timed("cp attention other", c, [&] { in_->attention_kv_extract(kv, qkv, B, T, H, KV, D); });
}
void ProfiledBackend::attention_block_forward(float* acc, float* ml, Ptr qkv, Ptr kv, const AttentionBlockShape& shape,
                                              bool first, float* scratch) {
  const int B = shape.B, Tq = shape.Tq, Tk = shape.Tk, H = shape.H, KV = shape.KV, D = shape.D;
  // A whole block of scores (its mask is the positions'), q and the block's keys and values
  // read, the fp32 accumulator and running max and sum written (and read after the first)
  const int64_t q = int64_t(B) * Tq * H * D, kv_elems = int64_t(B) * Tk * 2 * KV * D, rows = int64_t(B) * H * Tq;
  const OpCost c{d(q + kv_elems) * es() + 4.0 * d(q + 2 * rows) * (first ? 1 : 2), 4.0 * B * H * double(Tq) * Tk * D};
  timed("cp attention fwd", c, [&] { in_->attention_block_forward(acc, ml, qkv, kv, shape, first, scratch); });
}
void ProfiledBackend::attention_block_finish(Ptr out, float* lse, const float* acc, const float* ml, int B, int Tq,
                                             int H, int D) {
  const int64_t q = int64_t(B) * Tq * H * D, rows = int64_t(B) * H * Tq;
  const OpCost c{d(q) * es() + 4.0 * d(q + 3 * rows), 0};
  timed("cp attention other", c, [&] { in_->attention_block_finish(out, lse, acc, ml, B, Tq, H, D); });
}
void ProfiledBackend::attention_block_delta(float* delta, Ptr dout, Ptr out, int B, int Tq, int H, int D) {
  const OpCost c{2.0 * d(int64_t(B) * Tq * H * D) * es() + 4.0 * B * H * Tq, 0};
  timed("cp attention other", c, [&] { in_->attention_block_delta(delta, dout, out, B, Tq, H, D); });
}
void ProfiledBackend::attention_block_backward(float* dq, float* dkv, Ptr dout, Ptr qkv, Ptr kv, const float* lse,
                                               const float* delta, const AttentionBlockShape& shape, float* scratch) {
  const int B = shape.B, Tq = shape.Tq, Tk = shape.Tk, H = shape.H, KV = shape.KV, D = shape.D;
  const int64_t q = int64_t(B) * Tq * H * D, kv_elems = int64_t(B) * Tk * 2 * KV * D, rows = int64_t(B) * H * Tq;
  const OpCost c{d(2 * q + kv_elems) * es() + 8.0 * d(rows) + 8.0 * d(q + kv_elems), 8.0 * B * H * double(Tq) * Tk * D};
  timed("cp attention bwd", c,
        [&] { in_->attention_block_backward(dq, dkv, dout, qkv, kv, lse, delta, shape, scratch); });
}
void ProfiledBackend::attention_block_grads_store(Ptr dqkv, const float* dq, const float* dkv, int B, int T, int H,
                                                  int KV, int D) {
  const int64_t n = int64_t(B) * T * (H + 2 * KV) * D;
  timed("cp attention other", {d(n) * (4 + es()), 0},
        [&] { in_->attention_block_grads_store(dqkv, dq, dkv, B, T, H, KV, D); });
}
void ProfiledBackend::crossentropy(Ptr logits, float* losses, const Inputs& in, int N, int V, int valid, float dloss) {
  // the logits read (and their gradient written over them), the targets read, the losses written
  const OpCost c{d(int64_t(N) * V) * es() * (dloss != 0 ? 2 : 1) + 8.0 * N, 0};
  timed("loss", c, [&] { in_->crossentropy(logits, losses, in, N, V, valid, dloss); });
}
void ProfiledBackend::ce_stats(Ptr logits, const Inputs& in, int N, int Vl, int valid, int v0, float* rowmax,
                               float* target) {
  timed("loss", {d(int64_t(N) * Vl) * es() + 12.0 * N, 0},
        [&] { in_->ce_stats(logits, in, N, Vl, valid, v0, rowmax, target); });
}
void ProfiledBackend::ce_sumexp(Ptr logits, const float* rowmax, int N, int Vl, int valid, float* sumexp) {
  timed("loss", {d(int64_t(N) * Vl) * es() + 8.0 * N, 0},
        [&] { in_->ce_sumexp(logits, rowmax, N, Vl, valid, sumexp); });
}
void ProfiledBackend::ce_finish(Ptr logits, float* losses, const Inputs& in, int N, int Vl, int valid, int v0,
                                const float* rowmax, const float* sumexp, const float* target, float dloss) {
  timed("loss", {d(int64_t(N) * Vl) * es() * (dloss != 0 ? 2 : 1) + 20.0 * N, 0},
        [&] { in_->ce_finish(logits, losses, in, N, Vl, valid, v0, rowmax, sumexp, target, dloss); });
}

void ProfiledBackend::moe_route(float* probs, int32_t* idx, float* w, Ptr logits, int N, int E, int k) {
  const OpCost c{d(int64_t(N) * E) * (es() + 4) + 8.0 * N * k, 0};
  timed("moe routing", c, [&] { in_->moe_route(probs, idx, w, logits, N, E, k); });
}
void ProfiledBackend::moe_plan(int32_t* row_of, int32_t* token_of, int32_t* counts, const int32_t* idx, int N, int E,
                               int k, int cap, int slot, int rows, int32_t* scratch) {
  const OpCost c{8.0 * N * k + 4.0 * (rows + E), 0};
  timed("moe routing", c, [&] { in_->moe_plan(row_of, token_of, counts, idx, N, E, k, cap, slot, rows, scratch); });
}
void ProfiledBackend::moe_ep_maps(int32_t* map_in, int32_t* map_out, const int32_t* from, int P, int El, int slot) {
  timed("moe routing", {12.0 * P * El, 0}, [&] { in_->moe_ep_maps(map_in, map_out, from, P, El, slot); });
}
void ProfiledBackend::moe_stats_add(double* st, const int32_t* counts, const float* prob_sums, int N, int E, int k) {
  timed("moe routing", {8.0 * E + 64, 0}, [&] { in_->moe_stats_add(st, counts, prob_sums, N, E, k); });
}
void ProfiledBackend::moe_aux_grad(float* g, const int32_t* counts, double scale, int N, int E, int k) {
  timed("moe routing", {8.0 * E, 0}, [&] { in_->moe_aux_grad(g, counts, scale, N, E, k); });
}
void ProfiledBackend::moe_gather(Ptr rows, Ptr x, const int32_t* token_of_row, int R, int C) {
  timed("moe gather/scatter", {2.0 * d(int64_t(R) * C) * es() + 4.0 * R, 0},
        [&] { in_->moe_gather(rows, x, token_of_row, R, C); });
}
void ProfiledBackend::moe_combine(Ptr out, Ptr rows, const int32_t* row_of, const float* w, int N, int k, int C) {
  timed("moe gather/scatter", {d(int64_t(N) * (k + 1) * C) * es() + 8.0 * N * k, 0},
        [&] { in_->moe_combine(out, rows, row_of, w, N, k, C); });
}
void ProfiledBackend::moe_combine_backward(Ptr drows, float* dw, Ptr dout, Ptr rows, const int32_t* row_of,
                                           const float* w, int N, int k, int C) {
  timed("moe gather/scatter", {d(int64_t(N) * (2 * k + 1) * C) * es() + 12.0 * N * k, 0},
        [&] { in_->moe_combine_backward(drows, dw, dout, rows, row_of, w, N, k, C); });
}
void ProfiledBackend::moe_scatter_add(Ptr dx, Ptr drows, const int32_t* row_of, int N, int k, int C) {
  timed("moe gather/scatter", {d(int64_t(N) * (k + 2) * C) * es() + 4.0 * N * k, 0},
        [&] { in_->moe_scatter_add(dx, drows, row_of, N, k, C); });
}
void ProfiledBackend::moe_router_backward(Ptr dlogits, const float* probs, const int32_t* idx, const float* w,
                                          const float* dw, const float* aux_g, int N, int E, int k) {
  timed("moe routing", {d(int64_t(N) * E) * (4 + es()) + 12.0 * N * k + 4.0 * E, 0},
        [&] { in_->moe_router_backward(dlogits, probs, idx, w, dw, aux_g, N, E, k); });
}
void ProfiledBackend::column_sums(float* out, const float* probs, int N, int E) {
  timed("moe routing", {4.0 * d(int64_t(N) * E + E), 0}, [&] { in_->column_sums(out, probs, N, E); });
}

std::string profile_table(const OpProfile& p, const RooflineRates& r) {
  if (p.steps == 0) return "profile: no step was profiled\n";
  const double n = double(p.steps), step = p.step_ms / n;
  std::string out = fmt::format("{:<20} {:>7} {:>9} {:>6} {:>10} {:>10} {:>7} {:>8} {:>9}\n", "op family", "calls",
                                "ms/step", "share", "MB/step", "GFLOP/step", "TB/s", "TFLOP/s", "roofline");
  std::vector<const ProfileRow*> rows;
  for (const ProfileRow& row : p.rows) rows.push_back(&row);
  std::stable_sort(rows.begin(), rows.end(), [](auto* a, auto* b) { return a->ms > b->ms; });
  for (const ProfileRow* row : rows) {
    const double ms = row->ms / n, s = row->ms / 1e3;
    // the time the op would take at the copy bandwidth or the GEMM rate, whichever is longer
    const double ideal =
        std::max(r.copy_bw > 0 ? row->bytes / r.copy_bw : 0.0, r.gemm_flops > 0 ? row->flops / r.gemm_flops : 0.0);
    out += fmt::format("{:<20} {:>7.0f} {:>9.3f} {:>5.1f}% {:>10.2f} {:>10.3f} {:>7.3f} {:>8.2f} {:>8.1f}%\n",
                       row->family, double(row->calls) / n, ms, step > 0 ? 100.0 * ms / step : 0.0,
                       row->bytes / n / 1e6, row->flops / n / 1e9, s > 0 ? row->bytes / s / 1e12 : 0.0,
                       s > 0 ? row->flops / s / 1e12 : 0.0, s > 0 ? 100.0 * ideal / s : 0.0);
  }
  const double ops = p.ops_ms() / n, idle = step - ops;
  out += fmt::format("step {:.3f} ms on the device's timeline (mean of {}): ops {:.3f} ms, idle {:.3f} ms ({:.1f}%)\n",
                     step, plural(p.steps, "step"), ops, idle, step > 0 ? 100.0 * idle / step : 0.0);
  out += fmt::format("roofline: copy {:.3f} TB/s, GEMM {:.2f} TFLOP/s ({})\n", r.copy_bw / 1e12, r.gemm_flops / 1e12,
                     r.source);
  return out;
}

}  // namespace loom
