// Tokenized chat conversations for supervised fine-tuning: the token ids of a rendered conversation
// and a mask that is 1 exactly on the tokens of assistant output, as transformers'
// apply_chat_template(tokenize=True, return_dict=True, return_assistant_tokens_mask=True) gives.
//
// How the assistant output is found in the rendered text:
//   GenerationBlocks  the template wraps assistant output in {% generation %} ... {% endgeneration %}
//                     (transformers' AssistantTracker): one tracked render gives the byte ranges.
//   PrefixRenders     the template has no such blocks: for every assistant message k, the span is
//                     where render(messages[0..k], add_generation_prompt=false) extends
//                     render(messages[0..k), add_generation_prompt=true), i.e. the assistant's
//                     content and whatever the template closes the turn with (end-of-turn token,
//                     newline). That needs a prefix-consistent template: each of these renders must be
//                     a prefix of the next and of the whole conversation's. A template that re-renders
//                     earlier turns (Qwen3's drops the reasoning of turns before the last user
//                     message) fails with an error saying so; give it generation blocks instead.
//                     Costs two extra renders per assistant message.
//   Auto              GenerationBlocks when the template has generation blocks, else PrefixRenders.
// Spans become tokens as transformers maps them (assistant_mask_from_spans): the text is encoded
// without special tokens, with offsets; a span (s, e) marks tokens char_to_token(s) ..
// char_to_token(e - 1), to the end of the sequence when the latter is no token (or token 0), and a
// span whose start is in no token stops the marking of it and of every later span.
//
// Thread safety: a pure function of its arguments (Tokenizer and ChatTemplate are thread-safe).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"

namespace kiln {

enum class AssistantMaskMethod { Auto, GenerationBlocks, PrefixRenders };

struct ChatTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> assistant_mask;  // one per id: 1 on assistant output
  AssistantMaskMethod method = AssistantMaskMethod::Auto;  // the method used (never Auto)
  std::string text;                                        // the rendered conversation `ids` encode
  std::vector<std::pair<size_t, size_t>> assistant_spans;  // byte ranges of `text` the mask comes from
};

// Renders `in` (messages, tools, bos/eos, extra template variables; add_generation_prompt as given,
// normally false for training) with `tmpl`, encodes the text with `tok` (no special tokens added,
// as apply_chat_template does) and builds the assistant mask by `method`. Errors: messages that are
// not a list of objects with a string "role", tools that are not a list, a conversation without an
// assistant message, a template without generation blocks when GenerationBlocks is asked for, a
// template that is not prefix-consistent (PrefixRenders), template errors (naming the renders they
// came from), and a conversation whose mask would have no token set.
Result<ChatTokens> tokenize_chat_for_training(const Tokenizer& tok, const ChatTemplate& tmpl, const ChatTemplateInputs& in,
                                              AssistantMaskMethod method = AssistantMaskMethod::Auto);

// transformers' span -> token rule (above) over one encoding's offsets: a mask of offsets.size().
std::vector<uint8_t> assistant_mask_from_spans(const std::vector<TokenOffset>& offsets,
                                               const std::vector<std::pair<size_t, size_t>>& spans);

}  // namespace kiln
