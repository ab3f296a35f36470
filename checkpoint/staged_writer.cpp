#include "checkpoint/staged_writer.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "checkpoint/h5.h"
#include "runtime/error.h"

namespace loom {

namespace {
// Rows [r0, r0 + n) of a shard, row-major, into dst.
void shard_rows(const StagedShard& s, int64_t r0, int64_t n, float* dst) {
  Piece p = s.piece;
  p.lr += r0, p.gr += r0, p.rows = n;
  piece_gather(*s.spec, p, s.src, s.f0, dst);
}
// A run of rows of shard i, staged in a block.
struct Staged {
  size_t shard;
  int64_t r0, n;
  int block;
};
}  // namespace

void Stager::reserve(const std::vector<StagedShard>& shards, bool live) {
  int64_t largest = 0, longest_row = 1, total = 0;
  for (const StagedShard& s : shards) {
    largest = std::max(largest, s.piece.numel());
    longest_row = std::max(longest_row, s.piece.cols);
    total += s.piece.numel();
  }
  const int64_t block = std::max(min_block_, longest_row);
  const int64_t capacity = std::min(total, std::max(kLargestShards * largest, 2 * block));
  const size_t n = live ? size_t(std::max<int64_t>(2, (capacity + block - 1) / block)) : 1;
  if (block <= block_ && n <= blocks_.size()) return;
  block_ = block;
  blocks_.clear();
  for (size_t i = 0; i < n; ++i) blocks_.emplace_back(new float[size_t(block_)]);
}

void Stager::write(const std::string& path, std::vector<StagedShard>& shards, bool live,
                   const std::function<void()>& reads_done, const std::function<void(size_t)>& at) {
  auto rows_per_block = [&](const StagedShard& s) {
    return std::max<int64_t>(1, block_ / std::max<int64_t>(1, s.piece.cols));
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Staged> full;
  std::vector<int> free;
  for (int b = 0; b < int(blocks_.size()); ++b) free.push_back(b);
  bool stop = false;          // the writer is done with the reader (under mu)
  std::exception_ptr failed;  // what ended the reader early (under mu)
  std::thread reader;
  auto finish_reader = [&] {
    {
      std::lock_guard lk(mu);
      stop = true;
    }
    cv.notify_all();
    if (reader.joinable()) reader.join();
  };
  try {
    LOOM_ASSERT(blocks_.size() >= (live ? 2u : 1u));
    if (live) {
      // The reader: every shard's rows in order, as fast as blocks come free.
      reader = std::thread([&] {
        try {
          for (size_t i = 0; i < shards.size(); ++i)
            for (int64_t r0 = 0, per = rows_per_block(shards[i]); r0 < shards[i].piece.rows; r0 += per) {
              int b;
              {
                std::unique_lock lk(mu);
                cv.wait(lk, [&] { return stop || !free.empty(); });
                if (stop) {
                  lk.unlock();
                  reads_done();
                  return;
                }
                b = free.back();
                free.pop_back();
              }
              const int64_t n = std::min(per, shards[i].piece.rows - r0);
              shard_rows(shards[i], r0, n, blocks_[size_t(b)].get());
              {
                std::lock_guard lk(mu);
                full.push_back({i, r0, n, b});
              }
              cv.notify_all();
            }
        } catch (...) {
          std::lock_guard lk(mu);
          failed = std::current_exception();
        }
        cv.notify_all();
        reads_done();  // the state may change now; the writer goes on from the blocks
      });
    } else {
      reads_done();
    }
  } catch (...) {
    reads_done();  // nothing will read: the state may change
    throw;
  }
  try {
    H5Writer out(path);
    for (size_t i = 0; i < shards.size(); ++i) {
      if (at) at(i);
      StagedShard& s = shards[i];
      out.open(s.shard.dataset, s.shard.shape);
      Xxh64 hash;
      s.nonfinite = 0;
      for (int64_t r0 = 0, per = rows_per_block(s); r0 < s.piece.rows; r0 += per) {
        Staged st{i, r0, std::min(per, s.piece.rows - r0), 0};
        if (live) {
          std::unique_lock lk(mu);
          cv.wait(lk, [&] { return !full.empty() || failed; });
          if (full.empty()) std::rethrow_exception(failed);
          st = full.front();
          full.pop_front();
          LOOM_ASSERT(st.shard == i && st.r0 == r0);
        } else {
          shard_rows(s, r0, st.n, blocks_[0].get());
        }
        const float* rows = blocks_[size_t(st.block)].get();
        hash.add(rows, st.n * s.piece.cols);
        for (int64_t k = 0; k < st.n * s.piece.cols; ++k) s.nonfinite += !std::isfinite(rows[k]);
        out.rows(r0, st.n, rows);
        if (live) {
          {
            std::lock_guard lk(mu);
            free.push_back(st.block);
          }
          cv.notify_all();
        }
      }
      out.shut();
      s.shard.xxh64 = hash.hex();
    }
    finish_reader();  // done reading by now; joins it
    out.close();      // flushed and fsynced
  } catch (...) {
    finish_reader();
    throw;
  }
}

}  // namespace loom
