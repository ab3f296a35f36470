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

int bit_reverse(int r, int size) {
  int out = 0;
  for (int bit = 1; bit < size; bit <<= 1) out = (out << 1) | ((r & bit) ? 1 : 0);
  return out;
}

void tree_reduce_scatter(ProcessGroup& g, Backend& be, Buf in, Buf out, Buf half, int stride, int size) {
  TreeReduceScatter t(g, be);
  t.start(in, out, half, stride, size);
  t.finish();
}

int64_t TreeReduceScatter::start(Buf in, Buf out, Buf half, int stride, int size) {
  // The sub-group: the ranks that differ from this one only in the bits [stride, stride x size).
  const int p = size > 0 ? size : g_.size() / stride, r = (g_.rank() / stride) % p;
  LOOM_CHECK((p & (p - 1)) == 0, "a tree reduce-scatter over {} ranks: it needs a power of two", p);
  LOOM_ASSERT(in.count == out.count * p && int64_t(stride) * p <= g_.size());
  const int64_t n = out.count, id = started_++;
  // Halving pairs r with r ^ 1, then r ^ 2, ..., each partner keeping the blocks whose low bits
  // match its own: with block k moved to position bitrev(k), those are a contiguous range.
  for (int q = 0; q < p; ++q)
    if (const int t = bit_reverse(q, p); q < t) {
      Buf a = in.slice(int64_t(q) * n, n), b = in.slice(int64_t(t) * n, n), tmp = half.slice(0, n);
      be_.copy(tmp, a);
      be_.copy(a, b);
      be_.copy(b, tmp);
    }
  Run run{.id = id,
          .in = in,
          .out = out,
          .half = half,
          .n = n,
          .p = p,
          .v = bit_reverse(r, p),
          .base = g_.rank() - r * stride,
          .stride = stride,
          .bit = p >> 1,
          .lo = 0,
          .hi = p};
  if (run.bit == 0) {  // one rank: its block is the sum
    be_.copy(out, in.slice(int64_t(run.v) * n, n));
    return id;
  }
  if (!runs_.empty()) ++overlapped_;
  issue(run);
  runs_.push_back(std::move(run));
  return id;
}

void TreeReduceScatter::issue(Run& r) {
  const int mid = (r.lo + r.hi) / 2;
  const bool upper = (r.v & r.bit) != 0;
  r.keep_lo = upper ? mid : r.lo, r.keep_hi = upper ? r.hi : mid;
  const int send_lo = upper ? r.lo : mid;
  const int64_t len = int64_t(r.keep_hi - r.keep_lo) * r.n;
  const int peer = r.base + bit_reverse(r.v ^ r.bit, r.p) * r.stride;  // the rank r ^ bitrev(bit)
  const Stream& s = be_.stream();
  g_.group_start();  // one group (NCCL pairs the two)
  r.sent = g_.send(r.in.slice(int64_t(send_lo) * r.n, len), peer, 0, s);
  r.got = g_.recv(r.half.slice(0, len), peer, 0, s);
  g_.group_end();
}

bool TreeReduceScatter::complete(Run& r) {
  const Stream& s = be_.stream();
  r.got.wait_on(s);
  r.sent.wait_on(s);
  const int64_t len = int64_t(r.keep_hi - r.keep_lo) * r.n;
  be_.add(r.in.slice(int64_t(r.keep_lo) * r.n, len), r.half.slice(0, len));
  r.lo = r.keep_lo, r.hi = r.keep_hi;
  r.bit >>= 1;
  if (r.bit >= 1) return false;
  be_.copy(r.out, r.in.slice(int64_t(r.v) * r.n, r.n));
  return true;
}

void TreeReduceScatter::advance(int64_t through) {
  for (Run& r : runs_)
    if (r.id <= through && !complete(r)) issue(r);
  std::erase_if(runs_, [](const Run& r) { return r.bit == 0; });
}

void TreeReduceScatter::finish_through(int64_t run) {
  // Only the runs due: a later one's exchange waited for here would show (nothing ran since
  // it was issued), where the next hook's poll finds it done behind that unit's backward.
  while (!runs_.empty() && runs_.front().id <= run) advance(run);
}

