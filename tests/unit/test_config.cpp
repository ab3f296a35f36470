// Config loading: TOML and --set, unknown keys with a suggestion, wrong types, and every
// relation validate() enforces, each with the message a user would read.
#include <filesystem>
#include <fstream>
#include <regex>

#include "model/flops.h"
#include "parallel/pipeline_split.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "testing.h"
#include "train/trainer.h"

using namespace loom;
using loom::test::error_of;

namespace {
Config loaded(const std::string& toml) {
  Config c = config_defaults();
  config_load_string(c, toml, "test.toml");
  config_validate(c);
  return c;
}
}  // namespace

TEST(Config, LoadsTomlAndOverrides) {
  Config c = config_defaults();
  config_load_string(c, "[model]\narch = \"llama\"\nn_layer = 3\n[train]\nlr = 1\n", "t.toml");
  config_set(c, "model.d_model=64");
  config_set(c, "train.recompute=full");
  config_set(c, "log.dir=\"x y\"");
  config_validate(c);
  EXPECT_EQ(c.model.arch, Arch::llama);
  EXPECT_EQ(c.model.n_layer, 3);
  EXPECT_EQ(c.model.d_model, 64);
  EXPECT_DOUBLE_EQ(c.train.lr, 1.0);  // an integer is a fine number
  EXPECT_EQ(c.train.recompute, Recompute::full);
  EXPECT_EQ(c.log.dir, "x y");
  EXPECT_FALSE(c.model.tie_embeddings);  // llama's default
  EXPECT_EQ(c.model.d_ff, 192);          // 8/3 * 64 rounded up to 64
  EXPECT_EQ(loaded("").model.d_ff, 4 * 128);
  EXPECT_TRUE(loaded("").model.tie_embeddings);
}

TEST(Config, UnknownKeySuggestsTheNearest) {
  EXPECT_EQ(error_of([] { loaded("[model]\nn_layers = 2\n"); }),
            "test.toml: unknown config key 'model.n_layers'; did you mean 'model.n_layer'? "
            "(`loom train --list-keys` lists all)");
  EXPECT_NE(error_of([] { loaded("[train]\nseq_len = 2\n"); }).find("did you mean 'model.seq_len'"), std::string::npos);
  Config c = config_defaults();
  EXPECT_NE(error_of([&] { config_set(c, "train.lrr=1"); }).find("did you mean 'train.lr'"), std::string::npos);
}

TEST(Config, WrongTypeNamesKeyAndType) {
  EXPECT_EQ(error_of([] { loaded("[model]\nn_layer = \"two\"\n"); }),
            "test.toml: model.n_layer must be an integer, got a string");
  EXPECT_EQ(error_of([] { loaded("[model]\nn_layer = 2.5\n"); }),
            "test.toml: model.n_layer must be an integer, got a floating-point");
  Config c = config_defaults();
  EXPECT_EQ(error_of([&] { config_set(c, "train.steps=ten"); }),
            "--set train.steps: train.steps must be an integer, got 'ten'");
  EXPECT_EQ(error_of([&] { config_set(c, "data.shuffle=yes"); }),
            "--set data.shuffle: data.shuffle must be true or false, got 'yes'");
  EXPECT_NE(error_of([&] { config_set(c, "novalue"); }).find("expected section.key=value"), std::string::npos);
  EXPECT_NE(error_of([] { loaded("[model\n"); }).find("test.toml:1:"), std::string::npos);
}

