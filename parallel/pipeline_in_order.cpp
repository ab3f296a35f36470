// pipeline_check_in_order(): the schedule tables under NCCL's point-to-point rules.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "parallel/pipeline_schedule.h"
#include "runtime/error.h"

namespace loom {

namespace {

std::string op_text(const PipeOp& op) {
  return fmt::format("{} of micro-batch {} chunk {}", pipe_op_name(op.kind), op.micro, op.chunk);
}

bool op_pairs(const PipeOp& send, const PipeOp& recv) {
  const bool kinds = (send.kind == PipeOp::send_act && recv.kind == PipeOp::recv_act) ||
                     (send.kind == PipeOp::send_grad && recv.kind == PipeOp::recv_grad);
  return kinds && send.micro == recv.micro && send.chunk == recv.chunk;
}

}  // namespace

std::vector<std::vector<size_t>> pipeline_comm_batches(const std::vector<PipeOp>& ops) {
  std::vector<std::vector<size_t>> items;
  for (size_t i = 0; i < ops.size(); ++i) {
    const bool comm = pipe_op_is_comm(ops[i].kind);
    if (comm && i > 0 && pipe_op_is_comm(ops[i - 1].kind))
      items.back().push_back(i);
    else
      items.push_back({i});
  }
  return items;
}

PipeSchedule pipeline_in_order(const PipeSchedule& s) {
  const PipeTiming t = pipeline_check(s);
  std::map<std::tuple<int, int, int>, double> sent_at;  // (kind, micro, chunk) of a send -> time
  for (size_t st = 0; st < s.ops.size(); ++st)
    for (size_t i = 0; i < s.ops[st].size(); ++i) {
      const PipeOp& op = s.ops[st][i];
      if (op.kind == PipeOp::send_act || op.kind == PipeOp::send_grad)
        sent_at[{int(op.kind), op.micro, op.chunk}] = t.start[st][i];
    }
  PipeSchedule out = s;
  for (size_t st = 0; st < s.ops.size(); ++st) {
    // Each receive goes before the first compute op that starts at or after its send.
    std::vector<std::pair<double, PipeOp>> recvs;
    for (const PipeOp& op : s.ops[st])
      if (op.kind == PipeOp::recv_act || op.kind == PipeOp::recv_grad) {
        const int kind = op.kind == PipeOp::recv_act ? PipeOp::send_act : PipeOp::send_grad;
        recvs.push_back({sent_at.at({kind, op.micro, op.chunk}), op});
      }
    std::stable_sort(recvs.begin(), recvs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    auto& ops = out.ops[st];
    ops.clear();
    size_t next = 0;
    for (size_t i = 0; i < s.ops[st].size(); ++i) {
      const PipeOp& op = s.ops[st][i];
      if (op.kind == PipeOp::recv_act || op.kind == PipeOp::recv_grad) continue;
      if (!pipe_op_is_comm(op.kind))
        while (next < recvs.size() && recvs[next].first <= t.start[st][i]) ops.push_back(recvs[next++].second);
      ops.push_back(op);
    }
    while (next < recvs.size()) ops.push_back(recvs[next++].second);
  }
  pipeline_check(out);  // still sound: every receive ahead of its consumer
  return out;
}

void pipeline_check_in_order(const PipeSchedule& s) {
  const int p = s.stages;
  const size_t P = static_cast<size_t>(p);
  // Pair the k-th send from a to b with b's k-th receive from a.
  std::map<std::pair<int, int>, std::vector<size_t>> sends, recvs;  // (from, to) -> op indices
  for (int st = 0; st < p; ++st)
    for (size_t i = 0; i < s.ops[size_t(st)].size(); ++i) {
      const PipeOp& op = s.ops[size_t(st)][i];
      if (op.kind == PipeOp::send_act || op.kind == PipeOp::send_grad) sends[{st, op.peer}].push_back(i);
      if (op.kind == PipeOp::recv_act || op.kind == PipeOp::recv_grad) recvs[{op.peer, st}].push_back(i);
    }
  std::vector<std::vector<std::pair<int, size_t>>> partner(P);
  for (int st = 0; st < p; ++st) partner[size_t(st)].assign(s.ops[size_t(st)].size(), {-1, 0});
  for (const auto& [pair, out] : sends) {
    const auto& in = recvs[pair];
    const auto [a, b] = pair;
    LOOM_CHECK(in.size() == out.size(), "schedule {}: stage {} sends {} tensors to stage {}, which receives {}", s.name,
               a, out.size(), b, in.size());
    for (size_t k = 0; k < out.size(); ++k) {
      const PipeOp &so = s.ops[size_t(a)][out[k]], &ro = s.ops[size_t(b)][in[k]];
      LOOM_CHECK(op_pairs(so, ro),
                 "schedule {}: NCCL matches the sends and receives between two stages in issue order, and stage {}'s "
                 "send number {} to stage {} ({}) would arrive as its receive number {} ({})",
                 s.name, a, k + 1, b, op_text(so), k + 1, op_text(ro));
      partner[size_t(a)][out[k]] = {b, in[k]};
      partner[size_t(b)][in[k]] = {a, out[k]};
    }
  }
  // Run the groups: a stage moves past a compute op at once, past a group once each of its ops
  // has met its partner while the partner's group was the partner stage's current one.
  std::vector<std::vector<std::vector<size_t>>> items(P);
  std::vector<std::vector<size_t>> item_of(P);
  std::vector<std::vector<char>> met(P);
  for (size_t st = 0; st < P; ++st) {
    items[st] = pipeline_comm_batches(s.ops[st]);
    item_of[st].resize(s.ops[st].size());
    met[st].assign(s.ops[st].size(), 0);
    for (size_t k = 0; k < items[st].size(); ++k)
      for (size_t i : items[st][k]) item_of[st][i] = k;
  }
  std::vector<size_t> at(P, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t st = 0; st < P; ++st)
      while (at[st] < items[st].size()) {
        const auto& item = items[st][at[st]];
        bool all = true;
        for (size_t i : item) {
          if (!pipe_op_is_comm(s.ops[st][i].kind)) continue;
          const auto [b, j] = partner[st][i];
          if (b >= 0 && at[size_t(b)] < items[size_t(b)].size() && item_of[size_t(b)][j] == at[size_t(b)])
            met[st][i] = met[size_t(b)][j] = 1;
          all = all && met[st][i];
        }
        if (!all) break;
        ++at[st];
        progress = true;
      }
  }
  std::string stuck;
  for (size_t st = 0; st < P; ++st) {
    if (at[st] == items[st].size()) continue;
    std::string ops;
    for (size_t i : items[st][at[st]]) ops += (ops.empty() ? "" : ", ") + op_text(s.ops[st][i]);
    stuck += fmt::format("; stage {} waits in the group {{{}}}", st, ops);
  }
  LOOM_CHECK(stuck.empty(), "schedule {} deadlocks under NCCL's in-order point-to-point{}", s.name, stuck);
}

std::vector<PipeOp> pipeline_stage_ops(const PipeSchedule& s, int stage, int m) {
  PipeSchedule table = s.ops.empty() ? pipeline_schedule(PpSchedule::f1b1, 1, 1, m) : pipeline_in_order(s);
  return std::move(table.ops.at(size_t(s.ops.empty() ? 0 : stage)));
}

}  // namespace loom
