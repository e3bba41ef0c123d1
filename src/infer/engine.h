// Engine: kiln's inference engine, the one path every generating command, the server and RL
// rollouts go through. Requests are submitted from any thread; one engine thread runs the steps
// (scheduler -> executor -> sampling -> events), continuously batching every running request over a
// shared, paged KV pool with radix prefix reuse (infer/scheduler.h, infer/executor.h).
//
// Every generated token carries the policy version of the weights that produced it (0 until the RL
// layer updates weights); prefix KV is only reused from pages of the engine's current version.
// The model's weights have one owner (the shared_ptr given to create); the RL layer will replace it
// between steps.
//
// Ownership: the Engine owns its thread, scheduler and executor; the caller keeps the model (shared)
// and the tokenizer (if any) alive while the engine runs. Thread safety: submit, cancel and stats
// may be called from any thread; a RequestStream is read by one consumer at a time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "model/tokenizer.h"
#include "model/transformer.h"

namespace kiln {

class Scheduler;
class Executor;
struct StepPlan;
struct SampledToken;

struct GenerationRequest {
  std::vector<int32_t> prompt;         // token ids, at least one
  int32_t max_tokens = 16;             // generated tokens at most (0: finish at once)
  float temperature = 0.0f;            // 0: greedy
  int32_t top_k = 0;                   // 0: off
  float top_p = 1.0f;                  // (0, 1]
  float min_p = 0.0f;                  // [0, 1]
  float repetition_penalty = 1.0f;     // > 0; 1: off
  float frequency_penalty = 0.0f;      // [-2, 2]
  float presence_penalty = 0.0f;       // [-2, 2]
  uint64_t seed = 0;                   // the draws of token t depend only on (seed, t's position)
  std::vector<int32_t> stop_token_ids; // finish after one of these (it is included)
  std::vector<std::string> stop;       // finish when the text contains one (trimmed; needs a tokenizer)
  bool ignore_eos = false;             // do not stop at the model's EOS ids
  bool logprobs = false;               // log-probability of each generated token
  int32_t top_logprobs = 0;            // and this many alternatives (0 .. 20)
};

struct GeneratedToken {
  int32_t id = 0;
  float logprob = 0.0f;                        // when asked: log p under the raw model distribution
  std::vector<std::pair<int32_t, float>> top;  // when asked: (id, log p), most likely first
  uint64_t policy_version = 0;                 // the weights that produced it
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;      // prompt tokens served by the prefix cache
  int32_t completion_tokens = 0;
};

// One message of a request's stream: new tokens (and their text when the engine has a tokenizer),
// and at the end a final event.
struct EngineEvent {
  std::vector<GeneratedToken> tokens;
  std::string text;                // text of the new tokens; text that may begin a stop string waits
  bool finished = false;
  std::string finish_reason;       // final event: "stop", "length" or "abort"
  std::string error;               // final event of a request the engine could not run (else empty)
  Usage usage;                     // final event
};

// The events of one request, in order; the last has finished == true.
class RequestStream {
 public:
  explicit RequestStream(uint64_t id) : id_(id) {}
  uint64_t id() const { return id_; }
  // Blocks until the next event; nullopt after the final event was taken.
  std::optional<EngineEvent> next();
  // The next event if one is ready.
  std::optional<EngineEvent> poll();
  void push(EngineEvent e);  // the engine's side

