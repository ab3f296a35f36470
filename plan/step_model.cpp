#include "plan/step_model.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/flops.h"
#include "model/layout.h"
#include "model/registry.h"
#include "parallel/pipeline.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_split.h"
#include "plan/memory.h"
#include "plan/step_elementwise.h"
#include "plan/step_invariant.h"
#include "runtime/device_policy.h"
#include "runtime/error.h"
#include "runtime/file.h"
#include "runtime/launch_env.h"
#include "runtime/mesh.h"

namespace loom {

namespace {

const char* const kOps[4] = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all"};

double need_positive(const toml::table& t, const std::string& key, const std::string& origin, double fallback = -1) {
  const auto v = t.at_path(key).value<double>();
  if (!v && fallback >= 0) return fallback;
  LOOM_CHECK(v && *v > 0, "{}: `{}` must be a positive number (see examples/clusters/)", origin, key);
  // Rates and sizes far past any device's (1e12 GB/s makes memory free in a model's test): 1e308
  // TFLOP/s made the peak infinite and every layout's MFU 0.0%.
  LOOM_CHECK(*v <= 1e15, "{}: `{}` = {:g} is past any device's (at most 1e15); give the device's own figure", origin,
             key, *v);
  return *v;
}

LinkTier tier_parse(const toml::table& t, const std::string& name, const std::string& origin) {
  const double reduce = t.at_path(name + ".reduce_gbs").value_or(0.0);
  LOOM_CHECK(reduce >= 0, "{}: `{}.reduce_gbs` must be >= 0 (0: reductions are free)", origin, name);
  const auto alpha = t.at_path(name + ".alpha_us").value<double>();
  LOOM_CHECK(alpha && *alpha >= 0, "{}: `{}.alpha_us` must be a number >= 0 (see examples/clusters/)", origin, name);
  LinkTier l{*alpha * 1e-6, need_positive(t, name + ".bw_gbs", origin) * 1e9, reduce * 1e9};
  for (int i = 0; i < 4; ++i) {
    const std::string key = name + "." + kOps[i] + "_alpha_us";
    if (const auto a = t.at_path(key).value<double>()) {
      LOOM_CHECK(*a >= 0, "{}: `{}` must be >= 0", origin, key);
      l.op_alpha_s[i] = *a * 1e-6;
    }
    l.op_bw[i] = need_positive(t, name + "." + kOps[i] + "_gbs", origin, 0) * 1e9;
  }
  if (const toml::table* tier = t[name].as_table())
    for (auto&& [k, v] : *tier) {
      const std::string key(k.str());
      bool known = key == "alpha_us" || key == "bw_gbs" || key == "reduce_gbs";
      for (const char* op : kOps)
        known = known || key == std::string(op) + "_gbs" || key == std::string(op) + "_alpha_us";
      LOOM_CHECK(known,
                 "{}: unknown key `{}.{}`; a link tier has alpha_us, bw_gbs, reduce_gbs, and <collective>_alpha_us "
                 "and <collective>_gbs for all_reduce, reduce_scatter, all_gather, all_to_all",
                 origin, name, key);
    }
  return l;
}

}  // namespace

Cluster cluster_parse(const std::string& text, const std::string& origin) {
  toml::table t;
  try {
    t = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    fail("{}: {}", origin, std::string(e.description()));
  }
  static const char* keys[] = {
      "name",        "nodes",           "devices_per_node", "physical_devices",    "device",        "dtype",
      "peak_tflops", "gemm_efficiency", "mem_bw_gbs",       "memory_gb",           "overlap",       "tree",
      "intra",       "inter",           "attention_tflops", "cp_attention_tflops", "optimizer_gbs", "fitted_on"};
  for (auto&& [k, v] : t) {
    const std::string key(k.str());
    LOOM_CHECK(std::any_of(std::begin(keys), std::end(keys), [&](const char* s) { return key == s; }),
               "{}: unknown key `{}`; a cluster file has name, nodes, devices_per_node, physical_devices, device, "
               "dtype, peak_tflops, gemm_efficiency, mem_bw_gbs, attention_tflops, cp_attention_tflops, optimizer_gbs, "
               "memory_gb, overlap, tree, fitted_on, [intra] and [inter]",
               origin, key);
  }
  auto count = [&](const char* key, int64_t fallback) {
    const toml::node_view<toml::node> v = t[key];
    if (!v) {
      LOOM_CHECK(fallback >= 0, "{}: `{}` is missing (see examples/clusters/)", origin, key);
      return int(fallback);
    }
    const auto n = v.value_exact<int64_t>();
    LOOM_CHECK(n && *n >= (fallback >= 0 ? 0 : 1) && *n <= 1000000,
               "{}: `{}` must be a whole number from {} to 1000000", origin, key, fallback >= 0 ? 0 : 1);
    return int(*n);
  };
  auto word = [&](const char* key, const std::string& fallback) {
    if (!t[key]) return fallback;
    const auto v = t[key].value_exact<std::string>();
    LOOM_CHECK(v, "{}: `{}` must be a string", origin, key);
    return *v;
  };
  Cluster c;
  c.name = word("name", origin);
  c.fitted_on = word("fitted_on", "");
  c.nodes = count("nodes", -1);
  c.devices_per_node = count("devices_per_node", -1);
  c.physical_devices = count("physical_devices", 0);
  const std::string device = word("device", "cuda");
  LOOM_CHECK(device == "cuda" || device == "cpu", "{}: device = \"{}\" is not \"cuda\" or \"cpu\"", origin, device);
  c.device = device == "cuda" ? DeviceKind::cuda : DeviceKind::cpu;
  const std::string dtype = word("dtype", c.device == DeviceKind::cuda ? "bf16" : "f32");
  LOOM_CHECK(dtype == "bf16" || dtype == "f32", "{}: dtype = \"{}\" is not \"bf16\" or \"f32\"", origin, dtype);
  c.dtype = dtype == "bf16" ? DType::bf16 : DType::f32;
  c.peak_flops = need_positive(t, "peak_tflops", origin) * 1e12;
  c.gemm_efficiency = need_positive(t, "gemm_efficiency", origin);
  LOOM_CHECK(c.gemm_efficiency <= 1, "{}: gemm_efficiency = {} is a share of the peak, at most 1", origin,
             c.gemm_efficiency);
  c.mem_bw = need_positive(t, "mem_bw_gbs", origin) * 1e9;
  c.memory_bytes = need_positive(t, "memory_gb", origin, 0) * 1e9;             // absent: memory not checked
  c.attention_flops = need_positive(t, "attention_tflops", origin, 0) * 1e12;  // absent: 0, the fallback's
  c.cp_attention_flops = need_positive(t, "cp_attention_tflops", origin, 0) * 1e12;
  c.optimizer_bw = need_positive(t, "optimizer_gbs", origin, 0) * 1e9;
  c.overlap = t["overlap"] ? t["overlap"].value<double>().value_or(-1) : 1.0;
  LOOM_CHECK(c.overlap >= 0 && c.overlap <= 1, "{}: `overlap` must be a number in [0, 1]", origin);
  if (t["tree"]) {
    const auto tree = t["tree"].value_exact<bool>();
    LOOM_CHECK(tree, "{}: `tree` must be true or false", origin);
    c.tree = *tree;
  }
  c.intra = tier_parse(t, "intra", origin);
  c.inter = c.nodes > 1 || t.contains("inter") ? tier_parse(t, "inter", origin) : c.intra;
  return c;
}

ClusterRates cluster_rates(const Cluster& c) {
  ClusterRates r;
  r.matmul = c.peak_flops * c.gemm_efficiency;
  r.attention = c.attention_flops > 0 ? c.attention_flops : r.matmul;
  // Context parallel's block attention runs on the same flash tiles as the whole sequence's:
  // without a rate of its own, the attention rate.
  r.cp_attention = c.cp_attention_flops > 0 ? c.cp_attention_flops : r.attention;
  r.elementwise = c.mem_bw;
  r.optimizer = c.optimizer_bw > 0 ? c.optimizer_bw : c.mem_bw;
  r.describe = fmt::format(
      "rates assumed: matmuls {:.4g} TFLOP/s (peak_tflops x gemm_efficiency); attention {:.4g} TFLOP/s ({}); "
      "cp attention {:.4g} TFLOP/s ({}); element-wise {:.4g} GB/s (mem_bw_gbs); optimizer {:.4g} GB/s ({})",
      r.matmul / 1e12, r.attention / 1e12, c.attention_flops > 0 ? "attention_tflops" : "the matmuls' rate",
      r.cp_attention / 1e12, c.cp_attention_flops > 0 ? "cp_attention_tflops" : "assumed: the attention rate",
      r.elementwise / 1e9, r.optimizer / 1e9, c.optimizer_bw > 0 ? "optimizer_gbs" : "mem_bw_gbs");
  return r;
}

std::string machine_name() {
  // LOOM_MACHINE_NAME: the test suite runs "as another machine" with it (docs/testing.md).
  if (const char* name = std::getenv("LOOM_MACHINE_NAME"); name && *name) return name;
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      model = line.substr(line.find(':') + 1);
      model.erase(0, model.find_first_not_of(" \t"));
      break;
    }
  return fmt::format("{}, {} cores", model, cores_visible());
}

