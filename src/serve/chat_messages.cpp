#include "serve/chat_messages.h"

#include "serve/request_fields.h"

namespace kiln::serve {
namespace {

Status bad(const std::string& what) { return invalid_argument(what); }

// Text of a content value: a string, or a list of parts whose "text" parts (the type holding text in
// both protocols) are joined with "\n"; other parts are refused.
Result<std::string> content_text(const Json& content, const std::string& where) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return bad(where + ": 'content' must be a string or a list of content parts");
  std::string out;
  bool first = true;
  for (const Json& part : content) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      return bad(where + ": every content part must be an object with a 'type'");
    const std::string type = part["type"].get<std::string>();
    if (type != "text")
      return bad(where + ": content parts of type '" + type + "' are not supported (kiln serves text models); use text");
    if (!part.contains("text") || !part["text"].is_string()) return bad(where + ": a text part needs a string 'text'");
    if (!first) out += "\n";
    out += part["text"].get<std::string>();
    first = false;
  }
  return out;
}

// The arguments of a tool call as templates want them: the object its JSON text holds; text that is
// no JSON object stays a string.
Json arguments_object(const Json& arguments) {
  if (!arguments.is_string()) return arguments;
  Json parsed = Json::parse(arguments.get<std::string>(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) return arguments;
  return parsed;
}

}  // namespace

Result<Json> parse_request_body(std::string_view body) {
  int32_t depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') {
      if (++depth > kMaxRequestNesting)
        return bad("the request body nests deeper than " + std::to_string(kMaxRequestNesting) + " levels");
    } else if (c == '}' || c == ']') --depth;
  }
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("the request body is not valid JSON");
  if (!j.is_object()) return bad("the request body must be a JSON object");
  return j;
}

