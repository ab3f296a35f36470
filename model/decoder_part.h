// The decoder, written once: a DecoderPart is a contiguous run of units (the embedding, blocks, the
// head with the loss; a whole model is one part; a pipeline stage holds one or more) with explicit forward and backward
// over one micro-batch, its own flat buffers and its own activation plan, allocated once. Its ops go through a Backend
// (CPU fp32, CPU bf16, CUDA bf16); tensor parallelism (and sequence parallelism) is built in as the conjugate pairs of
// model/tensor_parallel.h. Each block's second residual add rides the norm that follows it (the next block's first
// norm, or the final one), so the stream is summed where it is next read.
// Not here: data parallelism and ZeRO (they reach the weights and gradients through
// UnitAccess), the optimizer, the schedule of micro-batches (the Trainer).
#pragma once
#include <memory>

#include "model/backend.h"
#include "model/context_parallel.h"
#include "model/layout.h"
#include "model/moe.h"
#include "runtime/comm/process_group.h"
#include "runtime/step_clock.h"
#include "runtime/trace.h"

namespace loom {

enum class Pass { forward, backward };
// What a backward computes: everything, or one half of a split backward (the zb schedule):
// input gradients (B, which the previous stage waits for) or weight gradients (W, deferred).
enum class Grads { all, input, weight };

// How forward and backward reach each unit's weights and where its gradients go. The chunk
// calls it at fixed points; plain training reads the flat buffers, data parallelism starts
// reductions from backward_done, ZeRO-3 gathers weights in params() and frees them after.
// Pointers address the unit's first element and stay valid until the matching *_done call;
// a unit may be asked for more than once in a pass (the tied lm_head reads the embedding).
class UnitAccess {
 public:
  virtual ~UnitAccess() = default;
  virtual Ptr params(int unit, Pass pass) = 0;
  virtual float* grads(int unit) = 0;  // accumulate (+=) here
  virtual void forward_done(int unit) { (void)unit; }
  virtual void backward_done(int unit) { (void)unit; }  // this micro-batch's grads are final
  // A split backward's input half is done with the unit's weights (its W half reads none).
  virtual void weights_done(int unit) { (void)unit; }
  // Where the head adds its gradient of a tied embedding when it is kept apart from the
  // embedding's (parallel/tied_head.h; the matrix's first element); null: in the unit's own.
  virtual float* tied_head_grads() { return nullptr; }
};

// Units [unit_lo, unit_hi) of the model: 0 is the embedding, 1..L the blocks, L+1 the head.
struct ChunkPiece {
  int unit_lo = 0, unit_hi = -1;  // -1: through the head
  // Micro-batches whose activations the piece holds at once (its peak in flight in a
  // pipeline's schedule); set_slot() picks the one forward and backward work on.
  int slots = 1;
};
// One run of units, or (a stage of the interleaved schedule) one per model chunk the stage
// holds, in model order: one set of flat buffers over all of them, activations per piece;
// set_piece() picks the one forward and backward work on.
struct PartSpec {
  std::vector<ChunkPiece> pieces{ChunkPiece{}};
};
// The activation plan of each piece, and the scratch they share (each buffer the largest
// piece's): what a DecoderPart allocates, for the memory planner too.
struct ChunkPlan {
  std::vector<ActPlan> pieces;
  std::vector<ActBuffer> scratch;
};
ChunkPlan chunk_plan(const ModelDims& dims, const PartSpec& spec, const BackendTraits& traits);
// The runs of a spec, for model_layout.
std::vector<std::pair<int, int>> chunk_runs(const PartSpec& spec);

class DecoderPart {
 public:
  // full_params / full_grads: whether this rank holds the chunk's whole flat buffers (ZeRO-3
  // and -2 do not; they bring their own UnitAccess). tp: the tensor-parallel group, its size
  // dims.tp. clock (may be null) is charged with the blocking tp collectives. ep: the
  // expert-parallel group (dims.ep > 1), the MoE layer's (model/moe.h). cp: the
  // context-parallel group (dims.cp > 1): the chunk holds T / cp tokens of each
  // sequence, whose global positions come with the inputs (ContextParallel::token_positions).
  DecoderPart(const ModelDims& dims, const PartSpec& spec, Backend& backend, ProcessGroup& tp, Trace& trace,
              StepClock* clock = nullptr, bool full_params = true, bool full_grads = true, ProcessGroup* ep = nullptr,
              ProcessGroup* cp = nullptr);
  ~DecoderPart();

