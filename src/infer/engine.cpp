#include "infer/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <new>

#include "infer/engine_internal.h"
#include "infer/executor.h"
#include "infer/structured/token_masks.h"
#include "infer/scheduler.h"
#include "infer/stop_strings.h"

namespace kiln {

// ---------------------------------------------------------------------------------------------
// RequestStream

std::optional<EngineEvent> RequestStream::next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !events_.empty() || drained_; });
  if (events_.empty()) return std::nullopt;
  EngineEvent e = std::move(events_.front());
  events_.pop_front();
  if (e.finished) drained_ = true;
  return e;
}

std::optional<EngineEvent> RequestStream::poll() {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.empty()) return std::nullopt;
  EngineEvent e = std::move(events_.front());
  events_.pop_front();
  if (e.finished) drained_ = true;
  return e;
}

void RequestStream::set_listener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = listener ? std::make_shared<const std::function<void()>>(std::move(listener)) : nullptr;
}

void RequestStream::push(EngineEvent e) {
  std::shared_ptr<const std::function<void()>> listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = e.finished;
    events_.push_back(std::move(e));
    listener = listener_;
  }
  cv_.notify_all();
  if (listener) (*listener)();
}

// ---------------------------------------------------------------------------------------------
// Engine

Engine::Engine(std::shared_ptr<const Transformer> model, const Tokenizer* tokenizer, std::vector<int32_t> eos_ids,
               const EngineOptions& options)
    : model_(std::move(model)), tokenizer_(tokenizer), eos_ids_(std::move(eos_ids)), options_(options) {}

Result<std::unique_ptr<Engine>> Engine::create(std::shared_ptr<const Transformer> model, const Tokenizer* tokenizer,
                                               std::vector<int32_t> eos_ids, const EngineOptions& options) {
  if (!model) return invalid_argument("the engine needs a model");
  std::unique_ptr<Engine> e(new Engine(std::move(model), tokenizer, std::move(eos_ids), options));
  KILN_RETURN_IF_ERROR(e->init());
  e->thread_ = std::thread([p = e.get()] { p->loop(); });
  return e;
}

