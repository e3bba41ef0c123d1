// tokenize_chat_for_training and the span -> token rule; see model/chat_tokens.h for the methods.
#include "model/chat_tokens.h"

#include <algorithm>

namespace kiln {
namespace {

// Checks what the methods rely on; returns the indices of the assistant messages.
Result<std::vector<size_t>> check_inputs(const std::string& where, const ChatTemplateInputs& in) {
  if (!in.messages.is_array() || in.messages.empty())
    return invalid_argument(where + "\"messages\" must be a non-empty list of {\"role\": ..., \"content\": ...} objects");
  if (!in.tools.is_null() && !in.tools.is_array())
    return invalid_argument(where + "\"tools\" must be a list of tool definitions (or absent)");
  std::vector<size_t> assistant;
  std::string roles;
  for (size_t k = 0; k < in.messages.size(); ++k) {
    const auto& m = in.messages[k];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return invalid_argument(where + "messages[" + std::to_string(k) + "] is not an object with a string \"role\": " +
                              m.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).substr(0, 200));
    const std::string role = m["role"];
    if (role == "assistant") assistant.push_back(k);
    if (k < 8) roles += (k ? ", " : "") + role;
  }
  if (assistant.empty())
    return invalid_argument(where + "the conversation has no assistant message, so there is nothing to train on (roles: " +
                            roles + (in.messages.size() > 8 ? ", ..." : "") + ")");
  return assistant;
}

// "at byte N: "...a..." vs "...b..."": where `a` and `b` first differ, with a little of each.
std::string first_difference(const std::string& a, const std::string& b) {
  size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  const size_t from = k >= 24 ? k - 24 : 0;
  auto quote = [from](const std::string& s) {
    return nlohmann::json(s.substr(std::min(from, s.size()), 64)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  return "at byte " + std::to_string(k) + ": " + quote(a) + " vs " + quote(b);
}

Result<std::string> render_part(const ChatTemplate& tmpl, const ChatTemplateInputs& in, size_t count, bool generation_prompt,
                                const std::string& where) {
  ChatTemplateInputs part = in;
  part.messages = nlohmann::ordered_json::array();
  for (size_t k = 0; k < count; ++k) part.messages.push_back(in.messages[k]);
  part.add_generation_prompt = generation_prompt;
  auto r = apply_chat_template(tmpl, part);
  if (!r.ok())
    return Status(r.status().code(), where + "rendering messages[0.." + std::to_string(count) + ")" +
                                         (generation_prompt ? " with a generation prompt" : "") +
                                         " for the prefix method failed: " + r.status().message());
  return r;
}

// PrefixRenders (chat_tokens.h): the spans in `full` of every assistant message.
Result<std::vector<std::pair<size_t, size_t>>> prefix_spans(const ChatTemplate& tmpl, const ChatTemplateInputs& in,
                                                            const std::vector<size_t>& assistant, const std::string& full,
                                                            const std::string& where) {
  const std::string advice =
      ": the template re-renders earlier parts of the conversation (Qwen3's drops the reasoning of turns before the "
      "last user message, for one), so assistant output cannot be found by rendering prefixes. Use a copy of the "
      "template with {% generation %} ... {% endgeneration %} around the assistant output, or split the "
      "conversation so that it ends at this message";
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t k : assistant) {
    KILN_ASSIGN_OR_RETURN(std::string before, render_part(tmpl, in, k, true, where));
    KILN_ASSIGN_OR_RETURN(std::string turn, render_part(tmpl, in, k + 1, false, where));
    const std::string msg = "messages[" + std::to_string(k) + "] (assistant)";
    if (turn.compare(0, before.size(), before) != 0 || turn.size() < before.size())
      return invalid_argument(where + "the template is not prefix-consistent at " + msg + ": rendering messages[0.." +
                              std::to_string(k + 1) + ") does not start with messages[0.." + std::to_string(k) +
                              ") rendered with a generation prompt (" + first_difference(turn, before) + ")" + advice);
    if (full.compare(0, turn.size(), turn) != 0 || full.size() < turn.size())
      return invalid_argument(where + "the template is not prefix-consistent at " + msg +
                              ": the whole conversation's rendering does not start with messages[0.." +
                              std::to_string(k + 1) + ") rendered alone (" + first_difference(full, turn) + ")" + advice);
    spans.emplace_back(before.size(), turn.size());
  }
  return spans;
}

}  // namespace

std::vector<uint8_t> assistant_mask_from_spans(const std::vector<TokenOffset>& offsets,
                                               const std::vector<std::pair<size_t, size_t>>& spans) {
  std::vector<uint8_t> mask(offsets.size(), 0);
  for (auto [s, e] : spans) {
    const std::optional<size_t> first = token_at_byte(offsets, s);
    // Python's char_to_token(e - 1); e == 0 (an empty span at the start) finds no token.
    const std::optional<size_t> last = e > 0 ? token_at_byte(offsets, e - 1) : std::nullopt;
    if (!first) break;  // transformers: "out of bounds maybe due to truncation"; later spans too
    const size_t stop = last && *last != 0 ? *last + 1 : offsets.size();
    for (size_t t = *first; t < stop; ++t) mask[t] = 1;
  }
  return mask;
}

Result<ChatTokens> tokenize_chat_for_training(const Tokenizer& tok, const ChatTemplate& tmpl, const ChatTemplateInputs& in,
                                              AssistantMaskMethod method) {
  const std::string where = "chat for training (template " + tmpl.name() + "): ";
  KILN_ASSIGN_OR_RETURN(std::vector<size_t> assistant, check_inputs(where, in));
  if (method == AssistantMaskMethod::Auto)
    method = tmpl.has_generation_blocks() ? AssistantMaskMethod::GenerationBlocks : AssistantMaskMethod::PrefixRenders;
  ChatTokens out;
  out.method = method;
  if (method == AssistantMaskMethod::GenerationBlocks) {
    if (!tmpl.has_generation_blocks())
      return invalid_argument(where + "the template has no {% generation %} blocks; use the prefix method "
                                      "(AssistantMaskMethod::PrefixRenders / Auto) or add the blocks around the "
                                      "assistant output");
    auto rendered = apply_chat_template_tracked(tmpl, in);
    if (!rendered.ok()) return Status(rendered.status().code(), where + "rendering the conversation failed: " + rendered.status().message());
    RenderedChat r = std::move(rendered).value();
    if (r.generation_spans.empty())
      return invalid_argument(where + "the template's {% generation %} blocks produced nothing for this conversation, "
                                      "although it has " + std::to_string(assistant.size()) +
                              " assistant message(s): the blocks do not cover its assistant turns");
    out.text = std::move(r.text);
    out.assistant_spans = std::move(r.generation_spans);
  } else {
    auto rendered = apply_chat_template(tmpl, in);
    if (!rendered.ok()) return Status(rendered.status().code(), where + "rendering the conversation failed: " + rendered.status().message());
    out.text = std::move(rendered).value();
    KILN_ASSIGN_OR_RETURN(out.assistant_spans, prefix_spans(tmpl, in, assistant, out.text, where));
  }
  auto enc = tok.encode_with_offsets(out.text, /*add_special_tokens=*/false);
  if (!enc.ok()) return Status(enc.status().code(), where + enc.status().message());
  out.assistant_mask = assistant_mask_from_spans(enc.value().offsets, out.assistant_spans);
  out.ids = std::move(enc.value().ids);
  if (std::find(out.assistant_mask.begin(), out.assistant_mask.end(), 1) == out.assistant_mask.end())
    return invalid_argument(where + "no token falls in the assistant output (empty assistant messages, or output that "
                                    "starts where no token does); nothing would be trained on");
  return out;
}

}  // namespace kiln