TEST(Config, RelationsAreCheckedWithTheFix) {
  EXPECT_EQ(error_of([] { loaded("[model]\nd_model = 100\nn_head = 3\n"); }),
            "model.n_head = 3 does not divide model.d_model = 100; use a divisor of d_model such as 4");
  EXPECT_EQ(error_of([] { loaded("[model]\narch = \"llama\"\nn_head = 4\nn_kv_head = 3\n"); }),
            "model.n_head = 4 is not a multiple of model.n_kv_head = 3; grouped-query attention needs "
            "n_head = k * n_kv_head");
  EXPECT_NE(
      error_of([] { loaded("[train]\nmicro_batch = 3\nglobal_batch = 16\n"); }).find("not a multiple of micro_batch"),
      std::string::npos);
  EXPECT_NE(error_of([] { loaded("[model]\narch = \"gpt3\"\n"); }).find("not one of gpt2|llama"), std::string::npos);
  EXPECT_NE(error_of([] { loaded("[train]\nrecompute = \"some\"\n"); }).find("none|selective|full"), std::string::npos);
  // Pipeline splits: 4 blocks by default.
  EXPECT_NE(error_of([] { loaded("[parallel]\npp = 3\n"); })
                .find("parallel.pp = 3 does not divide model.n_layer = 4; set parallel.pp_layers to the blocks per "
                      "stage, e.g. \"1,2,1\""),
            std::string::npos);
  EXPECT_NE(error_of([] { loaded("[parallel]\npp = 5\n"); }).find("every stage needs a block"), std::string::npos);
  EXPECT_NE(error_of([] { loaded("[parallel]\npp = 2\npp_layers = \"1,2\"\n"); }).find("sums to 3 blocks"),
            std::string::npos);
  EXPECT_NE(error_of([] { loaded("[parallel]\npp = 2\npp_layers = \"4\"\n"); }).find("gives 1 stage but"),
            std::string::npos);
  EXPECT_NE(error_of([] { loaded("[parallel]\npp = 2\npp_layers = \"0,4\"\n"); }).find("not a positive count"),
            std::string::npos);
  EXPECT_NE(error_of([] { loaded("[parallel]\npp = 2\npp_virtual = 2\n"); }).find("needs parallel.pp_schedule"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              loaded("[parallel]\npp = 3\npp_layers = \"1,2,1\"\npp_schedule = \"interleaved\"\n");
            }).find("needs a multiple of parallel.pp = 3 micro-batches per step, not 2"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              loaded("[parallel]\npp = 2\npp_virtual = 4\npp_schedule = \"interleaved\"\n");
            }).find("parallel.pp x pp_virtual = 8 model chunks but model.n_layer = 4"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              loaded("[parallel]\npp = 2\npp_virtual = 2\npp_schedule = \"interleaved\"\npp_layers = \"2,2\"\n");
            }).find("gives 2 model chunks but parallel.pp x pp_virtual = 4"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              loaded("[parallel]\npp = 2\npp_schedule = \"zb\"\n[train]\nrecompute = \"full\"\n");
            }).find("recompute every block twice"),
            std::string::npos);
  EXPECT_EQ(
      loaded("[parallel]\npp = 2\npp_schedule = \"zb\"\n[train]\nrecompute = \"selective\"\n").parallel.pp_schedule,
      PpSchedule::zb);
  EXPECT_NE(error_of([] { loaded("[parallel]\npp_schedule = \"gpipe\"\n"); }).find("but parallel.pp = 1"),
            std::string::npos);
  // Mixture of experts and expert parallelism: each a one-line error with the fix.
  const std::string moe = "[model]\narch = \"llama\"\n[model.moe]\nnum_experts = 4\n";
  EXPECT_NE(error_of([] { loaded("[model.moe]\nnum_experts = 4\n"); }).find("MoE layers are llama (Mixtral) blocks"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { loaded(moe + "top_k = 5\n"); }).find("top_k = 5 must be between 1 and model.moe.num_experts = 4"),
      std::string::npos);
  EXPECT_NE(error_of([&] { loaded(moe + "top_k = 0\n"); }).find("must be between 1"), std::string::npos);
  EXPECT_NE(error_of([&] {
              loaded(moe + "[parallel]\ndp = 2\nep = 3\n");
            }).find("ep = 3 does not divide model.moe.num_experts = 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              loaded(moe + "[parallel]\ndp = 2\nep = 4\n");
            }).find("ep = 4 does not divide parallel.dp x parallel.cp = 2 x 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { loaded("[parallel]\ndp = 2\nep = 2\n"); }).find("needs MoE layers"), std::string::npos);
  for (int zero : {1, 2, 3})  // every ZeRO stage shards a MoE block's experts over expert-dp
    EXPECT_EQ(loaded(moe + "[parallel]\ndp = 2\nep = 2\nzero = " + std::to_string(zero) + "\n").parallel.zero, zero);
  EXPECT_NE(error_of([&] {
              loaded(moe + "[parallel]\npp = 2\npp_schedule = \"zb\"\n");
            }).find("\"zb\" with MoE layers is not supported yet"),
            std::string::npos);
  EXPECT_EQ(loaded(moe + "[parallel]\ndp = 2\nep = 2\n").parallel.ep, 2);
  EXPECT_EQ(pipeline_layers(loaded("[parallel]\npp = 2\npp_layers = \"1,3\"\n")), (std::vector<int>{1, 3}));
  EXPECT_NE(error_of([] { loaded("[parallel]\ndp = 3\n"); }).find("not a multiple of micro_batch x dp = 8 x 3"),
            std::string::npos);
  EXPECT_NE(error_of([] { loaded("[data]\nsource = \"text\"\n"); }).find("needs data.path"), std::string::npos);
  EXPECT_NE(error_of([] { loaded("[model]\nn_layer = 0\n"); }).find("must be positive"), std::string::npos);
  EXPECT_EQ(error_of([] { loaded("[model]\nn_layer = 1\n"); }), "");
}

