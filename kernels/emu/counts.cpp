// The emulation's counters (counts.h). A block of a counted launch keeps, per lane, its
// dependent global round trips and how often it has reached each access site since its warp
// last exchanged; an access at the k-th visit of a site joins the warp's k-th request of that
// site (lanes of a warp run one after another between exchanges, so a request is complete when
// the warp next exchanges, or when the block ends). Closed requests become sectors and
// wavefronts. Built without instrumentation, as block.cpp.
#include "kernels/emu/counts.h"

#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <stdexcept>
#include <tuple>

#include "kernels/emu/count_ops.h"
#include "kernels/emu/device.h"
#include "kernels/emu/runtime.h"

namespace loom::emu {

void WorkCounts::add(const WorkCounts& o, double w) {
  mma += w * o.mma, wmma += w * o.wmma;
  ldmatrix += w * o.ldmatrix, ldmatrix_matrices += w * o.ldmatrix_matrices;
  ldmatrix_wavefronts += w * o.ldmatrix_wavefronts;
  wmma_ldst += w * o.wmma_ldst, wmma_bytes += w * o.wmma_bytes;
  wmma_wavefronts += w * o.wmma_wavefronts, wmma_ideal += w * o.wmma_ideal;
  cp_async += w * o.cp_async, cp_async_bytes += w * o.cp_async_bytes;
  cp_async_wavefronts += w * o.cp_async_wavefronts, cp_async_ideal += w * o.cp_async_ideal;
  lds += w * o.lds, lds_bytes += w * o.lds_bytes, lds_wavefronts += w * o.lds_wavefronts, lds_ideal += w * o.lds_ideal;
  sts += w * o.sts, sts_bytes += w * o.sts_bytes, sts_wavefronts += w * o.sts_wavefronts, sts_ideal += w * o.sts_ideal;
  ldg += w * o.ldg, ldg_bytes += w * o.ldg_bytes, ldg_sectors += w * o.ldg_sectors;
  stg += w * o.stg, stg_bytes += w * o.stg_bytes, stg_sectors += w * o.stg_sectors;
  ldg_walking += w * o.ldg_walking;
  barriers += w * o.barriers, warp_ops += w * o.warp_ops, mufu += w * o.mufu;
  warps += w * o.warps, trips_sum += w * o.trips_sum;
  trips_max = std::max(trips_max, o.trips_max);
}

namespace {

thread_local CountSession* tls_session = nullptr;

// The loads of one site a thread has in flight at most: nvcc unrolls a loop whose trip count it
// does not know by 4 (its PTX shows the loads of four iterations together), and a loop it
// unrolls completely shows as distinct sites here too (the host compiler peels it).
constexpr long kUnrolled = 4;

enum class Kind : uint8_t { ldg, stg, lds, sts, cp };

// One warp-level request: what each lane of the mask gave.
struct Request {
  Kind kind = Kind::ldg;
  uint32_t mask = 0;
  uint64_t seq = 0;  // the order requests opened in: program order
  uintptr_t addr[32];
  uintptr_t src[32];  // cp.async: the global source
  uint8_t bytes[32];
};

struct Lane {
  uint32_t trips = 0;
  bool pending = false;                                // global loads in flight whose values it has not waited for
  bool sealed = false;                                 // a global store used them: no later load joins them
  std::vector<uintptr_t> sites;                        // the sites of those loads
  std::vector<std::pair<uintptr_t, uint32_t>> visits;  // per site, since the warp's last exchange
};

struct BlockCount {
  WorkCounts work;
  std::vector<Lane> lanes;
  // Per warp, by (site, visit, kind): an exact key, so that no two requests ever merge.
  std::vector<std::map<std::tuple<uintptr_t, uint32_t, Kind>, Request>> open;
  std::vector<std::vector<uintptr_t>> ends;  // per warp: where its latest global loads ended
  uint64_t seq = 0;
  std::vector<std::pair<uintptr_t, uintptr_t>> device;  // sorted [begin, end)
  uintptr_t dyn_lo = 0, dyn_hi = 0;                     // dynamic shared memory
  uintptr_t tls_lo = 0, tls_hi = 0;                     // static __shared__ arrays: this thread's TLS block
  uintptr_t skip[2] = {0, 0};                           // the emulation's own thread-locals there
  uintptr_t gap[2] = {0, 0}, hit[2] = {0, 0};           // is_global's latest answers, [lo, hi)
};
thread_local BlockCount blk;

// The executable's TLS block: [thread pointer - size, thread pointer) on x86-64.
size_t tls_block_bytes() {
  static const size_t bytes = [] {
    size_t b = 0;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
          if (info->dlpi_tls_modid != 1) return 0;
          for (int i = 0; i < info->dlpi_phnum; ++i)
            if (info->dlpi_phdr[i].p_type == PT_TLS) {
              const size_t align = std::max<size_t>(info->dlpi_phdr[i].p_align, 1);
              *static_cast<size_t*>(out) = (info->dlpi_phdr[i].p_memsz + align - 1) / align * align;
            }
          return 0;
        },
        &b);
    return b;
  }();
  return bytes;
}

