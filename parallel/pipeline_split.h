// parallel.pp_layers resolved against the model: blocks per pipeline model chunk.
#pragma once
#include <vector>

#include "runtime/config.h"

namespace loom {

// Blocks per pipeline model chunk (a stage's, or under interleaved and V schedules pp x
// pp_virtual chunks): parallel.pp_layers, n_layer / chunks each, or with "auto" the split
// whose costliest chunk (forward FLOPs per token, the head's on the last) costs least; an Error
// says what does not fit.
std::vector<int> pipeline_layers(const Config& cfg);
// Forward FLOPs per token of each block, and of the head and loss: the costs "auto" splits.
std::vector<double> pipeline_block_flops(const Config& cfg);
double pipeline_head_flops(const Config& cfg);

}  // namespace loom
