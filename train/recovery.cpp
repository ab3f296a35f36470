// Recovery and drills (train/fault.h): the drills around a step's gradients, the SDC check,
// skipped updates and rollback, and the step boundary (stop signals, checkpoint commits, the
// straggler watch).
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "checkpoint/retention.h"
#include "runtime/cuda_api.h"
#include "train/divergence.h"
#include "train/trainer_parts.h"

namespace loom {

void Trainer::Parts::drills_step_begin(int64_t s1) {
  faults->at(s1, "");
  if (faults->hang(s1)) {
    faults->note("hang", s1, "stopping inside this step's next collective");
    mesh->hang_next_op();
  }
}

void Trainer::Parts::grads_compute(int64_t step, StepMetrics& m, uint64_t syncs0, bool* sdc_unresolved) {
  FaultInjector& fi = *faults;
  const int64_t s1 = step + 1;
  if (const double ms = fi.slow_ms(); ms > 0)
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
  const bool poison = fi.nan(s1), flip = fi.bitflip(s1);
  if (poison) fi.note("nan", s1, "a NaN into this rank's gradients");
  if (flip) fi.note("bitflip", s1, "a flipped bit in one weight while this step computes");
  if (cfg.fault.sdc_every > 0 && s1 % cfg.fault.sdc_every == 0) {
    m.sdc_ranks = sdc_check(step, flip, poison, sdc_unresolved);
    if (!m.sdc_ranks.empty() && lead) {
      std::string names;
      for (int r : m.sdc_ranks) names += (names.empty() ? "" : ", ") + std::to_string(r);
      spdlog::error("step {}: silent data corruption: rank {}'s gradients differ from its own recomputation; {}", s1,
                    names,
                    *sdc_unresolved ? "no two of three agree, the update is skipped"
                                    : "a third computation agrees with one of them and the update uses it");
      event_append(cfg.log.dir, "sdc",
                   fmt::format("\"step\":{},\"ranks\":[{}],\"resolved\":{}", s1, names, !*sdc_unresolved));
    }
    return;
  }
  const int64_t at = int64_t(chunk->num_params() / 2);
  if (flip) tensor_bit_flip(*backend, chunk->params_tensor(), at);
  micro_batches(step, true, poison);
  if (alloc->device() == DeviceKind::cuda_emulated) m.host_syncs_compute = int64_t(cuda_emulated_host_syncs() - syncs0);
  if (flip) tensor_bit_flip(*backend, chunk->params_tensor(), at);
}

void Trainer::Parts::skipped(int64_t s1, const std::string& why) {
  if (lead)
    spdlog::warn("step {}: update skipped on every rank: {} ({} in a row, {} in this run)", s1, why,
                 guard.skips_in_a_row(), guard.skips_total());
  if (lead) event_append(cfg.log.dir, "skip", fmt::format("\"step\":{},\"why\":\"{}\"", s1, why));
  if (!guard.rollback_due()) return;
  // The trouble began after the last step whose update was applied: the newest checkpoint
  // before it is the last one whose weights gave a finite loss (train/divergence.h).
  const int64_t proven = s1 - guard.skips_in_a_row();
  const std::string streak = fmt::format("{} updates in a row were skipped (fault.max_skips = {}; the last: {})",
                                         guard.skips_in_a_row(), cfg.fault.max_skips, why);
  if (!ckpt) diverged(streak);
  // A run is deterministic: rolled back, it replays the same steps and fails them the same way
  // unless the fault was transient. A second rollback before the run has got past the step of
  // the first is not made: the run ends, diverged.
  if (s1 <= rolled_back_at)
    diverged(fmt::format("{}, again after rolling back to step {} at step {}", streak, rolled_back_to, rolled_back_at));
  ckpt->flush();
  // Rank 0 writes a manifest after the other ranks have left the commit: once it reaches the
  // barrier every rank sees the same checkpoints. The newest one before the trouble that loads
  // on every rank, with the fallback of a resume.
  mesh->world_group().barrier().wait();
  Config latest = cfg;
  latest.checkpoint.resume = "latest";
  std::string from;
  const int64_t loaded = checkpoint_resume(latest, mesh->world_group(), chunk->registry(), *dpar, true, &from, proven);
  if (from.empty()) diverged(streak + ", and no checkpoint was written before the trouble began");
  // The checkpoints after it are of the steps run again (and their weights gave no finite loss).
  size_t gone = 0;
  if (mesh->world_group().rank() == 0) gone = checkpoints_remove_from(cfg.checkpoint.dir, loaded + 1, true).size();
  mesh->world_group().barrier().wait();
  if (lead) {
    spdlog::warn(
        "rolling back to {} (step {}), the newest checkpoint written before the trouble began, after {} skipped "
        "updates; steps {}..{} are run again{}",
        from, loaded, guard.skips_in_a_row(), loaded + 1, s1,
        gone ? fmt::format(" (the {} checkpoint{} after it removed)", gone, gone == 1 ? "" : "s") : "");
    event_append(cfg.log.dir, "rollback", fmt::format("\"from\":{},\"to\":{}", s1, loaded));
  }
  guard.rolled_back();
  rolled_back_to = loaded;
  rolled_back_at = s1;
  next = loaded;
}

std::vector<int> Trainer::Parts::sdc_check(int64_t step, bool flip, bool poison, bool* unresolved) {
  // Computed twice without communicating, each rank's gradients must be the same bits; a
  // rank where they differ computes a third time, and the update goes ahead where two agree.
  ProcessGroup& world = mesh->world_group();
  auto gather = [&](int32_t mine) {
    std::vector<int32_t> all(size_t(world.size()), 0);
    all[size_t(world.rank())] = mine;
    if (world.size() > 1)
      world.all_gather(Buf(&all[size_t(world.rank())], 1), Buf(all.data(), int64_t(all.size()))).wait();
    return all;
  };
  const int64_t at = int64_t(chunk->num_params() / 2);
  if (flip) tensor_bit_flip(*backend, chunk->params_tensor(), at);
  micro_batches(step, false, poison);  // the drills hit the first computation only: a transient fault
  if (flip) tensor_bit_flip(*backend, chunk->params_tensor(), at);
  const uint64_t a = tensor_hash(*backend, chunk->grads_tensor());
  backend->zero(Buf(chunk->loss_sum()));
  micro_batches(step, false, false);
  const uint64_t b = tensor_hash(*backend, chunk->grads_tensor());
  const std::vector<int32_t> differ = gather(a != b);
  std::vector<int> ranks;
  for (size_t r = 0; r < differ.size(); ++r)
    if (differ[r]) ranks.push_back(int(r));
  *unresolved = false;
  if (ranks.empty()) return ranks;
  backend->zero(Buf(chunk->loss_sum()));
  micro_batches(step, false, false);  // every rank: the tp collectives inside need all
  const uint64_t c = tensor_hash(*backend, chunk->grads_tensor());
  for (int32_t u : gather(a != b && c != a && c != b)) *unresolved = *unresolved || u;
  return ranks;
}

bool Trainer::between_steps() {
  Parts& p = *p_;
  // One gather a step: stop signals and checkpoint write states (the job acts on the worst),
  // and each rank's compute time (the straggler watch).
  ProcessGroup& world = p.mesh->world_group();
  const int n = world.size(), me = world.rank();
  std::vector<double> all(size_t(3 * n), 0.0);
  all[size_t(3 * me)] = stop_signal();
  all[size_t(3 * me + 1)] = p.ckpt ? p.ckpt->write_state() : 0;
  all[size_t(3 * me + 2)] = p.last_compute_ms;
  if (n > 1) world.all_gather(Buf(&all[size_t(3 * me)], 3), Buf(all.data(), int64_t(all.size()))).wait();
  int32_t sig = 0, write_state = 0;
  std::vector<double> compute(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    sig = std::max(sig, int32_t(all[size_t(3 * r)]));
    write_state = std::max(write_state, int32_t(all[size_t(3 * r + 1)]));
    compute[size_t(r)] = all[size_t(3 * r + 2)];
  }
  if (p.ckpt) p.ckpt->settle(write_state);
  if (n > 1 && p.result.steps_done > p.start_step) {
    std::vector<int> fresh;
    std::vector<int> stage(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) stage[size_t(r)] = mesh_coord(p.mesh->dims(), r).pp;
    p.stragglers = p.straggle.update(compute, &fresh, stage);
    for (int r : fresh)
      if (p.lead) {
        spdlog::warn(
            "rank {} is a straggler: compute {:.1f} ms a step against the ranks' median of {:.1f} ms, for {} "
            "steps in a row",
            r, compute[size_t(r)], p.straggle.median(r), 5);
        event_append(p.cfg.log.dir, "straggler",
                     fmt::format("\"rank\":{},\"step\":{},\"compute_ms\":{:.2f},\"median_ms\":{:.2f}", r,
                                 p.result.steps_done, compute[size_t(r)], p.straggle.median(r)));
      }
  }
  if (sig) p.result.stopped_by = sig;
  return sig != 0;
}

int Trainer::Parts::stop_agreed() {
  double sig = stop_signal();
  ProcessGroup& world = mesh->world_group();
  if (world.size() > 1) world.all_reduce(Buf(&sig, 1), ReduceOp::max).wait();
  return int(sig);
}

int64_t Trainer::next_step() const {
  return p_->next;
}

void Trainer::Parts::tied_copies_check() {
  // The first stage's embedding and the last stage's copy see the same summed gradients and
  // the same updates: their (master) weights must be the same bits. Collective.
  std::vector<float> w(chunk->num_params());
  dpar->weights_to(w.data());
  uint64_t h[2] = {0, 0};
  if (chunk->has_embedding() || chunk->holds_tied_copy()) {
    const ParamSpec& e = chunk->registry().at(head_names(cfg).wte);
    h[chunk->has_embedding() ? 0 : 1] = XXH64(w.data() + e.offset, size_t(e.numel()) * 4, 0);
  }
  ProcessGroup& embed = mesh->host_group(Axis::embed);
  std::vector<double> both = {double(h[0] >> 32), double(h[0] & 0xffffffffu), double(h[1] >> 32),
                              double(h[1] & 0xffffffffu)};
  if (embed.size() > 1) embed.all_reduce(Buf(both.data(), 4), ReduceOp::sum).wait();
  if (embed.size() < 2) return;  // a middle stage
  LOOM_CHECK(both[0] == both[2] && both[1] == both[3],
             "internal error: the tied embedding's copies on the first and last pipeline stage differ");
  if (lead) spdlog::info("tied embedding: the first and last stage's copies are bitwise equal");
}

}  // namespace loom
