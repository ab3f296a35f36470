// The emulated NCCL device of one rank (see nccl_emulated.h): a queue of launches run one at
// a time by one thread over MPI, this rank's page on the board, and a watchdog that reads the
// board while the host waits and ends the job on a deadlock or a timed-out op.
#pragma once
#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/comm/nccl_emu_board.h"
#include "runtime/comm/nccl_emulated.h"

namespace loom {

// One user-visible op: its Work, and its buffers as issued (inputs copied, outputs staged).
struct EmuOp {
  struct Staged {
    void* user;
    std::vector<char> copy;
    bool back;   // copy -> user when the op lands (an output)
    bool check;  // user must still equal copy when it lands (an input read later by NCCL)
  };
  CommOp kind;
  int64_t seq;
  std::shared_ptr<Work::State> state = std::make_shared<Work::State>();
  std::vector<Staged> bufs;
  bool submitted = false;  // handed to the device (an op in an open group is not, yet)
  bool landed = false;
};

// What the device runs at once: one collective, or a group of sends and receives.
struct EmuLaunch {
  struct P2p {
    int peer;  // group rank
    bool send;
    int64_t ordinal;  // the k-th send to (receive from) peer on this communicator
    void* data;
    int64_t count;
    DType dtype;
    int64_t seq;
  };
  struct Desc {  // what a collective's members compare
    int32_t kind, dtype, root, reduce;
    int64_t count, ordinal;
  };
  int comm = 0;  // the communicator's index on this rank's board page
  MPI_Comm mpi = MPI_COMM_NULL;
  std::string group;
  const ProcessGroup* owner = nullptr;  // valid while the device runs or queues the launch
  FlightRecorder* recorder = nullptr;   // the owner's
  CommOp kind = CommOp::barrier;
  int64_t seq = 0, collective = 0;  // collective: its ordinal (0: a group of sends and receives)
  Desc desc{};
  std::function<int(MPI_Request*)> start;  // the collective on the staged buffers
  std::vector<P2p> p2p;
  std::vector<std::shared_ptr<EmuOp>> ops;
  std::shared_ptr<void> keep;  // buffers MPI reads and writes while the launch runs
};

class NcclEmuDevice {
 public:
  NcclEmuDevice(std::unique_ptr<EmuBoard> board, const NcclEmuOptions& options);
  ~NcclEmuDevice();
  int world_rank() const { return opt_.world_rank; }
  // Posts a communicator on the board; returns its index there.
  int add_comm(const std::string& name, int color, int rank, const std::vector<int>& world);
  void submit(std::shared_ptr<EmuLaunch> launch);
  // Drops `owner`'s queued launches and abandons its running one (a group going away).
  void forget(const ProcessGroup* owner);
  // The host blocks on one of this device's ops (on = true) or no longer.
  void host_wait(bool on);
  // How a verdict ends the job.
  [[noreturn]] void end_job() const;

 private:
  void run();
  void watch();
  void execute(EmuLaunch& l);
  void exchange_p2p(EmuLaunch& l);
  void complete(std::vector<MPI_Request>& reqs, const EmuLaunch& l);
  void idle(std::chrono::steady_clock::time_point last_progress, const EmuLaunch& l);
  void publish(const EmuLaunch* head);

  std::unique_ptr<EmuBoard> board_;
  NcclEmuOptions opt_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<EmuLaunch>> queue_;
  std::shared_ptr<EmuLaunch> head_;
  std::chrono::steady_clock::time_point head_since_{};
  const ProcessGroup* abandon_ = nullptr;
  int host_waiting_ = 0;
  bool stop_ = false;
  std::mutex page_mu_;   // this rank's board page has two writers: the executor and the host
  std::mutex watch_mu_;  // held while the watchdog reads the head's owner; forget() takes it
  // Launches given up with MPI requests in flight: kept (never freed) so that MPI never writes
  // into freed memory; only on the way out of a failed job.
  std::vector<std::shared_ptr<EmuLaunch>> abandoned_;
  std::thread worker_, watchdog_;
};

}  // namespace loom
