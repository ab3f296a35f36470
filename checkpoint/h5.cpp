#include "checkpoint/h5.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>

#include "runtime/error.h"
#include "runtime/file.h"
#include "runtime/tensor.h"

namespace loom {

namespace {

// The innermost reason on this thread's HDF5 error stack, shortened to the OS's message
// where the file driver gives one; the stack is cleared.
std::string h5_reason() {
  std::string reason;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* e, void* out) -> herr_t {
        if (n == 0 && e->desc) *static_cast<std::string*>(out) = e->desc;
        return 0;
      },
      &reason);
  H5Eclear2(H5E_DEFAULT);
  const std::string key = "error message = '";
  if (auto at = reason.find(key); at != std::string::npos) {
    const size_t from = at + key.size(), to = reason.find('\'', from);
    return reason.substr(from, to == std::string::npos ? std::string::npos : to - from);
  }
  return reason.empty() ? "unknown HDF5 error" : reason;
}

// Before any other HDF5 call: errors come back as values, reported by us; and no exit handler.
// HDF5's handler closes the files still open at exit, and one whose flush failed on a full
// disk crashes it (exit 139 instead of the error's 74); such a file is never committed, so
// nothing is lost when the process ends without it. H5dont_atexit fails harmlessly once the
// library is initialized.
void h5_quiet() {
  H5dont_atexit();
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

// Closes an HDF5 object on scope exit.
struct Closer {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Closer() {
    if (id >= 0) close(id);
  }
};

}  // namespace

H5Writer::H5Writer(const std::string& path) : path_(path) {
  h5_quiet();
  output_check(path, "checkpoint.dir's");  // H5Fcreate would write through a link or into a device
  file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  LOOM_CHECK(file_ >= 0, "cannot create checkpoint file '{}': {}", path, h5_reason());
}

H5Writer::~H5Writer() {
  if (set_ >= 0) H5Dclose(set_);
  if (file_ >= 0) H5Fclose(file_);
}

void H5Writer::open(const std::string& name, const std::vector<int64_t>& shape) {
  LOOM_ASSERT(set_ < 0 && (shape.size() == 1 || shape.size() == 2));
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Closer space{H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose};
  Closer lcpl{H5Pcreate(H5P_LINK_CREATE), H5Pclose};
  H5Pset_create_intermediate_group(lcpl.id, 1);
  set_ = space.id >= 0 && lcpl.id >= 0
             ? H5Dcreate2(file_, name.c_str(), H5T_IEEE_F32LE, space.id, lcpl.id, H5P_DEFAULT, H5P_DEFAULT)
             : -1;
  LOOM_CHECK(set_ >= 0, "'{}': cannot create dataset '{}': {}", path_, name, h5_reason());
  set_name_ = name;
  set_shape_ = shape;
}

void H5Writer::rows(int64_t row0, int64_t n, const float* data) {
  LOOM_ASSERT(set_ >= 0 && n > 0);
  const bool two = set_shape_.size() == 2;
  const hsize_t cols = hsize_t(set_shape_.back());
  const hsize_t start[2] = {hsize_t(row0), 0}, count[2] = {hsize_t(n), cols};
  LOOM_ASSERT(two ? row0 + n <= set_shape_[0] : row0 == 0 && n == 1);
  Closer file_space{H5Dget_space(set_), H5Sclose};
  Closer mem{H5Screate_simple(two ? 2 : 1, two ? count : count + 1, nullptr), H5Sclose};
  LOOM_CHECK(file_space.id >= 0 && mem.id >= 0 &&
                 H5Sselect_hyperslab(file_space.id, H5S_SELECT_SET, two ? start : start + 1, nullptr,
                                     two ? count : count + 1, nullptr) >= 0 &&
                 H5Dwrite(set_, H5T_NATIVE_FLOAT, mem.id, file_space.id, H5P_DEFAULT, data) >= 0,
             "'{}': cannot write rows {}..{} of dataset '{}': {}", path_, row0, row0 + n, set_name_, h5_reason());
}

