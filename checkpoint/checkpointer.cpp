#include "checkpoint/checkpointer.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "checkpoint/h5.h"
#include "checkpoint/pieces.h"
#include "checkpoint/retention.h"
#include "model/layout.h"
#include "runtime/error.h"
#include "runtime/file.h"

namespace loom {

namespace fs = std::filesystem;

namespace {
constexpr const char* kKinds[3] = {"params", "exp_avg", "exp_avg_sq"};

std::string rank_file(int rank) {
  return fmt::format("rank-{:05d}.h5", rank);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
// Writes and deletes stay inside checkpoint.dir: a step directory or rank file that is a link
// (which the clean-up of an earlier attempt would follow, and a writer write through) is refused.
void no_link(const std::string& path, const std::string& root) {
  std::error_code ec;
  if (!fs::is_symlink(fs::symlink_status(path, ec))) return;
  const fs::path to = fs::read_symlink(path, ec);
  fail(
      "checkpoint: '{}' is a symbolic link (to '{}'); loom writes and deletes only inside checkpoint.dir '{}', never "
      "through a link: remove the link, or choose another checkpoint.dir",
      path, to.string(), root);
}

}  // namespace

Checkpointer::Checkpointer(const Config& cfg, ProcessGroup& world, nlohmann::json layout, bool quiet)
    : cfg_(cfg), world_(world), layout_(std::move(layout)), quiet_(quiet || world.rank() != 0) {
  // One job saves into and prunes a checkpoint directory at a time (every rank saves into the
  // same one: the ranks' configs are compared at start).
  if (world.rank() == 0) lock_ = std::make_unique<DirLock>(cfg.checkpoint.dir);
  // A rank of several is its launcher's child (mpirun's or its daemon's, srun's step daemon).
  if (world.size() > 1) launcher_ = ::getppid();
}

Checkpointer::~Checkpointer() {
  if (thread_.joinable()) thread_.join();
}

bool Checkpointer::due(int64_t steps_done) const {
  const int every = cfg_.checkpoint.every;
  return every > 0 && (steps_done % every == 0 || steps_done == cfg_.train.steps);
}

int32_t Checkpointer::write_state() const {
  return state_.load();
}

void Checkpointer::save(int64_t steps_done, DataParallel& dp) {
  flush();  // one save at a time: the previous one is written and committed first
  const std::string dir = cfg_.checkpoint.dir + "/" + checkpoint_dir_name(steps_done);
  no_link(dir, cfg_.checkpoint.dir);
  no_link(dir + "/" + rank_file(world_.rank()), cfg_.checkpoint.dir);
  std::error_code ec;
  // A step directory that holds what loom did not write is not loom's to write into (its
  // clean-up and pruning would touch it): the ranks agree, and all refuse.
  const std::vector<std::string> foreign =
      fs::is_directory(dir, ec) ? step_dir_foreign(dir) : std::vector<std::string>{};
  float refuse = foreign.empty() ? 0.0f : 1.0f;
  world_.all_reduce(Buf(&refuse, 1), ReduceOp::max).wait();
  if (refuse > 0)
    fail(
        "checkpoint step {}: '{}' {}, which loom did not write; loom saves a step only into a directory of its "
        "own: move {} out of checkpoint.dir, or choose another checkpoint.dir",
        steps_done, dir, foreign.empty() ? "holds files on another rank" : "holds " + names_list(foreign),
        foreign.size() == 1 ? "it" : "them");
  fs::create_directories(dir, ec);
  if (ec) fail_io("cannot create checkpoint directory '{}': {}", dir, ec.message());
  // Saving over a committed checkpoint of the same step (a rerun): it stops being one before
  // any rank overwrites its file.
  if (world_.rank() == 0) fs::remove(dir + "/manifest.json", ec);
  world_.barrier().wait();

  // Every piece of every run this rank writes, read by the writer from the state as it is now
  // (on CUDA, a copy downloaded now: then nothing waits for the writer's reads).
  const StateHost host = dp.state_host(keep_);
  const bool copied = keep_.size() > 0 && host.m >= keep_.data() && host.m < keep_.data() + keep_.size();
  items_.clear();
  std::map<std::string, int> count;
  const std::string file = rank_file(world_.rank());
  const std::vector<StateRun> runs = dp.state_runs(StateUse::write);
  LOOM_ASSERT(host.run_at.empty() || host.run_at.size() == runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    const StateRun& run = runs[i];
    const ParamSpec& spec = *run.spec;
    const int64_t f0 = run.flat - int64_t(spec.offset);
    // src: the run's first element, in the whole state or (packed) where run i came down.
    const int64_t w_at = host.run_at.empty() ? (host.weights_by_flat ? run.flat : run.state) : host.run_at[i];
    const int64_t s_at = host.run_at.empty() ? run.state : host.run_at[i];
    const float* src[3] = {host.weights + w_at, host.m + s_at, host.v + s_at};
    for (const Piece& p : pieces_of(spec, f0, f0 + run.n))
      for (int k = 0; k < 3; ++k) {
        StagedShard it;
        it.tensor = std::string(kKinds[k]) + "/" + spec.name;
        it.global_shape = spec.global_shape;
        it.shard = {file, fmt::format("{}/{}", it.tensor, count[it.tensor]++), piece_offset(spec, p),
                    piece_shape(spec, p), ""};
        it.spec = &spec;
        it.piece = p;
        it.src = src[k];
        it.f0 = f0;
        items_.push_back(std::move(it));
      }
  }
  live_ = !copied;
  stager_.reserve(items_, live_);
  saved_step_ = steps_done;
  pending_ = true;
  state_ = 1;
  error_.clear();
  reading_ = live_;
  if (!cfg_.checkpoint.async) {
    try {
      write(steps_done);
      state_ = 0;
    } catch (const Error& e) {
      error_ = e.what();
      state_ = 2;
    }
    flush();
    return;
  }
  thread_ = std::thread([this, steps_done] {
    try {
      write(steps_done);
      state_ = 0;
    } catch (const std::exception& e) {
      error_ = e.what();
      state_ = 2;
    }
  });
}

void Checkpointer::wait_reads() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return !reading_; });
}

