#include "model/cached_decoder.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/ops.h"
#include "model/flops.h"
#include "runtime/error.h"

namespace loom {

CachedDecoder::CachedDecoder(const ModelDims& dims, const WeightLoader& load) : dims_(dims) {
  dims_.tp = dims_.cp = dims_.ep = dims_.dp = 1;  // one process holds every tensor whole
  dims_.sp = false;
  LOOM_CHECK(dims_.moe.num_experts == 0,
             "generation with MoE layers is not supported yet (the decoder has no expert routing); use a dense model");
  layout_ = model_layout(dims_);
  w_.resize(layout_.reg.numel());
  unused_ = load(layout_.reg, w_.data());
  const ModelDims& m = dims_;
  T_ = m.T, C_ = m.C, H_ = m.H, KV_ = m.KV, D_ = m.D, F_ = m.F;
  V_ = m.vocab, Vp_ = int(m.V_padded()), L_ = m.L;
  llama_ = m.llama();
  k_.assign(size_t(L_) * size_t(T_) * size_t(KV_ * D_), 0.0f);
  v_.assign(k_.size(), 0.0f);
  if (llama_) {
    cos_.resize(size_t(T_) * size_t(D_ / 2));
    sin_.resize(cos_.size());
    cpu::rope_table(cos_.data(), sin_.data(), T_, D_, float(m.rope_theta));
  }
}

const float* CachedDecoder::at(int layer, WField f) const {
  const size_t off = layout_.layer_offsets[size_t(layer)][f];
  return off == SIZE_MAX ? nullptr : w_.data() + off;
}

const float* CachedDecoder::named(const char* name) const {
  return name ? w_.data() + layout_.reg.at(name).offset : nullptr;
}

// Queries at positions pos_ .. pos_ + n - 1 against every cached key up to their own position.
void CachedDecoder::attend(float* out, const float* qkv, int layer, int n) const {
  const int row = (H_ + 2 * KV_) * D_, group = H_ / KV_, kvw = KV_ * D_;
  const float scale = 1.0f / std::sqrt(float(D_));
  const float* K = k_.data() + size_t(layer) * size_t(T_) * size_t(kvw);
  const float* V = v_.data() + size_t(layer) * size_t(T_) * size_t(kvw);
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(T_));
#pragma omp for collapse(2) schedule(static)
    for (int i = 0; i < n; ++i)
      for (int h = 0; h < H_; ++h) {
        const float* q = qkv + int64_t(i) * row + h * D_;
        const int kv = h / group, last = pos_ + i;
        float mx = -INFINITY;
        for (int j = 0; j <= last; ++j) {
          const float* k = K + int64_t(j) * kvw + kv * D_;
          float s = 0.0f;
          for (int d = 0; d < D_; ++d) s += q[d] * k[d];
          p[size_t(j)] = s * scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        float sum = 0.0f;
        for (int j = 0; j <= last; ++j) sum += p[size_t(j)] = std::exp(p[size_t(j)] - mx);
        float* o = out + int64_t(i) * H_ * D_ + h * D_;
        std::fill(o, o + D_, 0.0f);
        for (int j = 0; j <= last; ++j) {
          const float* v = V + int64_t(j) * kvw + kv * D_;
          const float w = p[size_t(j)] / sum;
          for (int d = 0; d < D_; ++d) o[d] += w * v[d];
        }
      }
  }
}