void H5Writer::shut() {
  const hid_t s = set_;
  set_ = -1;
  LOOM_CHECK(H5Dclose(s) >= 0, "'{}': cannot close dataset '{}': {}", path_, set_name_, h5_reason());
}

void H5Writer::write(const std::string& name, const std::vector<int64_t>& shape, const float* data) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Closer space{H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose};
  Closer lcpl{H5Pcreate(H5P_LINK_CREATE), H5Pclose};
  H5Pset_create_intermediate_group(lcpl.id, 1);
  Closer set{space.id >= 0 && lcpl.id >= 0
                 ? H5Dcreate2(file_, name.c_str(), H5T_IEEE_F32LE, space.id, lcpl.id, H5P_DEFAULT, H5P_DEFAULT)
                 : -1,
             H5Dclose};
  LOOM_CHECK(set.id >= 0, "'{}': cannot create dataset '{}': {}", path_, name, h5_reason());
  LOOM_CHECK(H5Dwrite(set.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0,
             "'{}': cannot write dataset '{}': {}", path_, name, h5_reason());
}

void H5Writer::close() {
  const hid_t f = file_;
  file_ = -1;
  if (H5Fflush(f, H5F_SCOPE_GLOBAL) < 0) {
    const std::string why = h5_reason();
    H5Fclose(f);  // may fail too on a full disk; the library keeps the id (see h5_quiet)
    H5Eclear2(H5E_DEFAULT);
    fail("'{}': cannot flush: {}", path_, why);
  }
  LOOM_CHECK(H5Fclose(f) >= 0, "'{}': cannot close: {}", path_, h5_reason());
  const int fd = ::open(path_.c_str(), O_RDONLY);
  LOOM_CHECK(fd >= 0, "'{}': cannot reopen to fsync: {}", path_, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  LOOM_CHECK(rc == 0, "'{}': fsync failed: {}", path_, std::strerror(err));
}

H5Reader::H5Reader(const std::string& path) : path_(path) {
  h5_quiet();
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  LOOM_CHECK(file_ >= 0, "cannot open checkpoint file '{}': {}", path, h5_reason());
}

H5Reader::~H5Reader() {
  if (file_ >= 0) H5Fclose(file_);
}

std::vector<float> H5Reader::read(const std::string& name, const std::vector<int64_t>& shape) const {
  // Every step of the name a link inside this file: an external or soft link would have the
  // library open another file (or a FIFO) in the checkpoint's name.
  for (size_t at = name.find('/', 1);; at = name.find('/', at + 1)) {
    const std::string part = name.substr(0, at);
    H5L_info_t info{};
    LOOM_CHECK(
        H5Lexists(file_, part.c_str(), H5P_DEFAULT) > 0 && H5Lget_info(file_, part.c_str(), &info, H5P_DEFAULT) >= 0,
        "'{}' has no dataset '{}'", path_, name);
    LOOM_CHECK(info.type == H5L_TYPE_HARD,
               "'{}': '{}' is a link ({}), not data stored in this file; loom reads only data stored inside the "
               "checkpoint's own files",
               path_, part,
               info.type == H5L_TYPE_EXTERNAL ? "external"
               : info.type == H5L_TYPE_SOFT   ? "soft"
                                              : "user-defined");
    if (at == std::string::npos) break;
  }
  Closer set{H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose};
  LOOM_CHECK(set.id >= 0, "'{}' has no dataset '{}': {}", path_, name, h5_reason());
  std::string filters;  // a file repacked with compression (h5repack -f GZIP=...) still reads
  {
    Closer dcpl{H5Dget_create_plist(set.id), H5Pclose};
    for (int i = 0; dcpl.id >= 0 && i < H5Pget_nfilters(dcpl.id); ++i) {
      char filter[64] = {0};
      unsigned flags = 0, config = 0;
      size_t nvalues = 0;
      H5Pget_filter2(dcpl.id, unsigned(i), &flags, &nvalues, nullptr, sizeof filter, filter, &config);
      filters += (filters.empty() ? "" : ", ") + std::string(filter[0] ? filter : "unnamed");
    }
    const H5D_layout_t layout = dcpl.id >= 0 ? H5Pget_layout(dcpl.id) : H5D_LAYOUT_ERROR;
    LOOM_CHECK(layout == H5D_CONTIGUOUS || layout == H5D_CHUNKED || layout == H5D_COMPACT,
               "'{}': dataset '{}' is {}; loom reads only data stored inside the checkpoint's own files", path_, name,
               layout == H5D_VIRTUAL ? "a virtual dataset (its data is in other files)" : "of an unknown layout");
    LOOM_CHECK(H5Pget_external_count(dcpl.id) == 0,
               "'{}': dataset '{}' keeps its data in external files; loom reads only data stored inside the "
               "checkpoint's own files",
               path_, name);
  }
  Closer space{H5Dget_space(set.id), H5Sclose};
  const int rank = H5Sget_simple_extent_ndims(space.id);
  std::vector<hsize_t> dims(size_t(std::max(rank, 0)));
  if (rank > 0) H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  const std::vector<int64_t> got(dims.begin(), dims.end());
  LOOM_CHECK(got == shape, "'{}': dataset '{}' has shape {} but the manifest says {}", path_, name, shape_str(got),
             shape_str(shape));
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  // Checked before the buffer is allocated: forged dimensions must not ask for gigabytes the
  // file does not hold.
  // Compressed (its filters), it holds less, but not less than deflate's best ratio allows (1032:1).
  const hsize_t stored = H5Dget_storage_size(set.id);
  LOOM_CHECK(n == 0 || stored * (filters.empty() ? 1 : 1100) >= hsize_t(n) * sizeof(float),
             "'{}': dataset '{}' holds {} bytes{}, not the {} its shape {} needs; the file is corrupt", path_, name,
             uint64_t(stored), filters.empty() ? "" : " compressed (" + filters + ")", n * int64_t(sizeof(float)),
             shape_str(shape));
  std::vector<float> out(static_cast<size_t>(n));
  LOOM_CHECK(n == 0 || H5Dread(set.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0,
             "'{}': cannot read dataset '{}'{}: {}", path_, name,
             filters.empty() ? ""
                             : " (stored through the filters " + filters +
                                   "; loom writes plain datasets: "
                                   "`h5repack -f NONE` undoes them)",
             h5_reason());
  return out;
}

int64_t H5Reader::offset(const std::string& name) const {
  Closer set{H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose};
  LOOM_CHECK(set.id >= 0, "'{}' has no dataset '{}': {}", path_, name, h5_reason());
  const haddr_t at = H5Dget_offset(set.id);
  LOOM_CHECK(at != HADDR_UNDEF, "'{}': dataset '{}' has no contiguous storage", path_, name);
  return int64_t(at);
}

std::string checkpoint_libraries() {
  h5_quiet();
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  hbool_t safe = 0;
  H5is_library_threadsafe(&safe);
  const unsigned x = XXH_versionNumber();
  return fmt::format("HDF5 {}.{}.{}{}, xxHash {}.{}.{}", maj, min, rel, safe ? " (thread-safe)" : "", x / 10000,
                     x / 100 % 100, x % 100);
}

std::string xxh64_hex(const float* data, int64_t n) {
  return fmt::format("{:016x}", uint64_t(XXH64(data, size_t(n) * sizeof(float), 0)));
}

Xxh64::Xxh64() : state_(XXH64_createState()) {
  LOOM_CHECK(state_ && XXH64_reset(static_cast<XXH64_state_t*>(state_), 0) == XXH_OK, "xxHash: cannot make a state");
}
Xxh64::~Xxh64() {
  XXH64_freeState(static_cast<XXH64_state_t*>(state_));
}
void Xxh64::add(const float* data, int64_t n) {
  XXH64_update(static_cast<XXH64_state_t*>(state_), data, size_t(n) * sizeof(float));
}
std::string Xxh64::hex() const {
  return fmt::format("{:016x}", uint64_t(XXH64_digest(static_cast<XXH64_state_t*>(state_))));
}

}  // namespace loom
