#include "runtime/comm/nccl_group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "kernels/cuda/check.h"

#define LOOM_NCCL_CHECK(call)                                                                                   \
  do {                                                                                                          \
    ncclResult_t r_ = (call);                                                                                   \
    LOOM_CHECK(r_ == ncclSuccess, "{} failed at {}:{}: {}", #call, __FILE__, __LINE__, ncclGetErrorString(r_)); \
  } while (0)

namespace loom {

int cuda_device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

int cuda_device_select(int local_rank) {
  const int n = cuda_device_count();
  if (n == 0) return -1;
  LOOM_CUDA_CHECK(cudaSetDevice(local_rank % n));
  return local_rank % n;
}

class NcclWorld {
 public:
  ncclComm_t comm = nullptr;
  int rank = 0, size = 1;
  ~NcclWorld() {
    if (comm) ncclCommDestroy(comm);
  }
};

std::shared_ptr<NcclWorld> nccl_world_create(ProcessGroup& mpi_world) {
  auto w = std::make_shared<NcclWorld>();
  w->rank = mpi_world.rank();
  w->size = mpi_world.size();
  ncclUniqueId id;
  static_assert(sizeof(id) % 4 == 0);
  if (w->rank == 0) LOOM_NCCL_CHECK(ncclGetUniqueId(&id));
  mpi_world.broadcast(Buf(reinterpret_cast<int32_t*>(&id), sizeof(id) / 4), 0).wait();
  LOOM_NCCL_CHECK(ncclCommInitRank(&w->comm, w->size, id, w->rank));
  return w;
}

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
  }
  return ncclFloat32;
}

class NcclGroup final : public ProcessGroup {
 public:
  NcclGroup(std::shared_ptr<NcclWorld> world, const std::string& name, ncclComm_t comm, bool owns,
            std::vector<int> ranks)
      : ProcessGroup(name, 0, 1, std::move(ranks)), world_(std::move(world)), comm_(comm), owns_(owns) {
    LOOM_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    LOOM_NCCL_CHECK(ncclCommCount(comm_, &size_));
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~NcclGroup() override {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    if (scratch_) cudaFree(scratch_);
    if (owns_) ncclCommDestroy(comm_);
  }

  Work all_reduce(Buf b, ReduceOp op) override {
    count(CommOp::all_reduce, b.bytes());
    LOOM_NCCL_CHECK(ncclAllReduce(b.data, b.data, size_t(b.count), nccl_type(b.dtype),
                                  op == ReduceOp::sum ? ncclSum : ncclMax, comm_, stream_));
    return done_on_stream();
  }
  Work reduce_scatter(Buf in, Buf out) override {
    count(CommOp::reduce_scatter, in.bytes());
    LOOM_NCCL_CHECK(
        ncclReduceScatter(in.data, out.data, size_t(out.count), nccl_type(in.dtype), ncclSum, comm_, stream_));
    return done_on_stream();
  }
  Work all_gather(Buf in, Buf out) override {
    count(CommOp::all_gather, out.bytes());
    LOOM_NCCL_CHECK(ncclAllGather(in.data, out.data, size_t(in.count), nccl_type(in.dtype), comm_, stream_));
    return done_on_stream();
  }
  Work broadcast(Buf b, int root) override {
    count(CommOp::broadcast, b.bytes());
    LOOM_NCCL_CHECK(ncclBroadcast(b.data, b.data, size_t(b.count), nccl_type(b.dtype), root, comm_, stream_));
    return done_on_stream();
  }
  Work all_to_all_v(Buf in, const std::vector<int64_t>& sc, Buf out, const std::vector<int64_t>& rc) override {
    const size_t es = dtype_size(in.dtype);
    int64_t so = 0, ro = 0, sent = 0;
    LOOM_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; ++r) {
      if (sc[size_t(r)])
        LOOM_NCCL_CHECK(ncclSend(static_cast<char*>(in.data) + so * es, size_t(sc[size_t(r)]), nccl_type(in.dtype), r,
                                 comm_, stream_));
      if (rc[size_t(r)])
        LOOM_NCCL_CHECK(ncclRecv(static_cast<char*>(out.data) + ro * es, size_t(rc[size_t(r)]), nccl_type(out.dtype), r,
                                 comm_, stream_));
      so += sc[size_t(r)], ro += rc[size_t(r)], sent += sc[size_t(r)];
    }
    LOOM_NCCL_CHECK(ncclGroupEnd());
    count(CommOp::all_to_all, size_t(sent) * es);
    return done_on_stream();
  }
  Work send(Buf b, int peer, int) override {
    count(CommOp::send, b.bytes());
    LOOM_NCCL_CHECK(ncclSend(b.data, size_t(b.count), nccl_type(b.dtype), peer, comm_, stream_));
    return done_on_stream();
  }
  Work recv(Buf b, int peer, int) override {
    count(CommOp::recv, b.bytes());
    LOOM_NCCL_CHECK(ncclRecv(b.data, size_t(b.count), nccl_type(b.dtype), peer, comm_, stream_));
    return done_on_stream();
  }
  Work barrier() override {
    count(CommOp::barrier, 0);
    if (!scratch_) LOOM_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
    LOOM_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
    Work w = done_on_stream();
    w.wait();
    return w;
  }

 private:
  // A Work that completes when everything issued so far on this group's stream has.
  Work done_on_stream() {
    cudaEvent_t ev;
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    LOOM_CUDA_CHECK(cudaEventRecord(ev, stream_));
    std::shared_ptr<CUevent_st> owned(ev, [](cudaEvent_t e) { cudaEventDestroy(e); });
    auto st = std::make_shared<Work::State>();
    st->device = [owned](bool block) {
      if (block) {
        LOOM_CUDA_CHECK(cudaEventSynchronize(owned.get()));
        return true;
      }
      return cudaEventQuery(owned.get()) == cudaSuccess;
    };
    return Work(st);
  }

  std::shared_ptr<NcclWorld> world_;
  ncclComm_t comm_;
  bool owns_;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;
};

}  // namespace

std::unique_ptr<ProcessGroup> nccl_group(const std::shared_ptr<NcclWorld>& world, const std::string& name, int color,
                                         const std::vector<int>& ranks) {
  if (name == "world") return std::make_unique<NcclGroup>(world, name, world->comm, false, ranks);
  ncclComm_t sub = nullptr;
  LOOM_NCCL_CHECK(ncclCommSplit(world->comm, color, world->rank, &sub, nullptr));
  return std::make_unique<NcclGroup>(world, name, sub, true, ranks);
}

}  // namespace loom
