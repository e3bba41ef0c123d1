// NCCL collectives (collectives.h) for device tensors of a CUDA backend, built with CUDA. NCCL is
// loaded at run time (dlopen of libnccl.so.2), so a kiln binary runs where NCCL is absent and says
// so only when NCCL is asked for. The collectives are enqueued on the backend's stream and return
// at once (asynchronous, in order with the kernels around them); overlapped all-reduces go on a
// stream of their own, after an event of the backend's stream, and join() makes the backend's
// stream wait for them. Host scalars, barriers and the exchange of NCCL's unique id go through the
// bootstrap collectives (MPI, or nothing for one rank); a group made without one (make_nccl_group:
// the trainer and a remote engine, their id exchanged in the engine's protocol) moves tensors only.
//
// Hangs and failures: after each collective an event is recorded on the stream; a watchdog thread
// polls it and NCCL's asynchronous error, and when the collective is not done within the timeout
// (or NCCL reports an error) it aborts the communicator and ends the process with a message naming
// the rank and the collective, so a run never hangs without output.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "backend/collectives.h"
#include "backend/cuda_backend.h"

namespace kiln {
namespace {

// The NCCL entry points kiln uses, from the shared library.
struct NcclApi {
  void* handle = nullptr;
  ncclResult_t (*GetVersion)(int*) = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;

  static Result<NcclApi> load() {
    NcclApi api;
    // Never unloaded (RTLD_NODELETE): a destroyed communicator's threads may still be running NCCL's
    // code, and a later dlopen re-initialises its global state (a segfault under the GPU tests, which
    // make and destroy several communicators in one process).
    for (const char* name : {"libnccl.so.2", "libnccl.so"})
      if ((api.handle = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) != nullptr) break;
    if (!api.handle)
      return unsupported("NCCL is not installed here (libnccl.so.2 was not found): install it (Debian/Ubuntu: libnccl2), "
                         "point LD_LIBRARY_PATH at it, or use --collectives mpi");
    bool ok = true;
    auto get = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(api.handle, symbol));
      ok = ok && fn != nullptr;
    };
    get(api.GetVersion, "ncclGetVersion");
    get(api.GetUniqueId, "ncclGetUniqueId");
    get(api.CommInitRank, "ncclCommInitRank");
    get(api.CommDestroy, "ncclCommDestroy");
    get(api.CommAbort, "ncclCommAbort");
    get(api.CommGetAsyncError, "ncclCommGetAsyncError");
    get(api.GetErrorString, "ncclGetErrorString");
    get(api.AllReduce, "ncclAllReduce");
    get(api.Reduce, "ncclReduce");
    get(api.ReduceScatter, "ncclReduceScatter");
    get(api.AllGather, "ncclAllGather");
    get(api.Broadcast, "ncclBroadcast");
    get(api.Send, "ncclSend");
    get(api.Recv, "ncclRecv");
    if (!ok) return unsupported("the NCCL library found lacks functions kiln needs (NCCL 2.12 or newer is needed)");
    return api;
  }
};

class NcclCollectives final : public Collectives {
 public:
  // Over a bootstrap: rank 0's unique id goes to every rank through it.
  static Result<std::unique_ptr<Collectives>> create(Backend& be, std::unique_ptr<Collectives>& bootstrap, double timeout) {
    if (!be.device().is_cuda()) return invalid_argument("NCCL collectives need a CUDA device (--device cuda)");
    std::string id;
    if (bootstrap->rank() == 0) {
      KILN_ASSIGN_OR_RETURN(id, make_id());
    }
    if (bootstrap->size() > 1) {  // a device copy: the bootstrap's broadcast stages device tensors
      static_assert(sizeof(ncclUniqueId) % 4 == 0);
      const int64_t words = static_cast<int64_t>(sizeof(ncclUniqueId) / 4);
      id.resize(sizeof(ncclUniqueId));
      KILN_ASSIGN_OR_RETURN(TensorBuffer buf, empty(be, {words}, DType::i32));
      Tensor host{id.data(), DType::i32, Device::cpu(), Shape{words}};
      be.copy(buf.view(), host);
      KILN_RETURN_IF_ERROR(bootstrap->broadcast(be, buf.view(), 0));
      be.copy(host, buf.view());
      KILN_RETURN_IF_ERROR(be.synchronize());
    }
    const int32_t rank = bootstrap->rank(), size = bootstrap->size();
    auto c = std::unique_ptr<NcclCollectives>(new NcclCollectives(std::move(bootstrap), rank, size, timeout));
    Status st = c->start(be, id);
    if (!st.ok()) {
      bootstrap = std::move(c->bootstrap_);  // back to the caller, to end the other ranks with it
      return st;
    }
    return std::unique_ptr<Collectives>(std::move(c));
  }
  static Result<std::unique_ptr<Collectives>> create_group(Backend& be, int32_t rank, int32_t size,
                                                           const std::string& id, double timeout) {
    if (!be.device().is_cuda()) return invalid_argument("NCCL needs a CUDA device");
    if (size < 1 || rank < 0 || rank >= size)
      return invalid_argument("a NCCL group's rank must lie in [0, size): rank " + std::to_string(rank) + " of " +
                              std::to_string(size));
    auto c = std::unique_ptr<NcclCollectives>(new NcclCollectives(nullptr, rank, size, timeout));
    KILN_RETURN_IF_ERROR(c->start(be, id));
    return std::unique_ptr<Collectives>(std::move(c));
  }
  static Result<std::string> make_id() {
    KILN_ASSIGN_OR_RETURN(NcclApi api, NcclApi::load());
    ncclUniqueId id{};
    const ncclResult_t rc = api.GetUniqueId(&id);
    const std::string error = rc == ncclSuccess ? "" : api.GetErrorString(rc);
    dlclose(api.handle);
    if (!error.empty()) return Status(StatusCode::internal, "NCCL failed in ncclGetUniqueId: " + error);
    return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
  }

