// Data parallel's geometry without a run. ZeRO: over every dp rank, the shards cover each
// element of the model once, each starting at a multiple of the norm's block from its unit's
// start, and the optimizer tables cut the same norm blocks at every dp as the single rank's
// table does (what makes the exact gradient norm the same bits on any number of ranks). DDP:
// the buckets cover the buffer once from its end, none larger than asked, none mixing experts'
// tensors with dense ones.
#include <algorithm>
#include <tuple>

#include "model/layout.h"
#include "optim/adamw.h"
#include "parallel/ddp.h"
#include "parallel/zero.h"
#include "testing.h"

using namespace loom;

namespace {
Config small(const std::string& arch, int d_model) {
  Config cfg = config_defaults();
  config_set(cfg, "model.arch=" + arch);
  config_set(cfg, "model.n_layer=3");
  config_set(cfg, "model.d_model=" + std::to_string(d_model));
  config_set(cfg, "model.n_head=4");
  config_set(cfg, "model.vocab_size=300");
  config_set(cfg, "model.seq_len=16");
  config_validate(cfg);
  return cfg;
}

int64_t unit_start(const ModelLayout& layout, int64_t flat) {
  const std::vector<int64_t> u = unit_starts(layout);
  return *(std::upper_bound(u.begin(), u.end(), flat) - 1);
}

// The counted chunks of a table, by the flat gradient index they read (stage 1: flat).
std::vector<std::pair<int64_t, int32_t>> counted(const std::vector<OptChunk>& table) {
  std::vector<std::pair<int64_t, int32_t>> out;
  for (const OptChunk& c : table)
    if (c.norm) out.push_back({c.grad, c.n});
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

TEST(ZeroGeometry, ShardsCoverEachElementOnceFromBlockMultiples) {
  for (auto [arch, C] : {std::pair{"gpt2", 64}, std::pair{"llama", 40}, std::pair{"gpt2", 48}})
    for (int dp : {1, 2, 3, 4}) {
      const Config cfg = small(arch, C);
      const ModelLayout layout = model_layout(model_dims(cfg));
      const int64_t block = norm_block(model_dims(cfg));
      std::vector<std::tuple<int64_t, int64_t, int>> runs;  // flat, n, rank
      for (int r = 0; r < dp; ++r) {
        const ZeroRanks z = zero_ranks(data_parallel_options(cfg), model_dims(cfg), dp, r);
        ASSERT_EQ(z.block, block);
        int64_t state_end = 0;
        for (const StateRun& run : zero_state_runs(layout, z)) {
          EXPECT_GE(run.flat, int64_t(run.spec->offset)) << run.spec->name;
          EXPECT_LE(run.flat + run.n, int64_t(run.spec->offset) + run.spec->numel()) << run.spec->name;
          // A run starts at its shard's start (a block multiple into the unit) or at a tensor's.
          const bool at_tensor = run.flat == int64_t(run.spec->offset);
          EXPECT_TRUE(at_tensor || (run.flat - unit_start(layout, run.flat)) % block == 0)
              << arch << " dp " << dp << " rank " << r << " " << run.spec->name << " at " << run.flat;
          EXPECT_GE(run.state, state_end) << "shard space runs overlap";
          state_end = run.state + run.n;
          runs.push_back({run.flat, run.n, r});
        }
      }
      std::sort(runs.begin(), runs.end());
      int64_t next = 0;
      for (auto [flat, n, r] : runs) {
        ASSERT_EQ(flat, next) << arch << " dp " << dp << ": a gap or an overlap at " << next << " (rank " << r << ")";
        next += n;
      }
      EXPECT_EQ(next, int64_t(layout.reg.numel())) << arch << " dp " << dp;
    }
}

// The norm's blocks: the chunks every rank counts, together, are the single rank's table's.
TEST(ZeroGeometry, EveryDpCutsTheNormBlocksOfOneRank) {
  for (auto [arch, C] : {std::pair{"gpt2", 64}, std::pair{"llama", 40}}) {
    const Config cfg = small(arch, C);
    const ModelLayout layout = model_layout(model_dims(cfg));
    const auto one = counted(opt_chunks(layout.reg, unit_starts(layout), norm_block(model_dims(cfg)), 0));
    ASSERT_GT(one.size(), size_t(layout.num_units()));
    for (int dp : {1, 2, 3, 4}) {
      std::vector<OptChunk> all;
      for (int r = 0; r < dp; ++r)
        for (const OptChunk& c : zero_opt_chunks(layout, zero_ranks(data_parallel_options(cfg), model_dims(cfg), dp, r),
                                                 /*stage=*/1, /*tp_rank=*/0))
          all.push_back(c);
      EXPECT_EQ(counted(all), one) << arch << " dp " << dp;
    }
  }
}

TEST(DdpGeometry, BucketsCoverTheBufferFromTheEndWithoutMixingKinds) {
  for (bool moe : {false, true}) {
    Config cfg = small(moe ? "llama" : "gpt2", 64);
    if (moe) {
      config_set(cfg, "model.moe.num_experts=4");
      config_validate(cfg);
    }
    const ModelLayout layout = model_layout(model_dims(cfg));
    const int64_t numel = int64_t(layout.reg.numel());
    for (int64_t per : {int64_t(1000), int64_t(4096), numel + 1})
      for (bool apart : {false, true}) {
        const std::vector<BucketRange> b = ddp_buckets(layout.reg, numel, per, apart);
        ASSERT_FALSE(b.empty());
        EXPECT_EQ(b.front().hi, numel);
        EXPECT_EQ(b.back().lo, 0);
        bool any_experts = false;
        for (size_t i = 0; i < b.size(); ++i) {
          EXPECT_GT(b[i].hi, b[i].lo);
          EXPECT_LE(b[i].hi - b[i].lo, per);
          if (i > 0) {
            EXPECT_EQ(b[i].hi, b[i - 1].lo) << "launch order is from the end, with no gap";
          }
          for (const ParamSpec& s : layout.reg.all())
            if (int64_t(s.offset) < b[i].hi && int64_t(s.offset) + s.numel() > b[i].lo) {
              EXPECT_EQ(apart && expert_param(s.name), b[i].experts) << s.name << " in bucket " << i;
            }
          any_experts = any_experts || b[i].experts;
        }
        EXPECT_EQ(any_experts, moe && apart);
        if (!apart) {
          EXPECT_EQ(int64_t(b.size()), (numel + per - 1) / per) << "one run: cut only by size";
        }
      }
  }
}

// The planner's count of a run's optimizer chunks (arithmetic) is the table's (a walk).
TEST(OptChunks, CountIsTheTablesLength) {
  for (int64_t block : {int64_t(64), int64_t(512), int64_t(1024), int64_t(kOptChunk) * 2})
    for (int64_t at : {int64_t(0), int64_t(1), block - 1, block, 3 * block + 7})
      for (int64_t n : {int64_t(0), int64_t(1), block - at % block, block, 5 * block + 3, int64_t(100000)}) {
        std::vector<OptChunk> table;
        opt_chunks_add(table, 0, 0, 0, n, false, true, at, block);
        EXPECT_EQ(opt_chunks_count(n, at, block), table.size()) << "n " << n << " at " << at << " block " << block;
      }
}

// The options data parallel takes are the config's: each field on a config where every one
// differs from its default (a swapped or stale field shows), and the tied pipeline flag.
TEST(DataParallelOptions, EachFieldIsTheConfigs) {
  Config c = small("gpt2", 64);
  config_set(c, "parallel.zero=3");
  config_set(c, "parallel.zero3_reshard=after_step");
  config_set(c, "parallel.bucket_mb=7.5");
  config_set(c, "parallel.grad_reduce_dtype=bf16");
  config_set(c, "parallel.dp=4");
  config_set(c, "parallel.cp=2");
  config_set(c, "train.micro_batch=2");
  config_set(c, "train.global_batch=48");
  config_validate(c);
  const DataParallelOptions o = data_parallel_options(c);
  EXPECT_EQ(o.zero, 3);
  EXPECT_EQ(o.bucket_mb, 7.5);
  EXPECT_EQ(o.reduce, DType::bf16);
  EXPECT_FALSE(o.invariant);
  EXPECT_EQ(o.micro_batches, 6);  // 48 / (2 x 4)
  EXPECT_EQ(o.ranks, 8);
  EXPECT_EQ(o.ep, 1);
  EXPECT_TRUE(o.keep_gathered);
  EXPECT_FALSE(o.tied_across);
  Config p = small("gpt2", 64);
  config_set(p, "parallel.pp=3");
  config_set(p, "parallel.invariant=true");
  config_validate(p);
  const DataParallelOptions q = data_parallel_options(p);
  EXPECT_TRUE(q.invariant);
  EXPECT_TRUE(q.tied_across);
  EXPECT_FALSE(q.keep_gathered);
  EXPECT_EQ(q.zero, 0);
}
