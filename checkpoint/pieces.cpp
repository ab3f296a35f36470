#include "checkpoint/pieces.h"

#include <algorithm>

#include "runtime/error.h"

namespace loom {

namespace {

// The tensor as 2-D, locally and globally, and how its split dim maps.
struct View {
  int64_t rows, cols;            // local
  int64_t real_rows;             // global rows in the file (padded rows beyond)
  int split = -1;                // 0: rows, 1: cols, -1: none
  int64_t block = 0, slice = 0;  // along the split dim: a block of the global, a rank's slice of it
  int rank = 0;
  bool one_d = false;
};

View view_of(const ParamSpec& s) {
  LOOM_CHECK(s.shape.size() == 1 || s.shape.size() == 2, "checkpoint: tensor {} has {} dims; loom holds 1 or 2", s.name,
             s.shape.size());
  View v;
  v.one_d = s.shape.size() == 1;
  v.rows = v.one_d ? 1 : s.shape[0];
  v.cols = v.one_d ? s.shape[0] : s.shape[1];
  v.real_rows = v.one_d ? 1 : s.global_shape[0];
  if (!s.replicated() && s.tp > 1) {
    v.split = v.one_d ? 1 : s.shard_dim;
    const int64_t local = v.split == 0 ? v.rows : v.cols, global = local * s.tp;
    v.block = global / s.shard_parts;
    v.slice = v.block / s.tp;
    v.rank = s.tp_rank;
  }
  return v;
}

struct Seg {
  int64_t local, global, len;
};

// Local [j0, j1) along a dim, cut where the split's slices land apart.
std::vector<Seg> segments(const View& v, int dim, int64_t j0, int64_t j1) {
  std::vector<Seg> out;
  if (v.split != dim) {
    out.push_back({j0, j0, j1 - j0});
    return out;
  }
  for (int64_t j = j0; j < j1;) {
    const int64_t k = j / v.slice, end = std::min(j1, (k + 1) * v.slice);
    out.push_back({j, k * v.block + int64_t(v.rank) * v.slice + (j - k * v.slice), end - j});
    j = end;
  }
  return out;
}

}  // namespace

std::vector<Piece> pieces_of(const ParamSpec& spec, int64_t f0, int64_t f1) {
  const View v = view_of(spec);
  LOOM_ASSERT(0 <= f0 && f0 <= f1 && f1 <= spec.numel());
  std::vector<Piece> out;
  if (f0 == f1) return out;
  const int64_t b = v.cols, r0 = f0 / b, c0 = f0 % b, r1 = (f1 - 1) / b, c1 = (f1 - 1) % b + 1;
  std::vector<Piece> local;  // local boxes (gr, gc unset)
  if (r0 == r1) {
    local.push_back({r0, c0, 0, 0, 1, c1 - c0});
  } else {
    int64_t rs = r0, re = r1 + 1;
    if (c0 > 0) local.push_back({r0, c0, 0, 0, 1, b - c0}), rs = r0 + 1;
    if (c1 < b) re = r1;
    if (re > rs) local.push_back({rs, 0, 0, 0, re - rs, b});
    if (c1 < b) local.push_back({r1, 0, 0, 0, 1, c1});
  }
  for (const Piece& box : local)
    for (Seg r : segments(v, 0, box.lr, box.lr + box.rows)) {
      if (r.global >= v.real_rows) continue;  // padded vocabulary rows
      r.len = std::min(r.len, v.real_rows - r.global);
      for (const Seg& c : segments(v, 1, box.lc, box.lc + box.cols))
        out.push_back({r.local, c.local, r.global, c.global, r.len, c.len});
    }
  return out;
}

std::vector<int64_t> piece_offset(const ParamSpec& spec, const Piece& p) {
  if (spec.shape.size() == 1) return {p.gc};
  return {p.gr, p.gc};
}

std::vector<int64_t> piece_shape(const ParamSpec& spec, const Piece& p) {
  if (spec.shape.size() == 1) return {p.cols};
  return {p.rows, p.cols};
}

void piece_gather(const ParamSpec& spec, const Piece& p, const float* src, int64_t f0, float* out) {
  const int64_t b = view_of(spec).cols;
  for (int64_t i = 0; i < p.rows; ++i) std::copy_n(src + (p.lr + i) * b + p.lc - f0, p.cols, out + i * p.cols);
}

void piece_scatter(const ParamSpec& spec, const Piece& p, const float* in, float* dst, int64_t f0) {
  const int64_t b = view_of(spec).cols;
  for (int64_t i = 0; i < p.rows; ++i) std::copy_n(in + i * p.cols, p.cols, dst + (p.lr + i) * b + p.lc - f0);
}

Box box_of(const std::vector<int64_t>& offset, const std::vector<int64_t>& shape) {
  LOOM_CHECK(offset.size() == shape.size() && (shape.size() == 1 || shape.size() == 2),
             "checkpoint: a shard of {} dims (offset of {}); loom writes 1 or 2", shape.size(), offset.size());
  if (shape.size() == 1) return {0, offset[0], 1, shape[0]};
  return {offset[0], offset[1], shape[0], shape[1]};
}

int64_t piece_fill(const ParamSpec& spec, const Piece& p, const Box& box, const float* data, float* dst, int64_t f0) {
  const int64_t b = view_of(spec).cols;
  const int64_t r0 = std::max(p.gr, box.r0), r1 = std::min(p.gr + p.rows, box.r0 + box.rows);
  const int64_t c0 = std::max(p.gc, box.c0), c1 = std::min(p.gc + p.cols, box.c0 + box.cols);
  if (r0 >= r1 || c0 >= c1) return 0;
  for (int64_t r = r0; r < r1; ++r)
    std::copy_n(data + (r - box.r0) * box.cols + (c0 - box.c0), c1 - c0,
                dst + (p.lr + r - p.gr) * b + p.lc + (c0 - p.gc) - f0);
  return (r1 - r0) * (c1 - c0);
}

}  // namespace loom