void Checkpointer::write(int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  auto reads_done = [&] {
    {
      std::lock_guard lk(mu_);
      reading_ = false;
    }
    cv_.notify_all();
  };
  const std::string path = cfg_.checkpoint.dir + "/" + checkpoint_dir_name(step) + "/" + rank_file(world_.rank());
  auto halfway = [&](size_t i) {  // the fault drills strike halfway through the file
    if (i != items_.size() / 2) return;
    if (fault_in_write) fault_in_write(step);
    LOOM_CHECK(!(fault_enospc && fault_enospc(step)), "cannot write '{}': {} (fault drill: fault.enospc)", path,
               std::strerror(ENOSPC));
  };
  stager_.write(path, items_, live_, reads_done, halfway);
  write_s_ = seconds_since(t0);
}

void Checkpointer::settle(int32_t world_state) {
  if (!pending_) return;
  if (world_state == 1) return;  // some rank is still writing
  if (thread_.joinable()) thread_.join();
  if (world_state == 2) {
    pending_ = false;
    const std::string last = fmt::format(
        "the last committed checkpoint is untouched; free space or fix '{}' and "
        "resume",
        cfg_.checkpoint.dir);
    if (state_ == 2) fail_io("checkpoint step {} not committed: {}; {}", saved_step_, error_, last);
    fail_io("checkpoint step {} not committed: another rank could not write its file (see its error); {}", saved_step_,
            last);
  }
  commit();
}

void Checkpointer::flush() {
  if (!pending_) return;
  if (thread_.joinable()) thread_.join();
  int32_t s = state_;
  if (world_.size() > 1) world_.all_reduce(Buf(&s, 1), ReduceOp::max).wait();
  settle(s);
}

double Checkpointer::take_commit_ms() {
  const double ms = commit_ms_;
  commit_ms_ = 0;
  return ms;
}

