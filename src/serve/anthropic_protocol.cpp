#include "serve/anthropic_protocol.h"

#include "serve/chat_messages.h"
#include "serve/reasoning.h"
#include "serve/request_fields.h"

namespace kiln::serve {
namespace {

std::string stop_reason(const std::string& neutral) {
  if (neutral == "stop") return "end_turn";
  if (neutral == "stop_string") return "stop_sequence";
  if (neutral == "length") return "max_tokens";
  if (neutral == "tool_calls") return "tool_use";
  return neutral;  // abort, error: kiln's own
}

Json usage_json(const Usage& u) {
  return {{"input_tokens", u.prompt_tokens - u.cached_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", u.cached_tokens},
          {"output_tokens", u.completion_tokens}};
}

// The input object of a parsed call (its arguments text holds a JSON object).
Json tool_input(const ToolCall& c) {
  Json j = Json::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : Json::object();
}

std::string event(const char* name, const Json& data) {
  return std::string("event: ") + name + "\ndata: " + data.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
}

}  // namespace

Result<CompletionJob> parse_anthropic_messages(const Json& body, const ServeContext& ctx) {
  CompletionJob job;
  job.protocol = Protocol::anthropic_messages;
  FieldReader f(body);
  const Json* model = f.get("model");
  if (!model || !model->is_string()) return invalid_argument("model: Field required (a string naming the model)");
  job.model = model->get<std::string>();
  if (job.model != ctx.model_name) return not_found("model: " + job.model + " (this server serves '" + ctx.model_name + "')");
  if (!ctx.text) return invalid_argument("messages need the model's tokenizer and chat template, which are not loaded");
  if (!f.has("max_tokens")) return invalid_argument("max_tokens: Field required");
  int32_t max_tokens = 0;
  KILN_RETURN_IF_ERROR(f.read_int("max_tokens", &max_tokens, 1, INT32_MAX));
  const Json* messages = f.get("messages");
  if (!messages) return invalid_argument("messages: Field required");
  const Json* system = f.get("system");
  KILN_ASSIGN_OR_RETURN(AnthropicConversation conv, template_messages_from_anthropic(system ? *system : Json(), *messages));
  GenerationRequest& r = job.request;
  r.temperature = 1.0f;  // Anthropic's default, unless the model recommends otherwise
  ctx.sampling_defaults.apply(&r);
  KILN_RETURN_IF_ERROR(f.read_float("temperature", &r.temperature, 0.0, 1.0));
  KILN_RETURN_IF_ERROR(f.read_float("top_p", &r.top_p, 1e-9, 1.0));
  KILN_RETURN_IF_ERROR(f.read_int("top_k", &r.top_k, 0, 1 << 30));
  KILN_RETURN_IF_ERROR(f.read_strings("stop_sequences", &r.stop));
  KILN_RETURN_IF_ERROR(f.read_bool("stream", &job.stream));
  r.seed = random_seed();
  f.accept({"metadata"});
  if (const Json* tier = f.get("service_tier"))
    if (!(tier->is_string() && (*tier == "auto" || *tier == "standard_only")))
      return invalid_argument("service_tier: must be 'auto' or 'standard_only'");
  bool thinking_enabled = false;  // Anthropic's default: no extended thinking
  if (const Json* thinking = f.get("thinking")) {
    const std::string type = string_member(*thinking, "type");
    thinking_enabled = type == "enabled";
    if (type == "enabled") {
      // The model's <think> block, split off by the server's reasoning parser; kiln does not cut
      // the thinking at budget_tokens (max_tokens bounds the whole reply).
      if (!ctx.reasoning)
        return unsupported("thinking: this server splits no reasoning; start kiln serve with --reasoning-parser "
                           "auto|qwen3|deepseek_r1 for a model that thinks in <think> blocks");
      const Json* budget = thinking->is_object() && thinking->contains("budget_tokens") ? &(*thinking)["budget_tokens"] : nullptr;
      if (!budget || !integer_within(*budget, 1024, static_cast<int64_t>(max_tokens) - 1))
        return invalid_argument("thinking.budget_tokens: an integer >= 1024 and below max_tokens is required");
    } else if (type != "disabled") {
      return invalid_argument("thinking.type: must be 'enabled' or 'disabled'");
    }
  }
  // Structured outputs: output_config.format (Anthropic's GA field) or output_format (its beta's),
  // {"type": "json_schema", "schema": {...}}.
  const Json* format = nullptr;
  if (const Json* config = f.get("output_config")) {
    if (!config->is_object()) return invalid_argument("output_config: must be an object");
    for (auto it = config->begin(); it != config->end(); ++it)
      if (it.key() != "format") return unsupported("output_config." + it.key() + " is not supported by kiln");
    if (config->contains("format") && !(*config)["format"].is_null()) format = &(*config)["format"];
  }
  if (const Json* beta = f.get("output_format")) {
    if (format) return invalid_argument("give output_config.format or output_format, not both");
    if (!beta->is_null()) format = beta;
  }
  if (format) {
    if (!format->is_object() || string_member(*format, "type") != "json_schema" || !format->contains("schema"))
      return invalid_argument("output format: must be {\"type\": \"json_schema\", \"schema\": {...}}");
    Result<std::shared_ptr<const structured::JsonSchema>> schema = structured::JsonSchema::compile((*format)["schema"]);
    if (!schema.ok()) return invalid_argument("output format schema: " + schema.status().message());
    if (ctx.reasoning)
      return unsupported("structured outputs with a reasoning parser (--reasoning-parser) are not supported: the schema "
                         "would constrain the thinking too");
    r.json_schema = *schema;
  }
  // Tools.
  Json tools;
  const Json* tool_list = f.get("tools");
  const Json* choice = f.get("tool_choice");
  std::string mode = "auto", forced;
  if (choice) {
    if (!choice->is_object() || !choice->contains("type") || !(*choice)["type"].is_string())
      return invalid_argument("tool_choice: must be an object with a 'type' (auto, any, tool, none)");
    mode = (*choice)["type"].get<std::string>();
    if (mode != "auto" && mode != "any" && mode != "tool" && mode != "none")
      return invalid_argument("tool_choice.type: must be 'auto', 'any', 'tool' or 'none'");
    if (mode == "tool") {
      if (!choice->contains("name") || !(*choice)["name"].is_string()) return invalid_argument("tool_choice.name: Field required");
      forced = (*choice)["name"].get<std::string>();
    }
    if (choice->contains("disable_parallel_tool_use")) {
      if (!(*choice)["disable_parallel_tool_use"].is_boolean())
        return invalid_argument("tool_choice.disable_parallel_tool_use: must be true or false");
      job.tools.parallel = !(*choice)["disable_parallel_tool_use"].get<bool>();
    }
  }
  if (tool_list && !tool_list->empty() && mode != "none") {
    KILN_ASSIGN_OR_RETURN(tools, template_tools_from_anthropic(*tool_list));
    for (const Json& t : tools) job.tools.names.push_back(t["function"]["name"].get<std::string>());
    if (!forced.empty() && std::find(job.tools.names.begin(), job.tools.names.end(), forced) == job.tools.names.end())
      return invalid_argument("tool_choice.name: '" + forced + "' is not among the tools");
    if (ctx.tool_format == ToolCallFormat::none)
      return unsupported("this model's chat template has no tool-call format kiln can parse; start kiln serve with "
                         "--tool-call-parser hermes|llama3_json|mistral, or call without tools");
    job.tools.enabled = true;
    job.tools.format = ctx.tool_format;
    if (mode == "any" || mode == "tool")
      job.tools.forced_prefix = forced_tool_call_prefix(ctx.tool_format, forced, ctx.mistral_args_form);
    if (ctx.tool_format != ToolCallFormat::hermes) r.skip_special_tokens = false;
  } else if (mode == "any" || mode == "tool") {
    return invalid_argument("tool_choice: needs tools");
  }
  KILN_RETURN_IF_ERROR(f.refuse_unread("/v1/messages"));
  // With a reasoning parser, a template with a thinking switch (Qwen3's enable_thinking) follows the
  // request's thinking parameter: off unless enabled, as Anthropic's models think only when asked.
  Json template_kwargs = Json::object();
  if (ctx.reasoning)
    if (Result<const ChatTemplate*> tmpl = ctx.text->chat_template(ctx.template_name, !tools.is_null());
        tmpl.ok() && (*tmpl)->source().find("enable_thinking") != std::string::npos)
      template_kwargs["enable_thinking"] = thinking_enabled;
  // A prefill is part of the reply the client already has: the model continues it.
  KILN_ASSIGN_OR_RETURN(ChatPrompt prompt, render_chat_prompt(*ctx.text, ctx.template_name, conv.messages, tools,
                                                              conv.prefill + job.tools.forced_prefix, template_kwargs));
  const int64_t room = ctx.context_length - static_cast<int64_t>(prompt.ids.size());
  if (ctx.max_tokens_cap > 0 && max_tokens > ctx.max_tokens_cap)
    return invalid_argument("max_tokens: " + std::to_string(max_tokens) + " > " + std::to_string(ctx.max_tokens_cap) +
                            ", the most this server allows (--max-tokens-limit)");
  if (static_cast<int64_t>(max_tokens) > room)
    return invalid_argument("prompt is too long: " + std::to_string(prompt.ids.size()) + " tokens + max_tokens " +
                            std::to_string(max_tokens) + " > " + std::to_string(ctx.context_length) + " maximum");
  r.max_tokens = max_tokens;
  job.reasoning = ctx.reasoning;
  job.reasoning_opened = ctx.reasoning && prompt_opens_think(prompt.text);
  job.prompts.push_back(std::move(prompt.ids));
  return job;
}

Json anthropic_response(const CompletionRun& run, const std::string& id) {
  const ChoiceResult& r = run.results().at(0);
  const CompletionJob& job = run.job();
  Json content = Json::array();
  if (!r.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", r.reasoning}, {"signature", ""}});
  if (!r.text.empty() || (r.tool_calls.empty() && r.reasoning.empty()))
    content.push_back({{"type", "text"}, {"text", r.text}});
  for (size_t i = 0; i < r.tool_calls.size(); ++i)
    content.push_back({{"type", "tool_use"},
                       {"id", make_tool_call_id(job.tools.format, "toolu_", job.request.seed, static_cast<int32_t>(i))},
                       {"name", r.tool_calls[i].name},
                       {"input", tool_input(r.tool_calls[i])}});
  return {{"id", id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", job.model},
          {"content", content},
          {"stop_reason", stop_reason(r.finish_reason)},
          {"stop_sequence", r.stop_string.empty() ? Json() : Json(r.stop_string)},
          {"usage", usage_json(run.total_usage())},
          {"policy_versions", version_runs(r.tokens)}};
}

std::string AnthropicStream::begin() {
  Usage u;
  u.prompt_tokens = static_cast<int32_t>(job_.prompts.at(0).size());
  Json usage = usage_json(u);
  usage["output_tokens"] = 0;
  Json message = {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", job_.model},
                  {"content", Json::array()}, {"stop_reason", Json()}, {"stop_sequence", Json()}, {"usage", usage}};
  return event("message_start", {{"type", "message_start"}, {"message", message}}) + event("ping", {{"type", "ping"}});
}

std::string AnthropicStream::open_block(const Json& block) {
  std::string out = close_block();
  ++index_;
  open_ = true;
  return out + event("content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", block}});
}

std::string AnthropicStream::close_block() {
  if (!open_) return "";
  std::string out;
  if (thinking_open_)  // a thinking block ends with its signature (kiln signs nothing: empty)
    out = event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                        {"delta", {{"type", "signature_delta"}, {"signature", ""}}}});
  open_ = false;
  text_open_ = false;
  thinking_open_ = false;
  tool_index_ = -1;
  return out + event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
}

