// The end of a run that diverged (train/divergence.h): the checks at the end of a run, and the
// stop itself, which keeps the last checkpoint whose weights gave a finite loss as the newest.
#include "train/divergence.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "checkpoint/retention.h"
#include "train/trainer_parts.h"

namespace loom {

void Trainer::Parts::diverged(const std::string& why) {
  // The last step whose update was applied: the weights of every checkpoint before it gave a
  // finite loss and gradient norm.
  const int64_t proven = next - guard.skips_in_a_row();
  ProcessGroup& world = mesh->world_group();
  if (ckpt) ckpt->flush();  // a save in flight is committed (or refused) first
  std::string good, where;
  if (ckpt && world.rank() == 0) {
    good = checkpoint_newest_before(cfg.checkpoint.dir, proven);
    // The newer ones hold weights that gave no finite loss: `checkpoint.resume = "latest"` must
    // find the good one.
    const std::vector<std::string> gone =
        good.empty() ? std::vector<std::string>{}
                     : checkpoints_remove_from(cfg.checkpoint.dir, checkpoint_step_of(good) + 1, opt.quiet);
    where = good.empty()
                ? fmt::format("no checkpoint in '{}' holds weights that gave a finite loss (none from before step {})",
                              cfg.checkpoint.dir, proven)
                : fmt::format("the last checkpoint whose weights gave a finite loss is {}{}", good,
                              gone.empty() ? "" : fmt::format(" (the {} written after it were removed)", gone.size()));
    event_append(cfg.log.dir, "diverged",
                 fmt::format("\"step\":{},\"good\":{}", next, good.empty() ? -1 : checkpoint_step_of(good)));
  }
  if (world.size() > 1) world.barrier().wait();
  if (!ckpt) where = "there is no checkpoint to go back to (checkpoint.every = 0)";
  throw Diverged(fmt::format("the run diverged at step {}: {}; {}; lower train.lr (or raise train.warmup_steps){}",
                             next, why, where,
                             good.empty() ? " and start again" : ", and resume (checkpoint.resume = \"latest\")"));
}

void Trainer::Parts::diverged_at_end() {
  // Weights that hold a NaN or an infinity, or that gave a non-finite loss in the run's last
  // step (its update skipped), are no result: no export, no last checkpoint.
  std::vector<float> w(chunk->num_params());
  dpar->weights_to(w.data());
  float bad = float(std::count_if(w.begin(), w.end(), [](float v) { return !std::isfinite(v); }));
  ProcessGroup& world = mesh->world_group();
  if (world.size() > 1) world.all_reduce(Buf(&bad, 1), ReduceOp::sum).wait();
  if (bad > 0) diverged(fmt::format("its final weights hold {:.0f} NaN or infinite values", bad));
  if (guard.skips_in_a_row() > 0 && guard.last_nonfinite())
    diverged(guard.skips_in_a_row() == 1
                 ? std::string("its last update was skipped for a non-finite loss or gradient norm")
                 : fmt::format("its last {} updates were skipped for a non-finite loss or gradient norm",
                               guard.skips_in_a_row()));
}

}  // namespace loom
