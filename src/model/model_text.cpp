#include "model/model_text.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/json_text.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

Result<std::string> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return io_error("cannot read " + p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result<nlohmann::ordered_json> read_json(const fs::path& p) {
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(p));
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(p.string() + " is not valid JSON; fix or remove the file");
  return j;
}

// A special token of tokenizer_config.json (`key`): a string, an AddedToken object {"content": ...},
// or null (none: nullopt).
Result<std::optional<std::string>> token_string(const nlohmann::ordered_json& cfg, const std::string& key, const fs::path& path) {
  const nlohmann::ordered_json& v = cfg[key];
  if (v.is_string()) return std::optional<std::string>(v.get<std::string>());
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return std::optional<std::string>(v["content"].get<std::string>());
  if (v.is_null()) return std::optional<std::string>();
  return invalid_argument(path.string() + ": " + key + " must be a string, null or an object with a string \"content\"; it is " +
                          v.dump());
}

// The special tokens transformers 5 hands a chat template (its special_tokens_map): bos, eos, unk,
// sep, pad, cls and mask when not null, then its model-specific ones: the other keys ending in
// "_token" whose value is a string or a serialized AddedToken ({"__type": "AddedToken", "content"}),
// and the entries of an "extra_special_tokens" object.
Result<nlohmann::ordered_json> template_tokens(const nlohmann::ordered_json& cfg, const fs::path& path) {
  static const char* const kNamed[] = {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"};
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const char* key : kNamed) {
    if (!cfg.contains(key)) continue;
    KILN_ASSIGN_OR_RETURN(std::optional<std::string> t, token_string(cfg, key, path));
    if (t) out[key] = *t;
  }
  auto text = [](const nlohmann::ordered_json& v, bool plain_objects) -> std::optional<std::string> {
    if (v.is_string()) return v.get<std::string>();
    const bool added = v.is_object() && (plain_objects || v.value("__type", "") == "AddedToken");
    if (added && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    return std::nullopt;
  };
  for (const auto& [key, v] : cfg.items()) {
    const bool named = std::find(std::begin(kNamed), std::end(kNamed), key) != std::end(kNamed);
    if (named || key.size() < 6 || key.compare(key.size() - 6, 6, "_token") != 0) continue;
    if (std::optional<std::string> t = text(v, false)) out[key] = *t;
  }
  if (cfg.contains("extra_special_tokens") && cfg["extra_special_tokens"].is_object())
    for (const auto& [key, v] : cfg["extra_special_tokens"].items())
      if (std::optional<std::string> t = text(v, true)) out[key] = *t;
  return out;
}

// A boolean flag of tokenizer_config.json (`key`): true, false or null (absent).
Result<std::optional<bool>> config_flag(const nlohmann::ordered_json& cfg, const char* key, const fs::path& path) {
  const nlohmann::ordered_json& v = cfg[key];
  if (v.is_boolean()) return std::optional<bool>(v.get<bool>());
  if (v.is_null()) return std::optional<bool>();
  return invalid_argument(path.string() + ": " + key + " must be true, false or null; it is " + json_brief(v));
}

Status add_template(std::map<std::string, std::shared_ptr<const ChatTemplate>>& out, const std::string& name,
                    const std::string& source, const std::string& where) {
  KILN_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::parse(source, where));
  out[name] = std::make_shared<const ChatTemplate>(std::move(t));
  return Status::Ok();
}

}  // namespace

Result<ModelText> ModelText::load_tokenizer_file(const std::string& tokenizer_json) {
  ModelText m;
  m.source_ = tokenizer_json;
  if (!fs::exists(tokenizer_json)) return not_found(tokenizer_json + " does not exist; pass a tokenizer.json file");
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::from_file(tokenizer_json));
  m.tokenizer_ = std::move(tok);
  return m;
}