Cluster cluster_load(const std::string& path, const std::string& what) {
  std::error_code ec;
  LOOM_CHECK(std::filesystem::exists(path, ec) || ec,
             "cannot open the cluster file '{}' (examples/clusters/ has examples)", path);
  return cluster_parse(input_read_all(path, what, kConfigMaxBytes), path);
}

double collective_time(const char* op, int n, double bytes, const LinkTier& link, bool tree) {
  if (n <= 1 || bytes <= 0) return 0;
  LOOM_ASSERT(link.bw > 0);
  double steps = n - 1, volume = double(n - 1) / n * bytes, reduced = 0;
  if (!std::strcmp(op, "all_reduce")) {
    steps = 2.0 * (n - 1), reduced = volume, volume *= 2;
    if (tree) steps = std::min(steps, 2.0 * std::ceil(std::log2(double(n))));
  } else if (!std::strcmp(op, "reduce_scatter")) {
    reduced = volume;
  } else if (!std::strcmp(op, "send")) {
    steps = 1, volume = bytes;
  } else {
    LOOM_ASSERT(!std::strcmp(op, "all_gather") || !std::strcmp(op, "all_to_all"));
  }
  double alpha = link.alpha_s, bw = link.bw;
  for (int i = 0; i < 4; ++i)
    if (!std::strcmp(op, kOps[i])) {
      if (link.op_alpha_s[i] >= 0) alpha = link.op_alpha_s[i];
      if (link.op_bw[i] > 0) bw = link.op_bw[i];
    }
  return steps * alpha + volume / bw + (link.reduce_bw > 0 ? reduced / link.reduce_bw : 0);
}

