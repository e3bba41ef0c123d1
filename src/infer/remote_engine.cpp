// Engines in other processes (see remote_engine.h).
#include "infer/remote_engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "kernels/ops.h"

namespace kiln {
namespace {

using json = nlohmann::json;

constexpr int32_t kTagCommand = 10;  // client -> host: JSON commands
constexpr int32_t kTagWeights = 11;  // client -> host: one tensor's bytes
constexpr int32_t kTagReply = 20;    // host -> client: answers to commands that wait for one
constexpr int32_t kTagEvent = 21;    // host -> client: request events, then "closed"
constexpr double kNcclTimeoutSeconds = 600;  // the most one transfer of the weights over NCCL may take

json request_json(const GenerationRequest& r) {
  return {{"prompt", r.prompt},
          {"max_tokens", r.max_tokens},
          {"temperature", r.temperature},
          {"top_k", r.top_k},
          {"top_p", r.top_p},
          {"min_p", r.min_p},
          {"repetition_penalty", r.repetition_penalty},
          {"frequency_penalty", r.frequency_penalty},
          {"presence_penalty", r.presence_penalty},
          {"seed", r.seed},
          {"stop_token_ids", r.stop_token_ids},
          {"stop", r.stop},
          {"ignore_eos", r.ignore_eos},
          {"logprobs", r.logprobs},
          {"top_logprobs", r.top_logprobs},
          {"behaviour_logprobs", r.behaviour_logprobs},
          {"skip_special_tokens", r.skip_special_tokens},
          {"prompt_logprobs_from", r.prompt_logprobs_from}};
}

GenerationRequest request_from(const json& j) {
  GenerationRequest r;
  j.at("prompt").get_to(r.prompt);
  j.at("max_tokens").get_to(r.max_tokens);
  j.at("temperature").get_to(r.temperature);
  j.at("top_k").get_to(r.top_k);
  j.at("top_p").get_to(r.top_p);
  j.at("min_p").get_to(r.min_p);
  j.at("repetition_penalty").get_to(r.repetition_penalty);
  j.at("frequency_penalty").get_to(r.frequency_penalty);
  j.at("presence_penalty").get_to(r.presence_penalty);
  j.at("seed").get_to(r.seed);
  j.at("stop_token_ids").get_to(r.stop_token_ids);
  j.at("stop").get_to(r.stop);
  j.at("ignore_eos").get_to(r.ignore_eos);
  j.at("logprobs").get_to(r.logprobs);
  j.at("top_logprobs").get_to(r.top_logprobs);
  j.at("behaviour_logprobs").get_to(r.behaviour_logprobs);
  j.at("skip_special_tokens").get_to(r.skip_special_tokens);
  j.at("prompt_logprobs_from").get_to(r.prompt_logprobs_from);
  return r;
}

json event_json(const EngineEvent& e) {
  json tokens = json::array();
  for (const GeneratedToken& t : e.tokens) tokens.push_back({t.id, t.logprob, t.policy_version, t.top});
  return {{"tokens", tokens},
          {"prompt_logprobs", e.prompt_logprobs},
          {"text", e.text},
          {"finished", e.finished},
          {"finish_reason", e.finish_reason},
          {"stop_string", e.stop_string},
          {"error", e.error},
          {"usage", {e.usage.prompt_tokens, e.usage.cached_tokens, e.usage.completion_tokens, e.usage.preemptions}},
          {"admission_version", e.admission_version},
          {"finish_version", e.finish_version}};
}

EngineEvent event_from(const json& j) {
  EngineEvent e;
  for (const json& t : j.at("tokens")) {
    GeneratedToken g;
    t.at(0).get_to(g.id);
    t.at(1).get_to(g.logprob);
    t.at(2).get_to(g.policy_version);
    t.at(3).get_to(g.top);
    e.tokens.push_back(std::move(g));
  }
  j.at("prompt_logprobs").get_to(e.prompt_logprobs);
  j.at("text").get_to(e.text);
  j.at("finished").get_to(e.finished);
  j.at("finish_reason").get_to(e.finish_reason);
  j.at("stop_string").get_to(e.stop_string);
  j.at("error").get_to(e.error);
  const json& u = j.at("usage");
  e.usage = {u.at(0).get<int32_t>(), u.at(1).get<int32_t>(), u.at(2).get<int32_t>(), u.at(3).get<int32_t>()};
  j.at("admission_version").get_to(e.admission_version);
  j.at("finish_version").get_to(e.finish_version);
  return e;
}

json options_json(const EngineOptions& o) {
  return {{"max_running", o.max_running},   {"max_step_tokens", o.max_step_tokens},
          {"page_size", o.page_size},       {"kv_tokens", o.kv_tokens},
          {"kv_memory", o.kv_memory},       {"kv_memory_fraction", o.kv_memory_fraction},
          {"max_seq_len", o.max_seq_len},   {"prefix_cache", o.prefix_cache},
          {"use_graphs", o.use_graphs},     {"policy_version", o.policy_version},
          {"max_score_rows", o.max_score_rows}, {"lookahead", o.lookahead}};
}

EngineOptions options_from(const json& j) {
  EngineOptions o;
  j.at("max_running").get_to(o.max_running);
  j.at("max_step_tokens").get_to(o.max_step_tokens);
  j.at("page_size").get_to(o.page_size);
  j.at("kv_tokens").get_to(o.kv_tokens);
  j.at("kv_memory").get_to(o.kv_memory);
  j.at("kv_memory_fraction").get_to(o.kv_memory_fraction);
  j.at("max_seq_len").get_to(o.max_seq_len);
  j.at("prefix_cache").get_to(o.prefix_cache);
  j.at("use_graphs").get_to(o.use_graphs);
  j.at("policy_version").get_to(o.policy_version);
  j.at("max_score_rows").get_to(o.max_score_rows);
  j.at("lookahead").get_to(o.lookahead);
  return o;
}

json stats_json(const EngineStats& s) {
  return {s.running, s.waiting, s.kv_pages_used, s.kv_pages_free, s.kv_page_size, s.kv_pages_cached,
          s.prompt_tokens, s.prefix_hit_tokens, s.generated_tokens, s.steps, s.preemptions, s.graph_replays,
          s.tokens_per_second, s.policy_version, s.weight_updates, s.cross_version_hits, s.lookahead_steps};
}

EngineStats stats_from(const json& j) {
  EngineStats s;
  j.at(0).get_to(s.running);
  j.at(1).get_to(s.waiting);
  j.at(2).get_to(s.kv_pages_used);
  j.at(3).get_to(s.kv_pages_free);
  j.at(4).get_to(s.kv_page_size);
  j.at(5).get_to(s.kv_pages_cached);
  j.at(6).get_to(s.prompt_tokens);
  j.at(7).get_to(s.prefix_hit_tokens);
  j.at(8).get_to(s.generated_tokens);
  j.at(9).get_to(s.steps);
  j.at(10).get_to(s.preemptions);
  j.at(11).get_to(s.graph_replays);
  j.at(12).get_to(s.tokens_per_second);
  j.at(13).get_to(s.policy_version);
  j.at(14).get_to(s.weight_updates);
  j.at(15).get_to(s.cross_version_hits);
  j.at(16).get_to(s.lookahead_steps);
  return s;
}

// Bytes as hex digits in JSON (NCCL's unique id), and back.
std::string hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}
std::string unhex(const std::string& digits) {
  auto value = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::string out;
  for (size_t i = 0; i + 1 < digits.size(); i += 2)
    out += static_cast<char>(value(digits[i]) * 16 + value(digits[i + 1]));
  return out;
}

// Parses a message of the protocol; a malformed one is a bug of the other side, reported as such.
Result<json> parse(const std::string& bytes, const char* from) {
  json j = json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status(StatusCode::internal, std::string("a malformed remote-engine message from the ") + from);
  return j;
}

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

namespace {

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