void Checkpointer::commit() {
  const auto t0 = std::chrono::steady_clock::now();
  pending_ = false;
  // Every rank's shards to rank 0, which writes the manifest.
  nlohmann::json mine = nlohmann::json::array();
  for (const StagedShard& it : items_)
    mine.push_back({{"tensor", it.tensor}, {"shape", it.global_shape}, {"shard", shard_to_json(it.shard)}});
  // What this rank wrote, as it sees it: rank 0 commits only a directory where it sees the same.
  const std::string step_dir = cfg_.checkpoint.dir + "/" + checkpoint_dir_name(saved_step_);
  int64_t nonfinite = 0;
  for (const StagedShard& it : items_) nonfinite += it.nonfinite;
  mine.push_back({{"file", rank_file(world_.rank())},
                  {"sketch", file_sketch(step_dir + "/" + rank_file(world_.rank()))},
                  {"nonfinite", nonfinite}});
  items_.clear();
  std::string text = mine.dump();
  std::vector<std::string> all{text};
  if (world_.size() > 1) {
    const int n = world_.size();
    std::vector<int32_t> len(static_cast<size_t>(n));
    int32_t my_len = int32_t(text.size());
    world_.all_gather(Buf(&my_len, 1), Buf(len.data(), n)).wait();
    const int32_t words = (*std::max_element(len.begin(), len.end()) + 3) / 4;
    std::vector<int32_t> send(static_cast<size_t>(words), 0), recv(static_cast<size_t>(words) * size_t(n));
    std::memcpy(send.data(), text.data(), text.size());
    world_.all_gather(Buf(send.data(), words), Buf(recv.data(), int64_t(recv.size()))).wait();
    all.clear();
    for (int r = 0; r < n; ++r)
      all.emplace_back(reinterpret_cast<const char*>(recv.data() + size_t(r) * size_t(words)), size_t(len[size_t(r)]));
  }
  if (world_.rank() != 0) {
    commit_ms_ += seconds_since(t0) * 1e3;
    return;
  }
  const std::string dir = cfg_.checkpoint.dir + "/" + checkpoint_dir_name(saved_step_);
  // A launcher killed outright (SIGKILL to mpirun) leaves its ranks running for a second or two:
  // the job is gone, and what they would commit now no one asked for. Orphaned, rank 0 stops.
  if (launcher_ > 0 && ::getppid() != launcher_)
    fail_io(
        "checkpoint step {} not committed: the launcher that started this job (pid {}) is gone, so the job is "
        "ending; the last committed checkpoint stays the newest",
        saved_step_, launcher_);
  Manifest m;
  m.step = saved_step_;
  m.layout = layout_;
  m.config = config_to_toml(cfg_);
  int64_t bytes = 0;
  nonfinite = 0;  // now over every rank
  std::set<std::string> files;
  for (size_t r = 0; r < all.size(); ++r)
    for (auto& j : nlohmann::json::parse(all[r])) {
      if (j.contains("sketch")) {
        nonfinite += j["nonfinite"].get<int64_t>();
        const std::string file = j["file"].get<std::string>(), wrote = j["sketch"].get<std::string>();
        const std::string seen = file_sketch(dir + "/" + file);
        LOOM_CHECK(seen == wrote,
                   "checkpoint step {} not committed: rank {} wrote {} ({}) but rank 0 sees {} in '{}'; every rank "
                   "must save into one shared checkpoint.dir (a filesystem every node mounts at the same path): set "
                   "checkpoint.dir to such a path",
                   saved_step_, r, file, wrote, seen == "missing" ? "no such file" : seen, dir);
        continue;
      }
      TensorEntry& e = m.tensors[j["tensor"].get<std::string>()];
      e.shape = j["shape"].get<std::vector<int64_t>>();
      e.shards.push_back(shard_from_json(j["shard"]));
      files.insert(e.shards.back().file);
      int64_t n = 1;
      for (int64_t d : e.shards.back().shape) n *= d;
      bytes += 4 * n;
    }
  if (nonfinite > 0) {
    // Not a state to go back to: the run diverged (its rollback or its end says what follows).
    if (!quiet_)
      spdlog::error(
          "checkpoint step {} not committed: the state holds {} NaN or infinite values (the run diverged); its files "
          "are removed",
          saved_step_, nonfinite);
    step_dir_clear(dir, {}, quiet_);
    commit_ms_ += seconds_since(t0) * 1e3;
    return;
  }
  const std::string text_manifest = manifest_dump(m);
  try {
    file_write_atomic(dir + "/manifest.json", [&](std::FILE* f) {
      file_write(f, text_manifest.data(), text_manifest.size(), dir + "/manifest.json");
    });
    dir_fsync(cfg_.checkpoint.dir);  // the step directory's own entry
  } catch (const IoError& e) {
    fail_io("checkpoint step {} not committed: rank 0 could not write its manifest: {}", saved_step_, e.what());
  } catch (const Error& e) {  // something in checkpoint.dir that loom refuses to write through
    fail("checkpoint step {} not committed: {}", saved_step_, e.what());
  }
  no_link(dir, cfg_.checkpoint.dir);         // the clean-up below stays inside it
  std::set<std::string> step_files = files;  // and loom's files of an earlier, failed attempt go
  step_files.insert("manifest.json");
  step_dir_clear(dir, step_files, quiet_);
  checkpoints_prune(cfg_.checkpoint.dir, saved_step_, cfg_.checkpoint.keep, proven ? proven() : INT64_MIN, quiet_);
  commit_ms_ += seconds_since(t0) * 1e3;
  if (fault_after_commit) fault_after_commit(saved_step_, dir);
  if (!quiet_)
    spdlog::info("checkpoint step {} committed: {} ({:.1f} MB over {}; rank 0 wrote its part in {:.2f} s)", saved_step_,
                 dir, bytes / 1e6, plural(files.size(), "file"), write_s_);
}

