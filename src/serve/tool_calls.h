// Tool calls in a model's output text: which format a model writes them in, the text that forces
// one (an assistant prefill), and ToolCallParser, which splits streamed output into content and
// tool-call deltas as the text arrives. parse_tool_calls is the one-shot form for whole texts and
// gives exactly what feeding the same text in any split gives.
//
// Formats (what the models write):
//   hermes       (Qwen2.5/Qwen3, Hermes, ...) content, then blocks
//                `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, one or more.
//   llama3_json  (Llama 3.1-3.3) only when the output, after leading whitespace, starts with `{` or
//                `<|python_tag|>`: JSON objects `{"name": "f", "parameters": {...}}` separated by `;`
//                (or whitespace); any other output is all content.
//   mistral      content, then `[TOOL_CALLS]` followed by a JSON array of call objects (v0.3:
//                `[TOOL_CALLS] [{"name": "f", "arguments": {...}, "id": "..."}]`) or by
//                `name[ARGS]{...}` (v11+ tokenizers), the latter repeated with a `[TOOL_CALLS]` each.
// `<|python_tag|>` and `[TOOL_CALLS]` are special tokens: decode with special tokens kept for those
// formats. `<tool_call>` is an ordinary added token in Qwen's vocabularies.
//
// A call object is JSON with a string "name" (not empty) and an "arguments" (or "parameters")
// value that is an object; other keys (mistral's "id", "type") are checked as JSON and ignored.
// Keys come in either order. ToolCall::arguments is the object's raw text as the model wrote it.
// When the value is a string (some models quote the arguments), the string's decoded content is
// used, trimmed, if it is a JSON object. A call object without arguments gets "{}".
//
// Streaming and malformed calls. A call is *announced* (its first delta, with the name and `{`)
// once its name is known and its arguments object has begun (for arguments before the name, or as a
// string: once both are complete). From then on the argument text streams byte for byte as it
// arrives; it is a call and stays one. Before the announcement everything is held back: when the
// text turns out not to be a call (not JSON, no name, arguments not an object, or cut off by the end
// of generation) all the text held for it, the marker included, is released as content, and parsing
// resumes at the byte that broke it. A call whose JSON breaks or is cut off *after* it was announced
// cannot be taken back: it stays in calls() with complete == false and the arguments streamed so far
// (a prefix of a JSON object); text from the breaking byte on is parsed again as output.
// Complete arguments are always well-formed JSON (strict RFC 8259: valid UTF-8, paired surrogates).
//
// Whitespace next to a call (before its marker, between calls, after the last one) is not content,
// and neither is a hermes `</tool_call>` (optional: a missing one is accepted). Content is held back
// while it could still be the beginning of a marker or is a run of whitespace that could precede
// one, as stop strings are (infer/stop_strings.h); the rest is released at once.
//
// Ownership and memory: a ToolCallParser owns the text it holds back (bounded by the output's
// length) and the calls it found; it borrows nothing. Nothing is recursive, so no input nests deep
// enough to exhaust the stack. No function throws on any input (only std::bad_alloc).
// Thread safety: the functions are pure; a ToolCallParser is one request's, used by one thread at a
// time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kiln::serve {

enum class ToolCallFormat { none, hermes, llama3_json, mistral };

// "none", "hermes", "llama3_json" or "mistral" ("auto" is the caller's: detect_tool_call_format).
Result<ToolCallFormat> parse_tool_call_format(const std::string& s);
const char* tool_call_format_name(ToolCallFormat f);

// The format a model writes tool calls in, from its chat template source and its vocabulary
// (`has_token(text)`: an added token with exactly that text; may be empty). The first rule that
// holds decides:
//   1. the template or the vocabulary has "<tool_call>"                        -> hermes
//   2. the template or the vocabulary has "[TOOL_CALLS]"                       -> mistral
//   3. the template has "<|python_tag|>" or "<|eom_id|>", or has both
//      "<|start_header_id|>" and "tools" (a Llama 3 template that renders tools) -> llama3_json
//   4. otherwise                                                              -> none
// The Llama 3 rule reads the template only: every Llama 3.1 vocabulary has <|python_tag|>, tool
// trained or not.
ToolCallFormat detect_tool_call_format(const std::string& template_source,
                                       const std::function<bool(std::string_view)>& has_token);