Status Engine::init() {
  const EngineOptions& o = options_;
  // At most 65535: a step's requests index a CUDA grid dimension in the attention kernels.
  if (o.max_running < 1 || o.max_running > 65535) return invalid_argument("--max-running must be within [1, 65535]");
  // At most 2^30: a step's token count is padded up (to 256) in int32 arithmetic.
  if (o.max_step_tokens < 0 || o.max_step_tokens > (int32_t(1) << 30))
    return invalid_argument("--max-step-tokens must be within [1, 2^30] (0: automatic)");
  if (o.max_step_tokens > 0 && o.max_step_tokens < o.max_running)
    return invalid_argument("--max-step-tokens (" + std::to_string(o.max_step_tokens) +
                            ") must be at least --max-running (" + std::to_string(o.max_running) +
                            "): every running request decodes one token per step");
  const bool cuda = model_->backend().device().is_cuda();
  const int32_t step_tokens =
      o.max_step_tokens > 0 ? o.max_step_tokens
                            : std::max(o.max_running, cuda ? kAutoStepTokensCuda : kAutoStepTokensCpu);
  if (o.mixed_step_tokens < 1) return invalid_argument("--mixed-step-tokens must be positive");
  // Scoring rows are logit rows of a step beside the running requests' (int32 row counts).
  if (o.max_score_rows < 0 || o.max_score_rows > (int32_t(1) << 24))
    return invalid_argument("--max-score-rows must be within [0, 2^24] (0: no prompt scoring)");
  if (o.page_size < 0 || o.page_size > 4096)
    return invalid_argument("--page-size must be within [1, 4096] (0: automatic)");
  if (o.kv_tokens < 0 || o.kv_memory < 0) return invalid_argument("--kv-tokens and --kv-memory must not be negative");
  if (!(o.kv_memory_fraction > 0.0 && o.kv_memory_fraction < 1.0))
    return invalid_argument("the KV memory fraction must be within (0, 1)");
  // The context the model runs exactly (ModelConfig::exact_context).
  const ModelConfig& mc = model_->config();
  const int64_t model_context = mc.exact_context();
  const std::string context_name = mc.exact_context_source();
  int64_t max_seq = o.max_seq_len > 0 ? o.max_seq_len : model_context;
  if (max_seq > model_context)
    return invalid_argument("the sequence limit " + std::to_string(max_seq) + " exceeds the model's context of " +
                            std::to_string(model_context) + " tokens (" + context_name + ")");
  if (max_seq < 1) return invalid_argument("the model's context length must be positive");

  // options() reports what the engine runs with.
  options_.max_step_tokens = step_tokens;
  if (o.page_size == 0) options_.page_size = cuda ? kAutoPageSizeCuda : kAutoPageSizeCpu;
  options_.mixed_step_tokens = std::clamp(o.mixed_step_tokens, o.max_running, step_tokens);

  ExecutorConfig ec;
  ec.page_size = o.page_size;
  ec.max_running = o.max_running;
  ec.max_step_tokens = o.max_step_tokens;
  ec.use_graphs = o.use_graphs;
  ec.kv_memory_fraction = o.kv_memory_fraction;
  ec.max_score_rows = o.max_score_rows;
  const int64_t per_page = Executor::kv_bytes_per_token(*model_) * o.page_size;
  int64_t pages = 0;
  if (o.kv_tokens > 0)
    pages = (o.kv_tokens + o.page_size - 1) / o.page_size;
  else if (o.kv_memory > 0)
    pages = o.kv_memory / per_page;
  if (o.kv_memory > 0 && pages < 1)
    return invalid_argument("--kv-memory " + std::to_string(o.kv_memory) + " bytes holds less than one KV page (" +
                            std::to_string(per_page) + " bytes)");
  // Slots are int32 row indices: at most 2^31 - 1 of them.
  if (pages > INT32_MAX / o.page_size)
    return invalid_argument("the KV pool is too large (2^31 - 1 slots at most); lower --kv-tokens or --kv-memory");
  ec.num_pages = static_cast<int32_t>(pages);  // 0: the executor sizes it from free memory
  ec.max_seq_len = static_cast<int32_t>(max_seq);
  KILN_ASSIGN_OR_RETURN(executor_, Executor::create(*model_, ec));

  SchedulerConfig sc;
  sc.num_pages = executor_->config().num_pages;
  sc.page_size = o.page_size;
  sc.max_running = o.max_running;
  sc.max_step_tokens = o.max_step_tokens;
  sc.mixed_step_tokens = o.mixed_step_tokens;
  sc.prefix_cache = o.prefix_cache;
  sc.max_score_rows = o.max_score_rows;
  scheduler_ = std::make_unique<Scheduler>(sc);
  scheduler_->set_policy_version(o.policy_version);
  stats_.policy_version = o.policy_version;
  model_seq_limit_ = max_seq;
  max_sequence_tokens_ = std::min<int64_t>(max_seq, scheduler_->capacity_tokens());
  stats_.kv_pages_free = sc.num_pages;
  stats_.kv_page_size = sc.page_size;
  return Status::Ok();
}

