// Checkpoint pieces and manifests: every element of the global state lands in exactly one
// shard whatever the layout, at the global position that holds its value; a shard read back
// fills the local storage it came from; and a checkpoint's problems are found by name.
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "checkpoint/h5.h"
#include "checkpoint/manifest.h"
#include "checkpoint/pieces.h"
#include "checkpoint/staged_writer.h"
#include "model/layout.h"
#include "testing.h"

using namespace loom;

namespace {
Config small(const std::string& arch, int tp) {
  Config cfg = config_defaults();
  config_set(cfg, "model.arch=" + arch);
  config_set(cfg, "model.n_layer=1");
  config_set(cfg, "model.d_model=32");
  config_set(cfg, "model.n_head=4");
  config_set(cfg, "model.vocab_size=100");  // padded to 64 x tp: real rows end mid-shard
  config_set(cfg, "model.seq_len=8");
  config_set(cfg, "parallel.tp=" + std::to_string(tp));
  config_validate(cfg);
  return cfg;
}
}  // namespace

// Each local element of each tp rank's storage, cut into runs at random places, through
// pieces_of: the pieces' values are the global tensor's at their global positions, and over
// all ranks every real element is covered once (padded rows never).
TEST(CheckpointPieces, CoverEveryGlobalElementOnceAtItsPlace) {
  for (const char* arch : {"gpt2", "llama"})
    for (int tp : {1, 2, 4}) {
      const Config cfg = small(arch, tp);
      std::map<std::string, std::vector<int>> seen;
      std::mt19937 gen(7);
      for (int r = 0; r < tp; ++r) {
        const ModelLayout layout = model_layout(model_dims(cfg), r);
        for (const ParamSpec& s : layout.reg.all()) {
          if (s.replicated() && r != 0) continue;  // written by tp rank 0 (state_runs)
          std::vector<float> global(size_t(s.global_numel())), local(size_t(s.numel()));
          for (size_t i = 0; i < global.size(); ++i) global[i] = float(i);  // value = global index
          shard_take(s, global.data(), local.data());
          auto& count = seen[s.name];
          count.resize(global.size());
          const int64_t cols = s.global_shape.back();
          // Runs cut at random points (ZeRO shards and DDP's write shares cut anywhere).
          std::vector<int64_t> cuts = {0, s.numel()};
          for (int k = 0; k < 3; ++k) cuts.push_back(std::uniform_int_distribution<int64_t>(0, s.numel())(gen));
          std::sort(cuts.begin(), cuts.end());
          for (size_t k = 0; k + 1 < cuts.size(); ++k) {
            const int64_t f0 = cuts[k], f1 = cuts[k + 1];
            int64_t local_real = 0;
            std::vector<float> back(size_t(f1 - f0), -1.0f);  // the run refilled from its pieces' boxes
            for (const Piece& p : pieces_of(s, f0, f1)) {
              std::vector<float> vals(size_t(p.numel()));
              piece_gather(s, p, local.data() + f0, f0, vals.data());
              const Box b = box_of(piece_offset(s, p), piece_shape(s, p));
              for (int64_t i = 0; i < b.rows; ++i)
                for (int64_t j = 0; j < b.cols; ++j) {
                  const int64_t g = (b.r0 + i) * cols + b.c0 + j;
                  ASSERT_EQ(vals[size_t(i * b.cols + j)], float(g)) << s.name << " tp " << tp << " rank " << r;
                  ++count[size_t(g)];
                }
              ASSERT_EQ(piece_fill(s, p, b, vals.data(), back.data(), f0), p.numel());
              local_real += p.numel();
            }
            EXPECT_LE(local_real, f1 - f0);  // padded rows are in no piece
            // Filled back from their own boxes, the pieces restore the run's real elements.
            int64_t filled = 0;
            for (int64_t i = 0; i < f1 - f0; ++i) {
              if (back[size_t(i)] == -1.0f) continue;
              ++filled;
              ASSERT_EQ(back[size_t(i)], local[size_t(f0 + i)]) << s.name << " tp " << tp << " element " << f0 + i;
            }
            EXPECT_EQ(filled, local_real) << s.name;
          }
        }
      }
      for (auto& [name, count] : seen)
        for (size_t i = 0; i < count.size(); ++i)
          ASSERT_EQ(count[i], 1) << arch << " tp " << tp << " " << name << " element " << i;
    }
}

