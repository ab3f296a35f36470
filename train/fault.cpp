#include "train/fault.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "checkpoint/h5.h"
#include "checkpoint/manifest.h"
#include "model/backend.h"
#include "runtime/error.h"
#include "runtime/file.h"

namespace loom {

uint64_t tensor_hash(Backend& be, const Tensor& t) {
  std::vector<char> host(size_t(t.numel()) * dtype_size(t.dtype));
  be.download(host.data(), Buf(t));
  return XXH64(host.data(), host.size(), 0);
}

void tensor_bit_flip(Backend& be, Tensor& t, int64_t index) {
  LOOM_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16, "a bit flip needs fp32 or bf16 weights");
  const Buf one = Buf(t).slice(index, 1);
  uint32_t bits = 0;
  be.download(&bits, one);
  bits ^= t.dtype == DType::f32 ? (1u << 22) : (1u << 6);
  be.upload(one, &bits);
}

bool run_restarted() {
  for (const char* k : {"LOOM_RESTART", "SLURM_RESTART_COUNT"}) {
    const char* v = std::getenv(k);
    if (v && std::atoi(v) > 0) return true;
  }
  return false;
}

FaultInjector::FaultInjector(const Config& cfg, int world_rank, bool restarted)
    : cfg_(cfg), rank_(world_rank), armed_(!restarted) {
  const FaultConfig& f = cfg.fault;
  kill_.at = fault_parse("fault.kill", f.kill, true, true);
  exit_.at = fault_parse("fault.exit", f.exit, true, true);
  hang_.at = fault_parse("fault.hang", f.hang);
  nan_.at = fault_parse("fault.nan", f.nan);
  bitflip_.at = fault_parse("fault.bitflip", f.bitflip);
  corrupt_.at = fault_parse("fault.ckpt_corrupt", f.ckpt_corrupt, false);
  enospc_.at = fault_parse("fault.enospc", f.enospc, false);
  if (!f.slow.empty()) {  // RANK:MS
    const FaultAt s = fault_parse("fault.slow", f.slow);
    if (s.rank == world_rank) slow_ms_ = double(s.step);
  }
  const bool any = kill_.at.set() || exit_.at.set() || hang_.at.set() || nan_.at.set() || bitflip_.at.set() ||
                   corrupt_.at.set() || enospc_.at.set();
  if (any && restarted && world_rank == 0)
    spdlog::info("a restarted run: the fault drills of the config already fired and stay off");
}

bool FaultInjector::take(Drill& d, int64_t step, bool any_rank) {
  if (!armed_ || d.fired || !d.at.set() || d.at.step != step || (!any_rank && d.at.rank != rank_)) return false;
  d.fired = true;
  return true;
}

void FaultInjector::note(const char* kind, int64_t step, const std::string& what) const {
  spdlog::error("rank {}: fault drill: {} at step {}", rank_, what, step);
  event_append(cfg_.log.dir, "fault", fmt::format("\"kind\":\"{}\",\"rank\":{},\"step\":{}", kind, rank_, step));
}

void FaultInjector::at(int64_t step, const char* phase) {
  for (Drill* d : {&kill_, &exit_}) {
    if (d->at.phase != phase || !take(*d, step)) continue;
    const bool kill = d == &kill_;
    const std::string where = *phase ? fmt::format(" in the {} phase", phase) : std::string();
    note(kill ? "kill" : "exit", step, (kill ? "SIGKILL" : "exit(3)") + where);
    std::fflush(nullptr);
    if (kill) ::kill(::getpid(), SIGKILL);
    std::_Exit(3);  // a crash: no destructors, no MPI_Finalize
  }
}

bool FaultInjector::hang(int64_t step) {
  return take(hang_, step);
}
bool FaultInjector::nan(int64_t step) {
  return take(nan_, step);
}
bool FaultInjector::bitflip(int64_t step) {
  return take(bitflip_, step);
}
bool FaultInjector::ckpt_corrupt(int64_t step) {
  return rank_ == 0 && take(corrupt_, step, true);
}
bool FaultInjector::enospc(int64_t step) {
  return rank_ == 0 && take(enospc_, step, true);
}
double FaultInjector::slow_ms() {
  if (!armed_ || slow_ms_ <= 0) return 0.0;
  if (!slow_noted_) note("slow", 1, fmt::format("{} ms more compute every step", slow_ms_));
  slow_noted_ = true;
  return slow_ms_;
}

void checkpoint_corrupt(const FaultInjector& fi, int64_t step, const std::string& dir) {
  const Manifest m = manifest_read(dir);
  const ShardRef& s = m.tensors.begin()->second.shards.at(0);
  const std::string file = dir + "/" + s.file;
  const int64_t at = H5Reader(file).offset(s.dataset);
  std::FILE* f = std::fopen(file.c_str(), "r+b");
  LOOM_CHECK(f, "fault.ckpt_corrupt: cannot open '{}'", file);
  std::fseek(f, long(at), SEEK_SET);
  const int c = std::fgetc(f);
  std::fseek(f, long(at), SEEK_SET);
  std::fputc(c ^ 0x40, f);
  std::fclose(f);
  fi.note("ckpt_corrupt", step, fmt::format("flipped a byte of {} in {}", s.dataset, file));
}

std::string UpdateGuard::check(double loss, double norm) {
  std::string why;
  last_nonfinite_ = !std::isfinite(loss) || !std::isfinite(norm);
  if (last_nonfinite_) {
    why = fmt::format("non-finite {} ({})", std::isfinite(norm) ? "loss" : "gradient norm",
                      std::isfinite(norm) ? loss : norm);
  } else if (spike_factor_ > 0 && recent_.size() >= 8) {
    std::vector<double> sorted(recent_.begin(), recent_.end());
    std::nth_element(sorted.begin(), sorted.begin() + long(sorted.size() / 2), sorted.end());
    const double median = sorted[sorted.size() / 2];
    if (norm > spike_factor_ * median)
      why = fmt::format("gradient norm {:.4g} is {:.1f}x its running median {:.4g} (fault.spike_factor = {})", norm,
                        norm / median, median, spike_factor_);
  }
  if (!why.empty()) {
    ++in_a_row_;
    ++total_;
    return why;
  }
  in_a_row_ = 0;
  recent_.push_back(norm);
  if (recent_.size() > 32) recent_.pop_front();
  return why;
}

std::vector<int> StragglerWatch::update(const std::vector<double>& ms, std::vector<int>* fresh,
                                        const std::vector<int>& group) {
  std::vector<int> out;
  for (size_t r = 0; r < ms.size() && r < slow_.size(); ++r) {
    std::vector<double> peers;
    for (size_t q = 0; q < ms.size(); ++q)
      if (group.empty() || group[q] == group[r]) peers.push_back(ms[q]);
    std::sort(peers.begin(), peers.end());
    const double median = peers[(peers.size() - 1) / 2];  // the lower one: with 2 ranks, the faster
    median_[r] = median;
    const bool slow = peers.size() > 1 && ms[r] > median * (1 + margin_) && ms[r] > median + 2.0;
    slow_[r] = slow ? slow_[r] + 1 : 0;
    if (slow_[r] >= steps_) out.push_back(int(r));
    if (fresh && slow_[r] == steps_) fresh->push_back(int(r));
  }
  return out;
}

}  // namespace loom
