// The chunk's buffers by name and its tp communication scope, for the decoder's sources
// (decoder_part.cpp, decoder_part_block.cpp, decoder_part_passes.cpp; private to them: the MoE
// layer gets its block's buffers as a MoeBlock).
#pragma once
#include "model/decoder_part.h"

namespace loom {

// Order of the saved buffers and the scratch; act_plan and these agree.
enum ActBuf {
  RESIDUAL,
  LN1,
  LN1_MEAN,
  LN1_RSTD,
  QKV,
  ATTN_STATS,
  ATTY,
  RES2,
  LN2,
  LN2_MEAN,
  LN2_RSTD,
  FC,
  ACT,
  LNF,
  LNF_MEAN,
  LNF_RSTD,
  LNF_FULL,
  LOGITS,
  LOSSES,
  WGRAD_STASH,
  MOE_PROBS,
  MOE_IDX,
  MOE_W,
  MOE_ROW_OF,
  MOE_TOKEN,
  MOE_COUNTS,
  MOE_X,
  MOE_FC,
  MOE_ACT,
  MOE_Y,
  MOE_MAP_IN,
  MOE_MAP_OUT,
  NUM_BUF
};
enum Scr {
  D_RES,
  D_LN,
  D_ATTY,
  D_QKV,
  D_FC,
  D_ACT,
  ATTN_SCRATCH,
  FULL_A,
  FULL_B,
  D_SHARD,
  D_NORMW,
  CE_STATS,
  MOE_LOGITS,
  MOE_PLAN,
  MOE_DROWS,
  MOE_DFC,
  MOE_DACT,
  MOE_DW,
  MOE_AUX,
  MOE_DX,
  MOE_SEND,
  MOE_RECV,
  CP_KV,
  CP_ACC,
  CP_ML,
  CP_DKV,
  CP_SCORES,
  MOE_CP_COUNTS,
  NUM_SCR
};

// One block's parameters (or gradients): null where the architecture has none.
struct DecoderPart::LayerW {
  Ptr w[NUM_W];
  float* g[NUM_W];
};
// One block's activations: its own copies, or the shared ones backward refills.
struct DecoderPart::LayerA {
  Ptr ln1, qkv, stats, atty, res2, ln2, fc, act;  // fc, act: a dense block's
  float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
  int moe = -1;   // a MoE block: its index among the piece's MoE blocks (its buffers' copy)
  int layer = 0;  // the global block
};

template <class F>
void DecoderPart::tp_comm(const char* name, F&& f) {
  auto s = trace_.scope(name);
  StepClock::Scope c(clock_, Phase::comm);
  f();
}

}  // namespace loom
