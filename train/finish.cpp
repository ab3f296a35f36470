// The ends of a run: what the start logs (layout, plan, ledger), the final export and summary
// (Trainer::finish), and the step-1 gradient norms some checks read.
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/hf_export.h"
#include "parallel/pipeline_split.h"
#include "train/trainer_parts.h"

namespace loom {

void Trainer::Parts::grad_norms_write() const {
  const int64_t n = int64_t(chunk->num_params());
  std::vector<float> g(static_cast<size_t>(n));
  backend->download(g.data(), Buf(chunk->grads(), n, DType::f32, backend->device()));
  nlohmann::json j = nlohmann::json::object();
  for (const ParamSpec& spec : chunk->registry().all()) {
    double ss = 0;
    for (int64_t i = 0; i < spec.numel(); ++i) ss += double(g[spec.offset + size_t(i)]) * g[spec.offset + size_t(i)];
    j[spec.name] = std::sqrt(ss);
  }
  if (cfg.log.dir.empty()) return;
  const std::string path = cfg.log.dir + "/grad_norms.json", text = j.dump(1) + "\n";
  file_write_atomic(
      path, [&](std::FILE* f) { file_write(f, text.data(), text.size(), path); }, "log.dir");
}

void Trainer::Parts::startup_log() {
  const int T = cfg.model.seq_len, B = cfg.train.micro_batch;
  info(
      "model {}: {}, d_model {}, {} ({} kv), d_ff {}, vocab {} (padded to {}), seq_len {}: {:.2f}M "
      "parameters",
      cfg.model.arch, plural(cfg.model.n_layer, "layer"), cfg.model.d_model, plural(cfg.model.n_head, "head"),
      cfg.kv_heads(), cfg.model.d_ff, cfg.model.vocab_size, cfg.vocab_padded(), T, whole.reg.global_numel() / 1e6);
  if (const auto& moe = cfg.model.moe; moe.num_experts > 0) {
    // The rows a MoE layer saves: its experts' inputs, fc and activation outputs (Rr rows
    // received), and the outputs back in token order (R rows), per activation slot.
    const ModelDims model = model_dims(cfg);
    const int64_t N = int64_t(B) * cfg.local_seq(), R = moe_rows(model, N), Rr = moe_rows_received(model, N);
    const double mib =
        double(Rr * (cfg.model.d_model + 3 * cfg.model.d_ff) + R * cfg.model.d_model) * dtype_size(dtype) / 1048576.0;
    detail(
        "MoE: {} of {} blocks, {} experts ({} per rank over ep {}), top {}; {}; {:.2f}M of {:.2f}M parameters active "
        "per token",
        cfg.moe_layers(), cfg.model.n_layer, moe.num_experts, moe.num_experts / cfg.parallel.ep, cfg.parallel.ep,
        moe.top_k,
        moe.capacity_factor > 0
            ? fmt::format("capacity {} assignments per expert and micro-batch (capacity_factor {}), each expert a "
                          "slot of {} rows padded with zeros: every shape fixed, the host never waits for the device",
                          moe_capacity(model, N), moe.capacity_factor, moe_slot(model, N))
            : fmt::format("dropless: the experts' buffers hold the worst case, {} rows ({:.2f} MiB saved per MoE "
                          "layer and micro-batch in flight); the experts' GEMMs are sized on the device{}",
                          Rr, mib,
                          cfg.parallel.ep > 1 ? ", and each layer's forward reads its counts on the host to size "
                                                "the all-to-all (exchanged over the ep group on the device first)"
                                              : " and the host never waits for it"),
        double(active_param_count(model)) / 1e6, double(param_count(model)) / 1e6);
  }
  info("device: {} ({}); {} per rank ({}); data: {}", device_name(device), dtype_name(dtype), plural(threads, "thread"),
       threads_why, data.describe);
  // Every axis above one, outermost first, then data parallel's own description (dp ...).
  std::string axes;
  for (auto [name, n] : {std::pair{"pp", cfg.parallel.pp}, {"tp", cfg.parallel.tp}, {"cp", cfg.parallel.cp}})
    if (n > 1) axes += fmt::format("{} {} x ", name, n);
  info("layout: {} over {}; {}{}{}", plural(mesh->world(), "rank"), mesh->comm_name(), axes, dpar->describe(),
       cfg.parallel.ep > 1 ? fmt::format("; experts over ep {}", cfg.parallel.ep) : std::string());
  if (tp().size() > 1) {
    const double nc = double(B) * cfg.local_seq() * cfg.model.d_model * dtype_size(dtype) / 1048576.0;
    detail("tensor parallel: tp {}{}; per block and micro-batch {}", tp().size(),
           cfg.parallel.sp ? " with sequence parallel" : "",
           cfg.parallel.sp
               ? fmt::format("all-gather 2 x {:.2f} MiB and reduce-scatter 2 x {:.2f} MiB forward, all-gather 4 x, "
                             "reduce-scatter 2 x backward",
                             nc, nc)
               : fmt::format("all-reduce 2 x {:.2f} MiB forward and 2 x backward", nc));
  }
  if (const int64_t have = val_available(); have > 0 && have < cfg.data.val_batches)
    info("validation: {}, all the validation data holds (data.val_batches = {})", plural(have, "batch"),
         cfg.data.val_batches);
  if (cfg.parallel.pp > 1) {
    std::string split, held;
    for (int b : pipeline_layers(cfg)) split += (split.empty() ? "" : ",") + std::to_string(b);
    for (int j = 0; j < chunk->pieces(); ++j) held += (j ? "+" : "") + std::to_string(chunk->slots(j));
    info(
        "pipeline: {} stages (blocks {} per model chunk), schedule {}, {}; predicted bubble {:.3f} ({}); "
        "stage 0 holds {} in flight",
        cfg.parallel.pp, split, cfg.parallel.pp_schedule, plural(cfg.accum_steps(), "micro-batch"),
        pipeline_bubble_predicted(pipe_schedule), pipeline_bubble_formula(pipe_schedule), held);
  }
  info("batch: {} x {} = {} per step, {} of {} on {}; recompute {}", plural(cfg.train.global_batch, "sequence"),
       plural(T, "token"), plural(int64_t(cfg.train.global_batch) * T, "token"),
       plural(cfg.accum_steps(), "micro-batch"), B,
       cfg.parallel.dp == 1 ? std::string("the one dp rank") : fmt::format("each of {} dp ranks", cfg.parallel.dp),
       cfg.train.recompute);
  if (cfg.parallel.cp > 1)
    detail("context parallel: each sequence over {} ranks, {} tokens each (chunks i and {} - i of {}), attention {}{}",
           cfg.parallel.cp, cfg.local_seq(), 2 * cfg.parallel.cp - 1, 2 * cfg.parallel.cp, cfg.parallel.cp_attention,
           cfg.parallel.cp_attention == CpAttentionKind::ring && !cfg.parallel.cp_overlap
               ? " (transfers not overlapped)"
               : "");
  for (int j = 0; j < chunk->pieces(); ++j)  // a stage of the interleaved schedule holds several
    detail("activation plan (B={}, T={}{}):\n{}", B, cfg.local_seq(),
           chunk->pieces() > 1 ? fmt::format(", model chunk {}", j) : "", chunk->plan(j).table());
  {
    // Every rank's ledger, tabled by rank 0: ZeRO padding and tensor-parallel shards differ.
    const MemLedger& L = alloc->ledger();
    constexpr int K = kMemCategories + 1;
    const int world = mesh->world();
    std::vector<double> all(size_t(K) * size_t(world));
    for (int i = 0; i < kMemCategories; ++i) all[size_t(K * opt.world_rank + i)] = double(L.live[size_t(i)]);
    all[size_t(K * opt.world_rank + kMemCategories)] = double(L.peak_total);
    mesh->world_group()
        .all_gather(Buf(all.data() + K * opt.world_rank, K), Buf(all.data(), int64_t(all.size())))
        .wait();
    std::string table = fmt::format("{:<6}", "rank");
    for (int i = 0; i < kMemCategories; ++i) table += fmt::format(" {:>11}", mem_name(Mem(i)));
    table += fmt::format(" {:>11}", "peak");
    for (int r = 0; r < world; ++r) {
      table += fmt::format("\n{:<6}", r);
      for (int i = 0; i < K; ++i) table += fmt::format(" {:>11.2f}", all[size_t(K * r + i)] / 1048576.0);
    }
    detail("memory ledger per rank (MiB, {}):\n{}", device_name(device), table);
    double worst = 0;
    for (int r = 0; r < world; ++r) worst = std::max(worst, all[size_t(K * r + kMemCategories)]);
    info(
        "memory: {:.1f} MiB peak on the fullest rank ({}); --verbose prints the activation plan, every rank's "
        "ledger and the FLOPs",
        worst / 1048576.0, device_name(device));
  }
  detail("FLOPs/token {:.3g} (model), {:.3g} (hardware); MFU divides by a peak of {:.1f} GFLOP/s over all ranks{}",
         fpt.model, fpt.hardware, peak / 1e9,
         device == DeviceKind::cuda ? std::string(" (the GPU's bf16 dense rate)")
                                    : fmt::format(" ({} cores x {})", threads * mesh->world(), cpu_peak_describe()));
  if (peak == 0) info("this GPU is not in the peak table: MFU is reported as 0");
}

std::string Trainer::Parts::summary() const {
  const TrainResult& r = result;
  std::string out = fmt::format(
      "run summary: {} of {}{} in {:.1f} s{}", r.steps_done, plural(cfg.train.steps, "step"),
      start_step > 0 ? fmt::format(" (this run: {} to {}, resumed at {})", start_step + 1, r.steps_done, start_step)
                     : std::string(),
      r.seconds, r.stopped_by ? fmt::format(" (stopped by {})", stop_cause(r.stopped_by)) : "");
  if (!r.losses.empty()) {
    out += fmt::format("\n  loss        train {:.4f}", r.losses.back());
    if (!r.val.empty()) out += fmt::format(", validation {:.4f} (step {})", r.val.back().second, r.val.back().first);
  }
  out += fmt::format("\n  tokens      {} ({} a step)", tokens_per_step * (r.steps_done - start_step), tokens_per_step);
  if (r.tokens_per_s > 0) out += fmt::format(", {:.0f} tokens/s, MFU {:.1f}%", r.tokens_per_s, 100 * r.mfu);
  if (ckpt && ckpt->last_saved() > 0)
    out += fmt::format("\n  checkpoint  {}/{}", cfg.checkpoint.dir, checkpoint_dir_name(ckpt->last_saved()));
  out += "\n  export      " + (cfg.export_final.empty() ? std::string("none (set export.final)") : cfg.export_final);
  if (!cfg.log.dir.empty())
    out += fmt::format("\n  logs        {}/: metrics.jsonl, config.toml, run.json", cfg.log.dir);
  return out;
}

std::vector<float> Trainer::weights_hf() {
  Parts& p = *p_;
  std::vector<float> local(p.chunk->num_params());
  p.dpar->weights_to(local.data());
  const ParamRegistry& reg = p.chunk->registry();
  const ParamRegistry& whole = p.whole.reg;  // the whole model's names and places
  ProcessGroup& tp = p.mesh->host_group(Axis::tp);
  std::vector<float> out(whole.global_numel(), 0.0f), all;
  const char* copy = p.chunk->holds_tied_copy() ? head_names(p.chunk->dims()).wte : nullptr;
  for (auto& s : reg.all()) {
    if (copy && s.name == copy) continue;  // the first stage exports the tied embedding
    float* dst = out.data() + whole.at(s.name).global_offset;
    if (s.replicated() || tp.size() == 1) {
      shard_put(s, 0, local.data() + s.offset, dst);
      continue;
    }
    all.resize(size_t(s.numel()) * size_t(tp.size()));
    tp.all_gather(Buf(local.data() + s.offset, s.numel()), Buf(all.data(), int64_t(all.size()))).wait();
    for (int r = 0; r < tp.size(); ++r) shard_put(s, r, all.data() + size_t(r) * size_t(s.numel()), dst);
  }
  // Expert parallel: each rank holds its experts; the dense tensors, the same on every ep rank,
  // come from the first.
  ProcessGroup& ep = p.mesh->host_group(Axis::ep);
  if (ep.size() > 1 && ep.rank() != 0)
    for (auto& s : reg.all())
      if (!expert_param(s.name) && !(copy && s.name == copy))
        std::fill_n(out.data() + whole.at(s.name).global_offset, s.global_numel(), 0.0f);
  // Each element comes from exactly one stage and ep rank (the rest add zeros): the sum is the
  // whole model.
  ProcessGroup& pp = p.mesh->host_group(Axis::pp);
  if (pp.size() > 1) pp.all_reduce(Buf(out.data(), int64_t(out.size())), ReduceOp::sum).wait();
  if (ep.size() > 1) ep.all_reduce(Buf(out.data(), int64_t(out.size())), ReduceOp::sum).wait();
  return out;
}

void Trainer::Parts::tied_copies_check() {
  // The first stage's embedding and the last stage's copy see the same summed gradients and
  // the same updates: their (master) weights must be the same bits. Collective.
  std::vector<float> w(chunk->num_params());
  dpar->weights_to(w.data());
  uint64_t h[2] = {0, 0};
  if (chunk->has_embedding() || chunk->holds_tied_copy()) {
    const ParamSpec& e = chunk->registry().at(head_names(chunk->dims()).wte);
    h[chunk->has_embedding() ? 0 : 1] = XXH64(w.data() + e.offset, size_t(e.numel()) * 4, 0);
  }
  ProcessGroup& embed = mesh->host_group(Axis::embed);
  std::vector<double> both = {double(h[0] >> 32), double(h[0] & 0xffffffffu), double(h[1] >> 32),
                              double(h[1] & 0xffffffffu)};
  if (embed.size() > 1) embed.all_reduce(Buf(both.data(), 4), ReduceOp::sum).wait();
  if (embed.size() < 2) return;  // a middle stage
  if (both[0] != both[2] || both[1] != both[3])
    fail_bug("the tied embedding's copies on the first and last pipeline stage differ");
  if (lead) spdlog::info("tied embedding: the first and last stage's copies are bitwise equal");
}

TrainResult Trainer::finish() {
  Parts& p = *p_;
  p.diverged_at_end();  // weights that diverged are neither exported nor saved
  p.log->finish([this] { return validate(); }, p.tokens_per_step, p.fpt.model, p.peak, p.result.stopped_by,
                p.result.steps_done);
  if (p.cfg.parallel.pp > 1 && p.cfg.pp_tied_across()) p.tied_copies_check();
  if (p.ckpt) {
    // The state a run ends in is always checkpointed: where it stopped on a signal, or where
    // it was resumed when there was nothing left to run (which reshards a checkpoint).
    // Rank 0 decides, so that every rank agrees even where their views of the file system differ.
    const std::string end = p.cfg.checkpoint.dir + "/" + checkpoint_dir_name(p.result.steps_done);
    int32_t save_end = p.ckpt->last_saved() != p.result.steps_done && !std::filesystem::exists(end + "/manifest.json");
    ProcessGroup& world = p.mesh->world_group();
    if (world.size() > 1) world.broadcast(Buf(&save_end, 1), 0).wait();
    if (save_end) p.ckpt->save(p.result.steps_done, *p.dpar);
    const auto t0 = std::chrono::steady_clock::now();
    p.ckpt->flush();
    // An async save's last write is paid here, after the last step's metrics: say what it cost.
    if (p.cfg.checkpoint.async)
      p.info("the end of the run waited {:.0f} ms for the last checkpoint to be written and committed",
             std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::vector<float> hf;
  if (!p.cfg.export_final.empty() || p.opt.keep_params) hf = weights_hf();
  if (!p.cfg.export_final.empty()) {
    // The model's shape travels with its weights, so `loom generate` needs no config.
    if (p.lead && export_is_dir(p.cfg.export_final)) {
      std::vector<StView> views;
      for (auto& s : p.whole.reg.all()) views.push_back({s.name, s.global_shape, hf.data() + s.global_offset});
      hf_dir_write(p.cfg.export_final, p.cfg, views);
    } else if (p.lead) {
      model_save(p.whole.reg, hf.data(), p.cfg.export_final, export_metadata(p.cfg));
    }
  }
  if (p.trace.enabled()) {
    // Each rank's own file, then on rank 0 all of them as one (a process per rank).
    std::filesystem::create_directories(p.cfg.log.dir);
    const int world = p.mesh->world();
    auto part = [&](int r) {
      return p.cfg.log.dir + (world == 1 ? "/trace.json" : fmt::format("/trace.rank{}.json", r));
    };
    p.trace.write(part(p.opt.world_rank));
    if (world > 1) {
      p.mesh->world_group().barrier().wait();
      if (p.lead) {
        std::vector<std::string> parts;
        for (int r = 0; r < world; ++r) parts.push_back(part(r));
        try {  // the run has trained: a log.dir that is not shared costs only the merged file
          trace_merge(parts, p.cfg.log.dir + "/trace.json");
        } catch (const Error& e) {
          if (!p.opt.quiet) spdlog::warn("traces not merged: {}", e.what());
        }
      }
    }
    p.info("wrote {}/trace.json ({} events on rank 0{}; open it in Perfetto)", p.cfg.log.dir, p.trace.size(),
           p.trace_to < INT64_MAX ? fmt::format(", steps {} to {}", p.trace_from, p.trace_to) : "");
  }
  if (p.profiler) {
    p.result.profile = p.profiler->profile();
    p.info("roofline profile of steps {} to {} ({}):\n{}", p.profile_from, std::min(p.profile_to, p.result.steps_done),
           device_name(p.device), profile_table(p.result.profile, p.result.roofline));
  }
  if (p.lead && !p.opt.quiet) spdlog::info("{}", p.summary());
  p.result.mem = p.alloc->ledger();
  p.result.threads = p.threads;
  p.result.device = p.device;
  if (p.opt.keep_params) {
    p.result.params = std::move(hf);
    for (auto& s : p.whole.reg.all()) p.result.names.push_back({s.name, {int64_t(s.global_offset), s.global_numel()}});
  }
  p.mesh->world_group().barrier().wait();  // no rank tears down its groups while a peer still talks
  return p.result;
}

}  // namespace loom