// Wavefronts of one shared-memory phase: the most distinct 4-byte words any bank serves.
int phase_wavefronts(const uintptr_t* addr, const uint8_t* bytes, const int* lanes, int n) {
  if (n == 0) return 0;
  std::vector<uintptr_t> words[32];
  for (int i = 0; i < n; ++i) {
    const uintptr_t a = addr[lanes[i]], b = bytes[lanes[i]];
    for (uintptr_t w = a / 4; w <= (a + b - 1) / 4; ++w) {
      auto& v = words[w % 32];
      if (std::find(v.begin(), v.end(), w) == v.end()) v.push_back(w);
    }
  }
  size_t most = 1;
  for (auto& v : words) most = std::max(most, v.size());
  return int(most);
}

// Shared-memory wavefronts of a request and its ideal: lanes in phases of 128 bytes (all 32
// for words of up to 4 bytes, half-warps for 8, quarter-warps for 16).
void shared_wavefronts(const Request& r, double& wavefronts, double& ideal) {
  int size = 1;
  for (int l = 0; l < 32; ++l)
    if (r.mask >> l & 1u) size = std::max<int>(size, r.bytes[l]);
  const int per_phase = size <= 4 ? 32 : size <= 8 ? 16 : 8;
  for (int p = 0; p < 32; p += per_phase) {
    int lanes[32], n = 0;
    for (int l = p; l < p + per_phase; ++l)
      if (r.mask >> l & 1u) lanes[n++] = l;
    if (n == 0) continue;
    wavefronts += phase_wavefronts(r.addr, r.bytes, lanes, n);
    ideal += 1;
  }
}

// Distinct 32-byte sectors of the lanes' accesses (address 0: a cp.async zero fill, no read).
double sectors(const uintptr_t* addr, const uint8_t* bytes, uint32_t mask) {
  std::vector<uintptr_t> s;
  for (int l = 0; l < 32; ++l)
    if ((mask >> l & 1u) && addr[l])
      for (uintptr_t x = addr[l] / 32; x <= (addr[l] + bytes[l] - 1) / 32; ++x) s.push_back(x);
  std::sort(s.begin(), s.end());
  return double(std::unique(s.begin(), s.end()) - s.begin());
}

void close_request(const Request& r, WorkCounts& w) {
  double bytes = 0;
  for (int l = 0; l < 32; ++l)
    if (r.mask >> l & 1u) bytes += r.bytes[l];
  switch (r.kind) {
    case Kind::ldg:
      w.ldg += 1, w.ldg_bytes += bytes, w.ldg_sectors += sectors(r.addr, r.bytes, r.mask);
      break;
    case Kind::stg:
      w.stg += 1, w.stg_bytes += bytes, w.stg_sectors += sectors(r.addr, r.bytes, r.mask);
      break;
    case Kind::lds:
      w.lds += 1, w.lds_bytes += bytes;
      shared_wavefronts(r, w.lds_wavefronts, w.lds_ideal);
      break;
    case Kind::sts:
      w.sts += 1, w.sts_bytes += bytes;
      shared_wavefronts(r, w.sts_wavefronts, w.sts_ideal);
      break;
    case Kind::cp: {
      w.cp_async += 1, w.cp_async_bytes += bytes;
      shared_wavefronts(r, w.cp_async_wavefronts, w.cp_async_ideal);
      double read = 0;
      for (int l = 0; l < 32; ++l)
        if ((r.mask >> l & 1u) && r.src[l]) read += r.bytes[l];
      w.ldg += 1, w.ldg_bytes += read, w.ldg_sectors += sectors(r.src, r.bytes, r.mask);
      break;
    }
  }
}

// A warp's global load that starts where one of its latest ended: the warp walks a stream of
// its own (a row), one request at a time.
void walk_check(const Request& r, int warp) {
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int l = 0; l < 32; ++l)
    if (r.mask >> l & 1u) lo = std::min(lo, r.addr[l]), hi = std::max(hi, r.addr[l] + r.bytes[l]);
  auto& ends = blk.ends[size_t(warp)];
  for (uintptr_t e : ends)
    if (lo >= e && lo < e + 128) {
      blk.work.ldg_walking += 1;
      break;
    }
  ends.push_back(hi);
  if (ends.size() > 8) ends.erase(ends.begin());
}

