// The prompts of an RL run: a JSONL file, one object per line with the prompt as `prompt_ids`
// (token ids), `messages` (a chat, rendered with the model's chat template and its generation
// prompt, then tokenized without special tokens, as transformers' apply_chat_template does) or
// `prompt` (text, tokenized with the tokenizer's special tokens), plus any fields the reward reads
// (e.g. "answer"), kept with the prompt and copied into its rollout records. Offline DPO reads
// `chosen` and `rejected` (completion text, or `chosen_ids` / `rejected_ids`) from the same lines.
// Errors name the file and the line.
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "model/model_text.h"

namespace kiln::rl {

struct Prompt {
  std::vector<int32_t> ids;
  nlohmann::json fields;                    // the line's object
  std::vector<int32_t> chosen, rejected;    // preference lines (DPO)
};

// `text` may be null when every line gives ids. `preferences`: every line must have a chosen and a
// rejected completion. `prompt_as_chat`: a "prompt" text becomes one user message rendered with
// the chat template (as "messages" are) instead of being tokenized as it is.
Result<std::vector<Prompt>> load_prompts(const std::string& path, const ModelText* text, bool preferences,
                                         bool prompt_as_chat = false);

}  // namespace kiln::rl