TEST(Config, TensorParallelRefusesWhatDoesNotSplit) {
  EXPECT_EQ(error_of([] { loaded("[model]\nn_head = 4\n[parallel]\ntp = 3\n"); }),
            "parallel.tp = 3 does not divide model.n_head = 4; pick tp among the divisors of n_head");
  EXPECT_EQ(
      error_of([] { loaded("[model]\narch = \"llama\"\nn_head = 8\nn_kv_head = 2\n[parallel]\ntp = 4\n"); }),
      "parallel.tp = 4 does not divide the 2 key/value heads (model.n_kv_head); each tp rank needs whole kv heads");
  // Any vocabulary splits: loom pads it to a multiple of 64 x tp.
  EXPECT_EQ(error_of([] { loaded("[model]\nvocab_size = 50257\n[parallel]\ntp = 2\n"); }), "");
  EXPECT_EQ(loaded("[model]\nvocab_size = 50257\n[parallel]\ntp = 2\n").vocab_padded(), 50304);
  EXPECT_EQ(loaded("[model]\nvocab_size = 50257\nn_head = 8\n[parallel]\ntp = 8\n").vocab_padded(), 50688);
  EXPECT_EQ(loaded("[model]\nvocab_size = 512\n").vocab_padded(), 512);
  EXPECT_EQ(error_of([] { loaded("[parallel]\nsp = true\n"); }),
            "parallel.sp = true needs tensor parallelism (parallel.tp > 1)");
  EXPECT_EQ(error_of([] { loaded("[parallel]\ntp = 2\nsp = true\n"); }), "");
}

TEST(Config, TheGpuPathRefusesWhatItDoesNotHave) {
  if (!LOOM_HAVE_CUDA) {
    EXPECT_NE(error_of([] { loaded("[train]\ndevice = \"cuda\"\n"); }).find("this build has no CUDA"),
              std::string::npos);
    return;
  }
  // Every layout runs on the GPU; head dims the CUDA attention kernels do not take do not.
  EXPECT_EQ(error_of([] { loaded("[train]\ndevice = \"cuda\"\nmicro_batch = 8\n[parallel]\ndp = 2\nzero = 3\n"); }),
            "");
  EXPECT_NE(error_of([] {
              loaded("[train]\ndevice = \"cuda\"\n[model]\nd_model = 96\nn_head = 2\n");
            }).find("head dims 32, 64 and 128"),
            std::string::npos);
  EXPECT_NE(error_of([] { loaded("[train]\ndevice = \"cuda\"\ndtype = \"f32\"\n"); }).find("computes in bf16"),
            std::string::npos);
  EXPECT_EQ(error_of([] { loaded("[train]\ndevice = \"cuda\"\nrecompute = \"full\"\n"); }), "");
  EXPECT_EQ(error_of([] { loaded("[train]\ndevice = \"cuda\"\n"); }), "");
}

