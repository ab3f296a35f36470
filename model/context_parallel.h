// Context parallel (parallel.cp = N): each sequence of T tokens is cut into 2N chunks of
// c = T / 2N tokens, and rank i of the cp group holds chunks i and 2N-1-i, so that under the
// causal mask every rank does the same attention work (an early chunk sees few keys, its
// partner many). Positions stay global: the embedding and RoPE read each token's place in the
// whole sequence. Everything but attention is per token and runs on the rank's own T / N rows;
// attention brings the other ranks' keys and values to this rank's queries:
//   ring:      blocks travel around the cp ring by send/receive, each transfer overlapped with
//              the attention of the block already held; partial outputs merge by the online
//              softmax (running max and sum). Backward passes the blocks round again, each
//              with its key/value gradient, which is summed on the way and arrives home last.
//   allgather: every rank's keys and values gathered at once (small under GQA), attention over
//              them, their gradients reduce-scattered back. Simpler, more memory (N blocks).
// Either way a rank keeps only the log-sum-exp; backward recomputes P block by block.
// Weights are replicated over cp: gradients reduce over dp x cp (Axis::dcp).
#pragma once
#include <cstdint>
#include <vector>

#include "model/backend.h"
#include "runtime/comm/process_group.h"
#include "runtime/step_clock.h"
#include "runtime/trace.h"

namespace loom {

// The global positions of the T / cp tokens of a sequence that cp rank `rank` holds, in order.
std::vector<int32_t> cp_positions(int T, int cp, int rank);
// This rank's tokens of B sequences: out [B, T / cp] from in [B, T], by cp_positions.
void cp_select(int32_t* out, const int32_t* in, int B, int T, int cp, int rank);

// Where attention works: the chunk's cp_* scratch (model/layout.cpp plans their sizes).
struct CpBuffers {
  Ptr kv;         // key/value blocks [B, T/cp, 2 KV D]: ring 2, allgather cp + 1
  float* acc;     // [B, T/cp, H D]: the running output; backward: dq
  float* ml;      // [B, H, T/cp, 2]: running max and sum; backward: delta
  float* dkv;     // key/value gradient blocks: ring 3, allgather cp + 1
  float* scores;  // the kernels' scores, attention_block_scratch(B, T/cp, T/cp, H, KV)
};

class ContextParallel {
 public:
  // cp: the context-parallel group (of parallel.cp ranks); clock (may be null) is charged with
  // the time spent waiting for transfers, which is the exposed communication.
  ContextParallel(const ModelDims& dims, Backend& be, ProcessGroup& cp, Trace& trace, StepClock* clock);
  // The global positions of this rank's tokens, [B * T / cp] (each sequence's the same).
  const std::vector<int32_t>& token_positions() const { return token_pos_; }
  ProcessGroup& group() const { return cp_; }
  // out [B, Tl, H D] and lse [B, H, Tl] from this rank's qkv [B, Tl, (H + 2KV) D] (H, KV: this
  // tp rank's heads); doc [B, Tl]: with data.doc_mask, each token's position in its document
  // (its keys start at its document's first token), else null.
  void forward(Ptr out, float* lse, Ptr qkv, const int32_t* doc, const CpBuffers& buf, int H, int KV, int D);
  // dqkv [B, Tl, (H + 2KV) D] overwritten, from dout and what forward kept.
  void backward(Ptr dqkv, Ptr dout, Ptr out, Ptr qkv, const float* lse, const int32_t* doc, const CpBuffers& buf, int H,
                int KV, int D);

 private:
  // Rank `rank`'s positions where the block kernels read them.
  const int32_t* pos_of(int rank) const { return (table_ ? table_ : pos_.data()) + size_t(rank) * Tl_; }
  // Sends `send` to the next rank of the ring and receives `recv` from the previous one, paired
  // in one group (NCCL completes a send only once its peer has started the receive).
  void ring_pass(const char* name, Buf send, Buf recv, int tag, Work* sent, Work* got);
  // Waits for transfers; the time is exposed communication.
  void wait(std::initializer_list<Work*> works);
  Backend& be_;
  ProcessGroup& cp_;
  Trace& trace_;
  StepClock* clock_;
  bool ring_, overlap_;
  int N_, rank_, B_, Tl_;
  std::vector<int32_t> pos_;        // every rank's positions, [N, Tl]
  std::vector<int32_t> token_pos_;  // this rank's, for each of the B sequences
  const int32_t* table_;            // pos_ in the backend's memory, or null (the host's serves)
};

}  // namespace loom
