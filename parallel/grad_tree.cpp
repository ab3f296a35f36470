#include "parallel/grad_tree.h"

#include <algorithm>

#include "runtime/error.h"

namespace loom {

GradTree::GradTree(Backend& be, std::vector<int64_t> unit_starts, int64_t numel, int micro_batches)
    : be_(be), starts_(std::move(unit_starts)), micro_(micro_batches) {
  starts_.push_back(numel);
  seen_.assign(starts_.size() - 1, 0);
  for (int k = 0; k < levels(micro_batches); ++k) {
    level_.push_back(be_.alloc().empty({numel}, DType::f32, Mem::grads));
    be_.zero(Buf(level_.back()));
  }
}

void GradTree::reset() {
  std::fill(seen_.begin(), seen_.end(), 0);
}

bool GradTree::idle() const {
  return std::all_of(seen_.begin(), seen_.end(), [](int i) { return i == 0; });
}

void GradTree::fold(int u, float* grads, bool last) {
  const int64_t lo = starts_[size_t(u)], n = starts_[size_t(u) + 1] - lo;
  const int i = seen_[size_t(u)];
  LOOM_ASSERT(i < micro_ && last == (i == micro_ - 1));  // every micro-batch once, in order
  const Buf g(grads + lo, n, DType::f32, be_.device());
  auto level = [&](int k) { return Buf(level_[size_t(k)]).slice(lo, n); };
  // Micro-batch i closes the subtrees its trailing one bits stand for (carry = level + carry).
  int k = 0;
  for (; (i >> k) & 1; ++k) be_.add(g, level(k));
  if (!last) {
    be_.copy(level(k), g);
    be_.zero(g);
    seen_[size_t(u)] = i + 1;
    return;
  }
  // The last: the subtrees still open (a micro-batch count not a power of two), lowest first.
  for (int j = k + 1; (micro_ >> j) != 0; ++j)
    if ((micro_ >> j) & 1) be_.add(g, level(j));
  seen_[size_t(u)] = 0;
}

namespace {
// Sends `out` to `peer` and receives `in` from it, as one group (NCCL pairs them), and waits.
void exchange(ProcessGroup& g, const Stream& s, int peer, Buf out, Buf in) {
  g.group_start();
  Work sent = g.send(out, peer, 0, s);
  Work got = g.recv(in, peer, 0, s);
  g.group_end();
  got.wait_on(s);
  sent.wait_on(s);
}
}  // namespace

int bit_reverse(int r, int size) {
  int out = 0;
  for (int bit = 1; bit < size; bit <<= 1) out = (out << 1) | ((r & bit) ? 1 : 0);
  return out;
}

void tree_reduce_scatter(ProcessGroup& g, Backend& be, Buf in, Buf out, Buf half) {
  const int p = g.size(), r = g.rank();
  LOOM_CHECK((p & (p - 1)) == 0, "a tree reduce-scatter over {} ranks: it needs a power of two", p);
  LOOM_ASSERT(in.count == out.count * p);
  const Stream& s = be.stream();
  const int64_t n = out.count;
  int lo = 0, hi = p;  // the blocks both partners hold
  for (int bit = p >> 1; bit >= 1; bit >>= 1) {
    const int mid = (lo + hi) / 2;
    const bool upper = (r & bit) != 0;
    const int keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
    const int send_lo = upper ? lo : mid;
    const int64_t len = int64_t(keep_hi - keep_lo) * n;
    Buf got = half.slice(0, len);
    exchange(g, s, r ^ bit, in.slice(int64_t(send_lo) * n, len), got);
    be.add(in.slice(int64_t(keep_lo) * n, len), got);
    lo = keep_lo, hi = keep_hi;
  }
  be.copy(out, in.slice(int64_t(r) * n, n));
}

std::vector<PlanItem> grad_tree_plan(int micro_batches, int ranks, int64_t n) {
  std::vector<PlanItem> p;
  if (const int levels = GradTree::levels(micro_batches))
    p.push_back({"grad_tree", levels * n, DType::f32, Mem::grads});
  if (ranks > 2) p.push_back({"grad_tree_half", (n + 1) / 2, DType::f32, Mem::comm});
  return p;
}

void tree_all_reduce(ProcessGroup& g, Backend& be, Buf buf, Buf half, int first_bit) {
  const int p = g.size(), r = g.rank();
  LOOM_CHECK((p & (p - 1)) == 0, "a tree reduction over {} ranks: it needs a power of two", p);
  std::vector<int> bits;  // in the order they pair
  for (int b = 1; b < p; b <<= 1) bits.push_back(b);
  if (!bits.empty()) std::rotate(bits.begin(), bits.begin() + first_bit % int(bits.size()), bits.end());
  const Stream& s = be.stream();
  struct Range {
    int64_t lo, hi;
  };
  std::vector<Range> kept;  // before each halving step, the range both partners hold
  Range at{0, buf.count};
  for (const int bit : bits) {
    kept.push_back(at);
    const int64_t mid = at.lo + (at.hi - at.lo + 1) / 2;
    const bool upper = (r & bit) != 0;
    const Range mine = upper ? Range{mid, at.hi} : Range{at.lo, mid};
    const Range theirs = upper ? Range{at.lo, mid} : Range{mid, at.hi};
    Buf in = half.slice(0, mine.hi - mine.lo);
    exchange(g, s, r ^ bit, buf.slice(theirs.lo, theirs.hi - theirs.lo), in);
    be.add(buf.slice(mine.lo, mine.hi - mine.lo), in);  // both partners add the same two nodes
    at = mine;
  }
  for (auto b = bits.rbegin(); b != bits.rend(); ++b) {  // the sums back, last halving first
    const int bit = *b;
    const Range whole = kept.back();
    kept.pop_back();
    const Range other = (r & bit) ? Range{whole.lo, at.lo} : Range{at.hi, whole.hi};
    exchange(g, s, r ^ bit, buf.slice(at.lo, at.hi - at.lo), buf.slice(other.lo, other.hi - other.lo));
    at = whole;
  }
}

}  // namespace loom