int32_t Engine::kv_capacity_tokens() const {
  return static_cast<int32_t>(scheduler_->capacity_tokens());
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status Engine::validate(const GenerationRequest& r) const {
  const int64_t vocab = model_->config().vocab_size;
  if (r.prompt.empty()) return invalid_argument("the prompt is empty; give at least one token");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] < 0 || r.prompt[i] >= vocab)
      return invalid_argument("prompt token id " + std::to_string(r.prompt[i]) + " at index " + std::to_string(i) +
                              " is outside the model's vocabulary [0, " + std::to_string(vocab) + ")");
  if (r.max_tokens < 0) return invalid_argument("max_tokens must not be negative");
  if (r.prompt_logprobs_from < 0 || (r.prompt_logprobs_from > 0 && r.prompt_logprobs_from >= static_cast<int64_t>(r.prompt.size())))
    return invalid_argument("prompt_logprobs_from " + std::to_string(r.prompt_logprobs_from) +
                            " must be 0 (off) or a prompt index within [1, " + std::to_string(r.prompt.size() - 1) +
                            "]: the first token has no prediction");
  if (r.prompt_logprobs_from > 0 && options_.max_score_rows <= 0)
    return invalid_argument("prompt log-probabilities need an engine created with max_score_rows > 0");
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
  if (total > max_sequence_tokens_) {
    const bool by_pool = scheduler_->capacity_tokens() < model_seq_limit_;
    return invalid_argument("the prompt (" + std::to_string(r.prompt.size()) + " tokens) plus max_tokens (" +
                            std::to_string(r.max_tokens) + ") exceeds the " +
                            (by_pool ? "KV pool's capacity" : "model's context") + " of " +
                            std::to_string(max_sequence_tokens_) + " tokens");
  }
  if (!std::isfinite(r.temperature) || r.temperature < 0.0f)
    return invalid_argument("temperature must be a finite number >= 0 (0: greedy)");
  if (r.top_k < 0) return invalid_argument("top_k must be >= 0 (0: off)");
  if (!(r.top_p > 0.0f && r.top_p <= 1.0f)) return invalid_argument("top_p must be within (0, 1]");
  if (!(r.min_p >= 0.0f && r.min_p <= 1.0f)) return invalid_argument("min_p must be within [0, 1]");
  if (!(std::isfinite(r.repetition_penalty) && r.repetition_penalty > 0.0f))
    return invalid_argument("repetition_penalty must be > 0 (1: off)");
  if (!(r.frequency_penalty >= -2.0f && r.frequency_penalty <= 2.0f))
    return invalid_argument("frequency_penalty must be within [-2, 2]");
  if (!(r.presence_penalty >= -2.0f && r.presence_penalty <= 2.0f))
    return invalid_argument("presence_penalty must be within [-2, 2]");
  if (r.top_logprobs < 0 || r.top_logprobs > ops::kMaxTopLogprobs)
    return invalid_argument("top_logprobs must be within [0, " + std::to_string(ops::kMaxTopLogprobs) + "]");
  for (int32_t id : r.stop_token_ids)
    if (id < 0 || id >= vocab)
      return invalid_argument("stop token id " + std::to_string(id) + " is outside the vocabulary");
  if (r.logit_bias.size() > static_cast<size_t>(ops::kMaxLogitBias))
    return invalid_argument("at most " + std::to_string(ops::kMaxLogitBias) + " logit biases (" +
                            std::to_string(r.logit_bias.size()) + " given)");
  {
    std::vector<int32_t> ids;
    for (const auto& [id, bias] : r.logit_bias) {
      if (id < 0 || id >= vocab)
        return invalid_argument("logit_bias names token " + std::to_string(id) + ", outside the vocabulary");
      if (!(bias >= -100.0f && bias <= 100.0f))
        return invalid_argument("logit_bias of token " + std::to_string(id) + " must be within [-100, 100]");
      ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
    if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) return invalid_argument("logit_bias names a token twice");
  }
  if (r.stop.size() > static_cast<size_t>(kMaxStopStrings))
    return invalid_argument("at most " + std::to_string(kMaxStopStrings) + " stop strings (" +
                            std::to_string(r.stop.size()) + " given)");
  for (const std::string& s : r.stop) {
    if (s.empty()) return invalid_argument("a stop string must not be empty");
    if (s.size() > static_cast<size_t>(kMaxStopStringBytes))
      return invalid_argument("a stop string is at most " + std::to_string(kMaxStopStringBytes) + " bytes long (one has " +
                              std::to_string(s.size()) + ")");
  }
  if (!r.stop.empty() && !tokenizer_)
    return invalid_argument("stop strings need the model's tokenizer (tokenizer.json), which is not loaded");
  if (r.json_schema && !tokenizer_)
    return invalid_argument("structured output (a JSON schema) needs the model's tokenizer (tokenizer.json), which is not loaded");
  return Status::Ok();
}