namespace {
// Fills dst from `kind` tensors of the manifest for the runs given: dst + (by_flat ? flat :
// state) is where a run's first element goes. Every element of every run must be found.
void runs_fill(const std::string& dir, const Manifest& m, const char* kind, const std::vector<StateRun>& runs,
               bool by_flat, float* dst) {
  struct Need {
    Piece p;
    int64_t f0;
    float* base;
  };
  std::map<std::string, std::pair<const ParamSpec*, std::vector<Need>>> by_tensor;
  for (const StateRun& run : runs) {
    const int64_t f0 = run.flat - int64_t(run.spec->offset);
    auto& [spec, needs] = by_tensor[run.spec->name];
    spec = run.spec;
    for (const Piece& p : pieces_of(*run.spec, f0, f0 + run.n))
      needs.push_back({p, f0, dst + (by_flat ? run.flat : run.state)});
  }
  for (auto& [name, entry] : by_tensor) {
    const auto& [spec, needs] = entry;
    const std::string tensor = std::string(kind) + "/" + name;
    auto it = m.tensors.find(tensor);
    LOOM_CHECK(it != m.tensors.end(), "checkpoint '{}' has no tensor {}, which this model needs", dir, tensor);
    if (it->second.shape != spec->global_shape)
      throw OtherModel(fmt::format(
          "checkpoint '{}': tensor {} has shape {} but this model's is {}; the model.* keys must match the run that "
          "wrote it (nothing in checkpoint.dir was changed)",
          dir, tensor, shape_str(it->second.shape), shape_str(spec->global_shape)));
    int64_t want = 0, got = 0;
    for (const Need& n : needs) want += n.p.numel();
    for (const ShardRef& s : it->second.shards) {
      const Box b = box_of(s.offset, s.shape);
      const bool used = std::any_of(needs.begin(), needs.end(), [&](const Need& n) {
        return n.p.gr < b.r0 + b.rows && b.r0 < n.p.gr + n.p.rows && n.p.gc < b.c0 + b.cols && b.c0 < n.p.gc + n.p.cols;
      });
      if (!used) continue;
      const std::vector<float> data = ckpt_shard_read(dir, tensor, s);
      for (const Need& n : needs) got += piece_fill(*spec, n.p, b, data.data(), n.base, n.f0);
    }
    LOOM_CHECK(got == want, "checkpoint '{}': tensor {}: its shards give {} of the {} elements this rank needs", dir,
               tensor, got, want);
  }
}
}  // namespace

namespace {
// The differences from the saved config (a) to this run's (b), as "key = A there, B here; ...".
std::string joined(const std::vector<ConfigDiff>& v) {
  std::string out;
  for (const ConfigDiff& d : v)
    out += fmt::format("{}{} = {} there, {} here", out.empty() ? "" : "; ", d.key, d.a, d.b);
  return out;
}
}  // namespace

