// The OpenAI protocol: POST /v1/chat/completions and /v1/completions request bodies into
// CompletionJobs, and results into responses, streamed chunks (server-sent events) and errors.
//
// Accepted beyond OpenAI's fields (as vLLM accepts them): top_k, min_p, repetition_penalty,
// ignore_eos, stop_token_ids, skip_special_tokens, return_token_ids, chat_template_kwargs; with the
// server's reasoning parser, a chat reply's <think> block comes back as reasoning_content (and
// vLLM's newer name, reasoning), and assistant messages may carry it. Fields kiln does not support
// (response_format other than text, logit_bias, audio, functions, ...) and unknown fields are
// refused with a 400 naming them. Every choice carries "policy_versions" ([first token index,
// version] runs) and every streamed choice its "policy_version": the weights that produced its tokens.
// tool_choice "none" leaves the tools out of the prompt; "required" and a named function prefill
// the format's call opening (kiln has no constrained decoding yet), then parse as "auto".
//
// Thread safety: pure functions; a stream writer belongs to one response.
#pragma once

#include <string>
#include <vector>

#include "serve/completion_run.h"

namespace kiln::serve {

Result<CompletionJob> parse_openai_chat(const Json& body, const ServeContext& ctx);
Result<CompletionJob> parse_openai_completion(const Json& body, const ServeContext& ctx);

// The whole response of a finished run (chat.completion or text_completion).
Json openai_response(const CompletionRun& run, const ServeContext& ctx, const std::string& id, int64_t created);
// GET /v1/models.
Json openai_models(const ServeContext& ctx, uint64_t policy_version, int64_t created);

// Server-sent events of one streamed response: "data: {chunk}\n\n" ... "data: [DONE]\n\n".
class OpenAIStream {
 public:
  OpenAIStream(const CompletionJob& job, const ServeContext& ctx, std::string id, int64_t created);
  std::string begin();                                      // chat: each choice's role chunk
  std::string deltas(const std::vector<ChoiceDelta>& deltas);
  std::string end(const CompletionRun& run);                // the usage chunk (when asked) and [DONE]
  static std::string error(const ApiError& e);              // an error event mid-stream

 private:
  Json chunk(Json choices) const;
  const CompletionJob& job_;
  const ServeContext& ctx_;
  std::string id_;
  int64_t created_;
  std::vector<int32_t> text_offset_;  // completions logprobs: where each choice's text stands
};

// OpenAI finish_reason for a neutral one (serve/completion_run.h).
std::string openai_finish_reason(const std::string& neutral);

}  // namespace kiln::serve
