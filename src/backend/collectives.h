// Collectives: the communication of a data-parallel run between its processes ("ranks"), one per
// device. Every rank calls the same collectives in the same order with tensors of the same shapes.
//
//   all_reduce_sum   t <- the element-wise sum of every rank's t (f32, in place)
//   reduce_scatter   out <- rank r's share [r * n, (r + 1) * n) of the sum of every rank's in [size * n]
//   reduce           root's t <- the element-wise sum of every rank's t (f32, in place; the others'
//                    t unchanged)
//   all_gather       out [size * n] <- every rank's in [n], in rank order (f32 or bf16)
// reduce_scatter and all_gather also work in place: `out` (resp. `in`) may be this rank's part of
// the other tensor.
//   broadcast        t <- root's t
//   barrier          returns once every rank has called it
//   sum (scalars)    the sum over ranks of a few host doubles (counts, losses)
//
// Implementations: one process (world size 1: every call is the identity, nothing is copied), MPI
// (backend/mpi_collectives.cpp, when kiln is built with it): CPU tensors go to MPI directly, device
// tensors through host copies; and NCCL (backend/nccl_collectives.cpp, with CUDA): device tensors
// GPU to GPU on the backend's stream, with MPI (or nothing, for one rank) as its bootstrap. A collective that does not complete within the
// timeout (another rank died or took another path) ends the process with a message naming this
// rank and the collective, so a run never hangs without output; mpirun then stops the other ranks.
//
// The world comes from the launcher's environment (world_from_environment): OpenMPI's
// OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK, else RANK / WORLD_SIZE / LOCAL_RANK (torchrun, Slurm
// scripts), else a single process.
//
// Ownership: a Collectives object owns its communicator (MPI is initialised by the first and
// finalised with it). Thread safety: one thread calls a Collectives object.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "core/status.h"

namespace kiln {

struct WorldInfo {
  int32_t rank = 0, size = 1, local_rank = 0;
  std::string launcher = "none";  // "openmpi", "env" (RANK / WORLD_SIZE) or "none"
};

// The world the launcher describes; an error for inconsistent or unparsable values.
Result<WorldInfo> world_from_environment();

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int32_t rank() const = 0;
  virtual int32_t size() const = 0;
  virtual const char* transport() const = 0;  // "none", "mpi" or "nccl"
  // Tensors live on `be` (host or device); f32 unless said otherwise, contiguous.
  virtual Status all_reduce_sum(Backend& be, Tensor t) = 0;
  virtual Status reduce_scatter_sum(Backend& be, Tensor in, Tensor out) = 0;
  virtual Status all_gather(Backend& be, Tensor in, Tensor out) = 0;
  virtual Status broadcast(Backend& be, Tensor t, int32_t root) = 0;  // any dtype
  // Point-to-point tensors, any dtype, in order between two ranks: the receiver's tensor has the
  // sender's byte count. NCCL only, device tensors GPU to GPU on the backend's stream (no host
  // copy, asynchronous like its collectives); elsewhere unsupported (host bytes go by send_bytes).
  virtual Status send(Backend&, Tensor, int32_t /*to*/) {
    return unsupported(std::string("tensor sends need NCCL, not ") + transport());
  }
  virtual Status receive(Backend&, Tensor, int32_t /*from*/) {
    return unsupported(std::string("tensor receives need NCCL, not ") + transport());
  }
  virtual Status barrier() = 0;
  virtual Status sum(double* values, int32_t n) = 0;
  // Overlap with computation: starts an all-reduce of `t` that may run while the work issued later
  // on the backend's stream goes on (NCCL: on its own stream, after the work issued so far); `t`
  // must be neither read nor written until join(). Elsewhere it completes before returning.
  virtual Status all_reduce_sum_overlapped(Backend& be, Tensor t) { return all_reduce_sum(be, t); }
  // The same for a reduce to `root` (ZeRO-1/2: each bucket's piece to the rank owning it).
  virtual Status reduce_sum_overlapped(Backend& be, Tensor t, int32_t root) = 0;
  // The work issued on the backend's stream from now on waits for every overlapped collective.
  virtual Status join(Backend&) { return Status::Ok(); }
  // Point-to-point messages between ranks, for control protocols (remote engines: infer/
  // remote_engine.h). Unlike the collectives they may be used from several threads at once, and a
  // receive waits as long as it takes (a peer that dies ends the job through the launcher).
  // `tag` >= 0 separates conversations; the bytes are at most 2^31 - 1.
  virtual Status send_message(int32_t to, int32_t tag, const std::string& bytes) = 0;
  // The next message with `tag` from rank `from` (-1: any rank): its sender and its bytes.
  virtual Result<std::pair<int32_t, std::string>> receive_message(int32_t from, int32_t tag) = 0;
  // Large payloads without copies: `n` bytes (any count) from and into caller memory on the host;
  // the receiver must expect exactly the size that was sent (an error otherwise).
  virtual Status send_bytes(int32_t to, int32_t tag, const void* data, int64_t n) = 0;
  virtual Status receive_bytes(int32_t from, int32_t tag, void* data, int64_t n) = 0;
  // The most a collective may take before the process gives up (seconds, > 0).
  virtual void set_timeout(double seconds) = 0;
  // After an error on this rank: ends every rank of the run with `code` (MPI_Abort), since the
  // others would wait for this one in their next collective. Returns only in a single process.
  virtual void abort_all(int code) = 0;
};

// World size 1: every collective is the identity.
std::unique_ptr<Collectives> make_single_process_collectives();

// MPI over the launcher's world (an error when kiln was built without MPI, or when the processes
// were not started by an MPI launcher).
Result<std::unique_ptr<Collectives>> make_mpi_collectives(const WorldInfo& world, double timeout_seconds);

// NCCL over the ranks of `bootstrap` for device tensors of `be` (a CUDA backend; the collectives run
// on its stream, asynchronously); host scalars and barriers go through the bootstrap, which the NCCL
// collectives own: it is moved from `bootstrap` on success and left there on failure. An error
// when kiln was built without CUDA or NCCL cannot be loaded.
Result<std::unique_ptr<Collectives>> make_nccl_collectives(Backend& be, std::unique_ptr<Collectives>& bootstrap,
                                                          double timeout_seconds);

// A new NCCL communicator's unique id, as bytes to hand to each of its members (through messages
// of another transport); an error without CUDA or NCCL.
Result<std::string> make_nccl_id();

// NCCL among `size` ranks that were given the same `id`, this one being `rank`, with no bootstrap:
// device tensors only (collectives, send and receive); messages, scalars and barriers are
// unsupported. Every member calls it at about the same time; it returns once all have joined
// (or after the timeout, ending the process with a message). Each member must be on another GPU.
Result<std::unique_ptr<Collectives>> make_nccl_group(Backend& be, int32_t rank, int32_t size, const std::string& id,
                                                     double timeout_seconds);

// The collectives of `world`: one process when its size is 1, else MPI.
Result<std::unique_ptr<Collectives>> make_collectives(const WorldInfo& world, double timeout_seconds);

}  // namespace kiln
