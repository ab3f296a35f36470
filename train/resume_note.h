// What a resume says about layouts: a checkpoint written in one layout and loaded in another
// is resharded on load (checkpoint/checkpointer.cpp), and the run's log should say from which
// layout to which. It reads only the checkpoint's manifest; it changes nothing.
#pragma once
#include <string>

#include "runtime/config.h"

namespace loom {

// "dp 2 x tp 2, ZeRO-1, f32 (4 ranks)": the axes above one, the ZeRO stage, the dtype.
std::string layout_text(int dp, int tp, int pp, int cp, int ep, int zero, const std::string& dtype, int world);
// "; resharded from dp 2, f32 (2 ranks) to tp 2, f32 (2 ranks)" where the checkpoint in `dir`
// was written in another layout than `cfg`'s at `world` ranks and `dtype`; else "" (and "" when
// its manifest cannot be read: the load itself says what is wrong).
std::string resume_reshard_note(const std::string& dir, const Config& cfg, int world, const std::string& dtype);

}  // namespace loom
