// Engines in other processes: a RemoteEngine in the client's process (the RL loop's trainer rank)
// drives an Engine that serve_remote_engine runs on another rank, through the point-to-point
// messages of backend/collectives.h (MPI between CPU or GPU processes, on one host or several).
//
// The protocol, all JSON but the weights:
//   client -> host   hello {eos ids, engine options, its GPU's UUID, the weights' transport asked}
//                                               -> welcome {transport: nccl (+ NCCL id) or mpi} or {error}
//                    weights {tensors} + the tensors -> ready or {error}
//                    submit {request}           -> submitted {id} or {error}
//                    cancel {id}
//                    update {version, mode, tensors: [name, dtype, shape]} + the tensors
//                                               -> ack {WeightUpdateAck} or {error}
//                    stats                      -> stats {EngineStats}
//                    stop                       (the host's engine finishes, the host returns)
//   host -> client   event {id, EngineEvent}    each request's events, in order, on their own tag
// The tensors travel GPU to GPU over a NCCL pair of the two processes (made at the hello, when the
// trainer and the host are on different GPUs: no host copy, received on a stream of the host's
// own beside the engine's steps, into a device copy of the weights kept between updates), or as
// MPI messages of their bytes through host memory (pinned staging on both sides); in the
// trainer's dtype. The host installs them with the engine's own update protocol (same modes, same
// acknowledgement, same version stamps on every token), so a remote engine keeps every attribution
// guarantee of a local one. Floats travel as JSON numbers, which round-trip exactly: a remote
// run's rollouts equal a local run's bit for bit.
//
// Ownership: a RemoteEngine owns its receiving thread and the streams it feeds; it borrows the
// collectives, which must outlive it. Thread safety: as Engine (submit, cancel, stats,
// update_weights from any thread; calls that wait for an answer are serialised).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/collectives.h"
#include "infer/engine.h"

namespace kiln {

// Connects to the engine host on rank `host`: sends the hello and `initial` weights (every fused
// tensor of a model of `config`, on `backend`) as version `version`, and returns once the host
// acknowledged them. `options` are the host engine's. `weight_transport`: "nccl" (GPU to GPU,
// an error unless the trainer and the host are on two different GPUs with NCCL), "mpi" (messages
// through host memory) or "auto" (NCCL where it can be used); `*chosen_transport` (optional)
// receives the one in use.
Result<std::unique_ptr<EngineApi>> connect_remote_engine(Collectives& link, int32_t host, const ModelConfig& config,
                                                         const ModelWeights& initial, Backend& backend,
                                                         uint64_t version, const std::vector<int32_t>& eos_ids,
                                                         const EngineOptions& options,
                                                         const std::string& weight_transport = "auto",
                                                         std::string* chosen_transport = nullptr);

// The host's side, on rank `link.rank()`: waits for a client's hello (from any rank), builds an
// Engine over a model of `config` on `backend` (its weights from the client), and serves the
// client's messages until it says stop. `tokenizer` (optional) as Engine::create's.
Status serve_remote_engine(Collectives& link, Backend& backend, const ModelConfig& config, const Tokenizer* tokenizer);

}  // namespace kiln