// device_resolve is pure: the visible GPU count is its argument, so every case runs here.
TEST(Config, AutoDeviceTakesTheGpuWhereItsKernelsRunTheModel) {
  std::string why;
  const Config plain = loaded("");
  EXPECT_EQ(device_resolve(plain, 1, &why), DeviceKind::cuda);
  EXPECT_EQ(why, "");
  EXPECT_EQ(device_resolve(plain, 0, &why), DeviceKind::cpu);
  EXPECT_EQ(why, "");  // no GPU: nothing to explain
  // Every layout runs on the GPU.
  EXPECT_EQ(device_resolve(loaded("[train]\nmicro_batch = 8\n[parallel]\ndp = 2\nzero = 3\n"), 1, &why),
            DeviceKind::cuda);
  EXPECT_EQ(device_resolve(loaded("[parallel]\ntp = 2\nsp = true\n"), 1, &why), DeviceKind::cuda);
  EXPECT_EQ(device_resolve(loaded("[train]\nrecompute = \"full\"\n"), 2, &why), DeviceKind::cuda);
  EXPECT_EQ(device_resolve(loaded("[train]\ndtype = \"f32\"\n"), 1, &why), DeviceKind::cpu);
  EXPECT_NE(why.find("f32"), std::string::npos);
  why.clear();
  // A head dim the CUDA attention kernels do not take stays on the CPU rather than crash there.
  EXPECT_EQ(device_resolve(loaded("[model]\nd_model = 96\nn_head = 2\n"), 1, &why), DeviceKind::cpu);
  EXPECT_NE(why.find("head dims 32, 64 and 128"), std::string::npos);
  EXPECT_EQ(device_resolve(loaded("[train]\ndevice = \"cpu\"\n"), 1, &why), DeviceKind::cpu);
  // bf16 runs on either device: the CPU stores bf16 and computes in fp32.
  EXPECT_EQ(device_resolve(loaded("[train]\ndtype = \"bf16\"\n"), 1, &why), DeviceKind::cuda);
  EXPECT_EQ(device_resolve(loaded("[train]\ndtype = \"bf16\"\n"), 0, &why), DeviceKind::cpu);
  EXPECT_EQ(dtype_resolve(loaded("[train]\ndtype = \"bf16\"\n"), DeviceKind::cpu), DType::bf16);
  EXPECT_EQ(dtype_resolve(plain, DeviceKind::cpu), DType::f32);
  EXPECT_EQ(dtype_resolve(plain, DeviceKind::cuda), DType::bf16);
}

// comm_choose is pure: the device, the launch, the ranks on the node and its GPUs are arguments.
TEST(Config, CommChoiceFollowsTheDeviceAndTheRanksPerGpu) {
  auto plan = [](CommChoice c, DeviceKind d, bool launched, int local, int gpus) {
    return comm_choose(c, d, launched, local, gpus);
  };
  // One rank per GPU: NCCL, by default and when named.
  EXPECT_TRUE(plan(CommChoice::automatic, DeviceKind::cuda, true, 8, 8).nccl);
  EXPECT_TRUE(plan(CommChoice::nccl, DeviceKind::cuda, true, 4, 8).nccl);
  EXPECT_EQ(plan(CommChoice::automatic, DeviceKind::cuda, true, 8, 8).note, "");
  // Ranks sharing GPUs: auto stages through MPI and says so; nccl is refused, naming the fix.
  const CommPlan shared = plan(CommChoice::automatic, DeviceKind::cuda, true, 2, 1);
  EXPECT_FALSE(shared.nccl);
  EXPECT_NE(shared.note.find("2 ranks share 1 GPU on this node"), std::string::npos) << shared.note;
  EXPECT_NE(error_of([] {
              comm_choose(CommChoice::nccl, DeviceKind::cuda, true, 2, 1);
            }).find("NCCL takes one rank per GPU; use parallel.comm = \"mpi\""),
            std::string::npos);
  EXPECT_FALSE(plan(CommChoice::mpi, DeviceKind::cuda, true, 8, 8).nccl);
  // The CPU and the emulated device never take NCCL; nccl-emulated keeps its rules over MPI.
  EXPECT_FALSE(plan(CommChoice::automatic, DeviceKind::cpu, true, 2, 0).nccl);
  EXPECT_FALSE(plan(CommChoice::automatic, DeviceKind::cuda_emulated, true, 2, 0).nccl);
  const CommPlan emu = plan(CommChoice::nccl_emulated, DeviceKind::cpu, true, 2, 0);
  EXPECT_TRUE(emu.nccl_emulated && !emu.nccl && emu.note.empty());
  EXPECT_NE(plan(CommChoice::nccl_emulated, DeviceKind::cpu, false, 1, 0).note.find("on one process"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              comm_choose(CommChoice::nccl_emulated, DeviceKind::cuda, true, 2, 2);
            }).find("carries host buffers"),
            std::string::npos);
  EXPECT_NE(error_of([] { comm_choose(CommChoice::nccl, DeviceKind::cuda_emulated, true, 2, 0); }).find("needs GPUs"),
            std::string::npos);
  // One process on a GPU: no groups to make.
  EXPECT_FALSE(plan(CommChoice::automatic, DeviceKind::cuda, false, 1, 1).nccl);
}