  // Loads NCCL, joins the communicator of `id_bytes` and starts the watchdog.
  Status start(Backend& be, const std::string& id_bytes) {
    KILN_ASSIGN_OR_RETURN(api_, NcclApi::load());
    if (id_bytes.size() != sizeof(ncclUniqueId))
      return invalid_argument("a NCCL unique id has " + std::to_string(sizeof(ncclUniqueId)) + " bytes, not " +
                              std::to_string(id_bytes.size()));
    ncclUniqueId id{};
    std::memcpy(&id, id_bytes.data(), sizeof(id));
    stream_ = static_cast<CudaBackend&>(be).stream();
    device_ = be.device().index;
    if (cudaEventCreateWithFlags(&event_, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&issued_, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&overlapped_done_, cudaEventDisableTiming) != cudaSuccess ||
        cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking) != cudaSuccess)
      return Status(StatusCode::internal, "cannot create the CUDA events and stream of the NCCL collectives");
    watchdog_ = std::thread([this] { watch(); });
    Guard g(*this, "NCCL's initialisation");
    return check(api_.CommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
  }

  ~NcclCollectives() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (comm_) api_.CommDestroy(comm_);
    for (cudaEvent_t e : {event_, issued_, overlapped_done_})
      if (e) cudaEventDestroy(e);
    if (comm_stream_) cudaStreamDestroy(comm_stream_);
    if (api_.handle) dlclose(api_.handle);
  }

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }
  const char* transport() const override { return "nccl"; }
  void set_timeout(double seconds) override {
    timeout_ = seconds;
    if (bootstrap_) bootstrap_->set_timeout(seconds);
  }
  void abort_all(int code) override {
    if (comm_) api_.CommAbort(comm_);
    comm_ = nullptr;
    if (bootstrap_) bootstrap_->abort_all(code);
  }

  Status all_reduce_sum(Backend&, Tensor t) override {
    KILN_RETURN_IF_ERROR(check_dtype(t, "all-reduce", false));
    return enqueue("an all-reduce of " + std::to_string(t.numel()) + " values", [&] {
      return api_.AllReduce(t.data, t.data, static_cast<size_t>(t.numel()), ncclFloat32, ncclSum, comm_, stream_);
    });
  }
  Status reduce_scatter_sum(Backend&, Tensor in, Tensor out) override {
    KILN_RETURN_IF_ERROR(check_dtype(in, "reduce-scatter", false));
    KILN_RETURN_IF_ERROR(check_dtype(out, "reduce-scatter", false));
    if (in.numel() != out.numel() * size()) return invalid_argument("reduce-scatter: the input must hold size x the output's elements");
    return enqueue("a reduce-scatter of " + std::to_string(in.numel()) + " values", [&] {
      return api_.ReduceScatter(in.data, out.data, static_cast<size_t>(out.numel()), ncclFloat32, ncclSum, comm_, stream_);
    });
  }
  Status all_gather(Backend&, Tensor in, Tensor out) override {
    KILN_RETURN_IF_ERROR(check_dtype(in, "all-gather", true));
    if (out.dtype != in.dtype || out.numel() != in.numel() * size())
      return invalid_argument("all-gather: the output must hold size x the input's elements, in its dtype");
    const ncclDataType_t type = in.dtype == DType::f32 ? ncclFloat32 : ncclBfloat16;
    return enqueue("an all-gather of " + std::to_string(out.numel()) + " values", [&] {
      return api_.AllGather(in.data, out.data, static_cast<size_t>(in.numel()), type, comm_, stream_);
    });
  }
  Status broadcast(Backend&, Tensor t, int32_t root) override {
    if (root < 0 || root >= size()) return invalid_argument("broadcast: root " + std::to_string(root) + " is not a rank");
    return enqueue("a broadcast of " + std::to_string(t.nbytes()) + " bytes from rank " + std::to_string(root), [&] {
      return api_.Broadcast(t.data, t.data, static_cast<size_t>(t.nbytes()), ncclUint8, root, comm_, stream_);
    });
  }
  Status send(Backend&, Tensor t, int32_t to) override {
    KILN_RETURN_IF_ERROR(check_peer(to));
    return enqueue("a send of " + std::to_string(t.nbytes()) + " bytes to rank " + std::to_string(to), [&] {
      return api_.Send(t.data, static_cast<size_t>(t.nbytes()), ncclUint8, to, comm_, stream_);
    });
  }
  Status receive(Backend&, Tensor t, int32_t from) override {
    KILN_RETURN_IF_ERROR(check_peer(from));
    return enqueue("a receive of " + std::to_string(t.nbytes()) + " bytes from rank " + std::to_string(from), [&] {
      return api_.Recv(t.data, static_cast<size_t>(t.nbytes()), ncclUint8, from, comm_, stream_);
    });
  }
  Status all_reduce_sum_overlapped(Backend&, Tensor t) override {
    KILN_RETURN_IF_ERROR(check_dtype(t, "all-reduce", false));
    KILN_RETURN_IF_ERROR(order_comm_stream());
    return enqueue("an overlapped all-reduce of " + std::to_string(t.numel()) + " values", comm_stream_, [&] {
      return api_.AllReduce(t.data, t.data, static_cast<size_t>(t.numel()), ncclFloat32, ncclSum, comm_, comm_stream_);
    });
  }
  Status reduce_sum_overlapped(Backend&, Tensor t, int32_t root) override {
    KILN_RETURN_IF_ERROR(check_dtype(t, "reduce", false));
    if (root < 0 || root >= size()) return invalid_argument("reduce: root " + std::to_string(root) + " is not a rank");
    KILN_RETURN_IF_ERROR(order_comm_stream());
    return enqueue("an overlapped reduce of " + std::to_string(t.numel()) + " values to rank " + std::to_string(root),
                   comm_stream_, [&] {
                     return api_.Reduce(t.data, t.data, static_cast<size_t>(t.numel()), ncclFloat32, ncclSum, root,
                                        comm_, comm_stream_);
                   });
  }
  Status join(Backend&) override {
    if (cudaEventRecord(overlapped_done_, comm_stream_) != cudaSuccess ||
        cudaStreamWaitEvent(stream_, overlapped_done_, 0) != cudaSuccess)
      return Status(StatusCode::internal, "rank " + std::to_string(rank()) + ": cannot join the communication stream");
    return Status::Ok();
  }
  Status barrier() override {
    KILN_RETURN_IF_ERROR(check_bootstrap("a barrier"));
    return bootstrap_->barrier();
  }
  Status send_message(int32_t to, int32_t tag, const std::string& bytes) override {
    KILN_RETURN_IF_ERROR(check_bootstrap("a message"));
    return bootstrap_->send_message(to, tag, bytes);
  }
  Result<std::pair<int32_t, std::string>> receive_message(int32_t from, int32_t tag) override {
    KILN_RETURN_IF_ERROR(check_bootstrap("a message"));
    return bootstrap_->receive_message(from, tag);
  }
  Status send_bytes(int32_t to, int32_t tag, const void* data, int64_t n) override {
    KILN_RETURN_IF_ERROR(check_bootstrap("host bytes"));
    return bootstrap_->send_bytes(to, tag, data, n);
  }
  Status receive_bytes(int32_t from, int32_t tag, void* data, int64_t n) override {
    KILN_RETURN_IF_ERROR(check_bootstrap("host bytes"));
    return bootstrap_->receive_bytes(from, tag, data, n);
  }
  Status sum(double* values, int32_t n) override {
    KILN_RETURN_IF_ERROR(check_bootstrap("a sum of host values"));
    return bootstrap_->sum(values, n);
  }

 private:
  NcclCollectives(std::unique_ptr<Collectives> bootstrap, int32_t rank, int32_t size, double timeout)
      : bootstrap_(std::move(bootstrap)), rank_(rank), size_(size), timeout_(timeout) {}

  // The communication stream waits for the work issued so far on the backend's.
  Status order_comm_stream() {
    if (cudaEventRecord(issued_, stream_) != cudaSuccess || cudaStreamWaitEvent(comm_stream_, issued_, 0) != cudaSuccess)
      return Status(StatusCode::internal, "rank " + std::to_string(rank()) + ": cannot order the communication stream");
    return Status::Ok();
  }
  Status check_bootstrap(const char* what) const {
    if (bootstrap_) return Status::Ok();
    return unsupported(std::string("this NCCL group moves device tensors only, not ") + what);
  }
  Status check_peer(int32_t peer) const {
    if (peer >= 0 && peer < size_ && peer != rank_) return Status::Ok();
    return invalid_argument("rank " + std::to_string(peer) + " is not another rank of this NCCL group of " +
                            std::to_string(size_));
  }

  // Marks a host-blocking call (initialisation) for the watchdog.
  struct Guard {
    Guard(NcclCollectives& c, std::string what) : c_(c) { c_.arm(std::move(what), /*event=*/false); }
    ~Guard() { c_.disarm(); }
    NcclCollectives& c_;
  };

  template <typename Call>
  Status enqueue(const std::string& what, Call call) {
    return enqueue(what, stream_, call);
  }
  // The call, then the watchdog's event after it on `stream`.
  template <typename Call>
  Status enqueue(const std::string& what, cudaStream_t stream, Call call) {
    KILN_RETURN_IF_ERROR(check(call(), what.c_str()));
    if (cudaEventRecord(event_, stream) != cudaSuccess)
      return Status(StatusCode::internal, "rank " + std::to_string(rank()) + ": cannot record a CUDA event after " + what);
    arm(what, /*event=*/true);
    return Status::Ok();
  }
  void arm(std::string what, bool event) {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = std::move(what);
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_));
    pending_ = true;
    pending_event_ = event;
    cv_.notify_all();
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = false;
  }

  void watch() {
    cudaSetDevice(device_);  // the event's device
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      if (!pending_) {
        cv_.wait(lock, [&] { return stopping_ || pending_; });
        continue;
      }
      cv_.wait_for(lock, std::chrono::milliseconds(20));
      if (stopping_ || !pending_) continue;
      if (pending_event_ && cudaEventQuery(event_) == cudaSuccess) {
        pending_ = false;
        continue;
      }
      ncclResult_t async = ncclSuccess;
      if (comm_) api_.CommGetAsyncError(comm_, &async);
      const bool failed = async != ncclSuccess && async != ncclInProgress;
      if (!failed && std::chrono::steady_clock::now() < deadline_) continue;
      if (failed)
        std::fprintf(stderr, "kiln: error: rank %d of %d: NCCL failed in %s: %s; exiting\n", rank(), size(),
                     current_.c_str(), api_.GetErrorString(async));
      else
        std::fprintf(stderr,
                     "kiln: error: rank %d of %d: %s did not complete within %g s: another rank stopped or is doing "
                     "something else; exiting (raise --collective-timeout if a step is that slow)\n",
                     rank(), size(), current_.c_str(), timeout_);
      std::fflush(stderr);
      if (comm_) api_.CommAbort(comm_);
      _exit(1);
    }
  }

  Status check(ncclResult_t rc, const char* call) const {
    if (rc == ncclSuccess) return Status::Ok();
    return Status(StatusCode::internal,
                  "rank " + std::to_string(rank()) + ": NCCL failed in " + call + ": " + api_.GetErrorString(rc));
  }
  static Status check_dtype(Tensor t, const char* what, bool bf16_too) {
    if (t.dtype == DType::f32 || (bf16_too && t.dtype == DType::bf16)) return Status::Ok();
    return invalid_argument(std::string(what) + (bf16_too ? " takes f32 or bf16 tensors" : " takes f32 tensors"));
  }

  NcclApi api_;
  std::unique_ptr<Collectives> bootstrap_;  // null for a group made from an id
  int32_t rank_ = 0, size_ = 1;
  double timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;       // the backend's
  cudaStream_t comm_stream_ = nullptr;  // overlapped collectives
  int device_ = 0;
  cudaEvent_t event_ = nullptr;            // after the latest collective: the watchdog's
  cudaEvent_t issued_ = nullptr;           // the backend's work before an overlapped collective
  cudaEvent_t overlapped_done_ = nullptr;  // the overlapped collectives, for join()
  std::mutex mu_;
  std::condition_variable cv_;
  std::string current_;
  std::chrono::steady_clock::time_point deadline_;
  bool pending_ = false, pending_event_ = false, stopping_ = false;
  std::thread watchdog_;
};

}  // namespace

Result<std::unique_ptr<Collectives>> make_nccl_collectives(Backend& be, std::unique_ptr<Collectives>& bootstrap,
                                                          double timeout_seconds) {
  return NcclCollectives::create(be, bootstrap, timeout_seconds);
}

Result<std::string> make_nccl_id() { return NcclCollectives::make_id(); }

Result<std::unique_ptr<Collectives>> make_nccl_group(Backend& be, int32_t rank, int32_t size, const std::string& id,
                                                     double timeout_seconds) {
  return NcclCollectives::create_group(be, rank, size, id, timeout_seconds);
}

}  // namespace kiln