// Whether a Mistral template renders calls in the v11+ form `[TOOL_CALLS]name[ARGS]{...}` (it
// mentions "[ARGS]"), for forced_tool_call_prefix.
bool mistral_uses_args_form(const std::string& template_source);

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text of an object (a prefix of one while !complete)
  bool complete = true;   // false: announced, then cut off or broken (see the header comment)
};

// One piece of a call as it streams. The first piece of call `index` has `name` set (its arguments
// may be empty); later pieces carry only argument text. The argument pieces of a call, concatenated,
// are exactly its ToolCall::arguments. Indices count from 0 over the whole output.
struct ToolCallDelta {
  int32_t index = 0;
  std::string name;
  std::string arguments;
};

// The text that makes the model's output a tool call when put after the generation prompt
// (assistant prefill; kiln has no constrained decoding yet). Pass it to ToolCallParser as `prefix`.
//   name empty (any call):  hermes "<tool_call>", llama3_json "{\"name\": \"", mistral "[TOOL_CALLS]".
//   a named call: the opening up to where the arguments begin:
//     hermes       "<tool_call>\n{\"name\": \"NAME\", \"arguments\":"
//     llama3_json  "{\"name\": \"NAME\", \"parameters\":"
//     mistral      "[TOOL_CALLS] [{\"name\": \"NAME\", \"arguments\":", or with mistral_args_form
//                  "[TOOL_CALLS]NAME[ARGS]"
// NAME is JSON-escaped in the JSON forms. The named forms stop before the space that the model
// writes ahead of the arguments' `{`: BPE vocabularies merge " {" into one token, which a prefill
// ending in a lone space would split. ToolCallFormat::none: "" (nothing can be forced).
std::string forced_tool_call_prefix(ToolCallFormat f, const std::string& name, bool mistral_args_form = false);

// Incremental parser of one generation's output text (see the header comment for the rules).
class ToolCallParser {
 public:
  // `prefix`: text already in the prompt that the output continues (forced_tool_call_prefix);
  // parsed first, never returned as content. Its deltas, if any, come with the first feed/finish.
  explicit ToolCallParser(ToolCallFormat format, std::string prefix = "");
  ~ToolCallParser();
  ToolCallParser(ToolCallParser&&) noexcept;
  ToolCallParser& operator=(ToolCallParser&&) noexcept;

  struct Output {
    std::string content;               // content released by this call
    std::vector<ToolCallDelta> calls;  // new pieces, in order, at most one per call index
  };
  Output feed(std::string_view text);
  // End of generation: releases what was held back. A call not yet announced becomes content; an
  // announced one left open stays with complete == false. feed and finish do nothing afterwards.
  Output finish();

  // Every announced call so far, in order of index; the last may still be open while streaming.
  const std::vector<ToolCall>& calls() const;
  const std::string& content() const;  // all content released so far

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One-shot: the whole text (non-streaming responses); the same as feeding `text` and finishing.
struct ParsedToolCalls {
  std::string content;
  std::vector<ToolCall> calls;
};
ParsedToolCalls parse_tool_calls(ToolCallFormat f, std::string_view text, const std::string& prefix = "");

// Tool-call ids, deterministic in (seed, index): `protocol_prefix` ("call_" for OpenAI, "toolu_"
// for Anthropic) and 24 ASCII letters and digits; for ToolCallFormat::mistral 9 letters and digits
// and no prefix, the only shape Mistral templates accept when the id is rendered back.
std::string make_tool_call_id(ToolCallFormat f, std::string_view protocol_prefix, uint64_t seed, int32_t index);

}  // namespace kiln::serve