// A key of a few choices is read once into its enum: the names a config writes, refused
// otherwise with the list (and the nearest name), and written back by name.
TEST(Config, ChoiceKeysParseOnceIntoEnums) {
  const Config c = loaded(
      "[model]\narch = \"llama\"\n[train]\nrecompute = \"selective\"\ndevice = \"cuda-emulated\"\nschedule = "
      "\"wsd\"\nmicro_batch = 2\n[parallel]\npp = 2\npp_schedule = \"dualpipev\"\ncomm = \"nccl-emulated\"\n");
  EXPECT_EQ(c.model.arch, Arch::llama);
  EXPECT_EQ(c.train.recompute, Recompute::selective);
  EXPECT_EQ(c.train.device, DeviceChoice::cuda_emulated);
  EXPECT_EQ(c.train.schedule, LrSchedule::wsd);
  EXPECT_EQ(c.parallel.pp_schedule, PpSchedule::dualpipev);
  EXPECT_EQ(c.parallel.comm, CommChoice::nccl_emulated);
  const std::string toml = config_to_toml(c);
  for (const char* line : {"arch = \"llama\"", "recompute = \"selective\"", "device = \"cuda-emulated\"",
                           "pp_schedule = \"dualpipev\"", "comm = \"nccl-emulated\""})
    EXPECT_NE(toml.find(line), std::string::npos) << line;
  Config back = config_defaults();
  config_load_string(back, toml, "printed");
  EXPECT_EQ(config_to_toml(back), toml);
  EXPECT_EQ(error_of([] { loaded("[model]\narch = \"lama\"\n"); }),
            "test.toml: model.arch = 'lama' is not one of gpt2|llama; did you mean 'llama'?");
  Config s = config_defaults();
  EXPECT_EQ(error_of([&] { config_set(s, "train.recompute=fulll"); }),
            "--set: train.recompute = 'fulll' is not one of none|selective|full; did you mean 'full'?");
  EXPECT_EQ(error_of([&] { config_set(s, "parallel.pp_schedule=1F1B"); }).substr(0, 55),
            "--set: parallel.pp_schedule = '1F1B' is not one of gpip");
  EXPECT_EQ(error_of([] { loaded("[train]\ndevice = 1\n"); }).find("train.device must be one of its names"), 11);
  EXPECT_EQ(fmt::format("{} {}", PpSchedule::f1b1, DeviceChoice::cuda_emulated), "1f1b cuda-emulated");
}

