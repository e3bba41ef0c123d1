// Engines in other processes, the client's side (see remote_engine.h; the host's side is
// remote_engine_host.cpp, the wire format remote_wire.h).
#include "infer/remote_engine.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include "infer/remote_wire.h"

namespace kiln {
namespace {

using namespace remote_wire;

class RemoteEngine final : public EngineApi {
 public:
  RemoteEngine(Collectives& link, int32_t host, ModelTensorLayout layout)
      : link_(&link), host_(host), layout_(std::move(layout)) {
    receiver_ = std::thread([this] { receive_events(); });
  }

  ~RemoteEngine() override {
    {
      std::lock_guard<std::mutex> lock(call_mu_);
      (void)link_->send_message(host_, kTagCommand, json{{"op", "stop"}}.dump());
    }
    if (receiver_.joinable()) receiver_.join();  // until the host's "closed"
  }

  Result<std::shared_ptr<RequestStream>> submit(GenerationRequest request) override {
    std::lock_guard<std::mutex> call(call_mu_);
    const uint64_t id = next_id_++;
    auto stream = std::make_shared<RequestStream>(id);
    {  // registered first: its events may come before the answer
      std::lock_guard<std::mutex> lock(mu_);
      streams_[id] = stream;
    }
    KILN_ASSIGN_OR_RETURN(json reply, call_locked({{"op", "submit"}, {"id", id}, {"request", request_json(request)}}));
    if (reply.contains("error")) {
      std::lock_guard<std::mutex> lock(mu_);
      streams_.erase(id);
      return Status(static_cast<StatusCode>(reply.value("code", static_cast<int>(StatusCode::invalid_argument))),
                    reply.at("error").get<std::string>());
    }
    return stream;
  }

  void cancel(uint64_t id) override {
    std::lock_guard<std::mutex> call(call_mu_);
    (void)link_->send_message(host_, kTagCommand, json{{"op", "cancel"}, {"id", id}}.dump());
  }

  EngineStats stats() const override {
    std::lock_guard<std::mutex> call(call_mu_);
    Result<json> reply = call_locked({{"op", "stats"}});
    return reply.ok() && reply->contains("stats") ? stats_from(reply->at("stats")) : EngineStats{};
  }

  uint64_t policy_version() const override { return version_.load(); }

  Result<WeightUpdateAck> update_weights(const WeightSource& source, uint64_t version, WeightUpdateMode mode) override {
    std::lock_guard<std::mutex> call(call_mu_);
    json header = {{"op", "update"}, {"version", version}, {"mode", weight_update_mode_name(mode)}};
    if (!source.checkpoint_dir.empty()) {
      header["checkpoint_dir"] = source.checkpoint_dir;
      KILN_RETURN_IF_ERROR(link_->send_message(host_, kTagCommand, header.dump()));
    } else {
      if (!source.weights || !source.backend) return invalid_argument("a weight update names no weights");
      KILN_RETURN_IF_ERROR(send_with_weights(header, *source.weights, *source.backend));
    }
    KILN_ASSIGN_OR_RETURN(json reply, wait_reply());
    if (reply.contains("error")) return Status(StatusCode::invalid_argument, reply.at("error").get<std::string>());
    WeightUpdateAck ack;
    const json& a = reply.at("ack");
    a.at("version").get_to(ack.version);
    a.at("aborted").get_to(ack.aborted);
    a.at("kept").get_to(ack.kept);
    a.at("zero_copy").get_to(ack.zero_copy);
    a.at("seconds").get_to(ack.seconds);
    a.at("drain_seconds").get_to(ack.drain_seconds);
    a.at("copy_seconds").get_to(ack.copy_seconds);
    version_ = ack.version;
    return ack;
  }

  // The hello: agrees on the weights' transport, then the host builds its engine on these weights,
  // serving them as options.policy_version.
  Status hello(const std::vector<int32_t>& eos_ids, const EngineOptions& options, const ModelWeights& weights,
               Backend& backend, const std::string& transport) {
    std::lock_guard<std::mutex> call(call_mu_);
    version_ = options.policy_version;
    auto refused = [&](const json& reply) {
      return Status(StatusCode::invalid_argument,
                    "the remote engine on rank " + std::to_string(host_) + ": " + reply.at("error").get<std::string>());
    };
    KILN_ASSIGN_OR_RETURN(json welcome, call_locked({{"op", "hello"},
                                                     {"eos", eos_ids},
                                                     {"options", options_json(options)},
                                                     {"gpu", backend.device_uuid()},
                                                     {"weight_transport", transport}}));
    if (welcome.contains("error")) return refused(welcome);
    if (welcome.at("weight_transport") == "nccl") {
      KILN_ASSIGN_OR_RETURN(nccl_, make_nccl_group(backend, 0, 2, unhex(welcome.at("nccl_id").get<std::string>()),
                                                   kNcclTimeoutSeconds));
    }
    KILN_RETURN_IF_ERROR(send_with_weights({{"op", "weights"}}, weights, backend));
    KILN_ASSIGN_OR_RETURN(json ready, wait_reply());
    if (ready.contains("error")) return refused(ready);
    return Status::Ok();
  }
  const char* weight_transport() const { return nccl_ ? "nccl" : "mpi"; }

