// Chrome trace (Perfetto-viewable): one complete event per op, on a compute track per rank
// (communication gets its own track when it exists; a profiled run adds the device's timeline). Events are buffered in
// memory and written as JSON at the end of the run. A disabled Trace records nothing and costs one branch. Thread-safe:
// communication threads record on their own track.
#pragma once
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

namespace loom {

class Trace {
 public:
  // gpu: the device's own timeline of each op (the roofline profile, log.profile_steps).
  enum Track { compute = 0, comm = 1, host = 2, gpu = 3 };
  explicit Trace(bool enabled = false, int rank = 0);

  class Scope {
   public:
    Scope(Trace* t, const char* name, Track track);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Trace* t_;
    const char* name_;
    Track track_;
    double start_us_;
  };

  Scope scope(const char* name, Track track = compute) { return Scope(recording() ? this : nullptr, name, track); }
  bool enabled() const { return enabled_; }
  // Whether events are kept now: an enabled trace limited to some steps pauses between them.
  bool recording() const { return enabled_ && recording_.load(std::memory_order_relaxed); }
  void record(bool on) { recording_.store(on, std::memory_order_relaxed); }
  double now_us() const;
  void add(const char* name, Track track, double start_us, double dur_us);
  size_t size() const { return events_.size(); }
  void write(const std::string& path) const;

 private:
  struct Event {
    const char* name;
    Track track;
    double start_us, dur_us;
  };
  bool enabled_;
  std::atomic<bool> recording_{true};
  int rank_;
  std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mu_;  // compute and communication threads both record
  std::vector<Event> events_;
};

// Per-rank trace files (written by Trace::write) as one file, a process per rank, for Perfetto;
// a file missing from `parts` (a rank whose log.dir is not shared) is named in the Error.
void trace_merge(const std::vector<std::string>& parts, const std::string& out);

}  // namespace loom
