#include "optim/adamw.h"

#include <cmath>

#include "kernels/ops.h"
#include "runtime/comm/process_group.h"

namespace loom {

std::vector<AdamSegment> adam_segments(const ParamRegistry& reg) {
  std::vector<AdamSegment> out;
  for (auto& s : reg.all()) {
    const int64_t lo = int64_t(s.offset);
    out.push_back({lo, lo + s.numel(), s.decay, lo, lo});
  }
  return out;
}

AdamW::AdamW(std::vector<AdamSegment> segments, int64_t n, Allocator& alloc)
    : segments_(std::move(segments)),
      m_(alloc.empty({n}, DType::f32, Mem::optim)),
      v_(alloc.empty({n}, DType::f32, Mem::optim)) {}

void AdamW::update(float* params, const float* grads, const AdamWHyper& h, int64_t step) {
  // Scalars in double, as PyTorch computes them in Python floats.
  const double bc1 = 1.0 - std::pow(h.beta1, double(step));
  const double bc2 = 1.0 - std::pow(h.beta2, double(step));
  const float step_size = float(h.lr / bc1);
  const float bc2_sqrt = float(std::sqrt(bc2));
  const float b1 = float(h.beta1), b2 = float(h.beta2), eps = float(h.eps);
  float* M = m_.f32();
  float* V = v_.f32();
  for (auto& s : segments_) {
    const float decay = s.decay ? float(1.0 - h.lr * h.weight_decay) : 1.0f;
    const int64_t lo = s.lo, hi = s.hi;
    float* P = params + (s.p_lo - lo);
    const float* G = grads + (s.g_lo - lo);
#pragma omp parallel for schedule(static)
    for (int64_t i = lo; i < hi; ++i) {
      float g = G[i];
      float p = P[i] * decay;
      float m = M[i] + (g - M[i]) * (1.0f - b1);  // lerp, as exp_avg.lerp_
      float v = V[i] * b2 + (1.0f - b2) * g * g;
      float denom = std::sqrt(v) / bc2_sqrt + eps;
      P[i] = p - step_size * (m / denom);
      M[i] = m;
      V[i] = v;
    }
  }
}

double segments_sum_squares(const std::vector<AdamSegment>& segs, const float* grads) {
  double s = 0.0;
  for (auto& g : segs)
    if (g.in_norm) s += cpu::sum_squares(grads + g.g_lo, g.hi - g.lo);
  return s;
}

void segments_scale(const std::vector<AdamSegment>& segs, float* grads, float s) {
  for (auto& g : segs) cpu::scale_inplace(grads + g.g_lo, s, g.hi - g.lo);
}

double clip_grad_norm_tp(const ParamRegistry& reg, float* grads, double max_norm, ProcessGroup& tp) {
  if (tp.size() == 1) return clip_grad_norm(grads, int64_t(reg.numel()), max_norm);
  double ss = 0.0;
  for (auto& s : reg.all())
    if (!s.replicated() || tp.rank() == 0) ss += cpu::sum_squares(grads + s.offset, s.numel());
  float f = float(ss);
  tp.all_reduce(Buf(&f, 1)).wait();
  const double norm = std::sqrt(double(f));
  const double coef = clip_coef(norm, max_norm);
  if (coef < 1.0) cpu::scale_inplace(grads, float(coef), int64_t(reg.numel()));
  return norm;
}

double clip_grad_norm(float* grads, int64_t n, double max_norm) {
  double norm = std::sqrt(cpu::sum_squares(grads, n));
  const double coef = clip_coef(norm, max_norm);
  if (coef < 1.0) cpu::scale_inplace(grads, float(coef), n);
  return norm;
}

double lr_at(const TrainConfig& t, int64_t step) {
  if (step < t.warmup_steps) return t.lr * double(step + 1) / t.warmup_steps;
  const double span = std::max<int64_t>(1, t.steps - t.warmup_steps);
  const double progress = std::min(1.0, double(step - t.warmup_steps) / span);
  if (t.schedule == "constant") return t.lr;
  if (t.schedule == "cosine") return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + std::cos(M_PI * progress));
  if (t.schedule == "linear") return t.lr - (t.lr - t.min_lr) * progress;
  // wsd: warmup, stable, then decay over the last 20% of all steps.
  const int64_t decay_start = t.steps - std::max<int64_t>(1, t.steps / 5);
  if (step < decay_start) return t.lr;
  const double frac = std::min(1.0, double(step - decay_start) / std::max<int64_t>(1, t.steps - decay_start));
  return t.lr - (t.lr - t.min_lr) * frac;
}

}  // namespace loom
