// `loom plan memory`: each rank's bytes before launch, for any layout, dtype and device. For
// loom's own runs it adds up the very lists the components allocate from (model/layout.h's
// activation plan, the backends', the optimizer's and ZeRO's PlanItems), so it equals the
// ledger of a real run to the byte; and, for the ZeRO paper's setting, its closed form.
#pragma once
#include <array>
#include <string>

#include "runtime/allocator.h"
#include "runtime/config.h"

namespace loom {

struct PartSpec;

// ZeRO paper, Figure 1: bytes per rank for stages 0..3 with psi parameters, dp ranks and
// `bytes_param`, `bytes_grad`, `k` bytes per parameter (mixed precision: 2, 2, 12).
std::array<double, 4> plan_zero_paper(double psi, int dp, double bytes_param, double bytes_grad, double k);

struct MemoryPlan {
  std::array<int64_t, kMemCategories> bytes{};
  int64_t of(Mem m) const { return bytes[size_t(m)]; }
  int64_t total() const;
};
// What world rank `rank` of cfg holds while training on `device` ("cpu" or "cuda") in `dtype`
// (`spec`: its stage's pipeline_chunk_spec, when the caller has it already).
MemoryPlan plan_memory(const Config& cfg, DeviceKind device, DType dtype, int rank = 0, const PartSpec* spec = nullptr);
// The memory one rank may fill: `sharing` ranks divide the host's available memory (its
// MemAvailable, or what the cgroup's limit leaves when less) or, on a GPU, its free memory; the
// emulated device's where LOOM_EMULATED_DEVICE_MB sizes it (one a rank), else the host's.
struct MemoryAvailable {
  int64_t bytes = -1;  // -1: unknown (nothing is refused)
  std::string from;    // "18.2 GiB available on this host, shared by 4 ranks"
};
MemoryAvailable memory_available(DeviceKind kind, int sharing);
// Refuses, before anything is laid out, a model whose weights alone (in `dtype`, spread over
// all `world` ranks) exceed `avail`: a billion-layer model must not be built to be measured.
void memory_fit_rough(const Config& cfg, DType dtype, int world, const MemoryAvailable& avail);
// Refuses a rank whose plan exceeds `avail`, with the plan's numbers and what to change.
void memory_fit_check(const MemoryPlan& plan, int rank, const MemoryAvailable& avail);

// The flash backward's stored dS (the CUDA backend's "attention_ds", up to 1 GiB) against the
// device's memory: it is a speed-up, never a reason to refuse a run, so it is planned only where
// the rank's whole plan with it leaves a margin free (a twentieth of `avail`, at least 64 MiB,
// for what no plan lists: the CUDA context's and libraries' own allocations, fragmentation).
// Where it does not, the caller clears cfg.train.attention_ds (dQ recomputes S and dP, the
// same bits) and says `note` once.
struct AttentionDsFit {
  int64_t bytes = 0;  // the store cfg plans on this rank, 0 where none
  bool fits = true;   // false: leave it out
  std::string note;   // where it does not fit: what, against what, and what runs instead
};
// `with`: the rank's plan total with the store, where the caller has it (else planned here).
AttentionDsFit attention_ds_fit(const Config& cfg, DeviceKind device, DType dtype, int rank, const PartSpec* spec,
                                const MemoryAvailable& avail, int64_t with = -1);
// What the plan holds of the store, for `loom plan memory`: its size, or why there is none.
std::string attention_ds_line(const Config& cfg, DeviceKind device);

// The four ZeRO stages side by side for rank 0, MiB.
std::string plan_memory_table(const Config& cfg, DeviceKind device, DType dtype);
// Every rank's plan at cfg's stage, bytes, as JSON.
std::string plan_memory_json(const Config& cfg, DeviceKind device, DType dtype);

}  // namespace loom
