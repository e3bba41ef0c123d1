// Fuzz target (fuzz_common.h): the input is a chat template, optionally followed by a NUL byte and
// a JSON context (a list of messages, or an object of render variables). Parsing and rendering may
// fail with a Status, never crash or run away: the render runs under tight limits (the same
// mechanism as the defaults, smaller so that each input takes milliseconds).
#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "model/chat_template.h"

int kiln::fuzz::chat_template(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  Result<ChatTemplate> t = ChatTemplate::parse(input.substr(0, nul), "fuzz template");
  if (!t.ok()) return 0;
  nlohmann::ordered_json context = {
      {"messages",
       {{{"role", "system"}, {"content", "be brief"}},
        {{"role", "user"}, {"content", "hi"}},
        {{"role", "assistant"}, {"content", "hello"}, {"tool_calls", {{{"function", {{"name", "f"}, {"arguments", {{"x", 1}}}}}}}}}}},
      {"tools", nullptr},
      {"add_generation_prompt", true},
      {"bos_token", "<s>"},
      {"eos_token", "</s>"}};
  if (nul != std::string::npos) {
    nlohmann::ordered_json extra = nlohmann::ordered_json::parse(input.substr(nul + 1), nullptr, false);
    if (extra.is_array()) context["messages"] = extra;
    else if (extra.is_object()) context.update(extra);
  }
  TemplateLimits limits;
  limits.max_depth = 100;
  limits.max_loop_iterations = 20'000;
  limits.max_output_bytes = 1 << 20;
  limits.max_list_items = 100'000;
  Result<std::string> out = t->render(context, limits);
  if (out.ok() && static_cast<int64_t>(out->size()) > limits.max_output_bytes)
    invariant_failed("chat_template", "the output is larger than the limit");
  return 0;
}

KILN_FUZZ_ENTRY(chat_template)
