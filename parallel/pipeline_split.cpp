// parallel.pp_layers: how many blocks each pipeline model chunk holds, given as counts, even by
// default, or "auto" (balanced by forward FLOPs per token). Checked against the model here,
// where the pipeline is built, rather than in the config's own checks.
#include "parallel/pipeline_split.h"

#include <algorithm>
#include <limits>
#include <string>

#include "model/flops.h"
#include "runtime/error.h"

namespace loom {

std::vector<double> pipeline_block_flops(const Config& cfg) {
  const ModelDims model = model_dims(cfg);
  std::vector<double> out;
  for (int l = 0; l < model.L; ++l) out.push_back(block_flops(model, l).total());
  return out;
}

double pipeline_head_flops(const Config& cfg) {
  return head_flops(model_dims(cfg));
}

namespace {
// parallel.pp_layers = "auto": the split of L blocks into G contiguous chunks (one block at
// least each) whose largest cost is least, a chunk's cost its blocks' forward FLOPs per token
// and the last's the head's too (the embedding is a lookup: none). A backward costs about
// twice its forward whatever the chunk, so forward FLOPs rank splits as the step's compute
// does. Among splits whose largest cost ties (a head that outweighs the rest sets it alone),
// the one whose costs are most even (least sum of squares), then the one with the fewest
// blocks on the first chunks (whose stage holds the most activations in flight under 1F1B).
std::vector<int> pipeline_layers_auto(const Config& cfg, int G) {
  const std::vector<double> block = pipeline_block_flops(cfg);
  const int L = int(block.size());
  LOOM_CHECK(G <= L, "parallel.pp_layers = \"auto\": {} model chunks but model.n_layer = {}; every chunk needs a block",
             G, L);
  const double head = pipeline_head_flops(cfg);
  std::vector<double> sum(size_t(L) + 1, 0);
  for (int l = 0; l < L; ++l) sum[size_t(l) + 1] = sum[size_t(l)] + block[size_t(l)];
  // best[g][b]: (largest cost, sum of squares) of the best split of blocks b.. into chunks g..
  struct Cost {
    double worst, squares;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const auto better = [](const Cost& a, const Cost& b) {  // a before b, with room for rounding
    if (a.worst < b.worst * (1 - 1e-9)) return true;
    if (a.worst > b.worst * (1 + 1e-9)) return false;
    return a.squares <= b.squares * (1 + 1e-9);
  };
  std::vector<std::vector<Cost>> best(size_t(G) + 1, std::vector<Cost>(size_t(L) + 1, Cost{inf, inf}));
  std::vector<std::vector<int>> take(size_t(G) + 1, std::vector<int>(size_t(L) + 1, 0));
  best[size_t(G)][size_t(L)] = {0, 0};
  for (int g = G - 1; g >= 0; --g)
    for (int b = L - (G - g); b >= g; --b)
      for (int n = L - b - (G - g - 1); n >= 1; --n) {  // the last tie kept: the fewest blocks here
        const double own = sum[size_t(b + n)] - sum[size_t(b)] + (g == G - 1 ? head : 0);
        const Cost& rest = best[size_t(g + 1)][size_t(b + n)];
        const Cost c{std::max(own, rest.worst), own * own + rest.squares};
        if (better(c, best[size_t(g)][size_t(b)])) best[size_t(g)][size_t(b)] = c, take[size_t(g)][size_t(b)] = n;
      }
  std::vector<int> out;
  for (int g = 0, b = 0; g < G; b += out.back(), ++g) out.push_back(take[size_t(g)][size_t(b)]);
  if (G == cfg.parallel.pp) return out;
  // Several chunks a stage (interleaved, a V): a stage costs its chunks' sum, which the chunks'
  // balance only approximates (a V's stage 0 holds the first chunk and the head's). From that
  // split, move one block across a chunk boundary while the stages' (largest cost, sum of
  // squares) strictly falls.
  const int p = cfg.parallel.pp;
  const auto stages = [&](const std::vector<int>& split) {
    std::vector<double> st(size_t(p), 0);
    for (int g = 0, b = 0; g < G; b += split[size_t(g)], ++g)
      st[size_t(pipe_stage_of(g, p, cfg.pp_v_shape()))] +=
          sum[size_t(b + split[size_t(g)])] - sum[size_t(b)] + (g == G - 1 ? head : 0);
    Cost c{0, 0};
    for (double x : st) c.worst = std::max(c.worst, x), c.squares += x * x;
    return c;
  };
  const auto fewer = [](const Cost& a, const Cost& b) {
    return a.worst < b.worst * (1 - 1e-9) || (a.worst <= b.worst * (1 + 1e-9) && a.squares < b.squares * (1 - 1e-9));
  };
  Cost now = stages(out);
  for (bool moved = true; moved;) {
    moved = false;
    for (int g = 0; g + 1 < G; ++g)
      for (int d : {1, -1}) {  // chunk g takes a block from chunk g + 1, or gives one
        if (out[size_t(d > 0 ? g + 1 : g)] == 1) continue;
        out[size_t(g)] += d, out[size_t(g + 1)] -= d;
        const Cost c = stages(out);
        if (fewer(c, now))
          now = c, moved = true;
        else
          out[size_t(g)] -= d, out[size_t(g + 1)] += d;
      }
  }
  return out;
}
}  // namespace

std::vector<int> pipeline_layers(const Config& cfg) {
  std::string spec = cfg.parallel.pp_layers;
  std::erase(spec, ' ');
  if (spec == "auto") return pipeline_layers_auto(cfg, cfg.parallel.pp * cfg.parallel.pp_virtual);
  return pipeline_layers_given(cfg);
}

}  // namespace loom