int64_t checkpoint_load(const std::string& dir, const Config& cfg, const ParamRegistry& reg, DataParallel& dp,
                        bool warn) {
  const Manifest m = manifest_read(dir);
  // A config that does not read is damage (set aside by a resume), not another model.
  try {
    Config saved_cfg = config_defaults();
    config_load_string(saved_cfg, m.config, dir + "/manifest.json (config)");
  } catch (const Error& e) {
    fail("checkpoint '{}': its manifest's config does not read ({}); the manifest is damaged", dir, e.what());
  }
  // The model's shape must match; what steers the trajectory may change, with a warning.
  const auto saved = config_flat(m.config), now = config_flat(config_to_toml(cfg));
  std::vector<ConfigDiff> shape = config_diff(saved, now);
  std::erase_if(shape, [](const ConfigDiff& d) { return d.key.rfind("model.", 0) != 0; });
  if (!shape.empty())
    throw OtherModel(fmt::format(
        "checkpoint '{}' holds another model: {}; the model.* keys must match the run that wrote it (nothing in "
        "checkpoint.dir was changed): set them as they were, or give this run another checkpoint.dir",
        dir, joined(shape)));
  const std::vector<ConfigDiff> course =
      config_diff(saved, now,
                  {"train.global_batch", "train.steps", "train.lr", "train.min_lr", "train.warmup_steps",
                   "train.schedule", "train.weight_decay", "train.beta1", "train.beta2", "train.eps", "train.grad_clip",
                   "train.seed", "data.source", "data.path", "data.shuffle"});
  if (warn && !course.empty())
    spdlog::warn("resuming from '{}' with settings that change the run's course: {}", dir, joined(course));
  // Every tensor of the manifest is one of the model's state, as `loom ckpt verify` requires: a
  // manifest naming more was not written by a run of this model.
  std::set<std::string> state;
  const ModelLayout layout = model_layout(model_dims(cfg));
  for (const ParamSpec& s : layout.reg.all())
    for (const char* kind : kKinds) state.insert(std::string(kind) + "/" + s.name);
  for (const auto& [name, t] : m.tensors)
    LOOM_CHECK(state.count(name),
               "checkpoint '{}' holds tensor {}, which is not of the model its config describes; the manifest is "
               "damaged (`loom ckpt verify {}` lists what is wrong)",
               dir, name, dir);

  std::vector<float> weights(reg.numel(), 0.0f);  // padded rows stay zero
  runs_fill(dir, m, "params", dp.state_runs(StateUse::weights), true, weights.data());
  const std::vector<StateRun> held = dp.state_runs(StateUse::moments);
  std::vector<float> mom(size_t(dp.state_size()), 0.0f), sq(mom.size(), 0.0f);
  runs_fill(dir, m, "exp_avg", held, false, mom.data());
  runs_fill(dir, m, "exp_avg_sq", held, false, sq.data());
  dp.weights_from(weights.data());
  dp.moments_from(mom.data(), sq.data());
  return m.step;
}

