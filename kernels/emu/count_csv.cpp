// Counted ops as CSV and back (count_ops.h): one row per launch, the op's fields repeated, the
// launch's whole-grid counts and its heaviest block's. What tests/cuda/counts_at_commit.sh
// writes for an earlier commit's kernels, and what the model's test reads back.
#include <fmt/format.h>

#include <sstream>
#include <stdexcept>

#include "kernels/emu/count_ops.h"

namespace loom::emu {

namespace {

// The WorkCounts fields in CSV order, with their names.
template <class W, class Fn>
void each_field(W& w, Fn fn) {
  fn("mma", w.mma), fn("wmma", w.wmma), fn("ldmatrix", w.ldmatrix), fn("ldmatrix_matrices", w.ldmatrix_matrices);
  fn("ldmatrix_wavefronts", w.ldmatrix_wavefronts), fn("wmma_ldst", w.wmma_ldst), fn("wmma_bytes", w.wmma_bytes);
  fn("wmma_wavefronts", w.wmma_wavefronts), fn("wmma_ideal", w.wmma_ideal), fn("cp_async", w.cp_async);
  fn("cp_async_bytes", w.cp_async_bytes), fn("cp_async_wavefronts", w.cp_async_wavefronts);
  fn("cp_async_ideal", w.cp_async_ideal), fn("lds", w.lds), fn("lds_bytes", w.lds_bytes);
  fn("lds_wavefronts", w.lds_wavefronts), fn("lds_ideal", w.lds_ideal), fn("sts", w.sts), fn("sts_bytes", w.sts_bytes);
  fn("sts_wavefronts", w.sts_wavefronts), fn("sts_ideal", w.sts_ideal), fn("ldg", w.ldg), fn("ldg_bytes", w.ldg_bytes);
  fn("ldg_sectors", w.ldg_sectors), fn("stg", w.stg), fn("stg_bytes", w.stg_bytes), fn("stg_sectors", w.stg_sectors);
  fn("ldg_walking", w.ldg_walking);
  fn("barriers", w.barriers), fn("warp_ops", w.warp_ops), fn("mufu", w.mufu), fn("warps", w.warps);
  fn("trips_sum", w.trips_sum), fn("trips_max", w.trips_max);
}

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (char c : line) {
    if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      out.push_back(cur), cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

}  // namespace

std::string counts_csv(const std::string& model, const std::vector<CountedOp>& ops) {
  std::string out =
      "model,op,shape,per_step,min_bytes,model_flops,memory_bound,kernel,grid_x,grid_y,grid_z,threads,"
      "dynamic_shared,blocks,blocks_run";
  WorkCounts none;
  for (const char* part : {"", "heaviest_"})
    each_field(none, [&](const char* n, double) { out += fmt::format(",{}{}", part, n); });
  out += "\n";
  for (const CountedOp& op : ops)
    for (const LaunchCounts& l : op.launches) {
      out += fmt::format("\"{}\",\"{}\",\"{}\",{},{:.17g},{:.17g},{},\"{}\",{},{},{},{},{},{},{}", model, op.name,
                         op.shape, op.per_step, op.min_bytes, op.model_flops, op.memory_bound ? 1 : 0, l.kernel,
                         l.grid[0], l.grid[1], l.grid[2], l.threads(), l.dynamic_shared, l.blocks, l.blocks_run);
      for (const WorkCounts* w : {&l.total, &l.heaviest})
        each_field(*w, [&](const char*, double v) { out += fmt::format(",{:.17g}", v); });
      out += "\n";
    }
  return out;
}

std::vector<std::pair<std::string, CountedOp>> counts_csv_parse(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  const auto header = split(line);
  std::vector<std::pair<std::string, CountedOp>> out;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto f = split(line);
    if (f.size() != header.size())
      throw std::runtime_error("counts CSV: a row of " + std::to_string(f.size()) + " fields, the header has " +
                               std::to_string(header.size()));
    if (out.empty() || out.back().first != f[0] || out.back().second.name != f[1] || out.back().second.shape != f[2]) {
      CountedOp op;
      op.name = f[1], op.shape = f[2], op.per_step = std::stod(f[3]), op.min_bytes = std::stod(f[4]);
      op.model_flops = std::stod(f[5]), op.memory_bound = f[6] == "1";
      out.push_back({f[0], op});
    }
    LaunchCounts l;
    l.kernel = f[7];
    for (int d = 0; d < 3; ++d) l.grid[d] = unsigned(std::stoul(f[size_t(8 + d)]));
    l.block[0] = unsigned(std::stoul(f[11]));
    l.dynamic_shared = std::stoul(f[12]);
    l.blocks = std::stod(f[13]), l.blocks_run = std::stod(f[14]);
    size_t i = 15;
    for (WorkCounts* w : {&l.total, &l.heaviest})
      each_field(*w, [&](const char*, double& v) { v = std::stod(f[i++]); });
    out.back().second.launches.push_back(l);
  }
  return out;
}

}  // namespace loom::emu