Result<std::shared_ptr<RequestStream>> Engine::submit(GenerationRequest request) {
  KILN_RETURN_IF_ERROR(validate(request));
  auto live = std::make_unique<Live>();
  live->request = std::move(request);
  if (tokenizer_)
    live->text = std::make_unique<StopStringMatcher>(*tokenizer_, live->request.stop, live->request.skip_special_tokens);
  if (live->request.json_schema) {
    std::call_once(vocab_once_, [&] {
      token_vocab_ = structured::TokenVocabulary::build(*tokenizer_, static_cast<int32_t>(model_->config().vocab_size));
    });
    live->matcher = std::make_unique<structured::JsonMatcher>(live->request.json_schema);
    live->end_ids = live->request.stop_token_ids;
    if (!live->request.ignore_eos) live->end_ids.insert(live->end_ids.end(), eos_ids_.begin(), eos_ids_.end());
  }
  std::shared_ptr<RequestStream> stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fatal_.empty()) return Status(StatusCode::internal, "the engine stopped after an error: " + fatal_);
    if (stopping_) return Status(StatusCode::internal, "the engine is shutting down");
    live->id = next_id_++;
    stream = std::make_shared<RequestStream>(live->id);
    live->stream = stream;
    inbox_.emplace_back(live->id, std::move(live));
  }
  wake_.notify_all();
  return stream;
}

void Engine::cancel(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(id);
  }
  wake_.notify_all();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Engine::finish(Live& live, const std::string& reason, const std::string& error) {
  if (live.done) return;
  live.done = true;
  EngineEvent e;
  e.finished = true;
  e.finish_reason = reason;
  e.error = error;
  e.stop_string = live.stop_string;
  if (live.text && !live.stopped_by_string) e.text = live.text->flush();  // held-back text goes out
  if (const Sequence* seq = live.retired ? nullptr : scheduler_->find(live.id)) remember_usage(live, *seq);
  e.usage.prompt_tokens = static_cast<int32_t>(live.request.prompt.size());
  e.usage.cached_tokens = live.cached_tokens;
  e.usage.completion_tokens = live.generated;
  e.usage.preemptions = live.preemptions;
  e.finish_version = scheduler_->policy_version();
  e.admission_version = live.admission_version.value_or(e.finish_version);
  live.stream->push(std::move(e));
}

void Engine::remember_usage(Live& live, const Sequence& seq) {
  live.cached_tokens = std::max(seq.cached_prompt_tokens, 0);
  live.preemptions = seq.preemptions;
  if (seq.admission > 0) live.admission_version = seq.first_admission_version;
}

void Engine::retire(Live& live) {
  if (live.retired) return;
  live.retired = true;
  if (const Sequence* seq = scheduler_->find(live.id)) remember_usage(live, *seq);
  if (live.counts_row >= 0) executor_->release_counts_row(live.counts_row);
  live.counts_row = -1;
  scheduler_->remove(live.id);
}

void Engine::queue_arrivals(std::vector<std::pair<uint64_t, std::unique_ptr<Live>>>& arrivals) {
  for (auto& [id, live] : arrivals) {
    if (live->request.max_tokens == 0 && live->request.prompt_logprobs_from == 0) {
      finish(*live, "length");
      continue;
    }
    scheduler_->add(id, live->request.prompt, live->request.prompt_logprobs_from);
    prompt_total_ += static_cast<int64_t>(live->request.prompt.size());
    live_.emplace(id, std::move(live));
  }
}

void Engine::drain_inbox() {
  std::vector<std::pair<uint64_t, std::unique_ptr<Live>>> arrivals;
  std::vector<uint64_t> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    arrivals.swap(inbox_);
    cancels.swap(cancels_);
  }
  queue_arrivals(arrivals);
  if (!cancels.empty()) deliver_pending();  // a cancelled request's earlier tokens go out first
  for (uint64_t id : cancels) {
    auto it = live_.find(id);
    if (it == live_.end()) continue;
    finish(*it->second, "abort");
    retire(*it->second);
    live_.erase(it);
  }
}

int32_t Engine::abort_admitted() {
  deliver_pending();  // tokens already computed go out before the final event
  std::vector<uint64_t> ended;
  for (auto& [id, live] : live_) {
    const Sequence* seq = live->retired ? nullptr : scheduler_->find(id);
    if (!seq || seq->admission == 0) continue;
    finish(*live, "abort");
    retire(*live);
    ended.push_back(id);
  }
  for (uint64_t id : ended) live_.erase(id);
  return static_cast<int32_t>(ended.size());
}