int64_t checkpoint_resume(const Config& cfg, ProcessGroup& world, const ParamRegistry& reg, DataParallel& dp,
                          bool quiet, std::string* from, int64_t before) {
  const std::string& resume = cfg.checkpoint.resume;
  if (resume == "none") {
    // A fresh run that saves into a directory of another run's checkpoints would mix its
    // steps with them, and its pruning would delete them.
    const std::vector<std::string> there =
        cfg.checkpoint.every > 0 ? checkpoints_complete(cfg.checkpoint.dir) : std::vector<std::string>{};
    LOOM_CHECK(there.empty(),
               "checkpoint.dir '{}' holds checkpoints of an earlier run (the newest: {}) and checkpoint.resume = "
               "\"none\": this run's saves would be mixed with them and its pruning would delete them; resume from "
               "them (checkpoint.resume = \"latest\"), or save into another checkpoint.dir",
               cfg.checkpoint.dir, there.empty() ? "" : there.front());
    return 0;
  }
  const bool latest = resume == "latest";
  const bool lead = world.rank() == 0 && !quiet;
  // Readers and the writer of one checkpoint directory take turns: a run that resumes from a
  // directory it does not itself save into (and prune) holds a reader's lock while it reads.
  fs::path step_path = fs::path(resume).lexically_normal();
  if (step_path.filename().empty()) step_path = step_path.parent_path();  // "…/step-00000010/"
  const std::string from_dir = latest ? cfg.checkpoint.dir : step_path.parent_path().string();
  std::error_code same_ec;
  const bool own = cfg.checkpoint.every > 0 && fs::exists(from_dir, same_ec) &&
                   fs::equivalent(from_dir.empty() ? "." : from_dir, cfg.checkpoint.dir, same_ec);
  std::unique_ptr<DirLock> reading;
  if (world.rank() == 0 && !own)
    reading = std::make_unique<DirLock>(from_dir.empty() ? "." : from_dir, "checkpoint.dir", ".lock", true);
  std::vector<std::string> candidates = latest ? checkpoints_complete(cfg.checkpoint.dir) : std::vector{resume};
  std::erase_if(candidates, [&](const std::string& d) { return checkpoint_step_of(d) >= before; });
  if (candidates.empty()) {
    if (lead)
      spdlog::info("checkpoint.resume = latest: no checkpoint in '{}' yet; starting at step 0", cfg.checkpoint.dir);
    return 0;
  }
  if (!latest && cfg.checkpoint.every > 0) {
    // This run will save into checkpoint.dir and prune it: a newer checkpoint there would
    // be taken for this run's own and its older ones removed.
    const std::vector<std::string> there = checkpoints_complete(cfg.checkpoint.dir);
    const int64_t step = checkpoint_step_of(resume);
    LOOM_CHECK(there.empty() || step < 0 || checkpoint_step_of(there.front()) <= step ||
                   fs::weakly_canonical(there.front()) == fs::weakly_canonical(resume),
               "checkpoint.resume = '{}' but checkpoint.dir '{}' holds a newer checkpoint ({}), which this run's saves "
               "would be mixed with; resume from it (checkpoint.resume = \"latest\"), or save into another "
               "checkpoint.dir",
               resume, cfg.checkpoint.dir, there.front());
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    std::string err;
    int64_t step = 0;
    int32_t bad = 0;  // 1: damaged, 2: another model's (the worst over the ranks)
    try {
      step = checkpoint_load(candidates[i], cfg, reg, dp, lead);
    } catch (const OtherModel& e) {
      err = e.what();
      bad = 2;
    } catch (const Error& e) {
      err = e.what();
      bad = 1;
    }
    const int32_t mine = bad;
    if (world.size() > 1) world.all_reduce(Buf(&bad, 1), ReduceOp::max).wait();
    // The config is what is wrong, not the checkpoint: refused, and nothing is moved.
    if (bad == 2)
      fail("{}", mine == 2 ? err
                           : fmt::format("another rank found that checkpoint '{}' holds another model (see its error)",
                                         candidates[i]));
    if (!bad) {
      if (from) *from = candidates[i];
      if (world.rank() == 0) event_append(cfg.log.dir, "resume", fmt::format("\"step\":{}", step));
      return step;
    }
    if (!latest)
      fail("checkpoint.resume = '{}' does not load: {}", resume, err.empty() ? "see another rank's error" : err);
    if (!err.empty()) spdlog::warn("rank {}: {}", world.rank(), err);
    if (world.rank() == 0) {
      // Set aside, not deleted: it is no longer "complete" for later resumes and pruning, and
      // whoever investigates still finds it.
      std::error_code ec;
      std::string aside = candidates[i] + ".unusable";
      for (int n = 2; fs::exists(fs::symlink_status(aside, ec)); ++n)  // an earlier one stays as it is
        aside = fmt::format("{}.unusable-{}", candidates[i], n);
      fs::rename(candidates[i], aside, ec);
      event_append(cfg.log.dir, "fallback", fmt::format("\"step\":{}", checkpoint_step_of(candidates[i])));
      spdlog::warn("checkpoint {} is unusable (moved to {}); {}", candidates[i],
                   ec ? "nowhere: " + ec.message() : aside,
                   i + 1 < candidates.size() ? "falling back to " + candidates[i + 1] : std::string("none is left"));
    }
    if (world.size() > 1) world.barrier().wait();
  }
  fail(
      "no checkpoint in '{}' loads (each failed as the warnings above say); set checkpoint.resume = \"none\" to "
      "start from scratch",
      cfg.checkpoint.dir);
}

}  // namespace loom
