// The Anthropic protocol: POST /v1/messages request bodies into CompletionJobs, and results into
// messages, streamed events (message_start, content_block_start, ping, content_block_delta,
// content_block_stop, message_delta, message_stop) and errors.
//
// Accepted: model, max_tokens, messages, system, stop_sequences, temperature, top_p, top_k, stream,
// tools, tool_choice (auto, any, tool, none; disable_parallel_tool_use), metadata, service_tier;
// thinking ({"type": "enabled", "budget_tokens": N} where the server splits reasoning,
// --reasoning-parser: the model's <think> block comes back as a thinking block with an empty
// signature; the budget is not enforced, max_tokens bounds the reply; a template with Qwen3's
// enable_thinking switch gets it set from the request: off unless enabled, Anthropic's default). Anything else is refused
// with a 400 naming it. Assistant messages may carry thinking blocks (given to the template as
// reasoning_content) and redacted_thinking blocks (ignored). A final
// assistant message is a prefill (the reply continues it). usage.input_tokens counts the prompt
// tokens the prefix cache did not serve, cache_read_input_tokens those it did. The message (and
// the stream's message_delta) carries "policy_versions": [first token index, version] runs.
//
// Thread safety: pure functions; a stream writer belongs to one response.
#pragma once

#include <string>

#include "serve/completion_run.h"

namespace kiln::serve {

Result<CompletionJob> parse_anthropic_messages(const Json& body, const ServeContext& ctx);
Json anthropic_response(const CompletionRun& run, const std::string& id);

class AnthropicStream {
 public:
  AnthropicStream(const CompletionJob& job, std::string id) : job_(job), id_(std::move(id)) {}
  std::string begin();
  std::string deltas(const std::vector<ChoiceDelta>& deltas);
  std::string end(const CompletionRun& run);
  static std::string error(const ApiError& e);

 private:
  std::string open_block(const Json& block);
  std::string close_block();
  const CompletionJob& job_;
  std::string id_;
  int32_t index_ = -1;       // the open block's index (-1: none yet)
  bool open_ = false;
  bool text_open_ = false;   // the open block is a text block
  bool thinking_open_ = false;  // the open block is a thinking block
  int32_t tool_index_ = -1;  // the tool call the open tool_use block belongs to
};

}  // namespace kiln::serve
