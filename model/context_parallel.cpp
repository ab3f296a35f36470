#include "model/context_parallel.h"

namespace loom {

std::vector<int32_t> cp_positions(int T, int cp, int rank) {
  const int c = T / (2 * cp);
  std::vector<int32_t> pos;
  for (int chunk : {rank, 2 * cp - 1 - rank})
    for (int t = 0; t < c; ++t) pos.push_back(chunk * c + t);
  return pos;
}

void cp_select(int32_t* out, const int32_t* in, int B, int T, int cp, int rank) {
  const std::vector<int32_t> pos = cp_positions(T, cp, rank);
  const int Tl = int(pos.size());
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tl; ++t) out[b * Tl + t] = in[int64_t(b) * T + pos[size_t(t)]];
}

ContextParallel::ContextParallel(const ModelDims& dims, Backend& be, ProcessGroup& cp, Trace& trace, StepClock* clock)
    : be_(be),
      cp_(cp),
      trace_(trace),
      clock_(clock),
      ring_(dims.cp_attention == CpAttentionKind::ring),
      overlap_(dims.cp_overlap),
      N_(cp.size()),
      rank_(cp.rank()),
      B_(dims.B),
      Tl_(dims.T_local()),
      table_(be.cp_position_table()) {
  LOOM_CHECK(N_ == dims.cp, "the cp group has {} ranks but parallel.cp = {}", N_, dims.cp);
  for (int r = 0; r < N_; ++r) {
    const std::vector<int32_t> p = cp_positions(dims.T, N_, r);
    pos_.insert(pos_.end(), p.begin(), p.end());
  }
  const int32_t* own = pos_.data() + size_t(rank_) * Tl_;
  for (int b = 0; b < B_; ++b) token_pos_.insert(token_pos_.end(), own, own + Tl_);
}

void ContextParallel::wait(std::initializer_list<Work*> works) {
  auto s = trace_.scope("cp_wait");
  StepClock::Scope c(clock_, Phase::comm);
  for (Work* w : works) w->wait_on(be_.stream());
}

void ContextParallel::ring_pass(const char* name, Buf send, Buf recv, int tag, Work* sent, Work* got) {
  auto s = trace_.scope(name);
  const Stream& st = be_.stream();
  cp_.group_start();
  *sent = cp_.send(send, (rank_ + 1) % N_, tag, st);
  *got = cp_.recv(recv, (rank_ + N_ - 1) % N_, tag, st);
  cp_.group_end();
}

void ContextParallel::forward(Ptr out, float* lse, Ptr qkv, const int32_t* doc, const CpBuffers& buf, int H, int KV,
                              int D) {
  const int64_t kvn = int64_t(B_) * Tl_ * 2 * KV * D;
  const Stream& st = be_.stream();
  auto kv = [&](int i) { return buf.kv + i * kvn; };
  auto kvbuf = [&](int i) { return Buf(kv(i).p, kvn, be_.dtype(), be_.device()); };
  auto block = [&](Ptr blk, int src, bool first) {
    auto s = trace_.scope("attention_block_forward");
    const AttentionBlockShape shape{B_, Tl_, Tl_, H, KV, D, pos_of(rank_), pos_of(src), doc};
    be_.attention_block_forward(buf.acc, buf.ml, qkv, blk, shape, first, buf.scores);
  };
  if (ring_) {
    be_.attention_kv_extract(kv(0), qkv, B_, Tl_, H, KV, D);
    for (int s = 0; s < N_; ++s) {
      Work sent, got;
      if (s + 1 < N_) {  // the next block comes in while this one is computed on
        ring_pass("cp_ring_send", kvbuf(s % 2), kvbuf((s + 1) % 2), 0, &sent, &got);
        if (!overlap_) wait({&sent, &got});
      }
      block(kv(s % 2), (rank_ + N_ - s) % N_, s == 0);
      if (s + 1 < N_) wait({&sent, &got});
    }
  } else {
    be_.attention_kv_extract(kv(N_), qkv, B_, Tl_, H, KV, D);
    Work w;
    {
      auto sc = trace_.scope("cp_all_gather");
      w = cp_.all_gather(kvbuf(N_), Buf(kv(0).p, N_ * kvn, be_.dtype(), be_.device()), st);
    }
    wait({&w});
    for (int j = 0; j < N_; ++j) block(kv(j), j, j == 0);
  }
  auto s = trace_.scope("attention_block_finish");
  be_.attention_block_finish(out, lse, buf.acc, buf.ml, B_, Tl_, H, D);
}