Result<Json> template_messages_from_openai(const Json& messages) {
  if (!messages.is_array() || messages.empty()) return bad("'messages' must be a non-empty list of messages");
  Json out = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad(where + " must be an object");
    if (!m.contains("role") || !m["role"].is_string()) return bad(where + " needs a string 'role'");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      return bad(where + ": unknown role '" + role + "' (expected system, developer, user, assistant or tool)");
    Json t = {{"role", role}};
    const Json content = m.contains("content") ? m["content"] : Json();
    if (content.is_null() && role != "assistant") return bad(where + " needs 'content'");
    KILN_ASSIGN_OR_RETURN(std::string text, content_text(content, where));
    t["content"] = text;
    if (m.contains("name")) {
      if (!m["name"].is_string()) return bad(where + ": 'name' must be a string");
      t["name"] = m["name"];
    }
    // An earlier reply's reasoning (vLLM's reasoning_content, or its newer reasoning), for templates
    // that show it (Qwen3).
    for (const char* key : {"reasoning_content", "reasoning"}) {
      if (role != "assistant" || !m.contains(key) || m[key].is_null()) continue;
      if (!m[key].is_string()) return bad(where + ": '" + key + "' must be a string");
      t["reasoning_content"] = m[key];
    }
    if (role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      const Json& calls = m["tool_calls"];
      if (!calls.is_array()) return bad(where + ": 'tool_calls' must be a list");
      Json tc = Json::array();
      for (size_t k = 0; k < calls.size(); ++k) {
        const Json& c = calls[k];
        const std::string cw = where + ".tool_calls[" + std::to_string(k) + "]";
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
          return bad(cw + " needs a 'function' object");
        const Json& f = c["function"];
        if (!f.contains("name") || !f["name"].is_string()) return bad(cw + ".function needs a string 'name'");
        Json call = {{"type", "function"},
                     {"function", {{"name", f["name"]}, {"arguments", arguments_object(f.value("arguments", Json("{}")))}}}};
        if (c.contains("id") && c["id"].is_string()) call["id"] = c["id"];
        tc.push_back(std::move(call));
      }
      t["tool_calls"] = std::move(tc);
    }
    if (role == "tool") {
      if (m.contains("tool_call_id")) {
        if (!m["tool_call_id"].is_string()) return bad(where + ": 'tool_call_id' must be a string");
        t["tool_call_id"] = m["tool_call_id"];
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

Result<Json> template_tools_from_openai(const Json& tools) {
  if (!tools.is_array()) return bad("'tools' must be a list of tool definitions");
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (string_member(t, "type") != "function")
      return bad(where + " must be {\"type\": \"function\", \"function\": {...}}");
    if (!t.contains("function") || !t["function"].is_object()) return bad(where + " needs a 'function' object");
    const Json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      return bad(where + ".function needs a non-empty string 'name'");
    if (f.contains("parameters") && !f["parameters"].is_object())
      return bad(where + ".function.parameters must be a JSON schema object");
  }
  return tools;
}

Result<AnthropicConversation> template_messages_from_anthropic(const Json& system, const Json& messages) {
  AnthropicConversation conv;
  conv.messages = Json::array();
  if (!system.is_null()) {
    KILN_ASSIGN_OR_RETURN(std::string text, content_text(system, "system"));
    conv.messages.push_back({{"role", "system"}, {"content", text}});
  }
  if (!messages.is_array() || messages.empty()) return bad("messages: must be a non-empty list of messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string where = "messages." + std::to_string(i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) return bad(where + ": needs a string 'role'");
    const std::string role = m["role"].get<std::string>();
    if (role != "user" && role != "assistant") return bad(where + ".role: must be 'user' or 'assistant'");
    if (!m.contains("content")) return bad(where + ".content: Field required");
    const Json& content = m["content"];
    if (content.is_string()) {
      conv.messages.push_back({{"role", role}, {"content", content}});
      continue;
    }
    if (!content.is_array()) return bad(where + ".content: must be a string or a list of content blocks");
    std::string text, thinking;
    bool has_text = false;
    Json calls = Json::array();
    Json results = Json::array();  // tool messages, rendered before the user's text
    for (size_t k = 0; k < content.size(); ++k) {
      const Json& b = content[k];
      const std::string bw = where + ".content." + std::to_string(k);
      if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) return bad(bw + ": needs a string 'type'");
      const std::string type = b["type"].get<std::string>();
      if (type == "text") {
        if (!b.contains("text") || !b["text"].is_string()) return bad(bw + ".text: Field required");
        if (has_text) text += "\n";
        text += b["text"].get<std::string>();
        has_text = true;
      } else if (type == "thinking" && role == "assistant") {
        // Earlier reasoning: templates that show it (Qwen3's reasoning_content) get its text.
        if (!b.contains("thinking") || !b["thinking"].is_string()) return bad(bw + ".thinking: Field required");
        thinking += b["thinking"].get<std::string>();
      } else if (type == "redacted_thinking" && role == "assistant") {
        // Encrypted by another server: nothing kiln can show the template.
      } else if (type == "tool_use" && role == "assistant") {
        if (!b.contains("name") || !b["name"].is_string()) return bad(bw + ".name: Field required");
        Json input = b.contains("input") ? b["input"] : Json::object();
        if (!input.is_object()) return bad(bw + ".input: must be an object");
        Json call = {{"type", "function"}, {"function", {{"name", b["name"]}, {"arguments", input}}}};
        if (b.contains("id") && b["id"].is_string()) call["id"] = b["id"];
        calls.push_back(std::move(call));
      } else if (type == "tool_result" && role == "user") {
        if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string()) return bad(bw + ".tool_use_id: Field required");
        KILN_ASSIGN_OR_RETURN(std::string result, content_text(b.contains("content") ? b["content"] : Json(""), bw));
        const Json is_error = b.contains("is_error") ? b["is_error"] : Json(false);
        if (!is_error.is_boolean() && !is_error.is_null()) return bad(bw + ".is_error: must be true or false");
        if (is_error == true) result = "Error: " + result;
        results.push_back({{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", result}});
      } else {
        return bad(bw + ": content blocks of type '" + type + "' are not supported in " + role +
                   " messages (kiln serves text models: text, thinking, tool_use, tool_result)");
      }
    }
    for (Json& r : results) conv.messages.push_back(std::move(r));
    if (role == "assistant") {
      Json t = {{"role", "assistant"}, {"content", text}};
      if (!thinking.empty()) t["reasoning_content"] = thinking;
      if (!calls.empty()) t["tool_calls"] = std::move(calls);
      conv.messages.push_back(std::move(t));
    } else if (has_text || results.empty()) {
      conv.messages.push_back({{"role", "user"}, {"content", text}});
    }
  }
  // A final assistant message (without tool calls) is a prefill: the reply continues its text.
  const Json& last = conv.messages.back();
  if (last["role"] == "assistant" && !last.contains("tool_calls")) {
    conv.prefill = last["content"].get<std::string>();
    conv.messages.erase(conv.messages.size() - 1);
    if (conv.messages.empty()) return bad("messages: a conversation cannot be only an assistant prefill");
  }
  return conv;
}

Result<Json> template_tools_from_anthropic(const Json& tools) {
  if (!tools.is_array()) return bad("tools: must be a list of tools");
  Json out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string where = "tools." + std::to_string(i);
    if (!t.is_object()) return bad(where + ": must be an object");
    if (t.contains("type") && t["type"].is_string() && t["type"] != "custom")
      return bad(where + ": server tools of type '" + t["type"].get<std::string>() + "' are not supported");
    if (!t.contains("name") || !t["name"].is_string() || t["name"].get<std::string>().empty())
      return bad(where + ".name: Field required");
    if (!t.contains("input_schema") || !t["input_schema"].is_object())
      return bad(where + ".input_schema: Field required (a JSON schema object)");
    Json f = {{"name", t["name"]}};
    if (t.contains("description")) f["description"] = t["description"];
    f["parameters"] = t["input_schema"];
    out.push_back({{"type", "function"}, {"function", std::move(f)}});
  }
  return out;
}

Result<ChatPrompt> render_chat_prompt(const ModelText& text, const std::string& template_name, const Json& messages,
                                      const Json& tools, const std::string& suffix, const Json& template_kwargs) {
  ChatPrompt p;
  KILN_ASSIGN_OR_RETURN(p.text,
                        text.render_chat(messages, tools, /*add_generation_prompt=*/true, template_name, template_kwargs));
  p.text += suffix;
  KILN_ASSIGN_OR_RETURN(p.ids, text.tokenizer().encode(p.text, /*add_special_tokens=*/false));
  return p;
}

}  // namespace kiln::serve
