// MPI collectives (collectives.h), built when kiln is configured with MPI (KILN_WITH_MPI). CPU
// tensors go to MPI as they are; device tensors through host copies. Counts above 2^30 elements
// are sent in pieces (MPI counts are int). Errors come back as statuses (MPI_ERRORS_RETURN), and
// a watchdog thread ends the process when a collective outlives the timeout.
// The C API only: OpenMPI would otherwise pull in its deprecated C++ bindings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "backend/collectives.h"
#include "core/plural.h"

namespace kiln {
namespace {

constexpr int64_t kPiece = int64_t(1) << 30;  // elements per MPI call at most

class MpiCollectives final : public Collectives {
 public:
  static Result<std::unique_ptr<Collectives>> create(const WorldInfo& world, double timeout_seconds) {
    auto c = std::unique_ptr<MpiCollectives>(new MpiCollectives(timeout_seconds));
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      // Several threads may exchange messages (remote engines); the collectives stay on one.
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &c->thread_level_) != MPI_SUCCESS)
        return Status(StatusCode::internal, "MPI could not be initialised");
      c->owns_mpi_ = true;
    } else {
      MPI_Query_thread(&c->thread_level_);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size_);
    if (c->size_ != world.size || c->rank_ != world.rank)
      return invalid_argument("the launcher says rank " + std::to_string(world.rank) + " of " +
                              std::to_string(world.size) + " processes, but MPI sees rank " + std::to_string(c->rank_) +
                              " of " + std::to_string(c->size_) +
                              ": kiln's collectives need an MPI launcher (mpirun -np N, or srun --mpi=pmix)");
    c->watchdog_ = std::thread([p = c.get()] { p->watch(); });
    return std::unique_ptr<Collectives>(std::move(c));
  }

  ~MpiCollectives() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (owns_mpi_) MPI_Finalize();
  }

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }
  const char* transport() const override { return "mpi"; }
  void set_timeout(double seconds) override { timeout_ = seconds; }
  void abort_all(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    _exit(code);  // MPI_Abort does not return; should it, the process still ends
  }

  Status all_reduce_sum(Backend& be, Tensor t) override {
    KILN_RETURN_IF_ERROR(check_f32(t, "all-reduce"));
    Guard g(*this, "an all-reduce of " + std::to_string(t.numel()) + " values");
    float* p = host_view(be, t);
    for (int64_t at = 0; at < t.numel(); at += kPiece) {
      const int n = static_cast<int>(std::min(kPiece, t.numel() - at));
      KILN_RETURN_IF_ERROR(check(MPI_Allreduce(MPI_IN_PLACE, p + at, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce"));
    }
    write_back(be, t, p);
    return Status::Ok();
  }

  Status reduce_sum_overlapped(Backend& be, Tensor t, int32_t root) override {  // not overlapped: MPI blocks
    KILN_RETURN_IF_ERROR(check_f32(t, "reduce"));
    if (root < 0 || root >= size_) return invalid_argument("reduce: root " + std::to_string(root) + " is not a rank");
    Guard g(*this, "a reduce of " + std::to_string(t.numel()) + " values to rank " + std::to_string(root));
    float* p = host_view(be, t);
    for (int64_t at = 0; at < t.numel(); at += kPiece) {
      const int n = static_cast<int>(std::min(kPiece, t.numel() - at));
      const bool is_root = rank_ == root;  // (the receive buffer only counts at the root)
      KILN_RETURN_IF_ERROR(check(MPI_Reduce(is_root ? MPI_IN_PLACE : p + at, is_root ? p + at : nullptr, n, MPI_FLOAT,
                                            MPI_SUM, root, MPI_COMM_WORLD), "MPI_Reduce"));
    }
    if (rank_ == root) write_back(be, t, p);
    return Status::Ok();
  }

  Status reduce_scatter_sum(Backend& be, Tensor in, Tensor out) override {
    KILN_RETURN_IF_ERROR(check_f32(in, "reduce-scatter"));
    KILN_RETURN_IF_ERROR(check_f32(out, "reduce-scatter"));
    if (in.numel() != out.numel() * size_ || out.numel() > kPiece)
      return invalid_argument("reduce-scatter: the input must hold size x the output's elements (at most 2^30 per rank)");
    Guard g(*this, "a reduce-scatter of " + std::to_string(in.numel()) + " values");
    const float* src = host_view(be, in);  // `out` may be this rank's part of `in` (in place): staged
    std::vector<float> dst(static_cast<size_t>(out.numel()));
    KILN_RETURN_IF_ERROR(check(MPI_Reduce_scatter_block(src, dst.data(), static_cast<int>(out.numel()), MPI_FLOAT, MPI_SUM,
                                                        MPI_COMM_WORLD), "MPI_Reduce_scatter_block"));
    copy_from_host(be, out, dst.data());
    return Status::Ok();
  }

  Status all_gather(Backend& be, Tensor in, Tensor out) override {
    if (in.dtype != out.dtype || (in.dtype != DType::f32 && in.dtype != DType::bf16))
      return invalid_argument("all-gather takes f32 or bf16 tensors of one dtype");
    if (out.numel() != in.numel() * size_ || in.numel() > kPiece)
      return invalid_argument("all-gather: the output must hold size x the input's elements (at most 2^30 per rank)");
    Guard g(*this, "an all-gather of " + std::to_string(out.numel()) + " values");
    const MPI_Datatype type = in.dtype == DType::f32 ? MPI_FLOAT : MPI_UINT16_T;  // bf16 travels as its bits
    // Both sides staged: `in` may be this rank's part of `out` (in place).
    std::vector<char> src(static_cast<size_t>(in.nbytes())), dst(static_cast<size_t>(out.nbytes()));
    copy_to_host(be, in, src.data());
    KILN_RETURN_IF_ERROR(check(MPI_Allgather(src.data(), static_cast<int>(in.numel()), type, dst.data(),
                                             static_cast<int>(in.numel()), type, MPI_COMM_WORLD), "MPI_Allgather"));
    copy_from_host(be, out, dst.data());
    return Status::Ok();
  }

  Status broadcast(Backend& be, Tensor t, int32_t root) override {
    if (root < 0 || root >= size_) return invalid_argument("broadcast: root " + std::to_string(root) + " is not a rank");
    Guard g(*this, "a broadcast of " + std::to_string(t.nbytes()) + " bytes from rank " + std::to_string(root));
    const bool on_host = be.device().is_cpu();
    std::vector<char> staging;
    char* p = static_cast<char*>(t.data);
    if (!on_host) {
      staging.resize(static_cast<size_t>(t.nbytes()));
      p = staging.data();
      if (rank_ == root) copy_to_host(be, t, p);
    }
    for (int64_t at = 0; at < t.nbytes(); at += kPiece) {
      const int n = static_cast<int>(std::min(kPiece, t.nbytes() - at));
      KILN_RETURN_IF_ERROR(check(MPI_Bcast(p + at, n, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast"));
    }
    if (!on_host && rank_ != root) copy_from_host(be, t, p);
    return Status::Ok();
  }

  Status barrier() override {
    Guard g(*this, "a barrier");
    return check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
  }

  Status send_message(int32_t to, int32_t tag, const std::string& bytes) override {
    KILN_RETURN_IF_ERROR(check_messaging(to));
    if (bytes.size() > static_cast<size_t>(INT32_MAX)) return invalid_argument("a message is limited to 2 GiB");
    return check(MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, to, tag, MPI_COMM_WORLD), "MPI_Send");
  }

  Result<std::pair<int32_t, std::string>> receive_message(int32_t from, int32_t tag) override {
    KILN_RETURN_IF_ERROR(check_messaging(from < 0 ? rank_ : from));
    MPI_Message message;
    MPI_Status status;
    KILN_RETURN_IF_ERROR(probe(from, tag, &message, &status));
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    std::string bytes(static_cast<size_t>(count), '\0');
    KILN_RETURN_IF_ERROR(check(MPI_Mrecv(bytes.data(), count, MPI_BYTE, &message, &status), "MPI_Mrecv"));
    return std::make_pair(static_cast<int32_t>(status.MPI_SOURCE), std::move(bytes));
  }

  // Pieces of at most 1 GiB, each its own message of the same tag (MPI keeps their order); an empty
  // payload is one empty message.
  static int64_t pieces_of(int64_t n) { return std::max<int64_t>(1, (n + kPiece - 1) / kPiece); }
  Status send_bytes(int32_t to, int32_t tag, const void* data, int64_t n) override {
    KILN_RETURN_IF_ERROR(check_messaging(to));
    for (int64_t piece = 0; piece < pieces_of(n); ++piece) {
      const int64_t at = piece * kPiece;
      const int count = static_cast<int>(std::min(kPiece, n - at));
      KILN_RETURN_IF_ERROR(check(MPI_Send(static_cast<const char*>(data) + at, count, MPI_BYTE, to, tag, MPI_COMM_WORLD),
                                 "MPI_Send"));
    }
    return Status::Ok();
  }
  Status receive_bytes(int32_t from, int32_t tag, void* data, int64_t n) override {
    KILN_RETURN_IF_ERROR(check_messaging(from));
    for (int64_t piece = 0; piece < pieces_of(n); ++piece) {
      const int64_t at = piece * kPiece;
      MPI_Message message;
      MPI_Status status;
      KILN_RETURN_IF_ERROR(probe(from, tag, &message, &status));
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      const int expected = static_cast<int>(std::min(kPiece, n - at));
      if (count != expected) {
        std::string discard(static_cast<size_t>(count), '\0');
        MPI_Mrecv(discard.data(), count, MPI_BYTE, &message, &status);
        return invalid_argument("rank " + std::to_string(from) + " sent " + std::to_string(count) + " bytes where " +
                                std::to_string(expected) + " were expected");
      }
      KILN_RETURN_IF_ERROR(check(MPI_Mrecv(static_cast<char*>(data) + at, count, MPI_BYTE, &message, &status), "MPI_Mrecv"));
    }
    return Status::Ok();
  }

  Status sum(double* values, int32_t n) override {
    Guard g(*this, "a sum of " + count_of(n, "scalar"));
    return check(MPI_Allreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  }

 private:
  explicit MpiCollectives(double timeout) : timeout_(timeout) {}

  // Marks a collective in progress for the watchdog.
  struct Guard {
    Guard(MpiCollectives& c, std::string what) : c_(c) {
      std::lock_guard<std::mutex> lock(c_.mu_);
      c_.current_ = std::move(what);
      c_.deadline_ = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                            std::chrono::duration<double>(c_.timeout_));
      c_.busy_ = true;
      c_.cv_.notify_all();
    }
    ~Guard() {
      std::lock_guard<std::mutex> lock(c_.mu_);
      c_.busy_ = false;
    }
    MpiCollectives& c_;
  };

  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      if (!busy_) {
        cv_.wait(lock, [&] { return stopping_ || busy_; });
        continue;
      }
      const auto deadline = deadline_;
      if (cv_.wait_until(lock, deadline, [&] { return stopping_ || !busy_ || deadline_ != deadline; })) continue;
      std::fprintf(stderr,
                   "kiln: error: rank %d of %d: %s did not complete within %g s: another rank stopped or is doing "
                   "something else; exiting (raise --collective-timeout if a step is that slow)\n",
                   rank_, size_, current_.c_str(), timeout_);
      std::fflush(stderr);
      _exit(1);
    }
  }

  Status check(int rc, const char* call) const {
    if (rc == MPI_SUCCESS) return Status::Ok();
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return Status(StatusCode::internal, "rank " + std::to_string(rank_) + ": " + call + " failed: " + std::string(text, len));
  }
  // A matched probe (two threads receiving cannot take each other's message), polled with a growing
  // sleep (up to 1 ms) rather than MPI's busy wait: a receiver may wait for long (an engine for its
  // next command) and must not take a core from the work beside it.
  Status probe(int32_t from, int32_t tag, MPI_Message* message, MPI_Status* status) const {
    for (int polls = 0;; ++polls) {
      int found = 0;
      KILN_RETURN_IF_ERROR(
          check(MPI_Improbe(from < 0 ? MPI_ANY_SOURCE : from, tag, MPI_COMM_WORLD, &found, message, status), "MPI_Improbe"));
      if (found) return Status::Ok();
      if (polls >= 200) std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 * (polls - 199))));
    }
  }
  Status check_messaging(int32_t peer) const {
    if (thread_level_ < MPI_THREAD_MULTIPLE)
      return unsupported("this MPI library does not support messages from several threads (MPI_THREAD_MULTIPLE)");
    if (peer < 0 || peer >= size_) return invalid_argument("rank " + std::to_string(peer) + " is not in the run");
    return Status::Ok();
  }
  static Status check_f32(Tensor t, const char* what) {
    if (t.dtype != DType::f32) return invalid_argument(std::string(what) + " takes f32 tensors");
    return Status::Ok();
  }
  // The tensor's f32 values on the host: the tensor itself on the CPU, else a copy in staging_.
  float* host_view(Backend& be, Tensor t) {
    if (be.device().is_cpu()) return static_cast<float*>(t.data);
    staging_.resize(static_cast<size_t>(t.numel()));
    copy_to_host(be, t, staging_.data());
    return staging_.data();
  }
  void write_back(Backend& be, Tensor t, const float* p) {
    if (!be.device().is_cpu()) copy_from_host(be, t, p);
  }
  static void copy_to_host(Backend& be, Tensor t, void* p) {
    Tensor h = t;
    h.data = p;
    h.device = Device::cpu();
    be.copy(h, t);
  }
  static void copy_from_host(Backend& be, Tensor t, const void* p) {
    Tensor h = t;
    h.data = const_cast<void*>(p);
    h.device = Device::cpu();
    be.copy(t, h);
  }

  int rank_ = 0, size_ = 1;
  bool owns_mpi_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
  double timeout_;
  std::vector<float> staging_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string current_;
  std::chrono::steady_clock::time_point deadline_;
  bool busy_ = false, stopping_ = false;
  std::thread watchdog_;
};

}  // namespace

Result<std::unique_ptr<Collectives>> make_mpi_collectives(const WorldInfo& world, double timeout_seconds) {
  return MpiCollectives::create(world, timeout_seconds);
}

}  // namespace kiln
