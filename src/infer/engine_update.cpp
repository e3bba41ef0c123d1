// Engine weight updates and prefix-cache flushes: the transaction of infer/engine.h, run by the
// engine thread between two steps.
#include <chrono>
#include <future>

#include "infer/engine.h"
#include "infer/executor.h"
#include "infer/scheduler.h"
#include "model/config.h"

namespace kiln {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What must agree between the engine's model and a checkpoint beyond the tensor shapes.
Status check_same_architecture(const ModelConfig& a, const ModelConfig& b, const std::string& where) {
  auto differs = [&](const std::string& key, const std::string& x, const std::string& y) {
    return invalid_argument(where + ": " + key + " is " + y + " where the engine's model has " + x +
                            "; a weight update must keep the architecture");
  };
  if (a.architecture != b.architecture) return differs("the architecture", a.architecture_class, b.architecture_class);
  if (a.rms_norm_eps != b.rms_norm_eps)
    return differs("rms_norm_eps", std::to_string(a.rms_norm_eps), std::to_string(b.rms_norm_eps));
  if (a.tie_word_embeddings != b.tie_word_embeddings)
    return differs("tie_word_embeddings", std::to_string(a.tie_word_embeddings), std::to_string(b.tie_word_embeddings));
  if (a.rope.theta != b.rope.theta) return differs("rope_theta", std::to_string(a.rope.theta), std::to_string(b.rope.theta));
  if (a.rope != b.rope) return differs("rope_scaling", a.rope.type, b.rope.type + " (or its factors)");
  return Status::Ok();
}

}  // namespace

Result<WeightUpdateMode> parse_weight_update_mode(const std::string& s) {
  if (s == "sync") return WeightUpdateMode::sync;
  if (s == "abort") return WeightUpdateMode::abort;
  if (s == "keep") return WeightUpdateMode::keep;
  return invalid_argument("unknown weight update mode '" + s + "'; use sync, abort or keep");
}

const char* weight_update_mode_name(WeightUpdateMode m) {
  switch (m) {
    case WeightUpdateMode::sync: return "sync";
    case WeightUpdateMode::abort: return "abort";
    case WeightUpdateMode::keep: return "keep";
  }
  return "?";
}

struct Engine::Update {
  WeightSource source;
  uint64_t version = 0;
  WeightUpdateMode mode = WeightUpdateMode::sync;
  std::chrono::steady_clock::time_point called;
  std::chrono::steady_clock::time_point drain_started;
  bool draining = false;
  std::promise<Result<WeightUpdateAck>> done;
};

uint64_t Engine::policy_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.policy_version;
}

Result<WeightUpdateAck> Engine::update_weights(const WeightSource& source, uint64_t version, WeightUpdateMode mode) {
  if (std::this_thread::get_id() == thread_.get_id())
    return invalid_argument("update_weights must not be called from the engine thread");
  const bool in_process = source.weights != nullptr;
  if (in_process == !source.checkpoint_dir.empty())
    return invalid_argument("a weight update needs exactly one source: in-process weights or a checkpoint folder");
  if (in_process && !source.backend) return invalid_argument("in-process weights need the backend they live on");
  auto update = std::make_shared<Update>();
  update->source = source;
  update->version = version;
  update->mode = mode;
  update->called = std::chrono::steady_clock::now();
  // The source's writes (an optimizer step) are complete before the engine reads them.
  if (in_process) KILN_RETURN_IF_ERROR(source.backend->synchronize());
  std::future<Result<WeightUpdateAck>> ack = update->done.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fatal_.empty()) return Status(StatusCode::internal, "the engine stopped after an error: " + fatal_);
    if (stopping_) return Status(StatusCode::internal, "the engine is shutting down");
    updates_.push_back(update);
  }
  wake_.notify_all();
  return ack.get();
}

void Engine::refuse_updates(const std::string& why) {
  std::deque<std::shared_ptr<Update>> updates;
  {
    std::lock_guard<std::mutex> lock(mu_);
    updates.swap(updates_);
  }
  for (auto& u : updates) u->done.set_value(Status(StatusCode::internal, "weight update refused: " + why));
  scheduler_->set_admission_open(true);
}