// A checkpoint of two shards: sound as written; a flipped byte in one shard, a missing file and
// a tensor left half uncovered are each found and named.
TEST(CheckpointManifest, ProblemsAreFoundByName) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "loom_ckpt_problems";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {7, 8};
  {
    H5Writer w(dir + "/rank-00000.h5");
    w.write("params/w/0", {2, 3}, a.data());
    w.write("params/w/1", {1, 2}, b.data());
    w.close();
  }
  Manifest m;
  m.step = 3;
  m.config = "";
  m.layout = {{"world", 1}};
  m.tensors["params/w"] = {{3, 3},
                           {{"rank-00000.h5", "params/w/0", {0, 0}, {2, 3}, xxh64_hex(a.data(), 6)},
                            {"rank-00000.h5", "params/w/1", {2, 1}, {1, 2}, xxh64_hex(b.data(), 2)}}};
  // One element, (2, 0), is in no shard.
  auto problems = checkpoint_problems(dir, m);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("1 elements in no shard"), std::string::npos) << problems[0];
  m.tensors["params/w"].shape = {3, 3};
  m.tensors["params/w"].shards[1] = {"rank-00000.h5", "params/w/1", {2, 1}, {1, 2}, xxh64_hex(b.data(), 2)};
  m.tensors["params/v"] = {{1}, {{"rank-00000.h5", "params/w/1", {0}, {1}, "0"}}};  // wrong shape for the dataset
  problems = checkpoint_problems(dir, m);
  EXPECT_EQ(problems.size(), 2u);  // still the gap; and v's dataset shape
  m.tensors.erase("params/v");
  m.tensors["params/w"].shape = {3, 2};  // now a shard lies outside
  problems = checkpoint_problems(dir, m);
  EXPECT_FALSE(problems.empty());
  m.tensors["params/w"].shape = {3, 3};
  m.tensors["params/w"].shards.push_back({"rank-00001.h5", "params/w/2", {2, 0}, {1, 1}, "00"});
  problems = checkpoint_problems(dir, m);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("rank-00001.h5"), std::string::npos) << problems[0];  // the missing file
  // A flipped byte inside the first shard's data: found by its hash, naming the shard.
  m.tensors["params/w"].shards.pop_back();
  {
    const std::string f = dir + "/rank-00000.h5";
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(io)), std::istreambuf_iterator<char>());
    const float one = 1.0f;
    const auto at = bytes.find(std::string(reinterpret_cast<const char*>(&one), 4));
    ASSERT_NE(at, std::string::npos);
    io.seekp(std::streamoff(at));
    io.put(char(bytes[at] ^ 0x10));
  }
  problems = checkpoint_problems(dir, m);
  bool named = false;
  for (auto& p : problems) named |= p.find("params/w/0") != std::string::npos && p.find("corrupt") != std::string::npos;
  EXPECT_TRUE(named) << (problems.empty() ? "no problems" : problems[0]);
}

