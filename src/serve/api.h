// What every protocol front end (OpenAI chat and completions, Anthropic messages) turns a request
// into, and how errors map onto each protocol's status codes and shapes.
//
// A CompletionJob is protocol-independent: the prompts as token ids, the engine request, how many
// choices, streaming options, and how to read tool calls from the output. The protocol modules fill
// it from a request body (serve/openai_protocol.h, serve/anthropic_protocol.h) and render results.
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "infer/engine.h"
#include "infer/sampling_defaults.h"
#include "model/model_text.h"
#include "serve/tool_calls.h"

namespace kiln::serve {

using Json = nlohmann::ordered_json;

enum class Protocol { openai_chat, openai_completion, anthropic_messages };

// Tool calling for one chat request.
struct ToolSettings {
  bool enabled = false;                         // tools were given and tool_choice is not "none"
  ToolCallFormat format = ToolCallFormat::none; // how the model writes calls
  std::string forced_prefix;                    // prompt text forcing a call (required / named tool_choice)
  std::vector<std::string> names;               // the tools offered
  bool parallel = true;                         // more than one call allowed (OpenAI parallel_tool_calls)
};

struct CompletionJob {
  Protocol protocol = Protocol::openai_chat;
  std::string model;                        // as the client named it (echoed in responses)
  std::vector<std::vector<int32_t>> prompts;  // one per prompt (completions may have several)
  GenerationRequest request;                // sampling etc.; `prompt` is filled per prompt at submit
  int32_t n = 1;                            // choices per prompt
  bool stream = false;
  bool include_usage = false;               // OpenAI stream_options.include_usage
  bool echo = false;                        // completions: the prompt text precedes each choice's text
  bool return_token_ids = false;            // extension: token ids per choice (and per chunk)
  int32_t logprobs = -1;                    // completions' integer form (top count); -1: off
  ToolSettings tools;
  bool reasoning = false;                   // split <think> blocks into reasoning (serve/reasoning.h)
  bool reasoning_opened = false;            // ... the prompt leaves the block open
  std::vector<std::string> prompt_texts;    // for echo (completions)
  int32_t choices() const { return static_cast<int32_t>(prompts.size()) * n; }
};

// What the protocol parsers need to know about the model being served.
struct ServeContext {
  const ModelText* text = nullptr;   // null: no tokenizer (token-id prompts only)
  std::string model_name;            // the id clients must name
  std::string template_name;         // chat template name ("": the default)
  ToolCallFormat tool_format = ToolCallFormat::none;
  bool mistral_args_form = false;    // Mistral v11+ calls: [TOOL_CALLS]name[ARGS]{...}
  int64_t context_length = 0;        // the longest prompt + completion
  SamplingDefaults sampling_defaults;  // the model's recommended sampling, where a request gives none
  bool reasoning = false;            // chat replies' <think> blocks go to reasoning (--reasoning-parser)
  int32_t max_tokens_cap = 0;        // 0: none beyond the context
  int32_t max_n = 16;
};

// A protocol error: the HTTP status and the protocol's error type.
struct ApiError {
  int status = 400;
  std::string type;     // OpenAI: invalid_request_error ...; Anthropic: invalid_request_error ...
  std::string message;
  std::string param;    // OpenAI: the offending parameter (may be empty)
  std::string code;     // OpenAI: e.g. model_not_found, context_length_exceeded
};

// The status and types a Status maps to: invalid_argument 400, not_found 404, unsupported 400,
// out_of_memory 503, everything else 500.
ApiError api_error_from(const Status& s);
// The body each protocol sends with an error: OpenAI {"error": {message, type, param, code}},
// Anthropic {"type": "error", "error": {type, message}}.
Json openai_error_body(const ApiError& e);
Json anthropic_error_body(const ApiError& e);
// Anthropic's error type for a status (invalid_request_error, authentication_error, ...).
std::string anthropic_error_type(int status);
std::string openai_error_type(int status);

// Unix seconds, for "created" fields.
int64_t unix_seconds();
// A random hexadecimal id suffix (not a secret: request ids).
std::string random_id(int32_t chars);
// A random sampling seed, for requests that give none.
uint64_t random_seed();

}  // namespace kiln::serve
