// Engines in other processes, the host's side: serve_remote_engine (see remote_engine.h; the client
// is remote_engine.cpp, the wire format remote_wire.h).
#include "infer/remote_engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "infer/remote_wire.h"
#include "kernels/ops.h"

namespace kiln {
namespace {

using namespace remote_wire;

// The host's forwarding of its streams' events to the client, on a thread of its own.
class Forwarder {
 public:
  Forwarder(Collectives& link, int32_t client) : link_(&link), client_(client) {
    thread_ = std::thread([this] { run(); });
  }
  ~Forwarder() { close(); }

  void add(uint64_t client_id, std::shared_ptr<RequestStream> stream) {
    stream->set_listener([this] { wake(); });
    std::lock_guard<std::mutex> lock(mu_);
    streams_.emplace_back(client_id, std::move(stream));
    cv_.notify_all();
  }
  // Forwards what is left (the engine has finished every stream), then "closed".
  void close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) return;
      closing_ = true;
      cv_.notify_all();
    }
    thread_.join();
    (void)link_->send_message(client_, kTagEvent, json{{"op", "closed"}}.dump());
  }

 private:
  void wake() {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = true;
    cv_.notify_all();
  }
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return pending_ || closing_; });
      pending_ = false;
      std::vector<std::pair<uint64_t, std::shared_ptr<RequestStream>>> streams = streams_;
      lock.unlock();
      std::vector<uint64_t> done;
      for (auto& [id, stream] : streams)
        while (std::optional<EngineEvent> e = stream->poll()) {
          (void)link_->send_message(client_, kTagEvent, json{{"op", "event"}, {"id", id}, {"event", event_json(*e)}}.dump());
          if (e->finished) done.push_back(id);
        }
      lock.lock();
      std::erase_if(streams_, [&](const auto& s) { return std::find(done.begin(), done.end(), s.first) != done.end(); });
      if (closing_ && streams_.empty()) return;
    }
  }

  Collectives* link_;
  int32_t client_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<uint64_t, std::shared_ptr<RequestStream>>> streams_;
  bool pending_ = false, closing_ = false;
  std::thread thread_;
};

// Where the client's weights arrive, kept from one update to the next: over NCCL, device tensors
// that `be` (a backend of the engine's device with a stream of its own, so that the transfer
// overlaps the engine's steps) receives into; else host tensors (pinned when the engine is on a
// device, for its copy) that the messages fill.
struct ReceivedWeights {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Collectives> nccl;  // the client is its rank 0, this host 1; null: messages
  std::map<std::string, TensorBuffer> buffers;
  ModelWeights weights;
};
// Receives the tensors the client lists. Returns a transport error; `*fits` says whether the
// weights fit the model (when they do not, every message is still received, so that the
// conversation stays in step).
Status receive_weights(Collectives& link, int32_t client, const json& tensors, const ModelTensorLayout& layout,
                       Backend& engine_be, ReceivedWeights& into, Status* fits) {
  Status& error = *fits;
  error = Status::Ok();
  for (const json& t : tensors) {
    const std::string name = t.at(0).get<std::string>();
    const DType dtype = static_cast<DType>(t.at(1).get<int>());
    const int64_t nbytes = t.at(3).get<int64_t>();
    auto shape = std::find_if(layout.fused.begin(), layout.fused.end(), [&](const auto& f) { return f.first == name; });
    const bool fit = shape != layout.fused.end() && shape->second.str() == t.at(2).get<std::string>() &&
                     nbytes == shape->second.numel() * dtype_size(dtype);
    if (!fit && into.nccl) {  // the client sends them anyway: the transfer cannot be skipped
      return Status(StatusCode::internal, "the trainer's tensor " + name + " does not fit this engine's model");
    }
    if (!fit) {
      std::string discard(static_cast<size_t>(std::max<int64_t>(nbytes, 0)), '\0');
      KILN_RETURN_IF_ERROR(link.receive_bytes(client, kTagWeights, discard.data(), nbytes));
      error = invalid_argument("the weights' tensor " + name + " does not fit this engine's model");
      continue;
    }
    TensorBuffer& buf = into.buffers[name];
    if (!buf.allocated() || buf.view().dtype != dtype) {
      if (into.nccl) {
        KILN_ASSIGN_OR_RETURN(buf, empty(*into.be, shape->second, dtype));
      } else if (engine_be.device().is_cpu()) {
        buf = host_empty(shape->second, dtype);
      } else {
        KILN_ASSIGN_OR_RETURN(buf, pinned_host_empty(engine_be, shape->second, dtype));
      }
    }
    if (into.nccl) {
      KILN_RETURN_IF_ERROR(into.nccl->receive(*into.be, buf.view(), 0));
    } else {
      KILN_RETURN_IF_ERROR(link.receive_bytes(client, kTagWeights, buf.view().data, nbytes));
    }
    into.weights.set(name, buf.view());
  }
  return into.be->synchronize();  // the NCCL receives are complete
}