std::string AnthropicStream::deltas(const std::vector<ChoiceDelta>& deltas) {
  std::string out;
  for (const ChoiceDelta& d : deltas) {
    if (!d.reasoning.empty()) {
      if (!thinking_open_) {
        out += open_block({{"type", "thinking"}, {"thinking", ""}});
        thinking_open_ = true;
      }
      out += event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                           {"delta", {{"type", "thinking_delta"}, {"thinking", d.reasoning}}}});
    }
    if (!d.text.empty()) {
      if (!text_open_) {
        out += open_block({{"type", "text"}, {"text", ""}});
        text_open_ = true;
      }
      out += event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                           {"delta", {{"type", "text_delta"}, {"text", d.text}}}});
    }
    for (const ToolCallDelta& t : d.tool_calls) {
      if (!t.name.empty() || t.index != tool_index_) {
        out += open_block({{"type", "tool_use"},
                           {"id", make_tool_call_id(job_.tools.format, "toolu_", job_.request.seed, t.index)},
                           {"name", t.name},
                           {"input", Json::object()}});
        tool_index_ = t.index;
      }
      if (!t.arguments.empty())
        out += event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                             {"delta", {{"type", "input_json_delta"}, {"partial_json", t.arguments}}}});
    }
  }
  return out;
}

std::string AnthropicStream::end(const CompletionRun& run) {
  std::string out;
  if (index_ < 0) out += open_block({{"type", "text"}, {"text", ""}});  // an empty reply is one empty text block
  out += close_block();
  const ChoiceResult& r = run.results().at(0);
  Json usage = usage_json(run.total_usage());
  out += event("message_delta", {{"type", "message_delta"},
                                 {"delta", {{"stop_reason", stop_reason(r.finish_reason)},
                                            {"stop_sequence", r.stop_string.empty() ? Json() : Json(r.stop_string)}}},
                                 {"usage", usage},
                                 {"policy_versions", version_runs(r.tokens)}});
  out += event("message_stop", {{"type", "message_stop"}});
  return out;
}

std::string AnthropicStream::error(const ApiError& e) { return event("error", anthropic_error_body(e)); }

}  // namespace kiln::serve