std::vector<float> CachedDecoder::forward(const int32_t* tokens, int n, bool all_rows) {
  LOOM_CHECK(n > 0 && pos_ + n <= T_,
             "the model's context is model.seq_len = {} tokens and {} are in it already; {} more do not fit", T_, pos_,
             n);
  for (int i = 0; i < n; ++i)
    LOOM_CHECK(tokens[i] >= 0 && tokens[i] < V_, "token id {} is outside the model's vocabulary of {}", tokens[i], V_);
  using cpu::WLayout;
  const WLayout wl = llama_ ? WLayout::out_in : WLayout::in_out;
  const HeadNames names = head_names(dims_);
  const int qkvw = (H_ + 2 * KV_) * D_, fcw = llama_ ? 2 * F_ : F_, kvw = KV_ * D_;
  const float eps = float(dims_.norm_eps);
  std::vector<float> x(size_t(n) * C_), h(x.size()), tmp(x.size()), qkv(size_t(n) * qkvw), att(size_t(n) * H_ * D_),
      fc(size_t(n) * fcw), act(size_t(n) * F_), mean(static_cast<size_t>(n)), rstd(static_cast<size_t>(n));
  const float* wpe = named(names.wpe);
  cpu::embedding_forward(x.data(), tokens, named(names.wte), 0, Vp_, wpe ? wpe + int64_t(pos_) * C_ : nullptr, 1, n,
                         C_);
  auto norm = [&](float* out, float* in, const float* w, const float* b, int rows) {
    if (llama_)
      cpu::rmsnorm_forward(out, rstd.data(), in, static_cast<const float*>(nullptr), w, rows, C_, eps);
    else
      cpu::layernorm_forward(out, mean.data(), rstd.data(), in, static_cast<const float*>(nullptr), w, b, rows, C_,
                             eps);
  };
  for (int l = 0; l < L_; ++l) {
    norm(h.data(), x.data(), at(l, NORM1_W), at(l, NORM1_B), n);
    cpu::matmul_forward(qkv.data(), h.data(), at(l, QKV_W), at(l, QKV_B), n, C_, qkvw, wl);
    if (llama_) {
      const size_t off = size_t(pos_) * size_t(D_ / 2);
      cpu::rope_forward(qkv.data(), cos_.data() + off, sin_.data() + off, 1, n, H_, KV_, D_);
    }
    float* K = k_.data() + (size_t(l) * size_t(T_) + size_t(pos_)) * size_t(kvw);
    float* V = v_.data() + (size_t(l) * size_t(T_) + size_t(pos_)) * size_t(kvw);
    for (int i = 0; i < n; ++i) {
      const float* r = qkv.data() + size_t(i) * qkvw + H_ * D_;
      std::copy_n(r, kvw, K + size_t(i) * kvw);
      std::copy_n(r + kvw, kvw, V + size_t(i) * kvw);
    }
    attend(att.data(), qkv.data(), l, n);
    cpu::matmul_forward(tmp.data(), att.data(), at(l, PROJ_W), at(l, PROJ_B), n, H_ * D_, C_, wl);
    cpu::add_inplace(x.data(), tmp.data(), int64_t(x.size()));
    norm(h.data(), x.data(), at(l, NORM2_W), at(l, NORM2_B), n);
    cpu::matmul_forward(fc.data(), h.data(), at(l, FC_W), at(l, FC_B), n, C_, fcw, wl);
    if (llama_)
      cpu::swiglu_forward(act.data(), fc.data(), n, F_);
    else
      cpu::gelu_forward(act.data(), fc.data(), int64_t(act.size()));
    cpu::matmul_forward(tmp.data(), act.data(), at(l, DOWN_W), at(l, DOWN_B), n, F_, C_, wl);
    cpu::add_inplace(x.data(), tmp.data(), int64_t(x.size()));
  }
  pos_ += n;
  const int first = all_rows ? 0 : n - 1, rows = n - first;
  norm(h.data(), x.data() + size_t(first) * C_, named(names.norm_w), named(names.norm_b), rows);
  std::vector<float> padded(size_t(rows) * Vp_);
  cpu::matmul_forward(padded.data(), h.data(), named(names.lm_head), nullptr, rows, C_, Vp_, WLayout::out_in);
  std::vector<float> logits(size_t(rows) * V_);
  for (int r = 0; r < rows; ++r) std::copy_n(padded.data() + size_t(r) * Vp_, V_, logits.data() + size_t(r) * V_);
  return logits;
}

int32_t token_sample(const float* logits, int n, const SampleOptions& opt, std::mt19937_64& rng) {
  if (opt.temperature <= 0.0) return int32_t(std::max_element(logits, logits + n) - logits);
  const int k = opt.top_k > 0 ? std::min(opt.top_k, n) : n;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  // Largest first, ties by id: the same logits give the same order on every machine.
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  std::vector<double> p(static_cast<size_t>(k));
  double sum = 0.0;
  for (int i = 0; i < k; ++i)
    sum += p[size_t(i)] = std::exp((double(logits[ids[size_t(i)]]) - logits[ids[0]]) / opt.temperature);
  const double u = double(rng() >> 11) * 0x1.0p-53 * sum;  // uniform in [0, sum), not library-defined
  double acc = 0.0;
  for (int i = 0; i < k; ++i)
    if ((acc += p[size_t(i)]) > u) return ids[size_t(i)];
  return ids[size_t(k - 1)];
}

}  // namespace loom