std::vector<PlanItem> grad_tree_plan(int micro_batches, int ranks, int64_t n, int units) {
  std::vector<PlanItem> p;
  if (const int levels = GradTree::levels(micro_batches))
    p.push_back({"grad_tree", levels * n, DType::f32, Mem::grads});
  // (the sum of ceil(len / 2) over the units is at most (n + units) / 2)
  if (ranks > 2) p.push_back({"grad_tree_half", (n + units) / 2, DType::f32, Mem::comm});
  return p;
}

void tree_all_reduce(ProcessGroup& g, Backend& be, Buf buf, Buf half, int first_bit) {
  TreeAllReduce t(g, be, half, first_bit);
  t.start(buf);
  t.finish();
}

TreeAllReduce::TreeAllReduce(ProcessGroup& g, Backend& be, Buf half, int first_bit) : g_(g), be_(be), half_(half) {
  const int p = g.size();
  LOOM_CHECK((p & (p - 1)) == 0, "a tree reduction over {} ranks: it needs a power of two", p);
  for (int b = 1; b < p; b <<= 1) bits_.push_back(b);
  if (!bits_.empty()) std::rotate(bits_.begin(), bits_.begin() + first_bit % int(bits_.size()), bits_.end());
}

void TreeAllReduce::start(Buf buf) {
  ++started_;
  if (bits_.empty() || buf.count == 0) return;
  const int64_t need = (buf.count + 1) / 2;
  LOOM_ASSERT(half_used_ + need <= half_.count);
  Run r;
  r.buf = buf;
  r.half = half_.slice(half_used_, need);
  half_used_ += need;
  r.at = {0, buf.count};
  issue(r);
  runs_.push_back(std::move(r));
}

void TreeAllReduce::issue(Run& r) {
  const int rank = g_.rank();
  const size_t n_bits = bits_.size();
  Buf out, in;
  int bit = 0;
  if (r.step < n_bits) {  // halving: keep one half, send the other, add the partner's
    bit = bits_[r.step];
    r.kept.push_back(r.at);
    const int64_t mid = r.at.lo + (r.at.hi - r.at.lo + 1) / 2;
    const bool upper = (rank & bit) != 0;
    const Range mine = upper ? Range{mid, r.at.hi} : Range{r.at.lo, mid};
    const Range theirs = upper ? Range{r.at.lo, mid} : Range{mid, r.at.hi};
    out = r.buf.slice(theirs.lo, theirs.hi - theirs.lo);
    in = r.half.slice(0, mine.hi - mine.lo);
    r.add_to = r.buf.slice(mine.lo, mine.hi - mine.lo);  // both partners add the same two nodes
    r.add_from = in;
    r.next = mine;
  } else {  // doubling: the sums back, the last halving first
    bit = bits_[2 * n_bits - 1 - r.step];
    const Range whole = r.kept.back();
    r.kept.pop_back();
    const Range other = (rank & bit) ? Range{whole.lo, r.at.lo} : Range{r.at.hi, whole.hi};
    out = r.buf.slice(r.at.lo, r.at.hi - r.at.lo);
    in = r.buf.slice(other.lo, other.hi - other.lo);
    r.add_to = r.add_from = Buf();
    r.next = whole;
  }
  // One group (NCCL pairs the two).
  const Stream& s = be_.stream();
  g_.group_start();
  r.sent = g_.send(out, rank ^ bit, 0, s);
  r.got = g_.recv(in, rank ^ bit, 0, s);
  g_.group_end();
}

void TreeAllReduce::complete(Run& r) {
  const Stream& s = be_.stream();
  r.got.wait_on(s);
  r.sent.wait_on(s);
  if (r.add_to.data) be_.add(r.add_to, r.add_from);
  r.at = r.next;
}

void TreeAllReduce::poll() {
  for (Run& r : runs_) {
    complete(r);
    if (++r.step < 2 * bits_.size()) issue(r);
  }
  std::erase_if(runs_, [&](const Run& r) { return r.step == 2 * bits_.size(); });
  if (runs_.empty()) half_used_ = 0;
}

void TreeAllReduce::finish() {
  while (!runs_.empty()) poll();
}

}  // namespace loom
