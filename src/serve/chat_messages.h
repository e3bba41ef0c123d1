// Conversations of the OpenAI and Anthropic protocols turned into what a Hugging Face chat template
// expects (the messages and tools of transformers' apply_chat_template), and rendered into prompt
// token ids.
//
// OpenAI: roles system / developer (rendered as system) / user / assistant / tool; content a string
// or a list of text parts (joined with "\n"); assistant tool_calls keep their id and type, with
// function.arguments parsed from its JSON string into an object (what templates expect); tool
// messages keep tool_call_id (and name). Anthropic: `system` becomes a leading system message; text
// blocks are joined; tool_use blocks become the assistant's tool_calls; each tool_result block of a
// user message becomes a tool message (before the user's text); a final assistant message is a
// prefill that the reply continues. Images, documents and other non-text parts are refused.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <string>
#include <vector>

#include "serve/api.h"
#include "model/model_text.h"

namespace kiln::serve {

// The largest nesting a request body may have (objects and arrays), checked before parsing.
inline constexpr int32_t kMaxRequestNesting = 64;
// Parses a request body: an error for invalid JSON, a body that is not an object, or nesting deeper
// than kMaxRequestNesting.
Result<Json> parse_request_body(std::string_view body);

Result<Json> template_messages_from_openai(const Json& messages);
// OpenAI tools [{type: "function", function: {name, description?, parameters?}}] checked and passed on.
Result<Json> template_tools_from_openai(const Json& tools);

struct AnthropicConversation {
  Json messages;        // for the template
  std::string prefill;  // the text of a final assistant message (the reply continues it)
};
Result<AnthropicConversation> template_messages_from_anthropic(const Json& system, const Json& messages);
// Anthropic tools [{name, description?, input_schema}] as OpenAI-style function tools.
Result<Json> template_tools_from_anthropic(const Json& tools);

struct ChatPrompt {
  std::string text;           // the rendered prompt (generation prompt and prefill included)
  std::vector<int32_t> ids;   // its tokens (no special tokens added: the template writes them)
};
// Renders `messages` (and `tools` unless null) with the generation prompt and the template
// variables `template_kwargs` (an object; e.g. enable_thinking), appends `suffix` (a prefill or a
// forced tool-call opening), and encodes the text.
Result<ChatPrompt> render_chat_prompt(const ModelText& text, const std::string& template_name, const Json& messages,
                                      const Json& tools, const std::string& suffix,
                                      const Json& template_kwargs = Json::object());

}  // namespace kiln::serve
