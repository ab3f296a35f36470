#include "optim/adamw.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "runtime/exact_sum.h"

namespace loom {

namespace {
// The length of the chunk that starts `at` elements into its unit, with `left` elements to go.
int64_t chunk_len(int64_t at, int64_t left, int64_t block) {
  return std::min({block - at % block, left, int64_t(kOptChunk)});
}
}  // namespace

void opt_chunks_add(std::vector<OptChunk>& out, int64_t state, int64_t param, int64_t grad, int64_t n, bool decay,
                    bool norm, int64_t at, int64_t block) {
  for (int64_t k = 0; k < n;) {
    const int64_t len = chunk_len(at + k, n - k, block);
    out.push_back({state + k, param + k, grad + k, int32_t(len), int16_t(decay), int16_t(norm)});
    k += len;
  }
}

// Arithmetic, not a walk: plan layout plans the memory of thousands of layouts (an 8B model's
// walk took 4x the whole search).
size_t opt_chunks_count(int64_t n, int64_t at, int64_t block) {
  if (n <= 0) return 0;
  if (block <= kOptChunk) {  // (a norm block is at most 1024) to the next block boundary, then whole blocks
    const int64_t first = block - at % block;
    return n <= first ? 1 : 1 + size_t((n - first + block - 1) / block);
  }
  size_t count = 0;
  for (int64_t k = 0; k < n; ++count) k += chunk_len(at + k, n - k, block);
  return count;
}

std::vector<int64_t> unit_starts(const ModelLayout& layout) {
  std::vector<int64_t> out;
  for (int u = 0; u < layout.num_units(); ++u) out.push_back(layout.unit_lo(u));
  return out;
}

std::vector<OptChunk> opt_chunks(const ParamRegistry& reg, const std::vector<int64_t>& units, int64_t block,
                                 int tp_rank, const char* uncounted, int ep_rank) {
  std::vector<OptChunk> out;
  for (auto& s : reg.all()) {
    const int64_t lo = int64_t(s.offset);
    const int64_t unit = *(std::upper_bound(units.begin(), units.end(), lo) - 1);
    const bool counted = (!s.replicated() || tp_rank == 0) && !(uncounted && s.name == uncounted) &&
                         (ep_rank == 0 || expert_param(s.name));
    opt_chunks_add(out, lo, lo, lo, s.numel(), s.decay, counted, lo - unit, block);
  }
  return out;
}

std::vector<PlanItem> AdamW::plan(int64_t n, bool master, size_t n_chunks, DeviceKind device) {
  static_assert(sizeof(OptChunk) == 32);
  std::vector<PlanItem> p;
  if (master) p.push_back({"master", n, DType::f32, Mem::master});
  p.push_back({"exp_avg", n, DType::f32, Mem::optim});
  p.push_back({"exp_avg_sq", n, DType::f32, Mem::optim});
  if (device_is_cuda(device)) p.push_back({"opt_table", int64_t(n_chunks) * 8, DType::i32, Mem::optim});
  p.push_back({"grad_sum_squares", kExactDigits, DType::f64, Mem::workspace});
  p.push_back({"clip_scale", 1, DType::f32, Mem::workspace});
  return p;
}

AdamW::AdamW(Backend& be, std::vector<OptChunk> chunks, int64_t n, bool master) : be_(be) {
  table_.host = std::move(chunks);
  std::vector<Tensor> t;
  for (auto& item : plan(n, master, table_.host.size(), be_.device())) t.push_back(be_.alloc().empty(item));
  size_t i = 0;
  if (master) master_ = t[i++];
  m_ = t[i++];
  v_ = t[i++];
  if (device_is_cuda(be_.device())) {
    table_.device = t[i++];
    be_.upload(Buf(table_.device), table_.host.data());
  }
  ss_ = t[i++];
  scale_ = t[i++];
}

void AdamW::norm_squares(const float* grads) {
  be_.grad_sum_squares(ss_.data<double>(), grads, table_);
}

void AdamW::update(Ptr params, const float* grads, const AdamWHyper& h, int64_t step, double max_norm) {
  be_.clip_scale(scale_.f32(), ss_.data<double>(), max_norm);
  // Scalars in double, as PyTorch computes them in Python floats.
  const double bc1 = 1.0 - std::pow(h.beta1, double(step));
  const double bc2 = 1.0 - std::pow(h.beta2, double(step));
  const AdamScalars a{float(h.lr / bc1), float(std::sqrt(bc2)), float(h.beta1),
                      float(h.beta2),    float(h.eps),          float(1.0 - h.lr * h.weight_decay)};
  be_.adamw(master(), params, grads, m(), v(), table_, a, scale_.f32());
}

double AdamW::norm() {
  std::array<double, kExactDigits> digits{};
  be_.download(digits.data(), Buf(ss_));
  ExactSum sum;
  sum.digits_from(digits.data());
  return std::sqrt(sum.value());
}

double lr_at(const TrainConfig& t, int64_t step) {
  if (step < t.warmup_steps) return t.lr * double(step + 1) / t.warmup_steps;
  const double span = std::max<int64_t>(1, t.steps - t.warmup_steps);
  const double progress = std::min(1.0, double(step - t.warmup_steps) / span);
  if (t.schedule == LrSchedule::constant) return t.lr;
  if (t.schedule == LrSchedule::cosine) return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + std::cos(M_PI * progress));
  if (t.schedule == LrSchedule::linear) return t.lr - (t.lr - t.min_lr) * progress;
  // wsd: warmup, stable, then linear decay over the last decay_frac of all steps, reaching
  // min_lr at the last step (0-based steps - 1).
  const int64_t decay = std::max<int64_t>(1, int64_t(std::llround(double(t.steps) * t.decay_frac)));
  const int64_t decay_start = std::max<int64_t>(t.steps - decay, t.warmup_steps);  // never inside warmup
  if (step < decay_start) return t.lr;
  const double frac = std::min(1.0, double(step - decay_start + 1) / double(t.steps - decay_start));
  return t.lr - (t.lr - t.min_lr) * frac;
}

}  // namespace loom