  const ModelDims& dims() const { return dims_; }
  const ModelLayout& layout() const { return layout_; }
  const ParamRegistry& registry() const { return layout_.reg; }
  size_t num_params() const { return layout_.reg.numel(); }
  const ActPlan& plan(int piece) const { return pieces_[size_t(piece)].plan; }
  const ActPlan& plan() const { return plan(piece_); }
  Backend& backend() { return be_; }
  Ptr params() { return ptr_of(params_); }
  float* grads() { return grads_.defined() ? grads_.f32() : nullptr; }
  Tensor& params_tensor() { return params_; }
  Tensor& grads_tensor() { return grads_; }
  UnitAccess& flat() { return *flat_; }
  bool has_embedding() const { return pieces_.front().emb; }  // in any piece
  bool has_head() const { return pieces_.back().head; }
  // A head chunk without the embedding whose lm_head is tied: it holds its own copy of the
  // embedding (a pipeline's last stage), which the optimizer keeps equal to the first stage's.
  bool holds_tied_copy() const { return has_head() && !has_embedding() && dims_.tied; }
  int pieces() const { return int(pieces_.size()); }
  void set_piece(int piece);
  int slots(int piece) const { return pieces_[size_t(piece)].slots; }
  int slots() const { return slots(piece_); }  // of the current piece
  void set_slot(int slot) { slot_ = slot; }
  int vocab_lo() const { return v0_; }                                   // the first vocabulary row this rank holds
  int vocab_rows() const { return V_; }                                  // how many (padded)
  const ContextParallel* context_parallel() const { return cp_.get(); }  // null without cp
  void zero_grad();

  // Forward of one micro-batch: from the tokens (with the embedding) or from input(); to the
  // loss (with the head; losses summed into loss_sum(), and with dloss != 0 the logits become
  // their gradient) or to output().
  void forward(const Inputs& in, float dloss, UnitAccess& acc);
  // Backward: accumulates (+=) the micro-batch's gradients, from the loss or from
  // grad_output(), down to the embedding or to grad_input(). Units finish in reverse order.
  // Grads::input computes grad_input() only and keeps the output gradients the weight
  // gradients need in the slot's stash (the plan has one under the zb schedule); Grads::weight
  // then accumulates the weight gradients from it, finishing the units. Split or not, the
  // gradients are the same bits.
  void backward(const Inputs& in, UnitAccess& acc, Grads part = Grads::all);
  Ptr input();        // [Ns, C]: the activation a chunk without the embedding starts from
  Ptr output();       // [Ns, C]: what a chunk without the head ends with
  Ptr grad_output();  // [Ns, C]: d(output), set before backward
  Ptr grad_input();   // [Ns, C]: d(input) after backward (the same buffer)
  // f64 [kExactDigits]: per-token losses summed since it was last zeroed (head chunk), as exact
  // digits (runtime/exact_digits.h): one micro-batch's sum at a time, so the total is the same
  // bits whichever ranks computed which micro-batches and in whatever order they are added.
  Tensor& loss_sum() { return loss_sum_; }
  // The MoE layers' statistics since the last take (MoeLayer::stats_take); empty without MoE.
  std::vector<double> moe_stats_take() { return moe_ ? moe_->stats_take() : std::vector<double>{}; }