void Engine::fail_all(const std::string& message) {
  while (executor_->in_flight()) (void)executor_->wait();  // a step launched ahead of the failed one
  pending_.clear();
  retire_after_step_.clear();
  refuse_updates("the engine stopped after an error: " + message);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fatal_ = message;
  }
  for (auto& [id, live] : live_) {
    finish(*live, "abort", message);
    retire(*live);
  }
  live_.clear();
}

void Engine::publish_stats() {
  const double t = now_seconds();
  rate_window_.emplace_back(t, generated_total_);
  while (rate_window_.size() > 2 && rate_window_.front().first < t - 3.0) rate_window_.pop_front();
  EngineStats s;
  s.running = scheduler_->running_count();
  s.waiting = scheduler_->waiting_count();
  s.kv_pages_used = scheduler_->pool().used_pages();
  s.kv_pages_free = scheduler_->pool().free_pages();
  s.kv_pages_cached = scheduler_->radix().cached_pages();
  s.kv_page_size = scheduler_->config().page_size;
  s.prompt_tokens = prompt_total_;
  s.generated_tokens = generated_total_;
  s.steps = steps_;
  s.preemptions = preemptions_;
  s.graph_replays = executor_->graph_replays();
  s.lookahead_steps = lookahead_steps_;
  s.step_seconds = step_seconds_;
  s.schedule_seconds = schedule_seconds_;
  s.deliver_seconds = deliver_seconds_;
  s.executor_seconds = executor_->run_seconds();
  s.device_wait_seconds = executor_->wait_seconds();
  s.pack_seconds = executor_->pack_seconds();
  s.issue_seconds = executor_->issue_seconds();
  s.graph_launch_seconds = executor_->graph_launch_seconds();
  s.graph_device_seconds = executor_->graph_device_seconds();
  s.graph_gap_seconds = executor_->graph_gap_seconds();
  s.graph_gaps = executor_->graph_gaps();
  s.full_bucket_replays = executor_->full_bucket_replays();
  s.full_bucket_seconds = executor_->full_bucket_seconds();
  s.policy_version = scheduler_->policy_version();
  s.prefix_hit_tokens = hits_total_;
  s.weight_updates = updates_done_;
  s.cross_version_hits = scheduler_->cross_version_hits();
  const auto& [t0, g0] = rate_window_.front();
  s.tokens_per_second = t > t0 ? static_cast<double>(generated_total_ - g0) / (t - t0) : 0.0;
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = s;
}

void Engine::loop() {
  while (true) {
    bool updating = false;  // an update or a flush waits (one arriving later is seen next round)
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] {
        return stopping_ || !inbox_.empty() || !cancels_.empty() || !updates_.empty() || flush_requested_ ||
               !scheduler_->idle();
      });
      if (stopping_) break;
      updating = !updates_.empty() || flush_requested_;
    }
    drain_inbox();
    if (updating || !scheduler_->idle()) {
      const double t0 = now_seconds();
      // The engine thread's error boundary: what a step or an update throws (host memory running
      // out, a bug) ends the running requests with the reason, as a failed step's status does,
      // instead of taking the process down with every caller.
      try {
        if (updating) process_updates();
        if (!scheduler_->idle()) step();
      } catch (const OutOfMemory& e) {
        fail_all(std::string(e.what()) + " in an engine step; lower --max-running or --max-step-tokens");
      } catch (const std::bad_alloc&) {
        fail_all("out of host memory in an engine step; lower --max-running or --max-step-tokens");
      } catch (const std::exception& e) {
        fail_all(std::string("an engine step failed: ") + e.what());
      }
      step_seconds_ += now_seconds() - t0;
    }
    if (scheduler_->idle()) deliver_pending();  // nothing left to overlap with
    publish_stats();
  }
  drain_inbox();
  deliver_pending();
  refuse_updates("the engine shut down");
  for (auto& [id, live] : live_) {
    finish(*live, "abort", "the engine shut down");
    retire(*live);
  }
  live_.clear();
}

}  // namespace kiln
