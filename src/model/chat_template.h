// Hugging Face chat templates: a Jinja2 interpreter that renders exactly like transformers'
// apply_chat_template (jinja2 with trim_blocks, lstrip_blocks, loopcontrols, transformers' tojson,
// raise_exception and strftime_now), plus transformers' {% generation %} tag, whose output a tracked
// render locates (for assistant masks: model/chat_tokens.h). The implementation lives in
// src/model/jinja/.
// Thread safety: a ChatTemplate is immutable after parse(); render() may run on several threads.
#pragma once

#include <algorithm>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/json_text.h"
#include "core/status.h"

namespace kiln {

namespace jinja {
struct Program;
}

// Bounds on one render, so that a hostile template ends with a clear error instead of exhausting
// the stack, the memory or the time. The defaults are far above what real chat templates use.
struct TemplateLimits {
  int32_t max_depth = 400;                      // nested expressions, blocks and macro calls
  int64_t max_loop_iterations = 1'000'000;      // for-loop iterations in one render (about 1 s)
  int64_t max_output_bytes = int64_t(64) << 20; // the rendered text, and any string built on the way
  int64_t max_list_items = 1'000'000;           // any list built (repetition, concatenation, split)
  int32_t max_context_depth = 1000;             // nesting of the JSON context (messages, tools)
};

// A render with the places of its {% generation %} blocks: byte ranges [first, second) of `text`,
// in the order the blocks ran (transformers' generation_indices, in bytes where it counts characters).
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

// A compiled chat template. Immutable after parse(); render() is safe from several threads.
class ChatTemplate {
 public:
  // Syntax errors name the template and line: "chat template NAME, line N: ...".
  static Result<ChatTemplate> parse(const std::string& source, const std::string& name);
  // Renders with the variables in `context` (a JSON object: messages, tools, add_generation_prompt,
  // bos_token, eos_token, and any extra keys). A template that calls raise_exception(msg) returns an
  // error whose message is msg (prefixed by nothing else, so the CLI can print it).
  // Exceeding a limit is an error naming it.
  Result<std::string> render(const nlohmann::ordered_json& context, const TemplateLimits& limits = {}) const;
  // render() that also returns where each {% generation %} block's output is (transformers'
  // AssistantTracker; the text is render()'s). A generation block rendered inside a macro, a set or
  // filter block or another generation block is an error here (its place in the output is unknown).
  Result<RenderedChat> render_tracked(const nlohmann::ordered_json& context, const TemplateLimits& limits = {}) const;
  // True when the template has {% generation %} blocks (transformers requires one for
  // return_assistant_tokens_mask). Without tracking, a generation block just renders its body.
  bool has_generation_blocks() const;
  const std::string& name() const;
  const std::string& source() const;  // the template text (e.g. to recognise a model family's formats)

 private:
  Result<std::string> render_impl(const nlohmann::ordered_json& context, const TemplateLimits& limits,
                                  std::vector<std::pair<size_t, size_t>>* spans) const;
  std::shared_ptr<const jinja::Program> program_;
};

struct ChatTemplateInputs {
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;  // null when absent
  bool add_generation_prompt = false;
  // Unset: the template sees no such variable (transformers leaves out a special token that is null).
  std::optional<std::string> bos_token, eos_token;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

// What transformers' apply_chat_template(tokenize=False) passes to the template: messages, tools
// (None when not given, as transformers passes tools=None), documents (the `documents` key of
// `extra` when there is one, else None; it must be a list of objects), add_generation_prompt,
// bos/eos and the other special tokens as strings (put pad_token etc. into `extra`), plus extra kwargs
// (which override the special tokens, as in transformers).
Result<std::string> apply_chat_template(const ChatTemplate& tmpl, const ChatTemplateInputs& in);
// The same with the generation blocks' spans (render_tracked).
Result<RenderedChat> apply_chat_template_tracked(const ChatTemplate& tmpl, const ChatTemplateInputs& in);

}  // namespace kiln
