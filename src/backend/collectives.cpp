// Collectives (see collectives.h): the launcher's world and the single-process implementation.
#include "backend/collectives.h"

#include <charconv>
#include <cstdlib>
#include <cstring>

namespace kiln {
namespace {

// An environment variable as a non-negative integer; nullopt-like -1 when unset.
Result<int64_t> env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return int64_t(-1);
  int64_t x = 0;
  const auto [end, ec] = std::from_chars(v, v + std::strlen(v), x);
  if (ec != std::errc() || *end != '\0' || x < 0 || x > INT32_MAX)
    return invalid_argument(std::string("the environment variable ") + name + "='" + v +
                            "' is not a rank or a process count");
  return x;
}

class SingleProcess final : public Collectives {
 public:
  int32_t rank() const override { return 0; }
  int32_t size() const override { return 1; }
  const char* transport() const override { return "none"; }
  Status all_reduce_sum(Backend&, Tensor) override { return Status::Ok(); }
  Status reduce_sum_overlapped(Backend&, Tensor, int32_t) override { return Status::Ok(); }
  Status reduce_scatter_sum(Backend& be, Tensor in, Tensor out) override {
    if (in.data != out.data) be.copy(out, in);
    return Status::Ok();
  }
  Status all_gather(Backend& be, Tensor in, Tensor out) override {
    if (in.data != out.data) be.copy(out, in);
    return Status::Ok();
  }
  Status broadcast(Backend&, Tensor, int32_t) override { return Status::Ok(); }
  Status barrier() override { return Status::Ok(); }
  Status sum(double*, int32_t) override { return Status::Ok(); }
  Status send_message(int32_t, int32_t, const std::string&) override {
    return unsupported("a single process has no other rank to send messages to");
  }
  Result<std::pair<int32_t, std::string>> receive_message(int32_t, int32_t) override {
    return unsupported("a single process has no other rank to receive messages from");
  }
  Status send_bytes(int32_t, int32_t, const void*, int64_t) override {
    return unsupported("a single process has no other rank to send messages to");
  }
  Status receive_bytes(int32_t, int32_t, void*, int64_t) override {
    return unsupported("a single process has no other rank to receive messages from");
  }
  void set_timeout(double) override {}
  void abort_all(int) override {}
};

}  // namespace

Result<WorldInfo> world_from_environment() {
  WorldInfo w;
  const char* names[2][3] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
                             {"RANK", "WORLD_SIZE", "LOCAL_RANK"}};
  for (int k = 0; k < 2; ++k) {
    KILN_ASSIGN_OR_RETURN(int64_t rank, env_int(names[k][0]));
    KILN_ASSIGN_OR_RETURN(int64_t size, env_int(names[k][1]));
    if (rank < 0 && size < 0) continue;
    if (rank < 0 || size < 1 || rank >= size)
      return invalid_argument(std::string("the launcher's environment is inconsistent: ") + names[k][0] + "=" +
                              std::to_string(rank) + ", " + names[k][1] + "=" + std::to_string(size) +
                              " (a rank within [0, size) is needed)");
    KILN_ASSIGN_OR_RETURN(int64_t local, env_int(names[k][2]));
    w.rank = static_cast<int32_t>(rank);
    w.size = static_cast<int32_t>(size);
    w.local_rank = static_cast<int32_t>(local < 0 ? 0 : local);
    w.launcher = k == 0 ? "openmpi" : "env";
    return w;
  }
  return w;
}

std::unique_ptr<Collectives> make_single_process_collectives() { return std::make_unique<SingleProcess>(); }

Result<std::unique_ptr<Collectives>> make_collectives(const WorldInfo& world, double timeout_seconds) {
  if (world.size == 1) return make_single_process_collectives();
  return make_mpi_collectives(world, timeout_seconds);
}

#ifndef KILN_WITH_CUDA
Result<std::unique_ptr<Collectives>> make_nccl_collectives(Backend&, std::unique_ptr<Collectives>&, double) {
  return unsupported("this kiln was built without CUDA, so it has no NCCL collectives; use --collectives mpi");
}
Result<std::string> make_nccl_id() { return unsupported("this kiln was built without CUDA, so it has no NCCL"); }
Result<std::unique_ptr<Collectives>> make_nccl_group(Backend&, int32_t, int32_t, const std::string&, double) {
  return unsupported("this kiln was built without CUDA, so it has no NCCL");
}
#endif

#ifndef KILN_WITH_MPI
Result<std::unique_ptr<Collectives>> make_mpi_collectives(const WorldInfo& world, double) {
  return unsupported("this kiln was built without MPI, so it cannot run " + std::to_string(world.size) +
                     " ranks; build it where OpenMPI is installed (libopenmpi-dev) or run one process");
}
#endif

}  // namespace kiln