Result<ModelText> ModelText::load(const std::string& model_dir) {
  const fs::path dir(model_dir);
  if (!fs::is_directory(dir)) return not_found("model folder " + model_dir + " does not exist");
  const fs::path tok_path = dir / "tokenizer.json";
  if (!fs::exists(tok_path))
    return not_found(tok_path.string() + " does not exist: kiln reads Hugging Face fast tokenizers (tokenizer.json)");
  KILN_ASSIGN_OR_RETURN(ModelText m, load_tokenizer_file(tok_path.string()));
  m.source_ = model_dir;

  const fs::path cfg_path = dir / "tokenizer_config.json";
  if (fs::exists(cfg_path)) {
    KILN_ASSIGN_OR_RETURN(nlohmann::ordered_json cfg, read_json(cfg_path));
    if (!cfg.is_object()) return invalid_argument(cfg_path.string() + " must hold a JSON object");
    for (auto [key, out] : {std::pair{"bos_token", &m.special_.bos}, std::pair{"eos_token", &m.special_.eos},
                            std::pair{"pad_token", &m.special_.pad}, std::pair{"unk_token", &m.special_.unk}}) {
      if (cfg.contains(key)) {
        KILN_ASSIGN_OR_RETURN(std::optional<std::string> t, token_string(cfg, key, cfg_path));
        *out = t.value_or("");
      }
    }
    KILN_ASSIGN_OR_RETURN(m.template_tokens_, template_tokens(cfg, cfg_path));
    for (auto [key, out] : {std::pair{"add_bos_token", &m.special_.add_bos}, std::pair{"add_eos_token", &m.special_.add_eos}}) {
      if (cfg.contains(key)) {
        KILN_ASSIGN_OR_RETURN(*out, config_flag(cfg, key, cfg_path));
      }
    }
    if (cfg.contains("chat_template")) {
      const auto& ct = cfg["chat_template"];
      const std::string where = cfg_path.string() + ": chat_template";
      if (ct.is_string()) {
        KILN_RETURN_IF_ERROR(add_template(m.templates_, "default", ct.get<std::string>(), where));
      } else if (ct.is_array()) {
        for (const auto& entry : ct) {
          if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") || !entry["name"].is_string() ||
              !entry["template"].is_string())
            return invalid_argument(where + " must be a string or a list of {\"name\", \"template\"} objects");
          KILN_RETURN_IF_ERROR(add_template(m.templates_, entry["name"].get<std::string>(),
                                            entry["template"].get<std::string>(),
                                            where + " '" + entry["name"].get<std::string>() + "'"));
        }
      } else if (!ct.is_null()) {
        return invalid_argument(where + " must be a string or a list of {\"name\", \"template\"} objects");
      }
    }
  }
  const fs::path jinja_path = dir / "chat_template.jinja";
  if (fs::exists(jinja_path)) {
    KILN_ASSIGN_OR_RETURN(std::string source, read_file(jinja_path));
    KILN_RETURN_IF_ERROR(add_template(m.templates_, "default", source, jinja_path.string()));
  }
  const fs::path extra_dir = dir / "additional_chat_templates";
  if (fs::is_directory(extra_dir)) {
    for (const auto& e : fs::directory_iterator(extra_dir)) {
      if (e.path().extension() != ".jinja") continue;
      KILN_ASSIGN_OR_RETURN(std::string source, read_file(e.path()));
      KILN_RETURN_IF_ERROR(add_template(m.templates_, e.path().stem().string(), source, e.path().string()));
    }
  }

  const fs::path gen_path = dir / "generation_config.json";
  if (fs::exists(gen_path)) {
    KILN_ASSIGN_OR_RETURN(nlohmann::ordered_json gen, read_json(gen_path));
    if (gen.is_object() && gen.contains("eos_token_id")) {
      const auto& e = gen["eos_token_id"];
      auto add = [&](const nlohmann::ordered_json& v) -> Status {
        if (!v.is_number_integer()) return invalid_argument(gen_path.string() + ": eos_token_id must be an id or a list of ids");
        m.stop_ids_.push_back(v.get<int32_t>());
        return Status::Ok();
      };
      if (e.is_array()) {
        for (const auto& v : e) KILN_RETURN_IF_ERROR(add(v));
      } else if (!e.is_null()) {
        KILN_RETURN_IF_ERROR(add(e));
      }
    }
  }
  if (m.stop_ids_.empty() && !m.special_.eos.empty()) {
    if (std::optional<int32_t> id = m.tokenizer_->token_to_id(m.special_.eos)) m.stop_ids_.push_back(*id);
  }
  return m;
}

Result<const ChatTemplate*> ModelText::chat_template(const std::string& name, bool with_tools) const {
  if (templates_.empty())
    return not_found(source_ + " has no chat template (chat_template.jinja or tokenizer_config.json's chat_template)");
  if (!name.empty()) {
    auto it = templates_.find(name);
    if (it == templates_.end()) return not_found(source_ + " has no chat template named '" + name + "'");
    return it->second.get();
  }
  if (with_tools) {
    auto it = templates_.find("tool_use");
    if (it != templates_.end()) return it->second.get();
  }
  auto it = templates_.find("default");
  if (it != templates_.end()) return it->second.get();
  if (templates_.size() == 1) return templates_.begin()->second.get();
  return invalid_argument(source_ + " has several chat templates and none named 'default'; pick one by name");
}

Result<ChatTemplateInputs> ModelText::chat_inputs(const nlohmann::ordered_json& messages,
                                                  const nlohmann::ordered_json& tools, bool add_generation_prompt) const {
  const int64_t limit = TemplateLimits{}.max_context_depth - 1;
  if (json_depth(messages) > limit || json_depth(tools) > limit)
    return invalid_argument("the messages / tools nest deeper than " + std::to_string(limit) + " levels");
  ChatTemplateInputs in;
  in.messages = messages;
  in.tools = tools;
  in.add_generation_prompt = add_generation_prompt;
  for (const auto& [key, v] : template_tokens_.items()) {
    if (key == "bos_token") in.bos_token = v.get<std::string>();
    else if (key == "eos_token") in.eos_token = v.get<std::string>();
    else in.extra[key] = v;
  }
  return in;
}

Result<std::string> ModelText::render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                           bool add_generation_prompt, const std::string& template_name,
                                           const nlohmann::ordered_json& kwargs) const {
  KILN_ASSIGN_OR_RETURN(const ChatTemplate* tmpl, chat_template(template_name, !tools.is_null()));
  KILN_ASSIGN_OR_RETURN(ChatTemplateInputs in, chat_inputs(messages, tools, add_generation_prompt));
  if (kwargs.is_object())
    for (auto it = kwargs.begin(); it != kwargs.end(); ++it) in.extra[it.key()] = it.value();
  return apply_chat_template(*tmpl, in);
}

}  // namespace kiln
