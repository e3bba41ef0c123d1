// The engine thread's records of requests and steps, shared by the engine's source files
// (engine.cpp: submission, requests' lives; engine_step.cpp: steps). Not for other users.
// Thread safety: the engine thread's alone.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "infer/engine.h"
#include "infer/executor.h"
#include "infer/scheduler.h"
#include "infer/stop_strings.h"
#include "infer/structured/json_matcher.h"
#include "kernels/sampling.h"

namespace kiln {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Engine::Live {
  uint64_t id = 0;
  GenerationRequest request;
  std::shared_ptr<RequestStream> stream;
  std::unique_ptr<StopStringMatcher> text;  // with a tokenizer
  int32_t generated = 0;
  int32_t counts_row = -1;
  uint64_t admission_seen = 0;  // the scheduler's admission stamp at the last admission seen
  bool stopped_by_string = false;  // the text ends before a stop string: nothing held back is shown
  std::string stop_string;         // ... which one
  bool ended = false;              // its last token is known (stop token, max_tokens): planned no more
  bool done = false;               // the final event was pushed
  bool retired = false;            // out of the scheduler (its KV freed)
  bool retire_queued = false;      // in retire_after_step_
  uint64_t last_step = 0;          // the number of the last step launched that computes for it
  int32_t cached_tokens = 0;       // usage: prefix-cached prompt tokens, kept when it is retired
  int32_t preemptions = 0;         // usage, kept when it is retired
  std::optional<uint64_t> admission_version;  // the version at its first admission, kept when retired
  // Structured output (request.json_schema): the text so far, the mask of its next token, and the
  // tokens that may end it once the value is complete (its stop tokens, and EOS unless ignored).
  std::unique_ptr<structured::JsonMatcher> matcher;
  std::vector<uint32_t> mask;
  std::vector<int32_t> end_ids;
};

struct Engine::StepWork {
  StepPlan plan;
  std::vector<ops::SamplingRow> rows;  // one per entry that wants logits, in plan order
  std::vector<Live*> sampled;          // ... and its request
  std::vector<Executor::RowConstraints> constraints;  // ... and its token mask (Live::mask) and logit biases
  uint64_t version = 0;                // the policy version of the weights it runs on
  uint64_t number = 0;                 // launched_steps_ when it was launched
};

}  // namespace kiln
