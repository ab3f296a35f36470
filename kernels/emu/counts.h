// What a kernel launch asks of an sm_90, counted by the CUDA emulation from each lane's own
// addresses: mma.sync and WMMA products, ldmatrix, cp.async, plain shared and global requests
// per warp (shared-memory wavefronts against the ideal, as Nsight Compute counts bank
// conflicts; global 32-byte sectors), barriers, warp exchanges, MUFU operations and each
// warp's dependent global round trips. A CountSession on the calling thread turns it on: its
// launches run a few blocks of each distinct kind (stratum midpoints of each grid dimension)
// and scale them to the grid. Counts, not times: plan/kernel_model.h turns them into times.
// Global and plain shared accesses are seen only in
// kernels built for counting (LOOM_EMU_COUNT: compiled with access callbacks, count_hooks.cpp);
// the PTX primitives, barriers and exchanges are counted in every emulated build.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::emu {

// One block's work, or a launch's (the blocks run, each times the blocks it stands for).
struct WorkCounts {
  double mma = 0;   // mma.sync m16n8k16 warp instructions: 4096 FLOPs each
  double wmma = 0;  // wmma 16x16x16 mma_sync warp operations: 8192 FLOPs each
  // ldmatrix warp instructions, the 8x8 matrices they move (128 bytes each) and the
  // shared-memory wavefronts they take (one per matrix without bank conflicts).
  double ldmatrix = 0, ldmatrix_matrices = 0, ldmatrix_wavefronts = 0;
  // WMMA fragment loads and stores through shared memory (ldmatrix-like: 512 bytes each).
  double wmma_ldst = 0, wmma_bytes = 0, wmma_wavefronts = 0, wmma_ideal = 0;
  // cp.async warp requests, the bytes they copy, and their shared-memory wavefronts.
  double cp_async = 0, cp_async_bytes = 0, cp_async_wavefronts = 0, cp_async_ideal = 0;
  // Plain shared-memory requests (warp instructions), bytes, wavefronts and the ideal.
  double lds = 0, lds_bytes = 0, lds_wavefronts = 0, lds_ideal = 0;
  double sts = 0, sts_bytes = 0, sts_wavefronts = 0, sts_ideal = 0;
  // Global requests (warp instructions; cp.async's reads counted here too), the bytes the
  // lanes asked for, and the distinct 32-byte sectors each request touched.
  double ldg = 0, ldg_bytes = 0, ldg_sectors = 0;
  double stg = 0, stg_bytes = 0, stg_sectors = 0;
  // Plain global loads that start where the same warp's latest ended: a warp walking a row of
  // its own, a request at a time.
  double ldg_walking = 0;
  double barriers = 0;  // __syncthreads a block completes
  double warp_ops = 0;  // shuffles, votes, __syncwarp (warp instructions)
  double mufu = 0;      // ex2, exp, log, rsqrt (warp instructions)
  double warps = 0;
  // Dependent global round trips: summed over warps, and the most one warp waits on.
  double trips_sum = 0, trips_max = 0;
  void add(const WorkCounts& o, double weight);
  double tensor_flops() const { return 4096.0 * mma + 8192.0 * wmma; }
  double dram_bytes() const { return 32.0 * (ldg_sectors + stg_sectors); }
};

struct LaunchCounts {
  std::string kernel;
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  size_t dynamic_shared = 0;
  double blocks = 0;      // the grid's
  double blocks_run = 0;  // the ones the emulation ran
  WorkCounts total;       // the whole grid
  WorkCounts heaviest;    // the block with the most work of those run: where a causal grid ends
  int threads() const { return int(block[0] * block[1] * block[2]); }
};

// Blocks run per grid dimension: up to samples[d] stratum midpoints, each standing for its
// stratum (all of them where the dimension is no larger).
struct CountOptions {
  int samples[3] = {2, 16, 1};
};

// While one lives on a thread, that thread's launches are counted (and run only sampled
// blocks, so their outputs are incomplete: for counting, not for results).
class CountSession {
 public:
  explicit CountSession(CountOptions opt = {});
  ~CountSession();
  CountSession(const CountSession&) = delete;
  CountSession& operator=(const CountSession&) = delete;
  const std::vector<LaunchCounts>& launches() const { return launches_; }
  const CountOptions& options() const { return opt_; }
  std::vector<LaunchCounts> take();  // the launches so far; the session goes on empty
  void add(LaunchCounts c) { launches_.push_back(std::move(c)); }

 private:
  CountOptions opt_;
  std::vector<LaunchCounts> launches_;
  CountSession* outer_;
};
CountSession* count_session();

// "attention_forward_flash_kernel<64>" from a kernel_signature (runtime.h): the instantiation
// without namespaces, as tests/cuda/ptxas_check.py names ptxas's entries.
std::string kernel_instance(const char* signature);

// A grid dimension's sampled coordinates, each with the number of coordinates it stands for.
std::vector<std::pair<unsigned, double>> count_samples(unsigned n, int samples);

// Called by the emulation itself (block.cpp, ptx.h, wmma.h, device.h), no-ops unless a block
// of a counted launch runs on this thread.
struct BlockState;
extern thread_local bool counting_block;
void count_block_begin(int threads, const BlockState& block);
void count_block_end(double weight, LaunchCounts& into);
void count_lane_wait();                                 // this lane waits: a barrier or a warp exchange
void count_warp_done(int warp);                         // a warp exchange completed: its lanes' requests close
void count_warp_op();                                   // once per shuffle, vote or __syncwarp
void count_barrier();                                   // once per completed __syncthreads
void count_mma();                                       // once per warp
void count_wmma();                                      // once per warp
void count_ldmatrix(const uint64_t* lane_rows, int n);  // once per warp: word 8 l of lane l
void count_wmma_tile(const void* p, size_t ldm, size_t elem_bytes, bool col_major);  // once per warp
void count_cp_async(void* dst, const void* src, int bytes);                          // per lane
void count_cp_wait(int retired);                                                     // per lane: copies that landed
void count_mufu();                                                                   // per lane
// A plain access at `site` (the instruction's address in the counting build): global where
// it is device memory, shared where it is the block's shared memory, else not counted.
void count_access(uintptr_t addr, size_t bytes, bool store, uintptr_t site);

// The device allocations, for telling global accesses from others (stream.cpp).
std::vector<std::pair<uintptr_t, uintptr_t>> device_ranges();

// Memory for counted launches: device memory of `bytes` whose untouched pages cost nothing
// (zeros), registered as a device allocation until freed.
void* count_alloc(size_t bytes);
void count_free(void* p, size_t bytes);

}  // namespace loom::emu
