// The roofline profile (log.profile_steps, `loom bench train --profile`): a Backend that wraps
// another and times every op it issues, with an event before and after each on the backend's
// stream (CUDA events on a GPU, the host clock on the CPU), and counts what each op must move
// and compute from its shapes. Nothing waits inside a step: the events are read after the
// step's end, which synchronized the stream already. The wrapped backend runs the same ops in
// the same order, so a profiled run computes the same bits; a run without the key has no
// wrapper at all.
#pragma once
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "model/backend.h"
#include "runtime/trace.h"

namespace loom {

// What one op must move (bytes read and written, each tensor once) and compute (FLOPs of its
// matmuls; 0 for element-wise ops), from its shapes and the backend's element size.
struct OpCost {
  double bytes = 0, flops = 0;
};

// One op family's totals over the profiled steps.
struct ProfileRow {
  std::string family;
  int64_t calls = 0;
  double ms = 0, bytes = 0, flops = 0;
};
struct OpProfile {
  std::vector<ProfileRow> rows;  // in the order first issued
  int64_t steps = 0;
  double step_ms = 0;  // the step windows on the device's timeline, summed
  // Device work issued one call at a time in those steps (kernels, GEMMs, async copies and
  // memsets), counted by the emulated device's runtime; -1 where nothing counts them.
  int64_t launches = -1;
  double ops_ms() const;
  const ProfileRow* find(const std::string& family) const;
};

// The roofline: the device's copy bandwidth (bytes read + written per second) and its GEMM
// rate in the compute dtype, measured once per machine and cached (device_rates).
struct RooflineRates {
  double copy_bw = 0, gemm_flops = 0;
  std::string source;  // what was measured, where and when
};

// The table, one row per family: calls and ms per step, share of the step, MB and GFLOP per
// step, achieved TB/s and TFLOP/s, and the share of the roofline (the time at the copy
// bandwidth or the GEMM rate, whichever is longer, over the time taken); then the device's idle
// time inside a step (the step window minus the ops).
std::string profile_table(const OpProfile& p, const RooflineRates& r);

class ProfiledBackend final : public Backend {
 public:
  explicit ProfiledBackend(std::unique_ptr<Backend> inner);
  ~ProfiledBackend() override;
  // Times the ops issued from now until step_end; trace (if recording) gets them as a GPU track.
  void step_begin(Trace* trace);
  // Ends a profiled step: reads its events (after the step's end synchronized the stream).
  void step_end();
  bool recording() const { return on_; }
  const OpProfile& profile() const { return profile_; }
  // A profiled step's launches, where the device counts them (before step_end).
  void add_launches(int64_t n) { profile_.launches = std::max<int64_t>(profile_.launches, 0) + n; }

  const BackendTraits& traits() const override { return in_->traits(); }
  const Stream& stream() const override { return in_->stream(); }
  Allocator& alloc() override { return in_->alloc(); }