// The weights' transport the client asks for ("auto", "nccl" or "mpi") and this host's answer:
// NCCL between two different GPUs when NCCL is there, else MPI messages through the host's memory.
Result<json> choose_weight_transport(const json& hello, Backend& engine_be) {
  const std::string asked = hello.at("weight_transport").get<std::string>();
  const std::string client_gpu = hello.at("gpu").get<std::string>();
  std::string why_not;
  const std::string trainer_on = client_gpu.empty() ? "the CPU" : "a GPU";
  if (client_gpu.empty() || !engine_be.device().is_cuda())
    why_not = "NCCL moves weights between GPUs, and the trainer is on " + trainer_on + ", this engine on " +
              engine_be.device().str();
  else if (client_gpu == engine_be.device_uuid())
    why_not = "the trainer and this engine share one GPU (" + engine_be.device().str() + "), which NCCL cannot connect";
  json welcome = {{"op", "welcome"}, {"weight_transport", "mpi"}};
  if (asked == "mpi" || (asked == "auto" && !why_not.empty())) return welcome;
  if (!why_not.empty()) return json{{"error", "--weight-transport nccl: " + why_not}};
  Result<std::string> id = make_nccl_id();
  if (!id.ok()) {
    if (asked == "nccl") return json{{"error", "--weight-transport nccl: " + id.status().message()}};
    return welcome;
  }
  welcome["weight_transport"] = "nccl";
  welcome["nccl_id"] = hex(*id);
  return welcome;
}

// The host's command loop, until the client says stop.
Status serve_commands(Collectives& link, int32_t client, Engine& engine, Backend& engine_be,
                      const ModelTensorLayout& layout, Forwarder& forwarder, ReceivedWeights& received) {
  auto reply = [&](const json& j) { return link.send_message(client, kTagReply, j.dump()); };
  std::map<uint64_t, uint64_t> engine_ids;  // client id -> engine id
  while (true) {
    KILN_ASSIGN_OR_RETURN(auto msg, link.receive_message(client, kTagCommand));
    KILN_ASSIGN_OR_RETURN(json j, parse(msg.second, "client"));
    const std::string op = j.value("op", "");
    if (op == "stop") return Status::Ok();
    if (op == "submit") {
      const uint64_t id = j.at("id").get<uint64_t>();
      Result<std::shared_ptr<RequestStream>> s = engine.submit(request_from(j.at("request")));
      if (!s.ok()) {
        KILN_RETURN_IF_ERROR(reply({{"error", s.status().message()}, {"code", static_cast<int>(s.status().code())}}));
        continue;
      }
      engine_ids[id] = (*s)->id();
      forwarder.add(id, *s);
      KILN_RETURN_IF_ERROR(reply({{"op", "submitted"}}));
    } else if (op == "cancel") {
      auto it = engine_ids.find(j.at("id").get<uint64_t>());
      if (it != engine_ids.end()) engine.cancel(it->second);
    } else if (op == "stats") {
      KILN_RETURN_IF_ERROR(reply({{"stats", stats_json(engine.stats())}}));
    } else if (op == "update") {
      KILN_ASSIGN_OR_RETURN(WeightUpdateMode mode, parse_weight_update_mode(j.at("mode").get<std::string>()));
      const uint64_t version = j.at("version").get<uint64_t>();
      Result<WeightUpdateAck> ack = Status::Ok();
      if (j.contains("checkpoint_dir")) {
        ack = engine.update_weights(WeightSource::checkpoint(j.at("checkpoint_dir").get<std::string>()), version, mode);
      } else {
        Status fits = Status::Ok();
        KILN_RETURN_IF_ERROR(receive_weights(link, client, j.at("tensors"), layout, engine_be, received, &fits));
        ack = fits.ok() ? engine.update_weights(WeightSource::in_process(received.weights, *received.be), version, mode)
                        : Result<WeightUpdateAck>(fits);
      }
      if (!ack.ok()) {
        KILN_RETURN_IF_ERROR(reply({{"error", ack.status().message()}}));
        continue;
      }
      KILN_RETURN_IF_ERROR(reply({{"ack",
                                   {{"version", ack->version},
                                    {"aborted", ack->aborted},
                                    {"kept", ack->kept},
                                    {"zero_copy", ack->zero_copy},
                                    {"seconds", ack->seconds},
                                    {"drain_seconds", ack->drain_seconds},
                                    {"copy_seconds", ack->copy_seconds}}}}));
    } else {
      return Status(StatusCode::internal, "the remote engine's client sent an unknown command '" + op + "'");
    }
  }
}