void close_warp(int warp) {
  auto& open = blk.open[size_t(warp)];
  std::vector<const Request*> order;
  for (auto& [key, r] : open) order.push_back(&r);
  std::sort(order.begin(), order.end(), [](const Request* a, const Request* b) { return a->seq < b->seq; });
  for (const Request* r : order) {
    if (r->kind == Kind::ldg) walk_check(*r, warp);
    close_request(*r, blk.work);
  }
  open.clear();
  for (int l = 32 * warp; l < std::min<int>(32 * warp + 32, int(blk.lanes.size())); ++l)
    blk.lanes[size_t(l)].visits.clear();
}

void trip(Lane& l) {
  if (!l.pending) return;
  ++l.trips;
  l.pending = false;
  l.sealed = false;
  l.sites.clear();
}

// The request this lane's access at `site` joins.
Request& join(Kind kind, uintptr_t site) {
  const int t = current_thread->linear;
  Lane& lane = blk.lanes[size_t(t)];
  uint32_t visit = 0;
  for (auto& [s, n] : lane.visits)
    if (s == site) visit = ++n;
  if (visit == 0) lane.visits.push_back({site, visit = 1});
  Request& r = blk.open[size_t(t / 32)][{site, visit, kind}];
  if (r.mask == 0) r.seq = blk.seq++;
  r.kind = kind;
  r.mask |= 1u << (t % 32);
  return r;
}

}  // namespace

thread_local bool counting_block = false;

CountSession::CountSession(CountOptions opt) : opt_(opt), outer_(tls_session) {
  tls_session = this;
}
CountSession::~CountSession() {
  tls_session = outer_;
}
std::vector<LaunchCounts> CountSession::take() {
  std::vector<LaunchCounts> out;
  out.swap(launches_);
  return out;
}
CountSession* count_session() {
  return tls_session;
}

std::string kernel_instance(const char* signature) {
  std::string s = signature;
  const size_t k = s.find("K = ");
  if (k != std::string::npos) s = s.substr(k + 4, s.rfind(']') - k - 4);
  std::string out;
  for (size_t i = 0; i < s.size();) {
    // A qualifier: a name, "{anonymous}" or "(anonymous namespace)", then "::".
    size_t j = i;
    if (s.compare(i, 11, "{anonymous}") == 0) {
      j = i + 11;
    } else if (s.compare(i, 21, "(anonymous namespace)") == 0) {
      j = i + 21;
    } else {
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
    }
    if (j > i && s.compare(j, 2, "::") == 0) {
      i = j + 2;
      continue;
    }
    if (j == i) ++j;
    out += s.substr(i, j - i);
    i = j;
  }
  return out;
}

std::vector<std::pair<unsigned, double>> count_samples(unsigned n, int samples) {
  std::vector<std::pair<unsigned, double>> out;
  if (samples <= 0 || n <= unsigned(samples)) {
    for (unsigned i = 0; i < n; ++i) out.push_back({i, 1.0});
    return out;
  }
  for (int s = 0; s < samples; ++s) {
    const unsigned a = unsigned(uint64_t(n) * unsigned(s) / unsigned(samples)),
                   b = unsigned(uint64_t(n) * unsigned(s + 1) / unsigned(samples));
    out.push_back({a + (b - a) / 2, double(b - a)});
  }
  return out;
}

void count_block_begin(int threads, const BlockState& b) {
  blk.work = WorkCounts{};
  blk.lanes.assign(size_t(threads), Lane{});
  blk.open.assign(size_t((threads + 31) / 32), {});
  blk.ends.assign(size_t((threads + 31) / 32), {});
  blk.device = device_ranges();
  blk.gap[0] = blk.gap[1] = blk.hit[0] = blk.hit[1] = 0;
  blk.dyn_lo = reinterpret_cast<uintptr_t>(b.dynamic_shared);
  blk.dyn_hi = blk.dyn_lo + b.dynamic_bytes;
  blk.tls_hi = reinterpret_cast<uintptr_t>(__builtin_thread_pointer());
  blk.tls_lo = blk.tls_hi - tls_block_bytes();
  blk.skip[0] = reinterpret_cast<uintptr_t>(&current_thread);
  blk.skip[1] = reinterpret_cast<uintptr_t>(&current_block);
  counting_block = true;
}

