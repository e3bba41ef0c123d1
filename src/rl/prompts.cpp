#include "rl/prompts.h"

#include <fstream>

#include "core/json_text.h"
#include "model/chat_template.h"

namespace kiln::rl {
namespace {

Result<std::vector<int32_t>> ids_of(const nlohmann::json& v, const std::string& where) {
  if (!v.is_array() || v.empty()) return invalid_argument(where + " must be a non-empty array of token ids");
  std::vector<int32_t> ids;
  for (const nlohmann::json& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
      return invalid_argument(where + " holds " + json_brief(x) + ", not a token id");
    ids.push_back(x.get<int32_t>());
  }
  return ids;
}

// A completion given as text (`key`) or ids (`key`_ids).
Result<std::vector<int32_t>> completion_of(const nlohmann::json& line, const std::string& key, const ModelText* text,
                                           const std::string& where) {
  if (line.contains(key + "_ids")) return ids_of(line[key + "_ids"], where + ": \"" + key + "_ids\"");
  if (!line.contains(key) || !line[key].is_string())
    return invalid_argument(where + ": a preference line needs \"" + key + "\" (text) or \"" + key + "_ids\"");
  if (!text) return invalid_argument(where + ": \"" + key + "\" is text, and the model has no tokenizer.json");
  KILN_ASSIGN_OR_RETURN(std::vector<int32_t> ids, text->tokenizer().encode(line[key].get<std::string>(), false));
  if (ids.empty()) return invalid_argument(where + ": \"" + key + "\" is empty");
  return ids;
}

}  // namespace

Result<std::vector<Prompt>> load_prompts(const std::string& path, const ModelText* text, bool preferences,
                                         bool prompt_as_chat) {
  std::ifstream in(path);
  if (!in) return not_found("cannot open the prompts file " + path);
  std::vector<Prompt> out;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(number);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return invalid_argument(where + ": not a JSON object");
    // The line is kept (the reward reads its fields, rollout records copy and print it), and copying
    // or printing a value recurses as deep as it nests.
    const int64_t limit = TemplateLimits{}.max_context_depth - 1;
    KILN_RETURN_IF_ERROR(check_nesting(j, limit, where + ": the line"));
    Prompt p;
    if (j.contains("prompt_ids")) {
      KILN_ASSIGN_OR_RETURN(p.ids, ids_of(j["prompt_ids"], where + ": \"prompt_ids\""));
    } else if (j.contains("messages") || (prompt_as_chat && j.contains("prompt") && j["prompt"].is_string())) {
      if (!text) return invalid_argument(where + ": \"messages\" need the model's tokenizer and chat template");
      const nlohmann::ordered_json messages =
          j.contains("messages") ? nlohmann::ordered_json::parse(j["messages"].dump())
                                 : nlohmann::ordered_json::array({{{"role", "user"}, {"content", j["prompt"]}}});
      const nlohmann::ordered_json tools =
          j.contains("tools") ? nlohmann::ordered_json::parse(j["tools"].dump()) : nlohmann::ordered_json();
      Result<std::string> rendered = text->render_chat(messages, tools, /*add_generation_prompt=*/true);
      if (!rendered.ok()) return invalid_argument(where + ": " + rendered.status().message());
      KILN_ASSIGN_OR_RETURN(p.ids, text->tokenizer().encode(*rendered, false));
    } else if (j.contains("prompt") && j["prompt"].is_string()) {
      if (!text) return invalid_argument(where + ": \"prompt\" is text, and the model has no tokenizer.json");
      KILN_ASSIGN_OR_RETURN(p.ids, text->tokenizer().encode(j["prompt"].get<std::string>(), true));
    } else {
      return invalid_argument(where + ": a prompt line needs \"prompt\" (text), \"messages\" (a chat) or \"prompt_ids\"");
    }
    if (p.ids.empty()) return invalid_argument(where + ": the prompt has no tokens");
    if (preferences) {
      KILN_ASSIGN_OR_RETURN(p.chosen, completion_of(j, "chosen", text, where));
      KILN_ASSIGN_OR_RETURN(p.rejected, completion_of(j, "rejected", text, where));
    }
    p.fields = std::move(j);
    out.push_back(std::move(p));
  }
  if (out.empty()) return invalid_argument(path + " has no prompts");
  return out;
}

}  // namespace kiln::rl