Status serve_remote_engine_unchecked(Collectives& link, Backend& backend, const ModelConfig& config,
                                     const Tokenizer* tokenizer) {
  // The hello, from whichever rank is the client.
  KILN_ASSIGN_OR_RETURN(auto first, link.receive_message(-1, kTagCommand));
  const int32_t client = first.first;
  auto reply = [&](const json& j) { return link.send_message(client, kTagReply, j.dump()); };
  KILN_ASSIGN_OR_RETURN(json hello, parse(first.second, "client"));
  if (hello.value("op", "") != "hello") return Status(StatusCode::internal, "the remote engine's client did not say hello");
  // The weights' transport: NCCL from the trainer's GPU into this one's, or MPI messages.
  KILN_ASSIGN_OR_RETURN(json welcome, choose_weight_transport(hello, backend));
  KILN_RETURN_IF_ERROR(reply(welcome));
  if (welcome.contains("error")) return invalid_argument(welcome.at("error").get<std::string>());
  ReceivedWeights received;
  if (welcome.at("weight_transport") == "nccl") {
    KILN_ASSIGN_OR_RETURN(received.be, make_backend(backend.device()));
    const std::string id = unhex(welcome.at("nccl_id").get<std::string>());
    KILN_ASSIGN_OR_RETURN(received.nccl, make_nccl_group(*received.be, 1, 2, id, kNcclTimeoutSeconds));
  } else {
    received.be = make_cpu_backend();
  }
  KILN_ASSIGN_OR_RETURN(auto weights_msg, link.receive_message(client, kTagCommand));
  KILN_ASSIGN_OR_RETURN(json weights, parse(weights_msg.second, "client"));
  const ModelTensorLayout layout = model_tensor_layout(config);
  Status fits = Status::Ok();
  KILN_RETURN_IF_ERROR(receive_weights(link, client, weights.at("tensors"), layout, backend, received, &fits));
  Result<std::unique_ptr<Engine>> created = [&]() -> Result<std::unique_ptr<Engine>> {
    KILN_RETURN_IF_ERROR(fits);
    KILN_RETURN_IF_ERROR(received.weights.check(layout, received.buffers.begin()->second.view().dtype,
                                                received.be->device()));
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> model, Transformer::random(backend, config, 0));
    for (const auto& [name, shape] : layout.fused) {  // the client's weights, in the model's dtype
      const Tensor src = received.weights.get(name), dst = model->weights().get(name);
      if (src.dtype == dst.dtype) {
        backend.copy(dst, src);
      } else if (src.device == dst.device) {
        ops::cast(backend, dst, src);
      } else {
        return invalid_argument("the trainer's weights are " + std::string(dtype_name(src.dtype)) + ", the engine's " +
                                dtype_name(dst.dtype) + " on " + backend.device().str());
      }
    }
    KILN_RETURN_IF_ERROR(backend.synchronize());
    return Engine::create(std::move(model), tokenizer, hello.at("eos").get<std::vector<int32_t>>(),
                          options_from(hello.at("options")));
  }();
  if (!created.ok()) {
    KILN_RETURN_IF_ERROR(reply({{"error", created.status().message()}}));
    return created.status();
  }
  std::unique_ptr<Engine> engine = std::move(*created);
  KILN_RETURN_IF_ERROR(reply({{"op", "ready"}}));
  Forwarder forwarder(link, client);
  Status served = Status::Ok();
  try {
    served = serve_commands(link, client, *engine, backend, layout, forwarder, received);
  } catch (const json::exception& e) {  // a message without the fields the protocol names
    served = Status(StatusCode::internal, std::string("a malformed command from the remote engine's client: ") + e.what());
  }
  engine.reset();  // every open request ends ("abort"); the forwarder sends what is left, then "closed"
  forwarder.close();
  return served;
}

}  // namespace

Status serve_remote_engine(Collectives& link, Backend& backend, const ModelConfig& config, const Tokenizer* tokenizer) {
  try {
    return serve_remote_engine_unchecked(link, backend, config, tokenizer);
  } catch (const json::exception& e) {  // a hello without the fields the protocol names
    return Status(StatusCode::internal, std::string("a malformed hello from the remote engine's client: ") + e.what());
  }
}

}  // namespace kiln
