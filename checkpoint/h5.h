// The little of HDF5 that checkpoints use, through the C library: float32 datasets with no
// filters and no chunking (so h5py, h5dump or any HDF5 reader sees plain arrays), created with
// their groups, written whole and read whole. Every failure is an Error that names the file,
// the dataset and the library's innermost reason (e.g. "No space left on device").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

class H5Writer {
 public:
  explicit H5Writer(const std::string& path);  // creates (truncates) the file
  ~H5Writer();                                 // closes without the checks of close()
  H5Writer(const H5Writer&) = delete;
  H5Writer& operator=(const H5Writer&) = delete;
  // A dataset at `name` ("a/b/c": groups made as needed) of `shape` holding `data`.
  void write(const std::string& name, const std::vector<int64_t>& shape, const float* data);
  // The same a run of rows at a time (a 1-D dataset is one row): open() creates it, rows()
  // writes rows [row0, row0 + n) of it, row-major, shut() closes it.
  void open(const std::string& name, const std::vector<int64_t>& shape);
  void rows(int64_t row0, int64_t n, const float* data);
  void shut();
  // Flushes, closes and fsyncs the file: when it returns, the bytes are on disk.
  void close();

 private:
  std::string path_;
  int64_t file_ = -1;
  int64_t set_ = -1;  // the dataset open() made
  std::string set_name_;
  std::vector<int64_t> set_shape_;
};

class H5Reader {
 public:
  explicit H5Reader(const std::string& path);
  ~H5Reader();
  H5Reader(const H5Reader&) = delete;
  H5Reader& operator=(const H5Reader&) = delete;
  // The whole dataset, which must have `shape`.
  std::vector<float> read(const std::string& name, const std::vector<int64_t>& shape) const;
  // Where the dataset's bytes start in the file (contiguous storage), for fault drills.
  int64_t offset(const std::string& name) const;

 private:
  std::string path_;
  int64_t file_ = -1;
};

// "HDF5 1.10.8 (thread-safe), xxHash 0.8.1": the libraries checkpoints run on.
std::string checkpoint_libraries();
// xxh64 (seed 0) of n floats' bytes, as 16 hex digits.
std::string xxh64_hex(const float* data, int64_t n);
// The same over floats that come a run at a time.
class Xxh64 {
 public:
  Xxh64();
  ~Xxh64();
  Xxh64(const Xxh64&) = delete;
  Xxh64& operator=(const Xxh64&) = delete;
  void add(const float* data, int64_t n);
  std::string hex() const;

 private:
  void* state_;
};

}  // namespace loom
