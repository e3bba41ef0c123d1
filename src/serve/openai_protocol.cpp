#include "serve/openai_protocol.h"

#include "core/json_text.h"
#include "serve/chat_messages.h"
#include "serve/reasoning.h"
#include "serve/request_fields.h"

namespace kiln::serve {
namespace {

Status check_model(FieldReader& f, const ServeContext& ctx, CompletionJob* job) {
  const Json* model = f.get("model");
  if (!model || !model->is_string()) return invalid_argument("'model' is required: a string naming the model");
  job->model = model->get<std::string>();
  if (job->model != ctx.model_name)
    return not_found("The model '" + job->model + "' does not exist; this server serves '" + ctx.model_name + "'");
  return Status::Ok();
}

// Sampling, stopping and output fields shared by chat and completions.
Status read_common(FieldReader& f, const ServeContext& ctx, CompletionJob* job) {
  GenerationRequest& r = job->request;
  KILN_RETURN_IF_ERROR(f.read_bool("stream", &job->stream));
  if (const Json* so = f.get("stream_options")) {
    if (!so->is_object()) return invalid_argument("'stream_options' must be an object");
    if (!job->stream) return invalid_argument("'stream_options' is only allowed when 'stream' is true");
    for (auto it = so->begin(); it != so->end(); ++it) {
      if (it.key() == "include_usage") {
        if (!it->is_boolean()) return invalid_argument("'stream_options.include_usage' must be true or false");
        job->include_usage = it->get<bool>();
      } else if (it.key() != "continuous_usage_stats") {
        return invalid_argument("unknown parameter 'stream_options." + it.key() + "'");
      }
    }
  }
  KILN_RETURN_IF_ERROR(f.read_int("n", &job->n, 1, ctx.max_n));
  r.temperature = 1.0f;  // OpenAI's default, unless the model recommends otherwise
  ctx.sampling_defaults.apply(&r);
  KILN_RETURN_IF_ERROR(f.read_float("temperature", &r.temperature, 0.0, 2.0));
  KILN_RETURN_IF_ERROR(f.read_float("top_p", &r.top_p, 1e-9, 1.0));
  int32_t top_k = r.top_k;  // -1 (vLLM's "off") or 0
  KILN_RETURN_IF_ERROR(f.read_int("top_k", &top_k, -1, 1 << 30));
  r.top_k = top_k < 0 ? 0 : top_k;
  KILN_RETURN_IF_ERROR(f.read_float("min_p", &r.min_p, 0.0, 1.0));
  KILN_RETURN_IF_ERROR(f.read_float("presence_penalty", &r.presence_penalty, -2.0, 2.0));
  KILN_RETURN_IF_ERROR(f.read_float("frequency_penalty", &r.frequency_penalty, -2.0, 2.0));
  KILN_RETURN_IF_ERROR(f.read_float("repetition_penalty", &r.repetition_penalty, 1e-6, 100.0));
  if (f.has("seed")) {
    // OpenAI allows negative seeds: they map onto the unsigned range.
    const Json* s = f.get("seed");
    if (!s->is_number_integer()) return invalid_argument("'seed' must be an integer");
    r.seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  } else {
    r.seed = random_seed();
  }
  KILN_RETURN_IF_ERROR(f.read_strings("stop", &r.stop));
  if (!r.stop.empty() && !ctx.text) return invalid_argument("'stop' needs the model's tokenizer, which is not loaded");
  if (const Json* ids = f.get("stop_token_ids")) {
    if (!ids->is_array()) return invalid_argument("'stop_token_ids' must be a list of token ids");
    for (const Json& x : *ids) {
      if (!integer_within(x, 0, INT32_MAX)) return invalid_argument("'stop_token_ids' must hold token ids, not " + json_brief(x));
      r.stop_token_ids.push_back(x.get<int32_t>());
    }
  }
  KILN_RETURN_IF_ERROR(f.read_bool("ignore_eos", &r.ignore_eos));
  KILN_RETURN_IF_ERROR(f.read_bool("skip_special_tokens", &r.skip_special_tokens));
  KILN_RETURN_IF_ERROR(f.read_bool("return_token_ids", &job->return_token_ids));
  if (const Json* lb = f.get("logit_bias")) KILN_RETURN_IF_ERROR(read_logit_bias(*lb, &r.logit_bias));
  if (const Json* st = f.get("store"))
    if (!(st->is_boolean() && !st->get<bool>())) return unsupported("'store' is not supported: kiln keeps no responses");
  if (const Json* tier = f.get("service_tier"))
    if (!(tier->is_string() && (*tier == "auto" || *tier == "default")))
      return unsupported("'service_tier' must be 'auto' or 'default'");
  f.accept({"user", "metadata"});
  return Status::Ok();
}

// max_tokens against the context: absent means "what is left of the context" (capped).
// The completion length asked for (-1: not given).
Result<int32_t> read_max_tokens(FieldReader& f) {
  int32_t max_tokens = -1, max_completion = -1;
  KILN_RETURN_IF_ERROR(f.read_int("max_tokens", &max_tokens, 0, INT32_MAX));
  KILN_RETURN_IF_ERROR(f.read_int("max_completion_tokens", &max_completion, 0, INT32_MAX));
  if (max_tokens >= 0 && max_completion >= 0 && max_tokens != max_completion)
    return invalid_argument("give one of 'max_tokens' and 'max_completion_tokens'");
  return max_completion >= 0 ? max_completion : max_tokens;
}

Status fit_max_tokens(const ServeContext& ctx, CompletionJob* job, int32_t asked_tokens, int32_t default_max) {
  size_t longest = 0;
  for (const auto& p : job->prompts) longest = std::max(longest, p.size());
  const int64_t room = ctx.context_length - static_cast<int64_t>(longest);
  if (room <= 0) {
    return invalid_argument("This model's maximum context length is " + std::to_string(ctx.context_length) +
                            " tokens. However, your prompt has " + std::to_string(longest) +
                            " tokens. Please reduce the length of the prompt.");
  }
  int64_t asked = asked_tokens;
  if (asked < 0) {  // not given: the default (the protocol's, else the model's), what the context leaves, the cap
    if (default_max <= 0 && ctx.sampling_defaults.max_tokens) default_max = *ctx.sampling_defaults.max_tokens;
    asked = default_max > 0 ? std::min<int64_t>(default_max, room) : room;
    if (ctx.max_tokens_cap > 0) asked = std::min<int64_t>(asked, ctx.max_tokens_cap);
  } else if (ctx.max_tokens_cap > 0 && asked > ctx.max_tokens_cap) {
    return invalid_argument("max_tokens is too large: " + std::to_string(asked) + ". This server allows at most " +
                            std::to_string(ctx.max_tokens_cap) + " completion tokens (--max-tokens-limit).");
  }
  if (asked > room) {
    return invalid_argument("This model's maximum context length is " + std::to_string(ctx.context_length) +
                            " tokens. However, you requested " + std::to_string(longest + asked) + " tokens (" +
                            std::to_string(longest) + " in the prompt, " + std::to_string(asked) +
                            " for the completion). Please reduce the length of the prompt or max_tokens.");
  }
  job->request.max_tokens = static_cast<int32_t>(asked);
  return Status::Ok();
}

Status read_tools(FieldReader& f, const ServeContext& ctx, CompletionJob* job, Json* template_tools) {
  *template_tools = Json();
  const Json* tools = f.get("tools");
  const Json* choice = f.get("tool_choice");
  bool parallel = true;
  KILN_RETURN_IF_ERROR(f.read_bool("parallel_tool_calls", &parallel));
  job->tools.parallel = parallel;
  if (f.has("functions") || f.has("function_call"))
    return unsupported("'functions' and 'function_call' are deprecated; use 'tools' and 'tool_choice'");
  if (!tools || tools->empty()) {
    if (choice && !(choice->is_string() && (*choice == "none" || *choice == "auto")))
      return invalid_argument("'tool_choice' needs 'tools'");
    return Status::Ok();
  }
  KILN_ASSIGN_OR_RETURN(Json checked, template_tools_from_openai(*tools));
  for (const Json& t : checked) job->tools.names.push_back(t["function"]["name"].get<std::string>());
  std::string mode = "auto", forced;
  if (choice) {
    if (choice->is_string()) {
      mode = choice->get<std::string>();
      if (mode != "none" && mode != "auto" && mode != "required")
        return invalid_argument("'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", ...}");
    } else if (string_member(*choice, "type") == "function" && choice->contains("function") &&
               (*choice)["function"].is_object() && (*choice)["function"].contains("name") &&
               (*choice)["function"]["name"].is_string()) {
      mode = "named";
      forced = (*choice)["function"]["name"].get<std::string>();
      if (std::find(job->tools.names.begin(), job->tools.names.end(), forced) == job->tools.names.end())
        return invalid_argument("'tool_choice' names the function '" + forced + "', which is not among 'tools'");
    } else {
      return invalid_argument("'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
  }
  if (mode == "none") return Status::Ok();  // the tools stay out of the prompt: no call can be made
  if (ctx.tool_format == ToolCallFormat::none)
    return unsupported("this model's chat template has no tool-call format kiln can parse; start kiln serve with "
                       "--tool-call-parser hermes|llama3_json|mistral, or call without 'tools'");
  *template_tools = std::move(checked);
  job->tools.enabled = true;
  job->tools.format = ctx.tool_format;
  if (mode != "auto") job->tools.forced_prefix = forced_tool_call_prefix(ctx.tool_format, forced, ctx.mistral_args_form);
  return Status::Ok();
}

std::string token_text(const ServeContext& ctx, int32_t id) {
  if (!ctx.text) return "token_id:" + std::to_string(id);
  Result<std::string> s = ctx.text->tokenizer().decode({id}, /*skip_special_tokens=*/false);
  return s.ok() ? *s : "";
}

Json bytes_of(const std::string& s) {
  Json b = Json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// Chat logprobs entries of `tokens`.
Json chat_logprobs(const ServeContext& ctx, const std::vector<GeneratedToken>& tokens, int32_t top_n) {
  Json content = Json::array();
  for (const GeneratedToken& t : tokens) {
    const std::string s = token_text(ctx, t.id);
    Json top = Json::array();
    for (int32_t k = 0; k < top_n && k < static_cast<int32_t>(t.top.size()); ++k) {
      const std::string ts = token_text(ctx, t.top[k].first);
      top.push_back({{"token", ts}, {"logprob", t.top[k].second}, {"bytes", bytes_of(ts)}});
    }
    content.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

// Completions logprobs of `tokens`, text offsets counted from `offset` (advanced).
Json completion_logprobs(const ServeContext& ctx, const std::vector<GeneratedToken>& tokens, int32_t top_n,
                         int32_t* offset) {
  Json toks = Json::array(), lps = Json::array(), tops = Json::array(), offs = Json::array();
  for (const GeneratedToken& t : tokens) {
    const std::string s = token_text(ctx, t.id);
    toks.push_back(s);
    lps.push_back(t.logprob);
    Json top = Json::object();
    for (int32_t k = 0; k < top_n && k < static_cast<int32_t>(t.top.size()); ++k)
      top[token_text(ctx, t.top[k].first)] = t.top[k].second;
    tops.push_back(top_n > 0 ? top : Json());
    offs.push_back(*offset);
    *offset += static_cast<int32_t>(s.size());
  }
  return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

Json token_ids(const std::vector<GeneratedToken>& tokens) {
  Json ids = Json::array();
  for (const GeneratedToken& t : tokens) ids.push_back(t.id);
  return ids;
}

Json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

Json tool_calls_json(const std::vector<ToolCall>& calls, uint64_t seed, ToolCallFormat format) {
  Json out = Json::array();
  for (size_t i = 0; i < calls.size(); ++i)
    out.push_back({{"id", make_tool_call_id(format, "call_", seed, static_cast<int32_t>(i))},
                   {"type", "function"},
                   {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}});
  return out;
}

}  // namespace

std::string openai_finish_reason(const std::string& neutral) {
  if (neutral == "stop_string") return "stop";
  if (neutral == "error") return "abort";
  return neutral;  // stop, length, tool_calls, abort
}

Result<CompletionJob> parse_openai_chat(const Json& body, const ServeContext& ctx) {
  CompletionJob job;
  job.protocol = Protocol::openai_chat;
  FieldReader f(body);
  KILN_RETURN_IF_ERROR(check_model(f, ctx, &job));
  if (!ctx.text) return invalid_argument("chat completions need the model's tokenizer and chat template, which are not loaded");
  const Json* messages = f.get("messages");
  if (!messages) return invalid_argument("'messages' is required");
  KILN_ASSIGN_OR_RETURN(Json template_messages, template_messages_from_openai(*messages));
  KILN_RETURN_IF_ERROR(read_common(f, ctx, &job));
  bool logprobs = false;
  KILN_RETURN_IF_ERROR(f.read_bool("logprobs", &logprobs));
  int32_t top = 0;
  KILN_RETURN_IF_ERROR(f.read_int("top_logprobs", &top, 0, 20));
  if (top > 0 && !logprobs) return invalid_argument("'top_logprobs' needs 'logprobs': true");
  job.request.logprobs = logprobs;
  job.request.top_logprobs = top;
  if (const Json* rf = f.get("response_format")) {
    KILN_ASSIGN_OR_RETURN(job.request.json_schema, structured::JsonSchema::from_response_format(*rf));
    if (job.request.json_schema && ctx.reasoning)
      return unsupported("'response_format' with a reasoning parser (--reasoning-parser) is not supported: the schema "
                         "would constrain the thinking too");
  }
  for (const char* k : {"audio", "modalities", "prediction", "reasoning_effort", "web_search_options"})
    if (const Json* v = f.get(k))
      if (!(std::string(k) == "modalities" && *v == Json::array({"text"})))
        return unsupported(std::string("'") + k + "' is not supported by kiln");
  Json tools;
  KILN_RETURN_IF_ERROR(read_tools(f, ctx, &job, &tools));
  // vLLM's extension: more variables for the chat template (e.g. Qwen3's enable_thinking).
  Json template_kwargs = Json::object();
  if (const Json* kw = f.get("chat_template_kwargs")) {
    if (!kw->is_null() && !kw->is_object()) return invalid_argument("'chat_template_kwargs' must be an object");
    if (kw->is_object()) template_kwargs = *kw;
    for (const char* reserved : {"messages", "tools", "add_generation_prompt"})
      if (template_kwargs.contains(reserved))
        return invalid_argument(std::string("'chat_template_kwargs' may not set '") + reserved + "' (it is the request's own)");
  }
  KILN_ASSIGN_OR_RETURN(int32_t asked, read_max_tokens(f));
  KILN_RETURN_IF_ERROR(f.refuse_unread("/v1/chat/completions"));
  if (job.tools.enabled && job.tools.format != ToolCallFormat::hermes) job.request.skip_special_tokens = false;
  KILN_ASSIGN_OR_RETURN(ChatPrompt prompt, render_chat_prompt(*ctx.text, ctx.template_name, template_messages, tools,
                                                              job.tools.forced_prefix, template_kwargs));
  job.reasoning = ctx.reasoning;
  job.reasoning_opened = ctx.reasoning && prompt_opens_think(prompt.text);
  job.prompts.push_back(std::move(prompt.ids));
  KILN_RETURN_IF_ERROR(fit_max_tokens(ctx, &job, asked, 0));
  return job;
}

Result<CompletionJob> parse_openai_completion(const Json& body, const ServeContext& ctx) {
  CompletionJob job;
  job.protocol = Protocol::openai_completion;
  FieldReader f(body);
  KILN_RETURN_IF_ERROR(check_model(f, ctx, &job));
  const Json* prompt = f.get("prompt");
  if (!prompt) return invalid_argument("'prompt' is required");
  auto add_text = [&](const Json& s) -> Status {
    if (!ctx.text) return invalid_argument("text prompts need the model's tokenizer, which is not loaded; send token ids");
    KILN_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ctx.text->tokenizer().encode(s.get<std::string>(), true));
    job.prompts.push_back(std::move(ids));
    job.prompt_texts.push_back(s.get<std::string>());
    return Status::Ok();
  };
  auto add_ids = [&](const Json& a) -> Status {
    std::vector<int32_t> ids;
    for (const Json& x : a) {
      if (!x.is_number_integer()) return invalid_argument("'prompt' token lists must hold integers");
      const int64_t v = x.get<int64_t>();
      if (v < 0 || v > INT32_MAX) return invalid_argument("'prompt' holds the token id " + json_brief(x) + ", out of range");
      ids.push_back(static_cast<int32_t>(v));
    }
    job.prompts.push_back(std::move(ids));
    std::string text;
    if (ctx.text)
      if (Result<std::string> d = ctx.text->tokenizer().decode(job.prompts.back(), false); d.ok()) text = *d;
    job.prompt_texts.push_back(std::move(text));
    return Status::Ok();
  };
  if (prompt->is_string()) {
    KILN_RETURN_IF_ERROR(add_text(*prompt));
  } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number()) {
    KILN_RETURN_IF_ERROR(add_ids(*prompt));
  } else if (prompt->is_array() && !prompt->empty()) {
    for (const Json& p : *prompt) {
      if (p.is_string()) KILN_RETURN_IF_ERROR(add_text(p));
      else if (p.is_array()) KILN_RETURN_IF_ERROR(add_ids(p));
      else return invalid_argument("'prompt' must be a string, a list of strings, a list of token ids or a list of such lists");
    }
  } else {
    return invalid_argument("'prompt' must be a non-empty string, list of strings or list of token ids");
  }
  for (const auto& p : job.prompts)
    if (p.empty()) return invalid_argument("'prompt' is empty; give at least one token");
  if (job.prompts.size() > 1024) return invalid_argument("at most 1024 prompts per request");
  KILN_RETURN_IF_ERROR(read_common(f, ctx, &job));
  if (job.choices() > 4 * ctx.max_n) return invalid_argument("too many choices (prompts x n) in one request");
  KILN_RETURN_IF_ERROR(f.read_bool("echo", &job.echo));
  int32_t logprobs = -1;
  KILN_RETURN_IF_ERROR(f.read_int("logprobs", &logprobs, 0, 20));
  job.logprobs = logprobs;
  job.request.logprobs = logprobs >= 0;
  job.request.top_logprobs = std::max(logprobs, 0);
  int32_t best_of = job.n;
  KILN_RETURN_IF_ERROR(f.read_int("best_of", &best_of, 1, ctx.max_n));
  if (best_of != job.n) return unsupported("'best_of' other than 'n' is not supported by kiln");
  if (const Json* sfx = f.get("suffix"))
    if (!(sfx->is_string() && sfx->get<std::string>().empty())) return unsupported("'suffix' (fill in the middle) is not supported");
  KILN_ASSIGN_OR_RETURN(int32_t asked, read_max_tokens(f));
  KILN_RETURN_IF_ERROR(f.refuse_unread("/v1/completions"));
  KILN_RETURN_IF_ERROR(fit_max_tokens(ctx, &job, asked, 16));
  return job;
}

Json openai_response(const CompletionRun& run, const ServeContext& ctx, const std::string& id, int64_t created) {
  const CompletionJob& job = run.job();
  const bool chat = job.protocol == Protocol::openai_chat;
  Json choices = Json::array();
  for (size_t c = 0; c < run.results().size(); ++c) {
    const ChoiceResult& r = run.results()[c];
    Json ch = {{"index", static_cast<int64_t>(c)}};
    if (chat) {
      Json msg = {{"role", "assistant"}};
      msg["content"] = (r.text.empty() && (!r.tool_calls.empty() || !r.reasoning.empty())) ? Json() : Json(r.text);
      if (job.reasoning) {  // vLLM's field names: reasoning_content, and its newer reasoning
        msg["reasoning_content"] = r.reasoning.empty() ? Json() : Json(r.reasoning);
        msg["reasoning"] = msg["reasoning_content"];
      }
      if (!r.tool_calls.empty()) msg["tool_calls"] = tool_calls_json(r.tool_calls, job.request.seed + c, job.tools.format);
      ch["message"] = std::move(msg);
      ch["logprobs"] = job.request.logprobs ? chat_logprobs(ctx, r.tokens, job.request.top_logprobs) : Json();
    } else {
      const std::string& prompt_text = job.prompt_texts[static_cast<size_t>(r.prompt_index)];
      ch["text"] = job.echo ? prompt_text + r.text : r.text;
      int32_t offset = job.echo ? static_cast<int32_t>(prompt_text.size()) : 0;
      ch["logprobs"] = job.logprobs >= 0 ? completion_logprobs(ctx, r.tokens, job.logprobs, &offset) : Json();
    }
    ch["finish_reason"] = openai_finish_reason(r.finish_reason);
    ch["stop_reason"] = r.stop_string.empty() ? Json() : Json(r.stop_string);
    if (job.return_token_ids) ch["token_ids"] = token_ids(r.tokens);
    ch["policy_versions"] = version_runs(r.tokens);
    choices.push_back(std::move(ch));
  }
  return {{"id", id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", job.model},
          {"choices", choices},
          {"usage", usage_json(run.total_usage())},
          {"system_fingerprint", "kiln"}};
}

Json openai_models(const ServeContext& ctx, uint64_t policy_version, int64_t created) {
  return {{"object", "list"},
          {"data", Json::array({{{"id", ctx.model_name},
                                 {"object", "model"},
                                 {"created", created},
                                 {"owned_by", "kiln"},
                                 {"max_model_len", ctx.context_length},
                                 {"policy_version", policy_version}}})}};
}

OpenAIStream::OpenAIStream(const CompletionJob& job, const ServeContext& ctx, std::string id, int64_t created)
    : job_(job), ctx_(ctx), id_(std::move(id)), created_(created) {
  text_offset_.assign(static_cast<size_t>(job.choices()), 0);
}

Json OpenAIStream::chunk(Json choices) const {
  const bool chat = job_.protocol == Protocol::openai_chat;
  return {{"id", id_}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created_},
          {"model", job_.model}, {"system_fingerprint", "kiln"}, {"choices", std::move(choices)}};
}

static std::string sse(const Json& j) {
  return "data: " + j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
}

std::string OpenAIStream::begin() {
  std::string out;
  const bool chat = job_.protocol == Protocol::openai_chat;
  for (int32_t c = 0; c < job_.choices(); ++c) {
    if (chat) {
      out += sse(chunk(Json::array({{{"index", c}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                      {"logprobs", Json()}, {"finish_reason", Json()}}})));
    } else if (job_.echo) {
      const std::string& text = job_.prompt_texts[static_cast<size_t>(c / job_.n)];
      text_offset_[static_cast<size_t>(c)] = static_cast<int32_t>(text.size());
      out += sse(chunk(Json::array({{{"index", c}, {"text", text}, {"logprobs", Json()}, {"finish_reason", Json()}}})));
    }
  }
  return out;
}

std::string OpenAIStream::deltas(const std::vector<ChoiceDelta>& deltas) {
  std::string out;
  const bool chat = job_.protocol == Protocol::openai_chat;
  for (const ChoiceDelta& d : deltas) {
    const bool show_tokens = !d.tokens.empty() && (job_.request.logprobs || job_.return_token_ids);
    if (d.text.empty() && d.reasoning.empty() && d.tool_calls.empty() && !show_tokens && !d.finished) continue;
    Json ch = {{"index", d.index}};
    if (chat) {
      Json delta = Json::object();
      if (!d.reasoning.empty()) delta["reasoning_content"] = delta["reasoning"] = d.reasoning;
      if (!d.text.empty() || (d.tool_calls.empty() && d.reasoning.empty() && !d.finished)) delta["content"] = d.text;
      if (!d.tool_calls.empty()) {
        Json calls = Json::array();
        for (const ToolCallDelta& t : d.tool_calls) {
          Json call = {{"index", t.index}};
          if (!t.name.empty()) {
            call["id"] = make_tool_call_id(job_.tools.format, "call_", job_.request.seed + static_cast<uint64_t>(d.index), t.index);
            call["type"] = "function";
            call["function"] = {{"name", t.name}, {"arguments", t.arguments}};
          } else {
            call["function"] = {{"arguments", t.arguments}};
          }
          calls.push_back(std::move(call));
        }
        delta["tool_calls"] = std::move(calls);
      }
      ch["delta"] = std::move(delta);
      ch["logprobs"] = job_.request.logprobs && !d.tokens.empty() ? chat_logprobs(ctx_, d.tokens, job_.request.top_logprobs) : Json();
    } else {
      ch["text"] = d.text;
      ch["logprobs"] = job_.logprobs >= 0 && !d.tokens.empty()
                           ? completion_logprobs(ctx_, d.tokens, job_.logprobs, &text_offset_[static_cast<size_t>(d.index)])
                           : Json();
    }
    ch["finish_reason"] = d.finished ? Json(openai_finish_reason(d.finish_reason)) : Json();
    if (d.finished) ch["stop_reason"] = d.stop_string.empty() ? Json() : Json(d.stop_string);
    if (job_.return_token_ids) ch["token_ids"] = token_ids(d.tokens);
    if (!d.tokens.empty()) ch["policy_version"] = d.tokens.back().policy_version;
    out += sse(chunk(Json::array({std::move(ch)})));
  }
  return out;
}

std::string OpenAIStream::end(const CompletionRun& run) {
  std::string out;
  if (job_.include_usage) {
    Json c = chunk(Json::array());
    c["usage"] = usage_json(run.total_usage());
    out += sse(c);
  }
  return out + "data: [DONE]\n\n";
}

std::string OpenAIStream::error(const ApiError& e) { return sse(openai_error_body(e)); }

}  // namespace kiln::serve
