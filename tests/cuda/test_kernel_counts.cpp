// What the kernels ask of an sm_90, as the counting emulation counts it (kernels/emu/counts.h),
// held per kernel and launch shape against tests/cuda/kernel_counts.csv, exactly: a kernel change
// that adds an ldmatrix, a bank conflict, a global byte or a round trip fails here until the
// table is rewritten with it. Beside the table, what the flash kernels must keep whatever it
// says. Counts only; nothing here times a kernel.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "kernels/cuda/ops_cuda.h"
#include "kernels/emu/count_ops.h"
#include "kernels/emu/count_sets.h"

using namespace loom::emu;

namespace {

// A CSV line's fields (quoted fields keep their commas).
std::vector<std::string> fields(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (char c : line) {
    if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

const CountSet& set_named(const std::string& name) {
  static const std::vector<CountSet> sets = count_sets();
  for (const CountSet& s : sets)
    if (s.name == name) return s;
  throw std::runtime_error("no count set " + name);
}

// The checked-in table's text.
std::string table_text() {
  std::ifstream in(LOOM_SOURCE_DIR "/tests/cuda/kernel_counts.csv");
  if (!in) throw std::runtime_error("cannot read tests/cuda/kernel_counts.csv");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The set's rows of the checked-in table: its model's, attention ops or the others.
std::vector<std::string> table_rows(const CountSet& set, std::string& header) {
  auto all = lines(table_text());
  header = all.at(0);
  std::vector<std::string> out;
  for (size_t i = 1; i < all.size(); ++i) {
    const auto f = fields(all[i]);
    if (f.at(0) == set.model && (f.at(1).rfind("attention", 0) == 0) == set.attention) out.push_back(all[i]);
  }
  return out;
}

// Each difference between the table's rows and the counted ones, by op, launch and field.
void expect_matches_table(const std::string& name) {
  const CountSet& set = set_named(name);
  const std::vector<CountedOp> ops = set.run(*count_driver());
  auto got = lines(counts_csv(set.model, ops));
  const std::vector<std::string> names = fields(got.at(0));
  got.erase(got.begin());
  std::string header;
  const auto want = table_rows(set, header);
  ASSERT_EQ(header, lines(counts_csv(set.model, {})).at(0)) << "the table's columns";
  std::vector<std::string> diffs;
  for (size_t i = 0; i < std::max(got.size(), want.size()); ++i) {
    if (i >= got.size()) {
      diffs.push_back("a launch the table has and the kernels no longer make: " + want[i]);
      continue;
    }
    if (i >= want.size()) {
      diffs.push_back("a launch the table lacks: " + got[i]);
      continue;
    }
    const auto g = fields(got[i]), w = fields(want[i]);
    for (size_t k = 0; k < names.size(); ++k)
      if (k >= w.size() || g[k] != w[k])
        diffs.push_back(fmt::format("{} / {} / {}: {} is {}, the table says {}", g[1], g[2], g[7], names[k], g[k],
                                    k < w.size() ? w[k] : "nothing"));
  }
  if (diffs.size() > 40) diffs.resize(40), diffs.push_back("...");
  EXPECT_TRUE(diffs.empty()) << set.name << ": the counts differ from tests/cuda/kernel_counts.csv:\n  "
                             << fmt::format("{}", fmt::join(diffs, "\n  "))
                             << "\nIf the change is meant (and better), rewrite the table:\n"
                                "  build/tests/loom_counts_csv > tests/cuda/kernel_counts.csv";
}

// The table's flash kernel launches, of every attention shape. The properties below are held on
// the table, which the tests above hold to the kernels: a regression fails both, and still fails
// here once the table is rewritten with it.
std::vector<std::pair<std::string, LaunchCounts>> flash_launches() {
  std::vector<std::pair<std::string, LaunchCounts>> out;
  for (const auto& [model, op] : counts_csv_parse(table_text()))
    for (const LaunchCounts& l : op.launches)
      if (l.kernel.find("flash") != std::string::npos) out.push_back({model + " " + op.shape + " " + l.kernel, l});
  return out;
}

// The table's launches of kernels whose name starts with `prefix`, of every set.
std::vector<std::pair<std::string, LaunchCounts>> table_launches(const std::string& prefix) {
  std::vector<std::pair<std::string, LaunchCounts>> out;
  for (const auto& [model, op] : counts_csv_parse(table_text()))
    for (const LaunchCounts& l : op.launches)
      if (l.kernel.rfind(prefix, 0) == 0) out.push_back({model + " " + op.name + " " + l.kernel, l});
  return out;
}

}  // namespace

TEST(KernelCounts, Gpt2AttentionMatchesTheTable) {
  expect_matches_table("gpt2_124m attention");
}
TEST(KernelCounts, GroupedQueryAttentionMatchesTheTable) {
  expect_matches_table("gqa attention");
}
TEST(KernelCounts, HeadDim128AttentionMatchesTheTable) {
  expect_matches_table("d128 attention");
}
TEST(KernelCounts, Gpt2StepMatchesTheTable) {
  expect_matches_table("gpt2_124m step");
}
TEST(KernelCounts, LlamaStepMatchesTheTable) {
  expect_matches_table("llama_1b step");
}

// Padded shared-memory rows put the eight 16-byte rows of an ldmatrix matrix or a cp.async
// phase in distinct banks: one wavefront each. A tile without its padding conflicts 8 ways.
TEST(KernelCounts, FlashLdmatrixAndCpAsyncHaveNoBankConflicts) {
  const auto launches = flash_launches();
  ASSERT_EQ(launches.size(), 13u) << "three flash kernels at each of the table's three attention shapes, and the "
                                     "recomputing dQ and dK/dV at the two of head dim 64";
  for (const auto& [what, l] : launches) {
    EXPECT_GT(l.total.ldmatrix, 0) << what;
    EXPECT_EQ(l.total.ldmatrix_wavefronts, l.total.ldmatrix_matrices)
        << what << ": ldmatrix takes " << l.total.ldmatrix_wavefronts / l.total.ldmatrix_matrices
        << " wavefronts a matrix";
    EXPECT_EQ(l.total.cp_async_wavefronts, l.total.cp_async_ideal)
        << what << ": cp.async takes " << l.total.cp_async_wavefronts / l.total.cp_async_ideal << " wavefronts a phase";
  }
}

// Tile reuse: the mma.sync each ldmatrix feeds. At head dim 64 a warp holds two tiles of 16 rows
// (forward and dQ: queries; dK/dV: keys), so each K/V (Q/dO) fragment feeds both tiles' mma.sync:
// issue 53's floors, 3.5 forward and 3.0 in each backward kernel (the table: 3.89, 3.85, 3.14;
// dK/dV rereads half its V fragments, the registers hold no more). One tile a warp gives about 2.
// Head dim 128 keeps one tile (two tiles' accumulators would spill) and rereads Q and dO in
// the backward: held at 1.5 (the table: 1.95, 1.71, 1.60).
TEST(KernelCounts, FlashMmaPerLdmatrixHoldsItsFloor) {
  const std::map<std::string, double> floors = {
      {"attention_forward_flash_kernel<64>", 3.5}, {"attention_dq_flash_kernel<64>", 3.0},
      {"attention_dkv_flash_kernel<64>", 3.0},     {"attention_forward_flash_kernel<128>", 1.5},
      {"attention_dq_flash_kernel<128>", 1.5},     {"attention_dkv_flash_kernel<128>", 1.5},
      {"attention_dkv_ds_flash_kernel", 3.0},      {"attention_dq_ds_flash_kernel", 3.0}};
  int held = 0;
  for (const auto& [what, l] : flash_launches()) {
    const auto floor = floors.find(l.kernel);
    ASSERT_NE(floor, floors.end()) << what << ": a flash kernel without a floor";
    ASSERT_GT(l.total.ldmatrix, 0) << what;
    EXPECT_GE(l.total.mma / l.total.ldmatrix, floor->second) << what;
    ++held;
  }
  EXPECT_EQ(held, 13);
}

// The dQ pass of the stored dS (head dim 64) does one product, dQ += dS K, over the causal half
// and the diagonal chunks its 32-row pairs reach: B H T^2 D of mma FLOPs and ~3% more at T 1024.
// A dQ that recomputed S and dP would do three times that; one that walked every key tile, twice.
TEST(KernelCounts, StoredDsDqDoesOneProductOverTheCausalHalf) {
  int held = 0;
  for (const auto& [model, op] : counts_csv_parse(table_text()))
    for (const LaunchCounts& l : op.launches) {
      if (l.kernel != "attention_dq_ds_flash_kernel") continue;
      int B = 0, T = 0, H = 0, KV = 0, D = 0;
      ASSERT_EQ(std::sscanf(op.shape.c_str(), "B%d T%d H%d KV%d D%d", &B, &T, &H, &KV, &D), 5) << op.shape;
      const double product = double(B) * H * T * T * D, mma_flops = 4096.0 * l.total.mma;  // m16n8k16
      EXPECT_GE(mma_flops, product) << model << " " << op.shape;
      EXPECT_LE(mma_flops, 1.1 * product) << model << " " << op.shape;
      ++held;
    }
  EXPECT_EQ(held, 2) << "GPT-2's and the grouped-query shape's backward";
}

// Grid order (issue 53 item 9): x, the fastest in launch order, is a head's tiles, then y the
// (kv) heads and z the sequences, so the CTAs resident at once share a few heads' K/V (Q/dO) in
// L2 rather than one tile of every head. Counts cannot see L2 hits; this holds the order.
TEST(KernelCounts, FlashGridWalksAHeadsTilesFirst) {
  int held = 0;
  for (const auto& [model, op] : counts_csv_parse(table_text()))
    for (const LaunchCounts& l : op.launches) {
      if (l.kernel.find("flash") == std::string::npos) continue;
      int B = 0, T = 0, H = 0, KV = 0, D = 0;
      ASSERT_EQ(std::sscanf(op.shape.c_str(), "B%d T%d H%d KV%d D%d", &B, &T, &H, &KV, &D), 5) << op.shape;
      const int heads = l.kernel.find("dkv") != std::string::npos ? KV : H;
      const std::string what = model + " " + op.shape + " " + l.kernel;
      EXPECT_EQ(l.grid[1], unsigned(heads)) << what << ": grid y is the heads";
      EXPECT_EQ(l.grid[2], unsigned(B)) << what << ": grid z is the sequences";
      // A CTA's rows: 4 warps of two 16-row tiles at head dim 64 or less, of one at 128; dQ from
      // the stored dS 4 warps of three (the last CTA partial).
      const int rows = l.kernel.find("dq_ds") != std::string::npos ? 192 : D <= 64 ? 128 : 64;
      EXPECT_EQ(l.grid[0], unsigned((T + rows - 1) / rows)) << what << ": grid x is the tiles of " << T << " rows";
      ++held;
    }
  EXPECT_EQ(held, 13);
}

// Counting twice in one process gives the same counts (nothing carried from launch to launch).
TEST(KernelCounts, CountingTwiceGivesTheSameCounts) {
  const CountDriver& d = *count_driver();
  EXPECT_EQ(counts_csv("twice", d.attention(1, 256, 4, 2, 64)), counts_csv("twice", d.attention(1, 256, 4, 2, 64)));
}

// A counted launch's buffers end at most 255 bytes below an inaccessible page: a kernel (or a
// count driver's too-short buffer) writing past one faults at once instead of landing in whatever
// was mapped next (a thread's control block, once). Without the guard pages the write lands.
TEST(KernelCountsDeathTest, AWritePastACountedBufferFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (const size_t bytes : {size_t(1), size_t(300), size_t(4096), size_t(100000)}) {
    auto* p = static_cast<volatile unsigned char*>(count_alloc(bytes));
    p[0] = 1;  // the buffer itself is writable
    p[bytes - 1] = 2;
    EXPECT_DEATH({ p[bytes + 255] = 3; }, "") << bytes << " bytes";
    count_free(const_cast<unsigned char*>(p), bytes);
  }
}

// The column sums' partials (weight and bias gradients) store and load their shared rows
// without bank conflicts: with the word-major layout the stores took 8 wavefronts each.
TEST(KernelCounts, ColumnPartialsHaveNoBankConflicts) {
  const auto launches = table_launches("column_word_partials_kernel");
  ASSERT_GE(launches.size(), 1u) << "a bias's gradient alone (with dW it rides the GEMM; the norms' are fused)";
  for (const auto& [what, l] : launches) {
    EXPECT_GT(l.total.sts, 0) << what;
    EXPECT_EQ(l.total.sts_wavefronts, l.total.sts_ideal)
        << what << ": the stores take " << l.total.sts_wavefronts / l.total.sts_ideal << " wavefronts each";
    EXPECT_EQ(l.total.lds_wavefronts, l.total.lds_ideal)
        << what << ": the loads take " << l.total.lds_wavefronts / l.total.lds_ideal << " wavefronts each";
  }
}

// The table's ops named `prefix`, with their N x C shape.
struct NormOp {
  std::string what;
  double N = 0, C = 0;
  CountedOp op;
};
std::vector<NormOp> table_ops(const std::string& prefix) {
  std::vector<NormOp> out;
  for (const auto& [model, op] : counts_csv_parse(table_text()))
    if (op.name.rfind(prefix, 0) == 0) {
      const size_t x = op.shape.find('x');
      out.push_back({model + " " + op.name, std::stod(op.shape.substr(0, x)), std::stod(op.shape.substr(x + 1)), op});
    }
  return out;
}

// The norms' backward reads each row of dout and inp once: one kernel reads the rows (dout, inp
// and dinp once each; the weight once a warp, which takes 8 rows, so at most once in 4 rows
// here; each group's mean and rstd) and gives dinp and the weight (and bias) gradients'
// partials; the finish reads only those partials (a block's row of C floats per gradient). A
// separate pass over dout and inp for the partials (4 N C bytes) fails here, so does a row
// kernel that loads dout or inp again (2 N C) or the weight once a row (2 N C; before, twice).
TEST(KernelCounts, NormBackwardReadsDoutAndInpOnce) {
  const auto ops = table_ops("layernorm bwd"), rms = table_ops("rmsnorm bwd");
  ASSERT_EQ(ops.size(), 1u);
  ASSERT_EQ(rms.size(), 1u);
  for (const auto& [what, N, C, op] : {ops[0], rms[0]}) {
    // mean and rstd, or rstd; the weight's and the bias's gradients, or the weight's
    const double scalars = what.find("layernorm") != std::string::npos ? 2 : 1, gradients = scalars;
    const double rows = 3 * 2 * N * C + 2 * N * C / 4 + 32 * 4 * scalars * N;
    int row_kernels = 0;
    for (const LaunchCounts& l : op.launches) {
      if (l.total.ldg_bytes > 2 * N * C / 8) {
        ++row_kernels;
        EXPECT_LE(l.total.ldg_bytes, rows) << what << " " << l.kernel << ": reads the rows more than once";
      } else {
        // The partials, and the gradients the finish adds them to.
        EXPECT_LE(l.total.ldg_bytes, (loom::cuda::kMaxNormGradBlocks + 1) * C * 4 * gradients)
            << what << " " << l.kernel << ": more than partials";
      }
    }
    EXPECT_EQ(row_kernels, 1) << what << ": launches that read the rows";
  }
}

// The norms' forward and backward launches (row kernels and the partials' finish) move at most
// 10% more DRAM bytes than each input read once and each output written once: a block reads
// the weight (and bias) once, not once a row, and writes its rows' mean and rstd in one
// request; the backward's partials are a block's row of C floats over 64 rows (GPT-2) or 24
// (LLaMA). Before: 1.51x (LayerNorm forward), 1.57x (backward), 1.25x and 1.53x (RMSNorm),
// the weight read once or twice a row.
TEST(KernelCounts, NormsMoveAtMostATenthMoreThanTheirLeastBytes) {
  int ops = 0;
  for (const char* prefix : {"layernorm fwd", "layernorm bwd", "rmsnorm fwd", "rmsnorm bwd"})
    for (const auto& [what, N, C, op] : table_ops(prefix)) {
      double bytes = 0;
      for (const LaunchCounts& l : op.launches) bytes += l.total.dram_bytes();
      EXPECT_LE(bytes, 1.10 * op.min_bytes) << what << ": " << bytes / op.min_bytes << "x the least bytes";
      ++ops;
    }
  EXPECT_EQ(ops, 4);
}

// The norms' row kernels take a row's slice (256 columns a warp) in one batch of loads: one
// dependent round trip a warp and row (the forward's residual add stored after all of its
// loads, the backward's dinp loaded with dout and inp), and no warp walks a row of its own
// (the time model's 3 round trips a request, plan/kernel_model.h), the row being split across
// warps. Before: 6 round trips a row at LayerNorm's forward, 17 at RMSNorm's (loads between
// stores), and two thirds or more of the loads walking a warp's own row.
TEST(KernelCounts, NormRowsTakeOneRoundTripAWarpAndNoneWalks) {
  int kernels = 0;
  for (const char* prefix : {"layernorm fwd", "layernorm bwd", "rmsnorm fwd", "rmsnorm bwd"})
    for (const auto& [what, N, C, op] : table_ops(prefix))
      for (const LaunchCounts& l : op.launches) {
        if (l.kernel.find("norm_") == std::string::npos) continue;  // the partials' finish
        ++kernels;
        const double slices = std::ceil(C / 256);
        // (5%: the count scales sampled full blocks to the grid, whose last block is short.)
        EXPECT_LE(l.total.trips_sum, 1.05 * N * slices) << what << " " << l.kernel << ": round trips a row and slice";
        EXPECT_LE(l.total.trips_max, 8) << what << " " << l.kernel << ": a warp's rows in series";
        EXPECT_LE(l.total.ldg_walking, 0.05 * l.total.ldg) << what << " " << l.kernel << ": loads walking a row";
      }
  EXPECT_EQ(kernels, 4);
}

// The norm backward's row groups add their weight (and bias) gradient sums through shared
// memory: a warp's store of element k of its lanes' words (columns 8 l + k) and the block's
// loads of 32 consecutive columns each touch 32 banks (unpadded, 8 l + k took 8 wavefronts a
// store).
TEST(KernelCounts, NormBackwardAccumulatorsHaveNoBankConflicts) {
  auto launches = table_launches("layernorm_backward_kernel"), rms = table_launches("rmsnorm_backward_kernel");
  launches.insert(launches.end(), rms.begin(), rms.end());
  ASSERT_EQ(launches.size(), 2u);
  for (const auto& [what, l] : launches) {
    EXPECT_GT(l.total.sts, 0) << what;
    EXPECT_EQ(l.total.sts_wavefronts, l.total.sts_ideal) << what;
    EXPECT_EQ(l.total.lds_wavefronts, l.total.lds_ideal) << what;
  }
}

// The token embedding's gradient has no tail: the count's batch is Zipf-like (its most frequent
// token about 3% of it: 490 positions at GPT-2's, 250 at the LLaMA's), and no warp walks more
// than kEmbeddingPiece positions, a round trip each 4 (the unrolled loads) for each of its
// ceil(C / 256) columns: 48 round trips at C = 768, 128 at 2048 (one block walking the frequent
// token's positions took 408 and 632).
TEST(KernelCounts, EmbeddingBackwardHasNoLongWarp) {
  const auto ops = table_ops("embedding bwd");
  ASSERT_EQ(ops.size(), 2u);
  for (const auto& [what, N, C, op] : ops)
    for (const LaunchCounts& l : op.launches) {
      if (l.kernel.find("wpe") != std::string::npos) continue;
      const double columns = std::ceil(C / 256);
      EXPECT_LE(l.total.trips_max, loom::cuda::kEmbeddingPiece * columns / 4 + 2) << what << " " << l.kernel;
    }
}

// Cross-entropy reads the logits once: the first pass keeps the row in shared memory (100 KB at
// GPT-2's vocabulary) and the second reads it there (it read the row again from global memory:
// 3320 MB a step at GPT-2's shape for a 1648 MB tensor, with 106 MB of rows in flight on an H100
// against its 50 MB L2). The 32-byte sectors read: one read of the bf16 logits, 2 N V, and 2% for
// the targets, the target's logit (every thread asks for both) and words split at a row's ends.
TEST(KernelCounts, CrossEntropyReadsTheLogitsOnce) {
  const auto ops = table_ops("crossentropy");
  ASSERT_EQ(ops.size(), 2u);
  for (const auto& [what, N, V, op] : ops) {
    double read = 0;
    for (const LaunchCounts& l : op.launches) read += 32 * l.total.ldg_sectors;
    EXPECT_LE(read, 1.02 * 2 * N * V) << what;
  }
}

// The biases' gradients ride their weight gradients' GEMMs (cuBLASLt's BGRADA/BGRADB): what is
// left of them in GPT-2's step is dbias += the epilogue's sums, 12 bytes an element at least and
// 24 as add_f32 asks for sectors (each of its two 16-byte loads a lane spans every sector of the
// warp's 1 KB); the separate passes read dout, 2.7 GB a step. The backend's launches are held by
// emu.EmulatedDevice.LinearBackwardLaunchesNoBiasPass.
TEST(KernelCounts, BiasGradientsRideTheWeightGradientGemm) {
  int held = 0;
  for (const auto& [what, N, cols, op] : table_ops("bias bwd")) {
    if (op.per_step == 0) continue;  // the pass a bias takes alone, in no step
    double bytes = 0;
    for (const LaunchCounts& l : op.launches) bytes += l.total.dram_bytes();
    EXPECT_LE(bytes, 24 * cols) << what;
    ++held;
  }
  EXPECT_EQ(held, 4) << "qkv, proj, fc and fc2";
}
