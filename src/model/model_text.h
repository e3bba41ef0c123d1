// ModelText: the text side of a Hugging Face model folder, read together:
//   tokenizer.json          the tokenizer (Tokenizer)
//   tokenizer_config.json   the special tokens (strings or AddedToken objects: bos/eos/pad/unk
//                           for kiln, all that transformers passes to chat templates for those),
//                           and "chat_template" as one string or a list of {"name", "template"}
//   chat_template.jinja     the template as transformers 5 saves it (wins over tokenizer_config's
//                           default template); additional_chat_templates/<name>.jinja likewise
//   generation_config.json  "eos_token_id" (one id or a list): the ids generation stops at
// Ownership: owns the tokenizer and the compiled templates. Thread safety: immutable after load().
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"

namespace kiln {

struct SpecialTokens {
  std::string bos, eos, pad, unk;  // empty when the folder names none
  // tokenizer_config.json's add_bos_token / add_eos_token when present. Encoding with special
  // tokens follows tokenizer.json's post-processor, as transformers 5's tokenizers backend does
  // (it leaves these flags without effect there: checked against transformers 5.17).
  std::optional<bool> add_bos, add_eos;
};

class ModelText {
 public:
  // Loads a model folder; tokenizer.json must exist, the other files are optional.
  static Result<ModelText> load(const std::string& model_dir);
  // Just a tokenizer.json (no special-token strings, no chat templates).
  static Result<ModelText> load_tokenizer_file(const std::string& tokenizer_json);

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const SpecialTokens& special_tokens() const { return special_; }
  // Ids generation stops at: generation_config.json's eos ids, else the eos token's id.
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }

  // The template transformers would pick: `name` when given; with tools, "tool_use" when the folder
  // has one; else "default" (or the only template). not_found when the folder has no template.
  Result<const ChatTemplate*> chat_template(const std::string& name, bool with_tools) const;
  // What render_chat passes to the template: the messages and tools, bos/eos, and in `extra` the
  // other special tokens transformers passes (unk, sep, pad, cls, mask and the model-specific ones;
  // a null one is left out, so the template sees it undefined).
  // An error, before anything is copied, when they nest deeper than the template limits allow.
  Result<ChatTemplateInputs> chat_inputs(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                         bool add_generation_prompt) const;
  // apply_chat_template(messages, tools, add_generation_prompt, tokenize=False, **kwargs), the
  // object `kwargs` (null: none) overriding the special tokens' variables as transformers' do.
  Result<std::string> render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                  bool add_generation_prompt, const std::string& template_name = "",
                                  const nlohmann::ordered_json& kwargs = nullptr) const;

 private:
  std::string source_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  SpecialTokens special_;
  nlohmann::ordered_json template_tokens_ = nlohmann::ordered_json::object();  // name -> token string
  std::vector<int32_t> stop_ids_;
  std::map<std::string, std::shared_ptr<const ChatTemplate>> templates_;  // by name; "default" for the main one
};

}  // namespace kiln