 private:
  struct LayerW;  // pointers of one block's parameters, or gradients
  struct LayerA;  // pointers of one block's activations
  class FlatAccess;
  LayerW layer_w(Ptr unit_base, int l) const;
  LayerW layer_g(float* unit_base, int l) const;
  template <class P>
  void layer_fields(P* out, P unit_base, int l) const;
  LayerA layer_a(int i);
  Ptr at(Ptr unit_base, int unit, const char* name) const;
  float* at(float* unit_base, int unit, const char* name) const;
  Ptr act(int buf, int copy = 0);
  float* actf(int buf, int copy = 0);
  Ptr scr(int buf);
  float* scrf(int buf);
  Buf rows(Ptr p, int64_t n) const;  // a Buf of n compute-dtype elements at p
  // This rank's whole-sequence attention: its heads, the micro-batch's positions.
  AttentionShape attention_shape() const { return {B_, T_, H_, KV_, D_, pos_}; }
  // Communication on the tp group: traced, and charged to the clock's communication.
  template <class F>
  void tp_comm(const char* name, F&& f);
  // Row-parallel linear output `partial` [N, C] -> this rank's rows of `out`, summed over tp
  // (reduce_from_tp in place, or scatter_to_sp into out).
  void row_parallel_exit(Ptr partial, Ptr out);
  // A normed input [Ns, C] -> what a column-parallel linear reads, [N, C] (gather_from_sp).
  Ptr column_parallel_input(Ptr normed, Ptr full);
  // A column-parallel input gradient [N, C] -> this rank's rows, summed over tp.
  Ptr column_parallel_grad(Ptr dfull);
  // The gradient of a row-parallel output, this rank's rows -> [N, C].
  Ptr row_parallel_grad(Ptr drows, Ptr full);
  // Sequence-parallel norm gradients are partial sums: reduce them over tp into `grads`.
  void sp_param_grads_reduce(float* scratch, std::initializer_list<float*> grads, int64_t each);
  // Block forward from residual `in`, with `pending` (the previous block's branch) added into
  // it first; writes the block's MLP branch to `out` unless recomputing (full recompute stops
  // before the down projection, whose output backward does not need and `out` already holds).
  void block_forward(const LayerW& w, const LayerA& a, Ptr in, Ptr pending, Ptr out, bool recomputing);
  // dres holds d(out) on entry and d(in) on return (this rank's rows). With `keep`, no weight
  // gradients (g is empty): the output gradients they need go to the stash.
  void block_backward(const LayerW& w, const LayerW& g, const LayerA& a, Ptr in, Ptr dres, bool keep);
  // The weight gradients of block_backward(keep) from the stash.
  void block_weight_backward(const LayerW& g, const LayerA& a, Ptr in);
  void embedding_forward(const Inputs& in, UnitAccess& acc);
  void head_forward(const Inputs& in, float dloss, Ptr pending, UnitAccess& acc);
  void head_backward(UnitAccess& acc, Grads part);
  // A MoE block's weights, gradients (backward) and buffers, for moe_.
  MoeBlock moe_block(const LayerW& w, const LayerW& g, const LayerA& a);
  // The stash of a split backward: the next n elements of the slot's, in B's order.
  Ptr stash_next(int64_t n);
  Ptr stash_keep(Ptr src, int64_t n);  // B: src copied to the next n

  ModelDims dims_;
  Backend& be_;
  ProcessGroup& tp_;
  Trace& trace_;
  StepClock* clock_;
  bool llama_;
  int B_, T_, C_, H_, KV_, D_, F_, V_, L_;  // H_, KV_, F_, V_: this rank's share under tp (V_ padded)
  int tp_size_, tp_rank_, v0_, valid_;      // v0_: the first vocabulary id this rank holds; valid_: how many are real
  bool sp_;
  int Ns_;  // rows of the norm and residual regions on this rank (N / tp with sp)
  struct Piece {
    int b0, b1;      // blocks [b0, b1)
    bool emb, head;  // whether it starts with the embedding, ends with the head
    int slots;
    ActPlan plan;
    std::vector<Tensor> acts;
    int moe = 0;                   // MoE blocks
    std::vector<int> kind_index;   // per block: its index among the piece's blocks of its kind
    std::vector<MoeRoute> routes;  // per slot and MoE block
  };
  std::vector<Piece> pieces_;
  int piece_ = 0;
  int b0_, b1_;                // the current piece's blocks
  bool emb_here_, head_here_;  // and ends
  Recompute policy_;
  HeadNames names_;
  int lm_unit_;  // the unit holding the lm_head weight (the embedding's when tied)
  int slot_ = 0;
  int64_t stash_used_ = 0;
  ModelLayout layout_;
  Tensor params_, grads_;
  std::vector<Tensor> scratch_;
  Tensor rope_cos_, rope_sin_, loss_sum_;
  bool moe_training_ = false;     // the forward running is a training one
  const int32_t* pos_ = nullptr;  // the micro-batch's Inputs::pos (data.doc_mask's, else cp's), or null
  std::unique_ptr<UnitAccess> flat_;
  std::unique_ptr<ContextParallel> cp_;
  std::unique_ptr<MoeLayer> moe_;  // null without MoE blocks
  CpBuffers cp_buffers();
};

}  // namespace loom