void count_block_end(double weight, LaunchCounts& into) {
  counting_block = false;
  for (size_t w = 0; w < blk.open.size(); ++w) close_warp(int(w));
  for (size_t w = 0; w < blk.open.size(); ++w) {
    uint32_t most = 0;
    for (size_t l = 32 * w; l < std::min(32 * w + 32, blk.lanes.size()); ++l) {
      trip(blk.lanes[l]);  // loads the thread finished with
      most = std::max(most, blk.lanes[l].trips);
    }
    blk.work.trips_sum += most;
    blk.work.trips_max = std::max(blk.work.trips_max, double(most));
  }
  blk.work.warps = double(blk.open.size());
  into.total.add(blk.work, weight);
  into.blocks_run += 1;
  auto heft = [](const WorkCounts& w) { return w.tensor_flops() + w.dram_bytes() + w.ldg_bytes + w.stg_bytes; };
  if (heft(blk.work) > heft(into.heaviest)) into.heaviest = blk.work;
}

void count_lane_wait() {
  if (counting_block) trip(blk.lanes[size_t(current_thread->linear)]);
}
void count_warp_done(int warp) {
  if (counting_block) close_warp(warp);
}
void count_warp_op() {
  if (counting_block) blk.work.warp_ops += 1;
}
void count_barrier() {
  if (counting_block) blk.work.barriers += 1;
}
void count_mma() {
  if (counting_block) blk.work.mma += 1;
}
void count_wmma() {
  if (counting_block) blk.work.wmma += 1;
}
void count_mufu() {
  if (counting_block) blk.work.mufu += 1.0 / 32;
}