LinkTier group_link(const Cluster& c, int n, int stride, int first) {
  const int R = c.devices_per_node;
  // A group stays in a node when its first and last rank do (the one starting at `first`,
  // where given; else every group of the axis, which tiles blocks of n x stride ranks).
  const int64_t lo = first >= 0 ? first : 0, hi = lo + int64_t(n - 1) * stride;
  const int64_t block = int64_t(n) * stride;  // the ranks a group's axis tiles, at most a node
  const bool inside = first >= 0 ? lo / R == hi / R : block <= R && R % block == 0;
  if (inside) return c.intra;
  // Every group of this axis with ranks on a node crosses the node's link at once: min(stride,
  // R) of them. A ring through the node uses its link once each way, bounded by intra too.
  const int sharing = std::max(1, std::min(stride, R));
  LinkTier l = c.inter;
  l.bw = std::min(c.intra.bw, c.inter.bw / sharing);
  for (int i = 0; i < 4; ++i)
    if (l.op_bw[i] > 0)
      l.op_bw[i] = std::min(c.intra.op_bw[i] > 0 ? c.intra.op_bw[i] : c.intra.bw, l.op_bw[i] / sharing);
  return l;
}

namespace {

// Per micro-batch, one model chunk: seconds of F, B (the input gradient, or all of the
// backward where it is not split) and W (the weight gradient of a split backward), and the
// blocking collectives inside them.
struct ChunkCost {
  double f = 0, b = 0, w = 0;
  double tp_f = 0, tp_b = 0;  // tensor-parallel collectives
  double ep_f = 0, ep_b = 0;  // expert all-to-alls
  double cp_f = 0, cp_b = 0;  // context parallel's key/value transfers, what compute does not hide
  int blocks = 0, moe_blocks = 0;
};

ChunkCost chunk_cost(const Config& cfg, const Cluster& cl, int block0, int blocks, bool first, bool last,
                     double share) {
  const auto& m = cfg.model;
  const auto& p = cfg.parallel;
  const int tp = p.tp;
  const double C = m.d_model, F = m.d_ff, T = m.seq_len;
  const double kvd = double(cfg.kv_heads()) * cfg.head_dim();
  const double tokens = double(cfg.train.micro_batch) * cfg.local_seq();  // this rank's (T / cp a sequence)
  const double act = double(dtype_size(cl.dtype));
  const ClusterRates rates = cluster_rates(cl);
  const double rate = rates.matmul * share;
  // attention's scores and values: the whole sequence's kernels, or context parallel's blocks
  const double att_rate = (p.cp > 1 ? rates.cp_attention : rates.attention) * share;
  const Recompute rc = cfg.train.recompute;
  const bool zb = cfg.pp_split_backward();
  const LinkTier tl = group_link(cl, tp, 1);
  const double row = tokens * C * act;  // the residual stream of a micro-batch
  // Under sp a block's all-reduce is an all-gather and a reduce-scatter of the same rows.
  const double tp_one = p.sp ? collective_time("all_gather", tp, row, tl, cl.tree) +
                                   collective_time("reduce_scatter", tp, row, tl, cl.tree)
                             : collective_time("all_reduce", tp, row, tl, cl.tree);
  // Context parallel, per block: the ring's cp - 1 key/value transfers forward, each behind
  // the attention of one block (1 / cp of the core); backward the blocks again and their f32
  // gradients, behind twice that (cp sends, the last one home unhidden). All-gather: the gather forward, again
  // backward, and the gradients' reduce-scatter, none hidden.
  double cp_fwd = 0, cp_bwd = 0;
  if (p.cp > 1) {
    const LinkTier cl_cp = group_link(cl, p.cp, tp);
    const double kv_bytes = tokens * 2 * kvd / tp * act, dkv_bytes = kv_bytes / act * 4;
    // one block's forward attention: the causal half of a full block, on average over the blocks
    const double core_block = 0.5 * 4.0 * C * T / tp * tokens / att_rate / p.cp;
    if (p.cp_attention == CpAttentionKind::ring) {
      const double hop = collective_time("send", 2, kv_bytes, cl_cp, false);
      const double hop_grad = collective_time("send", 2, dkv_bytes, cl_cp, false);
      // What the cluster's overlap lets compute hide (none where a rank's communication thread
      // shares its core, as on this machine).
      const double hide = p.cp_overlap ? cl.overlap : 0.0;
      cp_fwd = (p.cp - 1) * std::max(0.0, hop - hide * core_block);
      cp_bwd = (p.cp - 1) * std::max(0.0, hop + hop_grad - hide * 2 * core_block) + hop_grad;
    } else {
      const double gather = collective_time("all_gather", p.cp, kv_bytes * p.cp, cl_cp, cl.tree);
      cp_fwd = gather;
      cp_bwd = gather + collective_time("reduce_scatter", p.cp, dkv_bytes * p.cp, cl_cp, cl.tree);
    }
  }
  ChunkCost c;
  c.blocks = blocks;
  const ModelDims model = model_dims(cfg);
  for (int l = block0; l < block0 + blocks; ++l) {
    const bool moe = cfg.moe_block(l);
    c.moe_blocks += moe;
    const double k = moe ? m.moe.top_k : 1;
    // Forward matmul FLOPs per token: attention and a dense MLP split over tp; a MoE layer's
    // router and experts are whole on every tp rank, which runs them on every row.
    const BlockFlops bf = block_flops(model, l);
    const double mm = bf.attn_proj / tp + (moe ? bf.mlp + bf.router : bf.mlp / tp);
    const double core = bf.core / tp;  // attention scores and values
    const BlockElementwise bytes = block_elementwise(cfg, cl, moe);
    const double ew = bytes.fwd * act * tokens / (cl.mem_bw * share);
    const double ew_b = bytes.bwd * act * tokens / (cl.mem_bw * share);
    const double fwd = mm * tokens / rate + core * tokens / att_rate + ew;
    double re = 0;  // the forward work recompute repeats
    if (rc == Recompute::full) re = fwd - (moe ? 0 : 2.0 * C * F / tp) * tokens / rate;  // all but the down projection
    if (rc == Recompute::selective && cl.device != DeviceKind::cuda && p.cp == 1)
      re = core * tokens / att_rate;  // flash, cp keep no P
    c.f += fwd;
    // Under zb, loom's selective policy recomputes in W (the split backward keeps the output
    // gradients, not the activation); zb with full recompute is refused.
    c.b += mm * tokens / rate + 2 * core * tokens / att_rate + ew_b + (zb ? 0 : re);
    c.w += mm * tokens / rate + (zb ? re : 0);
    // tp: two collectives of the residual stream forward, two backward, two more to recompute.
    c.tp_f += 2 * tp_one;
    c.tp_b += (2 + (rc == Recompute::full ? 2 : 0)) * tp_one;
    c.cp_f += cp_fwd;
    c.cp_b += cp_bwd + (rc == Recompute::full ? cp_fwd : 0);
    if (moe && p.ep > 1) {  // dispatch and return each way, the counts first
      const LinkTier el = group_link(cl, p.ep, tp);
      const double a2a = collective_time("all_to_all", p.ep, tokens * k * C * act, el, false);
      const double counts = collective_time("all_to_all", p.ep, 8.0 * p.ep, el, false);
      c.ep_f += 2 * a2a + counts;
      c.ep_b += (2 + (rc == Recompute::full ? 2 : 0)) * a2a + counts;
    }
  }
  const BlockElementwise ends = ends_elementwise(cfg, first, last);
  c.f += ends.fwd * act * tokens / (cl.mem_bw * share);
  c.b += ends.bwd * act * tokens / (cl.mem_bw * share);
  if (first) c.tp_f += tp_one;  // the vocabulary-parallel embedding's sum
  if (last) {                   // lm_head and the loss
    // The logits: the matmul over the real vocabulary, as MFU counts it (6N).
    const double head = 2.0 * double(m.vocab_size) * C / tp * tokens / rate;
    c.f += head, c.b += head, c.w += head;
    c.tp_f += tp_one + 2 * collective_time("all_reduce", tp, tokens * 4, tl, cl.tree);
    c.tp_b += tp_one;
  }
  if (!zb) c.b += c.w, c.w = 0;  // one backward op
  return c;
}

// A pipeline stage's costs.
struct Stage {
  double f = 0, b = 0, w = 0, tp = 0, ep = 0, cp = 0;  // per micro-batch
  double dp_f = 0, dp_b = 0, dp_end = 0, dp_total = 0, optimizer = 0;
  double fold = 0;  // parallel.invariant's micro-batch tree, per micro-batch
  int weight = 0;   // its chunks' blocks + 1 each: how its per-micro-batch ZeRO traffic splits over them
};

}  // namespace

