// Where a run of a rank's local tensor storage sits in the global (Hugging Face) tensor. A
// tensor is viewed as 2-D (a 1-D one as a single row); a contiguous run of its local elements
// is at most three local boxes (a partial first row, whole rows, a partial last row), and each
// local box maps to global boxes by translation: the tensor-parallel split cuts the split dim
// into slices that land at their own global offsets, and padded vocabulary rows map nowhere.
// Checkpoint shards are these global boxes, so a shard is a plain hyperslab of the tensor.
#pragma once
#include <cstdint>
#include <vector>

#include "model/registry.h"

namespace loom {

// A box of `rows` x `cols` elements at local (lr, lc) and global (gr, gc), in the 2-D views.
struct Piece {
  int64_t lr, lc, gr, gc, rows, cols;
  int64_t numel() const { return rows * cols; }
};

// The pieces of local elements [f0, f1) of `spec` (offsets within the tensor's local
// storage), covering every element that is in the global tensor exactly once.
std::vector<Piece> pieces_of(const ParamSpec& spec, int64_t f0, int64_t f1);

// A piece's global box in the tensor's own rank: offset and shape (1-D tensors drop the row).
std::vector<int64_t> piece_offset(const ParamSpec& spec, const Piece& p);
std::vector<int64_t> piece_shape(const ParamSpec& spec, const Piece& p);

// Copies a piece's elements, row-major, out of local storage `src` (src[k] is local element
// f0 + k) into `out`, or back (scatter).
void piece_gather(const ParamSpec& spec, const Piece& p, const float* src, int64_t f0, float* out);
void piece_scatter(const ParamSpec& spec, const Piece& p, const float* in, float* dst, int64_t f0);

// A box of the global tensor (2-D view): rows [r0, r0 + rows) x cols [c0, c0 + cols).
struct Box {
  int64_t r0, c0, rows, cols;
};
// The box that a global offset and shape name (as piece_offset/piece_shape give them).
Box box_of(const std::vector<int64_t>& offset, const std::vector<int64_t>& shape);
// Copies the elements where the piece and the stored box `b` (holding `data`, row-major)
// overlap into local storage (dst[k] is local element f0 + k); returns how many.
int64_t piece_fill(const ParamSpec& spec, const Piece& p, const Box& b, const float* data, float* dst, int64_t f0);

}  // namespace loom