 private:
  // `header` with the list of the model's tensors, then each tensor: over NCCL from the device
  // memory it is in, else its bytes, staged on the host one at a time (in pinned memory when they
  // come from a device, kept for the next update).
  Status send_with_weights(json header, const ModelWeights& weights, Backend& backend) {
    json tensors = json::array();
    int64_t largest = 0;
    for (const auto& [name, shape] : layout_.fused) {
      const Tensor t = weights.get(name);
      tensors.push_back({name, static_cast<int>(t.dtype), t.shape.str(), t.nbytes()});
      largest = std::max(largest, t.nbytes());
    }
    header["tensors"] = tensors;
    KILN_RETURN_IF_ERROR(link_->send_message(host_, kTagCommand, header.dump()));
    if (nccl_) {  // asynchronous on the backend's stream, done when the host has them all
      for (const auto& [name, shape] : layout_.fused) KILN_RETURN_IF_ERROR(nccl_->send(backend, weights.get(name), 1));
      return Status::Ok();
    }
    const bool on_host = backend.device().is_cpu();
    if (!on_host && (!staging_.allocated() || staging_.view().nbytes() < largest)) {
      KILN_ASSIGN_OR_RETURN(staging_, pinned_host_empty(backend, {(largest + 1) / 2}, DType::bf16));  // bytes
    }
    for (const auto& [name, shape] : layout_.fused) {
      const Tensor t = weights.get(name);
      const void* bytes = t.data;
      if (!on_host) {
        Tensor host = t;
        host.data = staging_.view().data;
        host.device = Device::cpu();
        backend.copy(host, t);
        KILN_RETURN_IF_ERROR(backend.synchronize());
        bytes = host.data;
      }
      KILN_RETURN_IF_ERROR(link_->send_bytes(host_, kTagWeights, bytes, t.nbytes()));
    }
    return Status::Ok();
  }
  Result<json> call_locked(const json& message) const {
    KILN_RETURN_IF_ERROR(link_->send_message(host_, kTagCommand, message.dump()));
    return wait_reply();
  }
  Result<json> wait_reply() const {
    KILN_ASSIGN_OR_RETURN(auto msg, link_->receive_message(host_, kTagReply));
    return parse(msg.second, "engine host");
  }

  // The host's events into the streams, until it says "closed".
  void receive_events() {
    while (true) {
      Result<std::pair<int32_t, std::string>> msg = link_->receive_message(host_, kTagEvent);
      Result<json> j = msg.ok() ? parse(msg->second, "engine host") : Result<json>(msg.status());
      if (!j.ok() || j->value("op", "") == "closed") {
        // Whatever is still open ends now (a lost host, or a stop with requests in flight).
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& [id, stream] : streams_) {
          EngineEvent e;
          e.finished = true;
          e.finish_reason = "abort";
          e.error = j.ok() ? "" : "the remote engine is gone: " + j.status().message();
          stream->push(std::move(e));
        }
        streams_.clear();
        return;
      }
      uint64_t id = 0;
      EngineEvent e;
      try {
        id = j->at("id").get<uint64_t>();
        e = event_from(j->at("event"));
      } catch (const json::exception& ex) {  // a bug of the other side: the stream ends with it
        e = EngineEvent{};
        e.finished = true;
        e.finish_reason = "abort";
        e.error = std::string("a malformed event from the remote engine: ") + ex.what();
      }
      std::shared_ptr<RequestStream> stream;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = streams_.find(id);
        if (it == streams_.end()) continue;
        stream = it->second;
        if (e.finished) streams_.erase(it);
      }
      stream->push(std::move(e));
    }
  }

  Collectives* link_;
  int32_t host_;
  ModelTensorLayout layout_;
  mutable std::mutex call_mu_;  // one command-and-answer at a time
  uint64_t next_id_ = 1;        // (call_mu_)
  std::atomic<uint64_t> version_{0};
  std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<RequestStream>> streams_;  // open requests (mu_)
  TensorBuffer staging_;  // pinned host bytes for the largest tensor (call_mu_)
  std::unique_ptr<Collectives> nccl_;  // the weights' path when it is NCCL: this rank 0, the host 1
  std::thread receiver_;
};

}  // namespace

Result<std::unique_ptr<EngineApi>> connect_remote_engine(Collectives& link, int32_t host, const ModelConfig& config,
                                                         const ModelWeights& initial, Backend& backend, uint64_t version,
                                                         const std::vector<int32_t>& eos_ids,
                                                         const EngineOptions& options,
                                                         const std::string& weight_transport,
                                                         std::string* chosen_transport) {
  if (host == link.rank() || host < 0 || host >= link.size())
    return invalid_argument("the remote engine's rank " + std::to_string(host) + " is not another rank of the run");
  if (weight_transport != "auto" && weight_transport != "nccl" && weight_transport != "mpi")
    return invalid_argument("the weights' transport is auto, nccl or mpi, not '" + weight_transport + "'");
  auto engine = std::make_unique<RemoteEngine>(link, host, model_tensor_layout(config));
  EngineOptions o = options;
  o.policy_version = version;
  KILN_RETURN_IF_ERROR(engine->hello(eos_ids, o, initial, backend, weight_transport));
  if (chosen_transport) *chosen_transport = engine->weight_transport();
  return std::unique_ptr<EngineApi>(std::move(engine));
}

}  // namespace kiln
