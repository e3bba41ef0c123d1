// CompletionRun: one API request's choices running on the engine. It submits a stream per choice
// (prompts x n), drains their events, separates reasoning (serve/reasoning.h) and then tool calls
// (serve/tool_calls.h) from content, and
// keeps each choice's result; protocol modules turn its deltas into chunks and its results into
// responses. Shared by the HTTP server and kiln run-batch.
//
// Finish reasons are protocol-neutral here: "stop" (EOS or a stop token), "stop_string" (one of the
// request's stop strings: `stop_string` says which), "length", "tool_calls", "abort", "error".
//
// Ownership: borrows the engine (which outlives it); cancels whatever is still running when
// destroyed. Thread safety: one consumer at a time; `on_event` (given to start) runs on the
// engine's thread whenever a stream has news, and should only schedule a poll().
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "serve/api.h"
#include "serve/reasoning.h"

namespace kiln::serve {

struct ChoiceDelta {
  int32_t index = 0;
  std::string text;                         // new content text
  std::string reasoning;                    // new reasoning text (jobs with `reasoning`)
  std::vector<ToolCallDelta> tool_calls;    // new tool-call pieces
  std::vector<GeneratedToken> tokens;       // new tokens (ids, log-probabilities, versions)
  bool finished = false;
  std::string finish_reason;                // when finished
  std::string stop_string;                  // when finished by one of the stop strings
};

struct ChoiceResult {
  int32_t prompt_index = 0;
  std::string text;                         // content (tool calls and reasoning taken out)
  std::string reasoning;                    // the <think> block's text (jobs with `reasoning`)
  std::vector<ToolCall> tool_calls;
  std::vector<GeneratedToken> tokens;
  std::string finish_reason, stop_string, error;
  Usage usage;
  uint64_t admission_version = 0, finish_version = 0;
  bool finished = false;
};

// [first token index, version] runs of a choice's tokens (the policy versions that produced them).
Json version_runs(const std::vector<GeneratedToken>& tokens);

class CompletionRun {
 public:
  // Submits every choice; an error (nothing left running) when the engine refuses one.
  static Result<std::unique_ptr<CompletionRun>> start(Engine& engine, const CompletionJob& job,
                                                      std::function<void()> on_event);
  ~CompletionRun();

  // The news of every choice since the last poll, in order (a choice's final delta comes last).
  std::vector<ChoiceDelta> poll();
  bool finished() const { return open_ == 0; }
  void cancel();  // every choice still running ends with "abort" (its KV freed at the next step)

  const std::vector<ChoiceResult>& results() const { return results_; }
  // Usage summed over the choices, the prompt counted once per prompt (as OpenAI reports n > 1).
  Usage total_usage() const;
  const CompletionJob& job() const { return job_; }

 private:
  CompletionRun(Engine& engine, CompletionJob job) : engine_(engine), job_(std::move(job)) {}
  struct Choice {
    std::shared_ptr<RequestStream> stream;
    std::unique_ptr<ToolCallParser> tools;  // when tool calls are parsed
    std::unique_ptr<ReasoningSplitter> reasoning;  // when reasoning is split off (before tool calls)
  };
  void apply(int32_t index, EngineEvent& e, ChoiceDelta& d);

  Engine& engine_;
  CompletionJob job_;
  std::vector<Choice> choices_;
  std::vector<ChoiceResult> results_;
  int32_t open_ = 0;
};

}  // namespace kiln::serve