StepPrediction step_predict(const Config& cfg, const Cluster& given) {
  const auto& p = cfg.parallel;
  const int world = cfg.world();
  LOOM_CHECK(world <= given.devices(),
             "the layout needs {} ranks (pp {} x dp {} x cp {} x tp {}), the cluster has {} devices", world, p.pp, p.dp,
             p.cp, p.tp, given.devices());
  LOOM_CHECK(cfg.train.dtype == DTypeChoice::automatic || cfg.train.dtype == dtype_choice(given.dtype),
             "train.dtype = \"{}\" but the cluster file trains in {}; set train.dtype = \"auto\" or change the "
             "cluster's dtype",
             cfg.train.dtype, dtype_name(given.dtype));
  const int hd = cfg.head_dim();
  LOOM_CHECK(given.device != DeviceKind::cuda || hd == 32 || hd == 64 || hd == 128,
             "model.d_model / model.n_head = {}: the CUDA attention kernels take head dims 32, 64 and 128", hd);
  const int physical = given.physical_devices > 0 ? given.physical_devices : given.devices();
  // Ranks sharing a device take turns on it, for compute and for what of communication is the
  // device's work: a message's overhead, the sums, and copies within a node (on a CPU, shared
  // memory is the cores' memcpy); a link's bandwidth between nodes stays the link's.
  const double share = std::min(1.0, double(physical) / world);
  Cluster cl = given;
  for (LinkTier* t : {&cl.intra, &cl.inter}) {
    t->alpha_s /= share, t->reduce_bw *= share;
    for (double& a : t->op_alpha_s) a /= share;
  }
  cl.intra.bw *= share;
  for (double& bw : cl.intra.op_bw) bw *= share;
  const int P = p.pp, v = P > 1 ? p.pp_virtual : 1, G = P * v, m = cfg.accum_steps();
  const double act = double(dtype_size(cl.dtype));
  const double tokens = double(cfg.train.micro_batch) * cfg.local_seq();
  const int dcp = p.dp * p.cp;  // the ranks holding the same weights: dp reduces over them
  const LinkTier dl = group_link(cl, dcp, p.tp);
  const double reduce_bytes = p.grad_reduce_dtype == GradReduce::bf16 ? 2 : 4;

  std::vector<ChunkCost> chunks;
  const std::vector<int> per_chunk = pipeline_layers(cfg);
  for (int g = 0, b0 = 0; g < G; b0 += per_chunk[size_t(g)], ++g)
    chunks.push_back(chunk_cost(cfg, cl, b0, per_chunk[size_t(g)], g == 0, g == G - 1, share));

  // Per stage: its parameters (from the layout), what dp or ZeRO moves of them, and where.
  std::vector<Stage> stages(static_cast<size_t>(P));
  StepPrediction out;
  for (int st = 0; st < P; ++st) {
    Stage& s = stages[size_t(st)];
    int units = 0, moe_units = 0;
    for (int g : pipeline_stage_chunks(cfg, st)) {
      const ChunkCost& c = chunks[size_t(g)];
      s.f += c.f, s.b += c.b, s.w += c.w, s.tp += c.tp_f + c.tp_b, s.ep += c.ep_f + c.ep_b, s.cp += c.cp_f + c.cp_b;
      units += c.blocks + (g == 0) + (g == G - 1);
      moe_units += c.moe_blocks;
      s.weight += c.blocks + 1;
    }
    const std::vector<std::pair<int, int>> runs = pipeline_stage_runs(cfg, st);
    const ModelLayout layout = model_layout(model_dims(cfg), 0, runs);
    if (st == 0 || st == P - 1) {  // the first holds the most activations, the last the head
      const PartSpec spec = pipeline_chunk_spec(cfg, st);
      // The stored dS where memory_gb has room for it, as the trainer weighs it on the device.
      const int rank = st * dcp * p.tp;
      int64_t bytes = plan_memory(cfg, cl.device, cl.dtype, rank, &spec).total();
      const MemoryAvailable avail{cl.memory_bytes > 0 ? int64_t(cl.memory_bytes) : -1, "memory_gb"};
      if (!attention_ds_fit(cfg, cl.device, cl.dtype, rank, &spec, avail, bytes).fits) {
        Config c = cfg;
        c.train.attention_ds = false;
        bytes = plan_memory(c, cl.device, cl.dtype, rank, &spec).total();
      }
      out.memory_bytes = std::max(out.memory_bytes, bytes);
    }
    // What dp moves: the dense parameters over dp; under ep the experts (a rank's E / ep of
    // them) over expert-dp, the ranks holding the same experts (dp / ep of them, ep apart).
    struct Group {
      double params;
      int n, units;
      LinkTier link;
    };
    double experts = 0;
    for (auto& spec : layout.reg.all())
      if (p.ep > 1 && expert_param(spec.name)) experts += double(spec.numel());
    std::vector<Group> groups = {{double(layout.reg.numel()) - experts, dcp, units, dl}};
    if (experts > 0)
      groups.push_back({experts, dcp / p.ep, std::max(1, moe_units), group_link(cl, dcp / p.ep, p.tp * p.ep)});
    const double bucket = p.bucket_mb * 1048576.0 / 4 * reduce_bytes;  // bucket_mb of fp32 gradients
    double rs = 0, ag = 0, all = 0, shard = 0;
    for (const Group& q : groups) {
      const double grads = q.params * reduce_bytes, weights = q.params * act;
      rs += q.units * collective_time("reduce_scatter", q.n, grads / q.units, q.link, cl.tree);
      ag += q.units * collective_time("all_gather", q.n, weights / q.units, q.link, cl.tree);
      const double full = std::floor(grads / bucket), rest = grads - full * bucket;  // buckets never mix them
      all += full * collective_time("all_reduce", q.n, bucket, q.link, cl.tree) +
             collective_time("all_reduce", q.n, rest, q.link, cl.tree);
      shard += p.zero >= 1 ? q.params / q.n : q.params;
    }
    const double window = cl.overlap * (s.b + s.w);  // one micro-batch's backward hides this much
    if (p.zero == 0) {  // buckets all-reduced during the last micro-batch's backward, the embedding's last
      const double dense = groups[0].params * reduce_bytes, rest = dense - std::floor(dense / bucket) * bucket;
      s.dp_end = std::max(all - window, collective_time("all_reduce", dcp, rest > 0 ? rest : bucket, dl, cl.tree));
      s.dp_total = all;
    } else if (p.zero == 1) {  // reduce-scatter and all-gather at the step's end
      s.dp_end = s.dp_total = rs + ag;
    } else if (p.zero == 2) {  // every micro-batch's gradients reduce-scattered unit by unit
      s.dp_b = std::max(rs - window, rs / units);
      s.dp_end = ag;
      s.dp_total = m * rs + ag;
    } else if (p.zero3_reshard == Zero3Reshard::after_step) {  // and the weights gathered once, in the first forward
      // (the schedule's costs are per micro-batch: the gathers' exposed part is spread over m)
      s.dp_f = std::max(ag - cl.overlap * s.f, ag / units) / m;
      s.dp_b = std::max(rs - window, rs / units);
      s.dp_total = ag + m * rs;
    } else {  // and the weights gathered before each forward and backward
      s.dp_f = std::max(ag - cl.overlap * s.f, ag / units);
      s.dp_b = std::max(ag + rs - window, (ag + rs) / units);
      s.dp_total = m * (2 * ag + rs);
    }
    if (p.invariant) {
      StageDpTerms t{s.dp_b, s.dp_end, s.dp_total, 0};
      invariant_terms(cfg, cl, share, layout, units, window, ag, rs, t);
      s.dp_b = t.dp_b, s.dp_end = t.dp_end, s.dp_total = t.dp_total, s.fold = t.fold;
    }
    s.optimizer = shard * (cl.dtype == DType::bf16 ? 34.0 : 32.0) / (cluster_rates(cl).optimizer * share);
  }

  // Each stage's ops in the schedule's order, with its own costs; hand-offs take `hop`.
  const size_t nG = static_cast<size_t>(G);
  std::vector<double> tf(nG), tb(nG), tw(nG);
  for (int g = 0; g < G; ++g) {
    const ChunkCost& c = chunks[size_t(g)];
    const Stage& s = stages[size_t(pipe_stage_of(g, P, cfg.pp_v_shape()))];
    const double part = double(c.blocks + 1) / s.weight;
    tf[size_t(g)] = c.f + c.tp_f + c.ep_f + c.cp_f + s.dp_f * part;
    tb[size_t(g)] = c.b + c.tp_b + c.ep_b + c.cp_b + (s.dp_b + s.fold) * part;
    tw[size_t(g)] = c.w;
  }
  std::vector<double> finish(stages.size(), 0), finish_hop(stages.size(), 0);
  if (P > 1) {
    const PipeSchedule sched = pipeline_schedule(p.pp_schedule, P, v, m);
    // Boundary b hands stage b's rows to stage b + 1 (and, interleaved, stage p-1's to 0; a V
    // crosses each boundary both ways and never wraps); its
    // slowest pair sets its time, the pairs crossing a node sharing that node's link.
    const double rows = tokens * cfg.model.d_model * act / (p.sp ? p.tp : 1);
    const int S = dcp * p.tp, R = cl.devices_per_node;
    std::vector<double> hop(stages.size());
    for (int b = 0; b < P; ++b) {
      const int next = (b + 1) % P;
      int crossing = 0;
      for (int r = b * S; r < (b + 1) * S; ++r) crossing += r / R != (r - b * S + next * S) / R;
      LinkTier l = cl.intra;
      if (crossing) l = cl.inter, l.bw = std::min(cl.intra.bw, cl.inter.bw / std::min(crossing, R));
      hop[size_t(b)] = collective_time("send", 2, rows, l, false);
    }
    const PipeTiming t0 = pipeline_check(sched, tf, tb, tw), t1 = pipeline_check(sched, tf, tb, tw, hop);
    for (int st = 0; st < P; ++st)
      for (size_t i = 0; i < t0.end[size_t(st)].size(); ++i) {
        finish[size_t(st)] = std::max(finish[size_t(st)], t0.end[size_t(st)][i]);
        finish_hop[size_t(st)] = std::max(finish_hop[size_t(st)], t1.end[size_t(st)][i]);
      }
  } else {
    finish[0] = finish_hop[0] = m * (tf[0] + tb[0] + tw[0]);
  }
  for (int st = 0; st < P; ++st) {
    const Stage& s = stages[size_t(st)];
    out.stage_compute.push_back(m * (s.f + s.b + s.w));
    const double step = finish_hop[size_t(st)] + s.dp_end + s.optimizer;
    if (step <= out.step) continue;
    out.step = step;
    out.compute = m * (s.f + s.b + s.w);
    out.tp = m * s.tp;
    out.ep = m * s.ep;
    out.cp = m * s.cp;
    out.dp = m * (s.dp_f + s.dp_b) + s.dp_end;
    out.dp_total = s.dp_total;
    out.pp = finish_hop[size_t(st)] - finish[size_t(st)];
    out.bubble = finish[size_t(st)] - m * (s.f + s.b + s.w + s.tp + s.ep + s.cp + s.dp_f + s.dp_b + s.fold);
    if (std::abs(out.bubble) < 1e-9 * step) out.bubble = 0;  // no pipeline: rounding, not idling
    out.optimizer = s.optimizer;
    out.tree_fold = m * s.fold;
    out.comm_exposed = out.tp + out.ep + out.cp + out.pp + out.dp;
  }
  out.fits = cl.memory_bytes <= 0 || double(out.memory_bytes) <= cl.memory_bytes;
  const double step_tokens = double(cfg.train.global_batch) * cfg.model.seq_len;
  out.tokens_per_s = step_tokens / out.step;
  out.mfu = flops_per_token(model_dims(cfg)).model * out.tokens_per_s / (world * given.peak_flops);
  if (p.invariant) {  // the same layout without the mode, for the cost's line
    Config plain = cfg;
    plain.parallel.invariant = false;
    const StepPrediction q = step_predict(plain, given);
    out.plain_step = q.step, out.plain_dp = q.dp, out.plain_dp_total = q.dp_total;
  }
  return out;
}

}  // namespace loom