 private:
  uint64_t id_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<EngineEvent> events_;
  bool closed_ = false;  // the final event was pushed
  bool drained_ = false; // ... and taken
};

struct EngineOptions {
  int32_t max_running = 256;       // requests decoded together at most
  int32_t max_step_tokens = 8192;  // tokens per step (prefill chunks + decodes)
  int32_t page_size = 16;          // KV page size in tokens
  int64_t kv_tokens = 0;           // KV pool capacity in tokens; 0: from kv_memory, else automatic
  int64_t kv_memory = 0;           // KV pool bytes; 0: automatic (CUDA: a fraction of free memory)
  double kv_memory_fraction = 0.85;
  int32_t max_seq_len = 0;         // 0: the model's max_position_embeddings
  bool prefix_cache = true;
  bool use_graphs = true;
};

struct EngineStats {
  int32_t running = 0, waiting = 0;
  int32_t kv_pages_used = 0, kv_pages_free = 0, kv_page_size = 0, kv_pages_cached = 0;
  int64_t prompt_tokens = 0, prefix_hit_tokens = 0, generated_tokens = 0;
  int64_t steps = 0, preemptions = 0, graph_replays = 0;
  double tokens_per_second = 0.0;  // generated tokens per second over the last few seconds
  // Where the engine thread's time went: whole steps, the executor's part of them, and the
  // executor's wait for the device (step - executor = scheduling and events; executor - wait =
  // packing, copies and launches).
  double step_seconds = 0.0, executor_seconds = 0.0, device_wait_seconds = 0.0;
  double pack_seconds = 0.0, issue_seconds = 0.0;  // the executor's host work: packing, issuing
  double upload_seconds = 0.0;                     // the input copies, part of issuing
  double schedule_seconds = 0.0, deliver_seconds = 0.0;  // planning steps; committing and emitting tokens
  double graph_launch_seconds = 0.0, graph_device_seconds = 0.0;  // replays: host launch, device time
  uint64_t policy_version = 0;
};

class Engine {
 public:
  // `tokenizer` (optional) gives text in events and stop strings; `eos_ids` end generation unless a
  // request sets ignore_eos.
  static Result<std::unique_ptr<Engine>> create(std::shared_ptr<const Transformer> model, const Tokenizer* tokenizer,
                                                std::vector<int32_t> eos_ids, const EngineOptions& options);
  ~Engine();  // finishes every open request with "abort" and joins the engine thread

  // Queues a request; an error (and nothing queued) when it is malformed or can never fit.
  Result<std::shared_ptr<RequestStream>> submit(GenerationRequest request);
  // Stops a request; its KV is freed at the next step and its stream ends with "abort".
  void cancel(uint64_t id);
  EngineStats stats() const;
  // Longest prompt + max_tokens a request may have.
  int64_t max_sequence_tokens() const { return max_sequence_tokens_; }
  const EngineOptions& options() const { return options_; }
  int32_t kv_capacity_tokens() const;

 private:
  struct Live;  // a request the engine thread is running (engine.cpp)
  Engine(std::shared_ptr<const Transformer> model, const Tokenizer* tokenizer, std::vector<int32_t> eos_ids,
         const EngineOptions& options);
  Status init();
  Status validate(const GenerationRequest& r) const;
  void loop();
  void step();
  void drain_inbox();
  void finish(Live& live, const std::string& reason, const std::string& error = "");
  // After a step's tokens are back: appends them to their sequences, ends the requests that hit a
  // stop token or max_tokens (out of the scheduler before the next step is planned), and queues
  // the tokens' events; drops requests a stop string ended while the step ran.
  void commit_step(const StepPlan& plan, const std::vector<Live*>& sampled, const std::vector<SampledToken>& out,
                   uint64_t version);
  // Pushes the queued events (detokenizing, matching stop strings) while the next step runs on
  // the device; a stop string ends its request, which leaves the scheduler after that step.
  void deliver_pending();
  // Takes a finished request out of the scheduler and the live table.
  void retire(Live& live);
  void publish_stats();
  // A step failed (a device error): every open request ends with the message; later submits fail.
  void fail_all(const std::string& message);

  std::shared_ptr<const Transformer> model_;
  const Tokenizer* tokenizer_;
  std::vector<int32_t> eos_ids_;
  EngineOptions options_;
  int64_t max_sequence_tokens_ = 0, model_seq_limit_ = 0;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Executor> executor_;

  // Shared with callers (mu_).
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::vector<std::pair<uint64_t, std::unique_ptr<Live>>> inbox_;
  std::vector<uint64_t> cancels_;
  bool stopping_ = false;
  std::string fatal_;  // set when a step failed: later submits are refused
  uint64_t next_id_ = 1;
  EngineStats stats_;

  // The engine thread's own state.
  std::map<uint64_t, std::unique_ptr<Live>> live_;
  struct PendingToken {
    Live* live;
    GeneratedToken token;
    const char* finish_reason;  // "stop" / "length" when this token ends the request, else nullptr
  };
  std::vector<PendingToken> pending_;  // events of the last step, delivered during the next one
  std::vector<Live*> ended_by_stop_string_;  // still scheduled: retired after the step in flight
  std::deque<std::pair<double, int64_t>> rate_window_;  // (seconds, generated tokens) samples
  int64_t generated_total_ = 0, prompt_total_ = 0, hits_total_ = 0, steps_ = 0, preemptions_ = 0;
  double step_seconds_ = 0, schedule_seconds_ = 0, deliver_seconds_ = 0;
  std::thread thread_;
};

}  // namespace kiln
