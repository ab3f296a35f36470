// The step model's element-wise traffic (plan/step_model.cpp's compute term): what loom's
// kernels move per token, in activation elements, for a block and for the model's ends.
#pragma once
#include "plan/step_model.h"
#include "runtime/config.h"

namespace loom {

// Element-wise traffic per token, in activation elements, per tp rank: what loom's kernels move
// (their DRAM bytes a call, tests/cuda/kernel_counts.csv and `loom bench kernels --counts`). A block:
//   each norm has the residual add fused in: forward reads the stream and the branch, writes the
//   sum and the normed rows (4C); backward reads dout and the input, reads and writes the stream's
//   gradient (4C); two a block, this rank's rows under sp: 16C;
//   GELU forward reads fc and writes act (2F); its backward is the dgelu GEMM epilogue where the
//   backend fuses it (CUDA, GPT-2), else reads dact and fc and writes dfc (3F); SwiGLU forward
//   reads gate and up, writes act (3F), backward reads those and dact, writes two (5F); each
//   tp's share of F, or k of them on every tp rank for a MoE layer;
//   RoPE rotates q and k in place each way: 2 (C + kvd) / tp forward, as much backward (the
//   kernel's cos/sin reads are a table that stays in cache);
//   GPT-2's bias gradients: in the GEMMs' epilogues on CUDA; the CPU reads dout once more for
//   each (3C + F per tp rank for qkv and fc, C each for the row-parallel two).
// The CPU's ops fuse the norms' adds as the kernels do; their other counts are the kernels'.
// GPT-2 124M (C 768, F 3072) on CUDA: 16C + 2F = 18432 a layer (the counts: 25 norm calls of 4C
// each way and 12 GELU forwards of 2F, over 12 layers); the 1.1B LLaMA (C 2048, kvd 256, F 5632):
// 16C + 8F + 4 (C + kvd) = 87040. The model before counted 36C + 12F (64512 and 141312), unfused
// kernels' traffic: 3.5 and 1.6 times what today's move a block (the whole counted steps,
// the ends included: 2.2 and 1.4 times).
struct BlockElementwise {
  double fwd = 0, bwd = 0;
};
BlockElementwise block_elementwise(const Config& cfg, const Cluster& cl, bool moe);
// The ends' element-wise traffic per token, in activation elements: the embedding's gather and
// its gradient's scatter (about 3C and 5C as counted at GPT-2 124M); the final norm (4C each way)
// and the loss, whose one kernel reads the logits and writes their gradient in place (2V).
BlockElementwise ends_elementwise(const Config& cfg, bool first, bool last);

}  // namespace loom