void count_ldmatrix(const uint64_t* lane_rows, int n) {
  if (!counting_block) return;
  blk.work.ldmatrix += 1;
  blk.work.ldmatrix_matrices += n;
  uintptr_t addr[8];
  uint8_t bytes[8];
  const int lanes[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  for (int m = 0; m < n; ++m) {
    for (int r = 0; r < 8; ++r) addr[r] = uintptr_t(lane_rows[(8 * m + r) * 8]), bytes[r] = 16;
    blk.work.ldmatrix_wavefronts += phase_wavefronts(addr, bytes, lanes, 8);
  }
}

namespace {
// Most accesses are a fiber's own stack (a kernel's arrays): the range between two device
// allocations that the latest address fell in, and the latest allocation hit, answer first.
bool is_global(uintptr_t addr) {
  if (addr >= blk.gap[0] && addr < blk.gap[1]) return false;
  if (addr >= blk.hit[0] && addr < blk.hit[1]) return true;
  auto it = std::upper_bound(blk.device.begin(), blk.device.end(), std::make_pair(addr, UINTPTR_MAX));
  const uintptr_t next = it == blk.device.end() ? UINTPTR_MAX : it->first;
  if (it != blk.device.begin() && addr < std::prev(it)->second) {
    blk.hit[0] = std::prev(it)->first, blk.hit[1] = std::prev(it)->second;
    return true;
  }
  blk.gap[0] = it == blk.device.begin() ? 0 : std::prev(it)->second, blk.gap[1] = next;
  return false;
}
}  // namespace

void count_wmma_tile(const void* p, size_t ldm, size_t elem, bool col_major) {
  if (!counting_block) return;
  (void)col_major;  // either way the tile is 16 rows (or columns) of 16 elements in memory
  const uintptr_t base = reinterpret_cast<uintptr_t>(p);
  const int chunks = int(16 * elem / 16);  // 16-byte pieces of a row: 2 (bf16) or 4 (fp32)
  if (is_global(base)) {                   // a fragment straight from global memory: 16 rows of 16 elements
    std::vector<uintptr_t> s;
    for (int r = 0; r < 16; ++r)
      for (uintptr_t x = (base + r * ldm * elem) / 32; x <= (base + r * ldm * elem + 16 * elem - 1) / 32; ++x)
        s.push_back(x);
    std::sort(s.begin(), s.end());
    blk.work.ldg += 2 * chunks, blk.work.ldg_bytes += 256.0 * double(elem);
    blk.work.ldg_sectors += double(std::unique(s.begin(), s.end()) - s.begin());
    const int w = current_thread->linear / 32;
    for (int l = 32 * w; l < 32 * w + 32 && l < int(blk.lanes.size()); ++l) blk.lanes[size_t(l)].pending = true;
    return;
  }
  blk.work.wmma_ldst += 1;
  blk.work.wmma_bytes += 256.0 * double(elem);
  uintptr_t addr[8];
  uint8_t bytes[8];
  const int lanes[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  for (int half = 0; half < 2; ++half)
    for (int c = 0; c < chunks; ++c) {
      for (int r = 0; r < 8; ++r) addr[r] = base + ((8 * half + r) * ldm) * elem + 16 * c, bytes[r] = 16;
      blk.work.wmma_wavefronts += phase_wavefronts(addr, bytes, lanes, 8);
      blk.work.wmma_ideal += 1;
    }
}

void count_cp_async(void* dst, const void* src, int bytes) {
  if (!counting_block) return;
  Request& r = join(Kind::cp, uintptr_t(1));
  const int l = current_thread->linear % 32;
  r.addr[l] = reinterpret_cast<uintptr_t>(dst);
  r.src[l] = reinterpret_cast<uintptr_t>(src);  // null: a zero fill, which reads nothing
  r.bytes[l] = uint8_t(bytes);
}

void count_cp_wait(int retired) {
  if (!counting_block || retired == 0) return;
  Lane& l = blk.lanes[size_t(current_thread->linear)];
  l.pending = true;  // the wait is a round trip, whatever else was in flight
  trip(l);
}

void count_access(uintptr_t addr, size_t bytes, bool store, uintptr_t site) {
  if (!counting_block || bytes == 0 || bytes > 255) return;
  bool shared = (addr >= blk.dyn_lo && addr < blk.dyn_hi) ||
                (addr >= blk.tls_lo && addr < blk.tls_hi && addr != blk.skip[0] && addr != blk.skip[1]);
  if (!shared && !is_global(addr)) return;  // registers, arguments, tables
  Lane& lane = blk.lanes[size_t(current_thread->linear)];
  if (store) {
    // A store waits for the loads its value came from; a later global load is not moved above
    // a global store it may alias, but is above a shared one (another address space).
    if (!shared && lane.pending) lane.sealed = true;
  } else if (!shared) {
    // A load after a sealed batch, or from a site with kUnrolled loads in flight (a loop's next
    // round of iterations), waits for the batch first.
    if (lane.sealed || std::count(lane.sites.begin(), lane.sites.end(), site) >= kUnrolled) trip(lane);
    lane.pending = true;
    lane.sites.push_back(site);
  }
  const Kind kind = shared ? (store ? Kind::sts : Kind::lds) : (store ? Kind::stg : Kind::ldg);
  Request& r = join(kind, site);
  const int l = current_thread->linear % 32;
  r.addr[l] = addr;
  r.bytes[l] = uint8_t(bytes);
}

// Each allocation ends at most 255 bytes below an inaccessible page (and starts somewhere above
// another): a kernel that writes more than the alignment's slack past its buffer faults there,
// in that kernel; an underrun is caught only past the rest of the first page. Unguarded, such a write lands
// in whatever is mapped next, which depends on the address layout (it once zeroed the thread's
// control block, and a later thread-local access crashed one run in six).
namespace {
size_t page_bytes() {
  static const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return page;
}
size_t guarded_pages(size_t bytes) {  // the pages between the guards
  return (std::max<size_t>(bytes, 1) + 255 + page_bytes() - 1) / page_bytes();
}
}  // namespace

void* count_alloc(size_t bytes) {
  const size_t page = page_bytes(), inner = guarded_pages(bytes);
  auto* map = static_cast<unsigned char*>(
      mmap(nullptr, (inner + 2) * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  if (map == MAP_FAILED) throw std::runtime_error("counting: could not map " + std::to_string(bytes) + " bytes");
  unsigned char* high = map + (inner + 1) * page;
  if (mprotect(map, page, PROT_NONE) != 0 || mprotect(high, page, PROT_NONE) != 0)
    throw std::runtime_error("counting: could not protect the guard pages of " + std::to_string(bytes) + " bytes");
  void* p = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(high) - std::max<size_t>(bytes, 1)) & ~uintptr_t(255));
  allocation_add(p, bytes);
  return p;
}
void count_free(void* p, size_t bytes) {
  if (!p) return;
  allocation_remove(p);
  const size_t page = page_bytes(), inner = guarded_pages(bytes);
  const uintptr_t high = (reinterpret_cast<uintptr_t>(p) + std::max<size_t>(bytes, 1) + page - 1) / page * page;
  munmap(reinterpret_cast<void*>(high - (inner + 1) * page), (inner + 2) * page);
}

namespace {
const CountDriver* the_driver = nullptr;
}
const CountDriver* count_driver() {
  return the_driver;
}
void set_count_driver(const CountDriver* d) {
  the_driver = d;
}

}  // namespace loom::emu
