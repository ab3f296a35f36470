// Recovery from a bad step (train/fault.h): the SDC check (the gradients computed again and
// compared), skipped updates and the rollback past fault.max_skips, and the straggler watch.
// Not here: the drills that make the faults (train/drills.h).
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
        gone ? fmt::format(" (the {} after it removed)", plural(gone, "checkpoint")) : "");
    event_append(cfg.log.dir, "rollback", fmt::format("\"from\":{},\"to\":{}", s1, loaded));
  }
  guard.rolled_back();
  rolled_back_to = loaded;
  rolled_back_at = s1;
  next = loaded;
}

std::vector<int> Trainer::Parts::sdc_check(int64_t step, float dloss, bool* unresolved) {
  // Computed twice without communicating, each rank's gradients must be the same bits; a
  // rank where they differ computes a third time, and the update goes ahead where two agree.
  // The drills (a flipped bit, a NaN seed) hit the first computation only: a transient fault.
  ProcessGroup& world = mesh->world_group();
  auto gather = [&](int32_t mine) {
    std::vector<int32_t> all(size_t(world.size()), 0);
    all[size_t(world.rank())] = mine;
    if (world.size() > 1)
      world.all_gather(Buf(&all[size_t(world.rank())], 1), Buf(all.data(), int64_t(all.size()))).wait();
    return all;
  };
  const int64_t s1 = step + 1;
  const float clean = 1.0f / float(tokens_per_step);
  micro_batches(step, dloss, false);
  drills->at(StepPoint::gradients_done, s1);
  const uint64_t a = tensor_hash(*backend, chunk->grads_tensor());
  backend->zero(Buf(chunk->loss_sum()));
  micro_batches(step, clean, false);
  const uint64_t b = tensor_hash(*backend, chunk->grads_tensor());
  const std::vector<int32_t> differ = gather(a != b);
  std::vector<int> ranks;
  for (size_t r = 0; r < differ.size(); ++r)
    if (differ[r]) ranks.push_back(int(r));
  *unresolved = false;
  if (!ranks.empty()) {
    backend->zero(Buf(chunk->loss_sum()));
    micro_batches(step, clean, false);  // every rank: the tp collectives inside need all
    const uint64_t c = tensor_hash(*backend, chunk->grads_tensor());
    for (int32_t u : gather(a != b && c != a && c != b)) *unresolved = *unresolved || u;
  }
  if (!ranks.empty() && lead) {
    std::string names;
    for (int r : ranks) names += (names.empty() ? "" : ", ") + std::to_string(r);
    spdlog::error("step {}: silent data corruption: rank {}'s gradients differ from its own recomputation; {}", s1,
                  names,
                  *unresolved ? "no two of three agree, the update is skipped"
                              : "a third computation agrees with one of them and the update uses it");
    event_append(cfg.log.dir, "sdc",
                 fmt::format("\"step\":{},\"ranks\":[{}],\"resolved\":{}", s1, names, !*unresolved));
  }
  return ranks;
}

void Trainer::Parts::stragglers_watch(const std::vector<double>& compute) {
  const int n = int(compute.size());
  if (n < 2 || result.steps_done <= start_step) return;
  std::vector<int> fresh;
  std::vector<int> stage(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) stage[size_t(r)] = mesh_coord(mesh->dims(), r).pp;
  stragglers = straggle.update(compute, &fresh, stage);
  for (int r : fresh)
    if (lead) {
      spdlog::warn(
          "rank {} is a straggler: compute {:.1f} ms a step against the ranks' median of {:.1f} ms, for {} "
          "steps in a row",
          r, compute[size_t(r)], straggle.median(r), 5);
      event_append(cfg.log.dir, "straggler",
                   fmt::format("\"rank\":{},\"step\":{},\"compute_ms\":{:.2f},\"median_ms\":{:.2f}", r,
                               result.steps_done, compute[size_t(r)], straggle.median(r)));
    }
}

}  // namespace loom
