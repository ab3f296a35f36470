// The flash backward's stored dS (kernels/flash_ds.h) weighed against the device's memory
// (plan/memory.h's attention_ds_fit), on the emulated device sized by LOOM_EMULATED_DEVICE_MB: a
// device with room for it keeps it; one with room for the run but not for the store trains
// without it, with the recomputing path's loss bits, and says so once; `loom plan memory` shows
// the store or says why there is none.
#include <cstdlib>
#include <fstream>

#include "cli_run.h"
#include "model/backend.h"
#include "plan/memory.h"
#include "train/trainer.h"

namespace loom {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// Head dim 64 (the stored dS's), two layers, three steps.
Config small() {
  Config c = config_defaults();
  c.model.n_layer = 2, c.model.d_model = 128, c.model.n_head = 2, c.model.vocab_size = 128, c.model.seq_len = 128;
  c.train.micro_batch = 2, c.train.global_batch = 2, c.train.steps = 3, c.train.threads = 1;
  c.train.device = DeviceChoice::cuda_emulated;
  c.data.val_batches = 0;
  c.log.dir.clear(), c.log.cluster = "none";
  config_validate(c);
  return c;
}

// LOOM_EMULATED_DEVICE_MB for one scope (0: unset, the host's memory).
class EmulatedDevice {
 public:
  explicit EmulatedDevice(double mib) {
    if (mib > 0) setenv("LOOM_EMULATED_DEVICE_MB", fmt::format("{:.3f}", mib).c_str(), 1);
  }
  ~EmulatedDevice() { unsetenv("LOOM_EMULATED_DEVICE_MB"); }
  EmulatedDevice(const EmulatedDevice&) = delete;
  EmulatedDevice& operator=(const EmulatedDevice&) = delete;
};

TrainResult run_on(const Config& c, double mib) {
  EmulatedDevice device(mib);
  TrainOptions o;
  o.quiet = true;
  return train_run(c, o);
}

int64_t planned(const Config& c) {
  return plan_memory(c, DeviceKind::cuda_emulated, DType::bf16).total();
}

TEST(AttentionDs, LeftOutWhereTheDeviceHasNoRoomSameLossBits) {
  const Config c = small();
  Config recomputing = c;
  recomputing.train.attention_ds = false;
  const int64_t store = Allocator::alloc_bytes(attention_ds_elems(model_dims(c)), DType::bf16);
  ASSERT_GT(store, 0);
  const int64_t with = planned(c), without = planned(recomputing);
  ASSERT_EQ(with - without, store - Allocator::alloc_bytes(0, DType::bf16));  // an empty one: 64 bytes
  const TrainResult want = run_on(recomputing, 0);
  // The host's memory: the store is planned, allocated, and gives the recomputing path's bits.
  const TrainResult roomy = run_on(c, 0);
  EXPECT_EQ(roomy.mem.peak_total, with);
  EXPECT_EQ(roomy.losses, want.losses);
  // Room for the run and its margin (64 MiB at this size) with the store: kept.
  const TrainResult fits = run_on(c, (with + (64 << 20)) / kMiB + 1);
  EXPECT_EQ(fits.mem.peak_total, with);
  // Room for the run and half the store: left out, the run trains all its steps (the emulated
  // device refuses an allocation past its size, so a store allocated anyway fails the run).
  const TrainResult tight = run_on(c, double(without + store / 2) / kMiB);
  EXPECT_EQ(tight.mem.peak_total, without);
  ASSERT_EQ(tight.losses.size(), size_t(c.train.steps));
  EXPECT_EQ(tight.losses, want.losses);
  EXPECT_EQ(tight.grad_norms, want.grad_norms);
  // The fit itself: unknown memory keeps the store; so does memory past the plan and margin.
  EXPECT_TRUE(attention_ds_fit(c, DeviceKind::cuda_emulated, DType::bf16, 0, nullptr, {}).fits);
  EXPECT_TRUE(
      attention_ds_fit(c, DeviceKind::cuda_emulated, DType::bf16, 0, nullptr, {with + (64 << 20), "test"}).fits);
  const AttentionDsFit no = attention_ds_fit(c, DeviceKind::cuda_emulated, DType::bf16, 0, nullptr, {with, "test"});
  EXPECT_FALSE(no.fits);
  EXPECT_EQ(no.bytes, store);
  EXPECT_FALSE(attention_ds_fit(c, DeviceKind::cpu, DType::f32, 0, nullptr, {0, "test"}).bytes);  // no store on a CPU
}

// The run says once why it left the store out, and the attention backward which dQ it runs.
TEST(AttentionDs, SaysOnceWhenLeftOut) {
  Config off = small();
  off.train.attention_ds = false;
  const std::string args = tiny() +
                           "--set model.n_layer=2 --set model.d_model=128 --set model.n_head=2 --set "
                           "model.vocab_size=128 --set model.seq_len=128 --set train.steps=2 "
                           "--set train.device=cuda-emulated";
  const CliRun tight =
      loom_run(args, fmt::format("LOOM_EMULATED_DEVICE_MB={:.3f}", double(planned(off) + (1 << 20)) / kMiB));
  ASSERT_EQ(tight.status, 0) << tight.output;
  const std::string said = "the flash backward's stored dS";
  const size_t at = tight.output.find(said);
  ASSERT_NE(at, std::string::npos) << tight.output;
  EXPECT_EQ(tight.output.find(said, at + 1), std::string::npos) << "said twice:\n" << tight.output;
  EXPECT_NE(tight.output.find("is left out"), std::string::npos) << tight.output;
  EXPECT_NE(tight.output.find("dQ recomputes S and dP (the stored dS left out"), std::string::npos) << tight.output;
  const CliRun roomy = loom_run(args);
  ASSERT_EQ(roomy.status, 0) << roomy.output;
  EXPECT_EQ(roomy.output.find(said), std::string::npos) << roomy.output;
  EXPECT_NE(roomy.output.find("dQ from the stored dS"), std::string::npos) << roomy.output;
}

// `loom plan memory` names the store where it is planned, and, against a cluster file whose
// memory_gb has no room for it, leaves it out and says so.
TEST(AttentionDs, PlanMemoryShowsTheStoreOrWhyNone) {
  const std::string gpt2 = std::string(" --config ") + LOOM_SOURCE_DIR + "/examples/configs/gpt2_124m_gpu.toml";
  const std::string h200 = std::string(" --cluster ") + LOOM_SOURCE_DIR + "/examples/clusters/h200.toml";
  const CliRun kept = loom_run("plan memory" + gpt2 + h200);
  ASSERT_EQ(kept.status, 0) << kept.output;
  EXPECT_NE(kept.output.find("attention_ds: the flash backward's stored dS, 0.2"), std::string::npos) << kept.output;
  const std::string small_gpu = tmp("small_gpu.toml");
  {
    std::ofstream f(small_gpu);
    f << "name = \"small\"\nnodes = 1\ndevices_per_node = 1\ndevice = \"cuda\"\npeak_tflops = 100\n"
         "gemm_efficiency = 0.5\nmem_bw_gbs = 1000\nmemory_gb = 9.3\n[intra]\nalpha_us = 1\nbw_gbs = 100\n";
  }
  const CliRun out = loom_run("plan memory" + gpt2 + " --cluster " + small_gpu);
  ASSERT_EQ(out.status, 0) << out.output;
  EXPECT_NE(out.output.find("attention_ds: none, dQ recomputes S and dP (no room for it on the device)"),
            std::string::npos)
      << out.output;
  EXPECT_NE(out.output.find("is left out"), std::string::npos) << out.output;
  const CliRun cpu = loom_run("plan memory" + gpt2 + " --set train.device=cpu");
  ASSERT_EQ(cpu.status, 0) << cpu.output;
  EXPECT_EQ(cpu.output.find("attention_ds"), std::string::npos) << cpu.output;
}

}  // namespace
}  // namespace loom