  void copy(Buf dst, Buf src) override;
  void zero(Buf b) override;
  void add(Buf acc, Buf x) override;
  void upload(Buf dst, const void* host) override;
  void download(void* host, Buf src) override;
  Inputs stage_inputs(const int32_t* tokens, const int32_t* targets, const int32_t* pos, int N, int T, int v0,
                      int Vl) override;
  void grad_sum_squares(double* out, const float* grads, const OptTable& t) override;
  void clip_scale(float* scale, const double* sum_squares, double max_norm) override;
  void adamw(float* master, Ptr params, const float* grads, float* m, float* v, const OptTable& t, const AdamScalars& a,
             const float* grad_scale) override;
  void loss_accumulate(double* acc, const float* losses, int N) override;
  void embedding_forward(Ptr out, const Inputs& in, Ptr wte, int v0, int Vl, Ptr wpe, int B, int T, int C) override;
  void embedding_backward(float* dwte, float* dwpe, Ptr dout, const Inputs& in, int v0, int Vl, int B, int T,
                          int C) override;
  void norm_forward(bool rms, Ptr out, float* mean, float* rstd, Ptr inout, Ptr add, Ptr w, Ptr b, int N, int C,
                    float eps) override;
  void norm_backward(bool rms, Ptr dinp, float* dw, float* db, Ptr dout, Ptr inp, Ptr w, const float* mean,
                     const float* rstd, int N, int C) override;
  void add_act(Ptr inout, Ptr x, int64_t n) override;
  void linear_forward(Ptr out, Ptr inp, Ptr w, Ptr bias, int M, int K, int N, WLayout layout) override;
  void linear_backward(Ptr dinp, float* dw, float* dbias, Ptr dout, Ptr inp, Ptr w, int M, int K, int N,
                       WLayout layout) override;
  void linear_forward_grouped(Ptr out, Ptr inp, Ptr w, int G, int64_t w_stride, int M, int K, int N,
                              WLayout layout) override;
  void linear_backward_grouped(Ptr dinp, float* dw, Ptr dout, Ptr inp, Ptr w, int G, int64_t w_stride, int M, int K,
                               int N, WLayout layout) override;
  void linear_forward_ragged(Ptr out, Ptr inp, Ptr w, int G, int64_t w_stride, const int32_t* counts, int sources,
                             int64_t R, int K, int N) override;
  void linear_backward_ragged(Ptr dinp, float* dw, Ptr dout, Ptr inp, Ptr w, int G, int64_t w_stride,
                              const int32_t* counts, int sources, int64_t R, int K, int N) override;
  void act_forward(bool swiglu, Ptr act, Ptr fc, int N, int F) override;
  void act_backward(bool swiglu, Ptr dfc, Ptr fc, Ptr dact, int N, int F) override;
  void down_act_backward(bool swiglu, Ptr dfc, float* dw, float* db, Ptr dout, Ptr act, Ptr fc, Ptr w, Ptr dact, int N,
                         int F, int C, WLayout layout) override;
  void rope(bool inverse, Ptr qkv, const float* cos, const float* sin, int B, int T, int H, int KV, int D,
            const int32_t* pos) override;
  void attention_forward(Ptr out, Ptr stats, Ptr qkv, const AttentionShape& shape) override;
  void attention_backward(Ptr dqkv, Ptr dout, Ptr out, Ptr qkv, Ptr stats, float* scratch,
                          const AttentionShape& shape) override;
  const int32_t* cp_position_table() const override { return in_->cp_position_table(); }
  void attention_kv_extract(Ptr kv, Ptr qkv, int B, int T, int H, int KV, int D) override;
  void attention_block_forward(float* acc, float* ml, Ptr qkv, Ptr kv, const AttentionBlockShape& shape, bool first,
                               float* scratch) override;
  void attention_block_finish(Ptr out, float* lse, const float* acc, const float* ml, int B, int Tq, int H,
                              int D) override;
  void attention_block_delta(float* delta, Ptr dout, Ptr out, int B, int Tq, int H, int D) override;
  void attention_block_backward(float* dq, float* dkv, Ptr dout, Ptr qkv, Ptr kv, const float* lse, const float* delta,
                                const AttentionBlockShape& shape, float* scratch) override;
  void attention_block_grads_store(Ptr dqkv, const float* dq, const float* dkv, int B, int T, int H, int KV,
                                   int D) override;
  void crossentropy(Ptr logits, float* losses, const Inputs& in, int N, int V, int valid, float dloss) override;
  void moe_route(float* probs, int32_t* idx, float* w, Ptr logits, int N, int E, int k) override;
  void moe_plan(int32_t* row_of, int32_t* token_of, int32_t* counts, const int32_t* idx, int N, int E, int k, int cap,
                int slot, int rows, int32_t* scratch) override;
  void moe_ep_maps(int32_t* map_in, int32_t* map_out, const int32_t* from, int P, int El, int slot) override;
  void moe_stats_add(double* st, const int32_t* counts, const float* prob_sums, int N, int E, int k) override;
  void moe_aux_grad(float* g, const int32_t* counts, double scale, int N, int E, int k) override;
  void moe_gather(Ptr rows, Ptr x, const int32_t* token_of_row, int R, int C) override;
  void moe_combine(Ptr out, Ptr rows, const int32_t* row_of, const float* w, int N, int k, int C) override;
  void moe_combine_backward(Ptr drows, float* dw, Ptr dout, Ptr rows, const int32_t* row_of, const float* w, int N,
                            int k, int C) override;
  void moe_scatter_add(Ptr dx, Ptr drows, const int32_t* row_of, int N, int k, int C) override;
  void moe_router_backward(Ptr dlogits, const float* probs, const int32_t* idx, const float* w, const float* dw,
                           const float* aux_g, int N, int E, int k) override;
  void column_sums(float* out, const float* probs, int N, int E) override;
  void ce_stats(Ptr logits, const Inputs& in, int N, int Vl, int valid, int v0, float* rowmax, float* target) override;
  void ce_sumexp(Ptr logits, const float* rowmax, int N, int Vl, int valid, float* sumexp) override;
  void ce_finish(Ptr logits, float* losses, const Inputs& in, int N, int Vl, int valid, int v0, const float* rowmax,
                 const float* sumexp, const float* target, float dloss) override;

 private:
  // Runs f, between two events when recording; family: a string literal (it names the op in
  // the table and the trace).
  template <class F>
  void timed(const char* family, OpCost cost, F&& f);
  std::unique_ptr<Backend> in_;
  bool on_ = false;
  Trace* trace_ = nullptr;
  struct Issued {
    const char* family;
    OpCost cost;
  };
  std::vector<Issued> issued_;  // this step's ops; events 2i and 2i + 1 bracket op i
  std::vector<Event> events_;   // reused every step
  Event origin_, last_;         // the step window
  double origin_us_ = 0;        // the trace's clock when origin_ was recorded
  OpProfile profile_;
};

}  // namespace loom