// The staged writer (checkpoint/staged_writer.h) with tiny blocks: shards cut into runs of rows (2-D,
// and 1-D ones held whole), hashed and written in order; the state is scribbled over the moment
// the reader says it is done, which must come before the writer is (staging holds 4 of the
// largest shard, a fraction of 24), and the file must hold the values as they were, each
// shard's hash that of its bytes. A private copy (no reader) writes the same file; a writer
// that fails halfway, the reader stalled on full blocks, ends the reads and reports the error.
TEST(CheckpointStage, WritesWhatTheStateWasWhenItsReadsWereDone) {
  char tmpl[] = "/tmp/loom-stage-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  ParamSpec w, b;
  w.name = "w", w.shape = w.global_shape = {37, 5};
  b.name = "b", b.shape = b.global_shape = {11};
  std::vector<float> ws(185), bs(11);
  for (size_t i = 0; i < ws.size(); ++i) ws[i] = float(i) + 0.5f;
  for (size_t i = 0; i < bs.size(); ++i) bs[i] = -float(i);
  const std::vector<float> w0 = ws, b0 = bs;
  std::vector<StagedShard> shards;
  int64_t total = 0;
  for (int k = 0; k < 24; ++k) {  // the same tensors many times over, as params and moments are
    const ParamSpec& s = k % 3 == 2 ? b : w;
    for (const Piece& p : pieces_of(s, 0, s.numel())) {
      StagedShard sh;
      sh.tensor = fmt::format("t{}", k);
      sh.global_shape = s.global_shape;
      sh.shard = {"f.h5", fmt::format("t{}/0", k), piece_offset(s, p), piece_shape(s, p), ""};
      sh.spec = &s, sh.piece = p, sh.src = (&s == &w ? ws : bs).data(), sh.f0 = 0;
      shards.push_back(sh);
      total += p.numel();
    }
  }
  auto check = [&](const std::string& path, const std::vector<StagedShard>& written) {
    H5Reader in(path);
    for (const StagedShard& sh : written) {
      const std::vector<float> got = in.read(sh.shard.dataset, sh.shard.shape);
      EXPECT_EQ(got, sh.spec == &w ? w0 : b0) << sh.shard.dataset;
      EXPECT_EQ(sh.shard.xxh64, xxh64_hex(got.data(), int64_t(got.size()))) << sh.shard.dataset;
    }
  };
  Stager stager(12);  // 12 floats: two rows of w a block, b (11) alone
  stager.reserve(shards, true);
  EXPECT_LE(stager.bytes(), int64_t(4 * 4 * (185 + 11))) << "4 of the largest shard, in whole blocks";
  EXPECT_LT(stager.bytes(), 4 * total / 3) << "staging holds a fraction of the state";
  size_t begun = 0, begun_at_reads_done = 0;
  stager.write(
      dir + "/f.h5", shards, true,
      [&] {
        begun_at_reads_done = begun;
        std::fill(ws.begin(), ws.end(), 99.0f);  // the next optimizer step
        std::fill(bs.begin(), bs.end(), 99.0f);
      },
      [&](size_t i) { begun = i + 1; });
  EXPECT_EQ(begun, shards.size());
  EXPECT_LT(begun_at_reads_done, shards.size()) << "the reads ended only when the writer had";
  EXPECT_GT(begun_at_reads_done, 0u);
  check(dir + "/f.h5", shards);

  // A private copy: the same bytes, the reads done before anything is written.
  std::copy(w0.begin(), w0.end(), ws.begin());
  std::copy(b0.begin(), b0.end(), bs.begin());
  Stager one(12);
  one.reserve(shards, false);
  EXPECT_EQ(one.bytes(), int64_t(12 * 4));
  bool done = false;
  one.write(dir + "/g.h5", shards, false, [&] { done = true; }, {});
  EXPECT_TRUE(done);
  check(dir + "/g.h5", shards);

  // A failure halfway (a full disk) while the reader waits for blocks, and a file that cannot
  // be made: the error comes back, and the reads are over all the same.
  for (const std::string& path : {dir + "/h.h5", dir + "/no/such/dir/f.h5"}) {
    done = false;
    EXPECT_THROW(stager.write(
                     path, shards, true, [&] { done = true; },
                     [&](size_t i) { LOOM_CHECK(i != shards.size() / 2, "no space left (test)"); }),
                 Error)
        << path;
    EXPECT_TRUE(done) << path;
  }
  std::filesystem::remove_all(dir);
}