void Engine::flush_prefix_cache() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    flush_requested_ = true;
  }
  wake_.notify_all();
}

Result<bool> Engine::install_weights(const WeightSource& source) {
  const ModelWeights& own = model_->weights();
  const ModelTensorLayout layout = model_tensor_layout(model_->config());
  Backend& be = model_->backend();
  std::unique_ptr<Transformer> loaded;  // a checkpoint, complete before anything is replaced
  const ModelWeights* from = source.weights;
  if (!from) {
    KILN_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(source.checkpoint_dir));
    KILN_RETURN_IF_ERROR(check_same_architecture(model_->config(), config, config.source));
    KILN_ASSIGN_OR_RETURN(loaded, Transformer::load(be, source.checkpoint_dir));
    from = &loaded->weights();
  }
  bool zero_copy = true;
  for (const auto& [name, shape] : layout.fused) {
    if (!from->has(name)) return invalid_argument("the new weights have no tensor " + name);
    const Tensor src = from->get(name), dst = own.get(name);
    if (src.shape != shape)
      return invalid_argument("the new weights' " + name + " has shape " + src.shape.str() + " where the model has " +
                              shape.str());
    if (src.dtype != dst.dtype && src.device != dst.device)
      return invalid_argument("the new weights' " + name + " is " + dtype_name(src.dtype) + " on " + src.device.str() +
                              ": give " + dtype_name(dst.dtype) + " weights, or weights on " + dst.device.str());
    zero_copy = zero_copy && src.data == dst.data;
  }
  if (zero_copy) return true;
  for (const auto& [name, shape] : layout.fused) {
    const Tensor src = from->get(name), dst = own.get(name);
    if (src.dtype == dst.dtype)
      be.copy(dst, src);
    else
      ops::cast(be, dst, src);
  }
  KILN_RETURN_IF_ERROR(be.synchronize());
  return false;
}

void Engine::process_updates() {
  bool flush = false;
  std::shared_ptr<Update> u;
  {
    std::lock_guard<std::mutex> lock(mu_);
    flush = std::exchange(flush_requested_, false);
    if (!updates_.empty()) u = updates_.front();
  }
  if (flush) scheduler_->flush_prefix_cache();
  if (!u) return;
  auto pop = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    updates_.pop_front();
  };
  const uint64_t current = scheduler_->policy_version();
  if (u->version <= current) {
    pop();
    u->done.set_value(invalid_argument("weight version " + std::to_string(u->version) +
                                       " is not newer than the version serving, " + std::to_string(current) +
                                       ": versions must increase strictly"));
    return;
  }
  WeightUpdateAck ack;
  if (u->mode == WeightUpdateMode::sync) {
    if (!u->draining) {
      u->draining = true;
      u->drain_started = std::chrono::steady_clock::now();
      scheduler_->set_admission_open(false);
    }
    if (scheduler_->admitted_count() > 0) return;  // the requests in flight finish first
    ack.drain_seconds = seconds_since(u->drain_started);
  }
  if (u->mode == WeightUpdateMode::abort) {
    ack.aborted = abort_admitted();
  }
  if (u->mode == WeightUpdateMode::keep) ack.kept = scheduler_->admitted_count();
  const auto t_copy = std::chrono::steady_clock::now();
  Result<bool> zero_copy = install_weights(u->source);
  ack.copy_seconds = seconds_since(t_copy);
  scheduler_->set_admission_open(true);
  pop();
  if (!zero_copy.ok()) {
    const Status& st = zero_copy.status();
    u->done.set_value(Status(st.code(), "weight update to version " + std::to_string(u->version) +
                                            " refused; version " + std::to_string(current) +
                                            " keeps serving: " + st.message()));
    return;
  }
  ack.zero_copy = *zero_copy;
  scheduler_->set_policy_version(u->version);
  ++updates_done_;
  publish_stats();
  ack.version = u->version;
  ack.seconds = seconds_since(u->called);
  u->done.set_value(ack);
}

}  // namespace kiln
