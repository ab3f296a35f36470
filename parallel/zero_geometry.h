// How ZeRO cuts a chunk into parts and shards (parallel/zero.h), shared by zero.cpp and
// zero_invariant.cpp; defined in zero_geometry.cpp. Not a public interface: callers use zero.h's.
#pragma once
#include <vector>

#include "parallel/zero.h"

namespace loom::zero_detail {

// A part: a unit, or its dense part or a tail split off its end, sharded over n ranks (this one r).
struct Part {
  int64_t lo, len;
  int n, r;
  bool expert, tail;
};

struct Geometry {
  std::vector<Part> parts;
  std::vector<int64_t> s;  // per part shard size
  int64_t shard = 0, max_unit = 0, max_s = 0;
};

Geometry geometry(const ModelLayout& layout, const ZeroRanks& z);

// What a unit's slot holds at stages 2 and 3: the unit in its own layout with its dense part
// padded for dp after it (buf), an expert tail's padded copy for expert-dp (aux), and the
// rank's reduced shards of both (result).
struct SlotSize {
  int64_t buf = 0, aux = 0, result = 0;
};

// The four slots' sizes: both edges, then two blocks in turn (each the largest unit it serves).
std::vector<SlotSize> slot_sizes(const ModelLayout& layout, const Geometry& g);

}  // namespace loom::zero_detail