// One rule for every float key, found by what it accepts (a number, not a word): nan and
// +-inf are refused from --set and from TOML alike.
TEST(Config, EveryFloatKeyRefusesWhatIsNotFinite) {
  int floats = 0;
  for (const std::string& key : config_keys()) {
    Config c = config_defaults();
    const bool number = error_of([&] { config_set(c, key + "=0.5"); }).empty();
    const bool word = error_of([&] { config_set(c, key + "=x"); }).empty();
    if (!number || word) continue;
    ++floats;
    const size_t dot = key.rfind('.');
    for (const char* bad : {"nan", "inf", "-inf"}) {
      EXPECT_NE(error_of([&] { config_set(c, key + "=" + bad); }).find("is not a finite number"), std::string::npos)
          << key << " = " << bad;
      Config t = config_defaults();
      const std::string toml = "[" + key.substr(0, dot) + "]\n" + key.substr(dot + 1) + " = " + bad + "\n";
      EXPECT_NE(error_of([&] { config_load_string(t, toml, "test"); }).find("is not a finite number"),
                std::string::npos)
          << toml;
    }
  }
  EXPECT_GE(floats, 15);  // lr, min_lr, eps, weight_decay, rope_theta, capacity_factor, timeout_s, ...
  // Ranges of keys that had none, and keys whose value could never work.
  EXPECT_NE(error_of([] { loaded("[train]\nweight_decay = -0.1\n"); }).find("must be >= 0"), std::string::npos);
  EXPECT_NE(error_of([] { loaded("[train]\neps = 0.0\n"); }).find("must be positive"), std::string::npos);
  EXPECT_NE(error_of([] { loaded("[model]\narch = \"llama\"\nrope_theta = 0.5\n"); }).find("must be above 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { loaded("[train]\nthreads = 100000\n"); }).find("more threads than any node"),
            std::string::npos);
  Config big = config_defaults();
  EXPECT_NE(error_of([&] { config_set(big, "model.n_layer=5000000000"); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([] {
              loaded("[parallel]\ndp = 2\ntimeout_s = 0.0\n[fault]\nhang = \"1:2\"\n");
            }).find("the hang would never be detected"),
            std::string::npos);
}

TEST(Config, EveryKeyRoundTripsThroughToml) {
  Config a = loaded("[model]\narch = \"llama\"\nn_kv_head = 2\n[train]\nlr = 0.25\n");
  Config b = config_defaults();
  config_load_string(b, config_to_toml(a), "roundtrip");
  config_validate(b);
  EXPECT_EQ(config_to_toml(a), config_to_toml(b));
  EXPECT_EQ(config_keys().size(), 92u);  // parallel.invariant the 92nd
}

// The example configs' opening comments state their shapes ("22 layers", "d_model 2048",
// "GQA 32/4", "1.1B model", "124M parameters"): every stated number must match the values.
TEST(Config, ExampleConfigCommentsMatchTheirValues) {
  namespace fs = std::filesystem;
  int checked = 0;
  for (auto& entry : fs::directory_iterator(std::string(LOOM_SOURCE_DIR) + "/examples/configs")) {
    if (entry.path().extension() != ".toml") continue;
    std::ifstream in(entry.path());
    std::string comment, line;
    while (std::getline(in, line) && line.rfind("#", 0) == 0) comment += line + " ";
    Config c = config_defaults();
    config_load_file(c, entry.path().string());
    config_validate(c);
    const std::string name = entry.path().filename().string();
    std::smatch m;
    auto number = [&](const char* re, auto&& check) {
      if (std::regex_search(comment, m, std::regex(re))) check(), ++checked;
    };
    number(R"((\d+) layers)", [&] { EXPECT_EQ(std::stoi(m[1]), c.model.n_layer) << name; });
    number(R"(d_model (\d+))", [&] { EXPECT_EQ(std::stoi(m[1]), c.model.d_model) << name; });
    number(R"(GQA (\d+)/(\d+))", [&] {
      EXPECT_EQ(std::stoi(m[1]), c.model.n_head) << name;
      EXPECT_EQ(std::stoi(m[2]), c.kv_heads()) << name;
    });
    number(R"(head dim (\d+))", [&] { EXPECT_EQ(std::stoi(m[1]), c.head_dim()) << name; });
    number(R"(SwiGLU (\d+))", [&] { EXPECT_EQ(std::stoi(m[1]), c.model.d_ff) << name; });
    number(R"(([\d.]+)B model)", [&] { EXPECT_NEAR(param_count(model_dims(c)) / 1e9, std::stod(m[1]), 0.05) << name; });
    number(R"((\d+)M parameters)",
           [&] { EXPECT_NEAR(param_count(model_dims(c)) / 1e6, std::stod(m[1]), 1.0) << name; });
    number(R"(B=(\d+), T=(\d+))", [&] {
      EXPECT_EQ(std::stoi(m[1]), c.train.micro_batch) << name;
      EXPECT_EQ(std::stoi(m[2]), c.model.seq_len) << name;
    });
  }
  EXPECT_GE(checked, 8);
}

namespace loom {
namespace {

// The costliest stage of a split, as "auto" scores it: a stage the sum of its model chunks
// (pipe_stage_of), a chunk its blocks' FLOPs and the last chunk the head's too.
double stage_worst(const Config& c, const std::vector<int>& split) {
  const std::vector<double> f = pipeline_block_flops(c);
  const int p = c.parallel.pp, G = int(split.size());
  std::vector<double> st(size_t(p), 0);
  for (int g = 0, b = 0; g < G; b += split[size_t(g)], ++g) {
    double own = g + 1 == G ? pipeline_head_flops(c) : 0;
    for (int l = b; l < b + split[size_t(g)]; ++l) own += f[size_t(l)];
    st[size_t(pipe_stage_of(g, p, c.pp_v_shape()))] += own;
  }
  return *std::max_element(st.begin(), st.end());
}

// Every split of L blocks into G chunks of at least one block (brute force).
void splits(int L, int G, std::vector<int>& at, std::vector<std::vector<int>>& out) {
  if (G == 1) {
    at.push_back(L);
    out.push_back(at);
    at.pop_back();
    return;
  }
  for (int n = 1; n <= L - (G - 1); ++n) {
    at.push_back(n);
    splits(L - n, G - 1, at, out);
    at.pop_back();
  }
}

}  // namespace

// parallel.pp_layers = "auto": the split whose costliest chunk (stage, with several chunks a
// stage) costs least (against every split, brute force), the head's FLOPs on the last chunk, MoE blocks' experts on
// theirs; the even split where the head is light; fewer blocks on the head's chunk where it is heavy; interleaved and V
// chunks too; and a count of chunks the blocks cannot cover refused.
TEST(Config, PipelineLayersAutoBalancesTheHead) {
  auto with = [](const std::string& toml) { return loaded("[parallel]\npp_layers = \"auto\"\n" + toml); };
  for (int vocab : {512, 8192, 50257})
    for (int pp : {2, 3, 4}) {
      const Config c = with(fmt::format("pp = {}\n[model]\nn_layer = 9\nd_model = 128\nvocab_size = {}\n", pp, vocab));
      const std::vector<int> got = pipeline_layers(c);
      std::vector<int> at;
      std::vector<std::vector<int>> all;
      splits(9, pp, at, all);
      double least = 1e300;
      for (auto& s : all) least = std::min(least, stage_worst(c, s));
      EXPECT_NEAR(stage_worst(c, got), least, 1e-9 * least) << "vocab " << vocab << " pp " << pp;
    }
  EXPECT_EQ(pipeline_layers(with("pp = 4\n[model]\nn_layer = 8\nd_model = 512\nvocab_size = 512\n")),
            (std::vector<int>{2, 2, 2, 2}));
  const std::vector<int> heavy =
      pipeline_layers(with("pp = 2\n[model]\nn_layer = 8\nd_model = 256\nvocab_size = 16384\n"));
  EXPECT_EQ(heavy, (std::vector<int>{6, 2}));
  // MoE blocks (every second one, 8 experts of top 2) cost more than dense ones: a split that
  // counts blocks alone is not the least.
  const Config moe = with(
      "pp = 2\n[model]\narch = \"llama\"\nn_layer = 6\nd_model = 128\nvocab_size = 512\n"
      "[model.moe]\nnum_experts = 8\nevery = 3\n");
  EXPECT_LE(stage_worst(moe, pipeline_layers(moe)), stage_worst(moe, {3, 3}));
  EXPECT_GT(pipeline_block_flops(moe)[2], 1.5 * pipeline_block_flops(moe)[0]);
  // Interleaved and V: a stage costs the sum of its chunks (a V's stage 0 holds the head's
  // chunk too): the split's costliest stage against every split (brute force).
  for (const char* sched : {"zbv", "interleaved"})
    for (int vocab : {512, 4096, 16384})
      for (int pp : {2, 3}) {
        const Config c =
            with(fmt::format("pp = {}\npp_schedule = \"{}\"\npp_virtual = 2\n[model]\nn_layer = 10\n"
                             "d_model = 256\nvocab_size = {}\n[train]\nglobal_batch = 48\nmicro_batch = 8\n",
                             pp, sched, vocab));
        std::vector<int> at;
        std::vector<std::vector<int>> all;
        splits(10, 2 * pp, at, all);
        double least = 1e300;
        for (auto& x : all) least = std::min(least, stage_worst(c, x));
        EXPECT_NEAR(stage_worst(c, pipeline_layers(c)), least, 1e-9 * least)
            << sched << " vocab " << vocab << " pp " << pp;
      }
  // Interleaved and V: a count per model chunk.
  EXPECT_EQ(pipeline_layers(with("pp = 2\npp_schedule = \"zbv\"\n[model]\nn_layer = 8\n")).size(), 4u);
  EXPECT_EQ(pipeline_layers(with("pp = 2\npp_schedule = \"interleaved\"\npp_virtual = 2\n[model]\nn_layer = 8\n"
                                 "[train]\nglobal_batch = 16\nmicro_batch = 8\n"))
                .size(),
            4u);
  EXPECT_NE(error_of([&] { with("pp = 4\n[model]\nn_layer = 3\n"); }).find("every chunk needs a block"),
            std::string::npos);
}

}  // namespace loom

// A string holding control characters is written as TOML escapes, one line, and reads back the
// same (a raw newline made --print-config and log.dir/config.toml unloadable); path keys refuse
// them, naming the key.
TEST(Config, ControlCharactersRoundTripAndPathsRefuseThem) {
  Config c = config_defaults();
  c.log.dir = std::string("a\nb\t\"c\\") + char(0x1b) + char(0x7f);
  Config back = config_defaults();
  config_load_string(back, config_to_toml(c), "printed");
  EXPECT_EQ(back.log.dir, c.log.dir);
  EXPECT_EQ(config_flat(config_to_toml(c)).count("log.dir"), 1u);
  EXPECT_NE(error_of([&] { config_validate(c); }).find("log.dir holds a control character (U+000A at byte 1)"),
            std::string::npos);
}

// parallel.invariant refuses the layouts its tree does not cover, each naming what to change,
// and takes the ones it does.
TEST(Config, InvariantRefusesWhatItCannotCover) {
  const std::string on = "[parallel]\ninvariant = true\n";
  EXPECT_NE(error_of([&] { loaded(on + "dp = 3\n[train]\nglobal_batch = 24\n"); }).find("dp must be a power of two"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              loaded(on + "dp = 2\n[train]\nglobal_batch = 48\nmicro_batch = 8\n");
            }).find("must be a power of two to form a subtree"),
            std::string::npos);  // 3 micro-batches a rank
  EXPECT_EQ(error_of([&] { loaded(on + "dp = 2\nzero = 2\n[train]\nglobal_batch = 48\nmicro_batch = 8\n"); }), "");
  EXPECT_NE(error_of([&] { loaded(on + "grad_reduce_dtype = \"bf16\"\n"); }).find("set it to \"f32\""),
            std::string::npos);
  EXPECT_EQ(error_of([&] { loaded(on + "cp = 2\ndp = 2\nzero = 1\n"); }), "");
  EXPECT_EQ(error_of([&] { loaded(on + "cp = 2\ndp = 2\nzero = 2\n"); }), "");  // the cp parts after the tree
  EXPECT_NE(error_of([&] { loaded(on + "cp = 3\n[model]\nseq_len = 96\n"); }).find("cp must be a power of two"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { loaded(on + "pp = 2\n[model]\nn_layer = 2\narch = \"gpt2\"\n"); }), "");  // tied
  EXPECT_EQ(error_of([&] { loaded(on + "dp = 4\nzero = 3\n[train]\nglobal_batch = 32\n"); }), "");
}