void ContextParallel::backward(Ptr dqkv, Ptr dout, Ptr out, Ptr qkv, const float* lse, const int32_t* doc,
                               const CpBuffers& buf, int H, int KV, int D) {
  const int64_t kvn = int64_t(B_) * Tl_ * 2 * KV * D;
  const Stream& st = be_.stream();
  const DeviceKind dev = be_.device();
  auto kv = [&](int i) { return buf.kv + i * kvn; };
  auto kvbuf = [&](int i) { return Buf(kv(i).p, kvn, be_.dtype(), dev); };
  auto dkv = [&](int i) { return buf.dkv + i * kvn; };
  auto dkvbuf = [&](int i) { return Buf(dkv(i), kvn, DType::f32, dev); };
  float* dq = buf.acc;
  float* delta = buf.ml;
  be_.attention_block_delta(delta, dout, out, B_, Tl_, H, D);
  be_.zero(Buf(dq, int64_t(B_) * Tl_ * H * D, DType::f32, dev));
  auto block = [&](float* dkv_blk, Ptr blk, int src) {
    auto s = trace_.scope("attention_block_backward");
    const AttentionBlockShape shape{B_, Tl_, Tl_, H, KV, D, pos_of(rank_), pos_of(src), doc};
    be_.attention_block_backward(dq, dkv_blk, dout, qkv, blk, lse, delta, shape, buf.scores);
  };
  float* own;  // this rank's key/value gradient, summed over every rank's queries
  if (ring_) {
    // Step s holds rank (rank - s)'s block, whose gradient so far arrives from prev (into
    // accumulator s % 2) while this rank computes its own part. The sum goes on to next, paired
    // with the receive of the next step's sum (NCCL completes a send only once its peer has
    // started the receive); after the last step every block's sum arrives at its owner.
    be_.attention_kv_extract(kv(0), qkv, B_, Tl_, H, KV, D);
    Work acc_sent[2], acc_got;
    for (int s = 0; s < N_; ++s) {
      const int a = s % 2;
      Work sent, got;
      if (s + 1 < N_) {
        ring_pass("cp_ring_send", kvbuf(s % 2), kvbuf((s + 1) % 2), 0, &sent, &got);
        if (!overlap_) wait({&sent, &got, &acc_got});
      }
      float* part = s == 0 ? dkv(0) : dkv(2);
      be_.zero(Buf(part, kvn, DType::f32, dev));
      block(part, kv(s % 2), (rank_ + N_ - s) % N_);
      if (s >= 1) {
        wait({&acc_got});
        be_.add(dkvbuf(a), Buf(part, kvn, DType::f32, dev));
      }
      const int into = s + 1 < N_ ? (s + 1) % 2 : 2;  // the next step's accumulator, or home
      if (into < 2) wait({&acc_sent[into]});          // sent from there a step ago
      ring_pass("cp_ring_send_grad", dkvbuf(a), dkvbuf(into), 1, &acc_sent[a], &acc_got);
      if (s + 1 < N_) wait({&sent, &got});
    }
    wait({&acc_sent[0], &acc_sent[1], &acc_got});
    own = dkv(2);
  } else {
    be_.attention_kv_extract(kv(N_), qkv, B_, Tl_, H, KV, D);
    Work w;
    {
      auto sc = trace_.scope("cp_all_gather");
      w = cp_.all_gather(kvbuf(N_), Buf(kv(0).p, N_ * kvn, be_.dtype(), dev), st);
    }
    wait({&w});
    be_.zero(Buf(dkv(0), N_ * kvn, DType::f32, dev));
    for (int j = 0; j < N_; ++j) block(dkv(j), kv(j), j);
    {
      auto sc = trace_.scope("cp_reduce_scatter");
      w = cp_.reduce_scatter(Buf(dkv(0), N_ * kvn, DType::f32, dev), dkvbuf(N_), st);
    }
    wait({&w});
    own = dkv(N_);
  }
  auto s = trace_.scope("attention_block_grads_store");
  be_.attention_block_grads_store(dqkv, dq, own, B_, Tl_, H, KV, D);
}

}  // namespace loom
