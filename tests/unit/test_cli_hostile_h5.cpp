// Checkpoint rank files whose data lives outside them, through the `loom` binary: a dataset with
// external storage (H5Pset_external), an external link in place of a dataset, a virtual
// dataset. ckpt verify, ckpt export and resume must refuse each (they read the file outside the
// checkpoint, and hung on a FIFO), saying why, with status 2; nothing outside is read. And a rank file
// whose hashes hold but whose weights are not finite.
#include <hdf5.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/h5.h"
#include "cli_run.h"
#include "runtime/file.h"
#include "testing.h"

namespace {

namespace fs = std::filesystem;

std::vector<std::string> datasets_of(hid_t file) {
  std::vector<std::string> out;
  H5Ovisit(
      file, H5_INDEX_NAME, H5_ITER_NATIVE,
      [](hid_t, const char* name, const H5O_info_t* info, void* data) -> herr_t {
        if (info->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(data)->push_back(name);
        return 0;
      },
      &out);
  return out;
}

std::vector<float> read_all(hid_t file, const std::string& name, std::vector<hsize_t>& dims) {
  const hid_t set = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  const hid_t space = H5Dget_space(set);
  dims.assign(size_t(H5Sget_simple_extent_ndims(space)), 0);
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  hsize_t n = 1;
  for (hsize_t d : dims) n *= d;
  std::vector<float> v(n);
  H5Dread(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  H5Sclose(space);
  H5Dclose(set);
  return v;
}

enum class Outside { storage, link, virtual_set };

// A copy of checkpoint `good` in `bad` whose rank file keeps one weight's dataset outside it, in
// `outside_dir`, the way `how` says; every value the same (only where it is read from differs).
void forge(const std::string& good, const std::string& bad, const std::string& outside_dir, Outside how) {
  fs::remove_all(bad);
  fs::create_directories(bad);
  fs::create_directories(outside_dir);
  fs::copy_file(good + "/manifest.json", bad + "/manifest.json");
  const hid_t in = H5Fopen((good + "/rank-00000.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(in, 0);
  const hid_t out = H5Fcreate((bad + "/rank-00000.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  const std::vector<std::string> names = datasets_of(in);
  // A weight: what every reader reads (export reads only params/).
  const size_t forged =
      size_t(std::find_if(names.begin(), names.end(), [](const std::string& n) { return n.rfind("params/", 0) == 0; }) -
             names.begin());
  ASSERT_LT(forged, names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    std::vector<hsize_t> dims;
    const std::vector<float> v = read_all(in, names[i], dims);
    const hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t where = out;
    std::string name = names[i];
    if (i == forged && how == Outside::storage) {
      H5Pset_external(dcpl, (outside_dir + "/raw.bin").c_str(), 0, hsize_t(v.size() * 4));
    } else if (i == forged && how == Outside::link) {
      // The dataset itself in another file; the rank file links to it.
      where = H5Fcreate((outside_dir + "/other.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    } else if (i == forged && how == Outside::virtual_set) {
      const hid_t src = H5Fcreate((outside_dir + "/source.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
      const hid_t s = H5Dcreate2(src, "data", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      H5Dwrite(s, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
      H5Dclose(s);
      H5Fclose(src);
      H5Pset_virtual(dcpl, space, (outside_dir + "/source.h5").c_str(), "data", space);
    }
    const hid_t set = H5Dcreate2(where, name.c_str(), H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT);
    ASSERT_GE(set, 0) << name;
    if (!(i == forged && how == Outside::virtual_set))
      H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Dclose(set);
    if (where != out) {
      H5Fclose(where);
      H5Lcreate_external((outside_dir + "/other.h5").c_str(), name.c_str(), out, name.c_str(), lcpl, H5P_DEFAULT);
    }
    H5Pclose(dcpl);
    H5Sclose(space);
  }
  H5Pclose(lcpl);
  H5Fclose(out);
  H5Fclose(in);
}

// A copy of checkpoint `good` in `bad` with one weight infinite, its hash in the manifest
// updated: a state a diverged run would have left, every byte accounted for.
void forge_infinite(const std::string& good, const std::string& bad) {
  fs::remove_all(bad);
  fs::create_directories(bad);
  const hid_t in = H5Fopen((good + "/rank-00000.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(in, 0);
  const hid_t out = H5Fcreate((bad + "/rank-00000.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  nlohmann::json m = nlohmann::json::parse(loom::input_read_all(good + "/manifest.json", "", 1 << 24));
  bool forged = false;
  for (const std::string& name : datasets_of(in)) {
    std::vector<hsize_t> dims;
    std::vector<float> v = read_all(in, name, dims);
    if (!forged && name.rfind("params/", 0) == 0) {
      v[0] = std::numeric_limits<float>::infinity();
      for (auto& [tensor, t] : m["tensors"].items())
        for (auto& shard : t["shards"])
          if (shard["dataset"] == name) shard["xxh64"] = loom::xxh64_hex(v.data(), int64_t(v.size()));
      forged = true;
    }
    const hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
    const hid_t set = H5Dcreate2(out, name.c_str(), H5T_IEEE_F32LE, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Dclose(set);
    H5Sclose(space);
  }
  H5Pclose(lcpl);
  H5Fclose(out);
  H5Fclose(in);
  ASSERT_TRUE(forged);
  const std::string text = m.dump(1);
  loom::file_write_atomic(bad + "/manifest.json", [&](std::FILE* f) { std::fputs(text.c_str(), f); });
}

const char* kModel =
    "--set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 --set model.vocab_size=64 "
    "--set model.seq_len=8 --set train.micro_batch=2 --set train.global_batch=2 --set train.threads=1 "
    "--set data.val_batches=0 --set train.device=cpu ";

void every_reader_refuses(const std::string& ck, const std::string& phrase) {
  const CliRun verify = loom_run("ckpt verify " + ck);
  EXPECT_NE(verify.status, 0) << verify.output;
  EXPECT_NE(verify.output.find(phrase), std::string::npos) << verify.output;
  const CliRun exported = loom_run("ckpt export " + ck + " " + tmp("h5_out.safetensors"));
  EXPECT_EQ(exported.status, 2) << exported.output;
  EXPECT_NE(exported.output.find(phrase), std::string::npos) << exported.output;
  const CliRun resumed =
      loom_run(std::string("train ") + kModel + "--set train.steps=3 --set checkpoint.resume=" + ck +
               " --set checkpoint.dir=" + tmp("h5_resumed") + " --set log.dir=" + tmp("h5_resumed_log"));
  EXPECT_EQ(resumed.status, 2) << resumed.output;
  EXPECT_NE(resumed.output.find(phrase), std::string::npos) << resumed.output;
}

class HostileH5 : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::remove_all(tmp("h5_good"));
    const CliRun r = loom_run(std::string("train ") + kModel + "--set train.steps=2 --set checkpoint.every=2 " +
                              "--set checkpoint.dir=" + tmp("h5_good") + " --set log.dir=" + tmp("h5_good_log"));
    ASSERT_EQ(r.status, 0) << r.output;
    good = tmp("h5_good") + "/step-00000002";
  }
  std::string good;
};

TEST_F(HostileH5, ExternalStorageIsRefused) {
  forge(good, tmp("h5_storage/step-00000002"), tmp("h5_storage_outside"), Outside::storage);
  every_reader_refuses(tmp("h5_storage/step-00000002"), "keeps its data in external files");
}

TEST_F(HostileH5, ExternalLinkIsRefused) {
  forge(good, tmp("h5_link/step-00000002"), tmp("h5_link_outside"), Outside::link);
  every_reader_refuses(tmp("h5_link/step-00000002"), "is a link (external)");
}

TEST_F(HostileH5, VirtualDatasetIsRefused) {
  forge(good, tmp("h5_virtual/step-00000002"), tmp("h5_virtual_outside"), Outside::virtual_set);
  every_reader_refuses(tmp("h5_virtual/step-00000002"), "a virtual dataset");
}

// A checkpoint whose weights are not finite passes its hashes but is no state to go on from:
// verify fails naming it (it said "ok"), export and resume refuse it.
TEST_F(HostileH5, NonFiniteWeightsAreRefused) {
  forge_infinite(good, tmp("h5_inf/step-00000002"));
  every_reader_refuses(tmp("h5_inf/step-00000002"), "NaN or infinite value");
}

}  // namespace
