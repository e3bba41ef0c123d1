// The remote engine's wire format (remote_wire.h).
#include "infer/remote_wire.h"

namespace kiln::remote_wire {

json request_json(const GenerationRequest& r) {
  return {{"prompt", r.prompt},
          {"max_tokens", r.max_tokens},
          {"temperature", r.temperature},
          {"top_k", r.top_k},
          {"top_p", r.top_p},
          {"min_p", r.min_p},
          {"repetition_penalty", r.repetition_penalty},
          {"frequency_penalty", r.frequency_penalty},
          {"presence_penalty", r.presence_penalty},
          {"seed", r.seed},
          {"stop_token_ids", r.stop_token_ids},
          {"stop", r.stop},
          {"logit_bias", r.logit_bias},
          {"ignore_eos", r.ignore_eos},
          {"logprobs", r.logprobs},
          {"top_logprobs", r.top_logprobs},
          {"behaviour_logprobs", r.behaviour_logprobs},
          {"skip_special_tokens", r.skip_special_tokens},
          {"prompt_logprobs_from", r.prompt_logprobs_from},
          {"json_schema", r.json_schema ? r.json_schema->source() : json(nullptr)}};
}

GenerationRequest request_from(const json& j) {
  GenerationRequest r;
  j.at("prompt").get_to(r.prompt);
  j.at("max_tokens").get_to(r.max_tokens);
  j.at("temperature").get_to(r.temperature);
  j.at("top_k").get_to(r.top_k);
  j.at("top_p").get_to(r.top_p);
  j.at("min_p").get_to(r.min_p);
  j.at("repetition_penalty").get_to(r.repetition_penalty);
  j.at("frequency_penalty").get_to(r.frequency_penalty);
  j.at("presence_penalty").get_to(r.presence_penalty);
  j.at("seed").get_to(r.seed);
  j.at("stop_token_ids").get_to(r.stop_token_ids);
  j.at("stop").get_to(r.stop);
  if (j.contains("logit_bias")) j["logit_bias"].get_to(r.logit_bias);
  j.at("ignore_eos").get_to(r.ignore_eos);
  j.at("logprobs").get_to(r.logprobs);
  j.at("top_logprobs").get_to(r.top_logprobs);
  j.at("behaviour_logprobs").get_to(r.behaviour_logprobs);
  j.at("skip_special_tokens").get_to(r.skip_special_tokens);
  j.at("prompt_logprobs_from").get_to(r.prompt_logprobs_from);
  if (j.contains("json_schema") && !j["json_schema"].is_null()) {
    // The sender compiled the same schema with the same code.
    Result<std::shared_ptr<const structured::JsonSchema>> schema = structured::JsonSchema::compile(j["json_schema"]);
    KILN_ASSERT(schema.ok());
    r.json_schema = *schema;
  }
  return r;
}

json event_json(const EngineEvent& e) {
  json tokens = json::array();
  for (const GeneratedToken& t : e.tokens) tokens.push_back({t.id, t.logprob, t.policy_version, t.top});
  return {{"tokens", tokens},
          {"prompt_logprobs", e.prompt_logprobs},
          {"text", e.text},
          {"finished", e.finished},
          {"finish_reason", e.finish_reason},
          {"stop_string", e.stop_string},
          {"error", e.error},
          {"usage", {e.usage.prompt_tokens, e.usage.cached_tokens, e.usage.completion_tokens, e.usage.preemptions}},
          {"admission_version", e.admission_version},
          {"finish_version", e.finish_version}};
}

EngineEvent event_from(const json& j) {
  EngineEvent e;
  for (const json& t : j.at("tokens")) {
    GeneratedToken g;
    t.at(0).get_to(g.id);
    t.at(1).get_to(g.logprob);
    t.at(2).get_to(g.policy_version);
    t.at(3).get_to(g.top);
    e.tokens.push_back(std::move(g));
  }
  j.at("prompt_logprobs").get_to(e.prompt_logprobs);
  j.at("text").get_to(e.text);
  j.at("finished").get_to(e.finished);
  j.at("finish_reason").get_to(e.finish_reason);
  j.at("stop_string").get_to(e.stop_string);
  j.at("error").get_to(e.error);
  const json& u = j.at("usage");
  e.usage = {u.at(0).get<int32_t>(), u.at(1).get<int32_t>(), u.at(2).get<int32_t>(), u.at(3).get<int32_t>()};
  j.at("admission_version").get_to(e.admission_version);
  j.at("finish_version").get_to(e.finish_version);
  return e;
}

json options_json(const EngineOptions& o) {
  return {{"max_running", o.max_running},   {"max_step_tokens", o.max_step_tokens},
          {"mixed_step_tokens", o.mixed_step_tokens},
          {"page_size", o.page_size},       {"kv_tokens", o.kv_tokens},
          {"kv_memory", o.kv_memory},       {"kv_memory_fraction", o.kv_memory_fraction},
          {"max_seq_len", o.max_seq_len},   {"prefix_cache", o.prefix_cache},
          {"use_graphs", o.use_graphs},     {"policy_version", o.policy_version},
          {"max_score_rows", o.max_score_rows}, {"lookahead", o.lookahead}};
}

EngineOptions options_from(const json& j) {
  EngineOptions o;
  j.at("max_running").get_to(o.max_running);
  j.at("max_step_tokens").get_to(o.max_step_tokens);
  j.at("mixed_step_tokens").get_to(o.mixed_step_tokens);
  j.at("page_size").get_to(o.page_size);
  j.at("kv_tokens").get_to(o.kv_tokens);
  j.at("kv_memory").get_to(o.kv_memory);
  j.at("kv_memory_fraction").get_to(o.kv_memory_fraction);
  j.at("max_seq_len").get_to(o.max_seq_len);
  j.at("prefix_cache").get_to(o.prefix_cache);
  j.at("use_graphs").get_to(o.use_graphs);
  j.at("policy_version").get_to(o.policy_version);
  j.at("max_score_rows").get_to(o.max_score_rows);
  j.at("lookahead").get_to(o.lookahead);
  return o;
}

json stats_json(const EngineStats& s) {
  return {s.running, s.waiting, s.kv_pages_used, s.kv_pages_free, s.kv_page_size, s.kv_pages_cached,
          s.prompt_tokens, s.prefix_hit_tokens, s.generated_tokens, s.steps, s.preemptions, s.graph_replays,
          s.tokens_per_second, s.policy_version, s.weight_updates, s.cross_version_hits, s.lookahead_steps};
}

EngineStats stats_from(const json& j) {
  EngineStats s;
  j.at(0).get_to(s.running);
  j.at(1).get_to(s.waiting);
  j.at(2).get_to(s.kv_pages_used);
  j.at(3).get_to(s.kv_pages_free);
  j.at(4).get_to(s.kv_page_size);
  j.at(5).get_to(s.kv_pages_cached);
  j.at(6).get_to(s.prompt_tokens);
  j.at(7).get_to(s.prefix_hit_tokens);
  j.at(8).get_to(s.generated_tokens);
  j.at(9).get_to(s.steps);
  j.at(10).get_to(s.preemptions);
  j.at(11).get_to(s.graph_replays);
  j.at(12).get_to(s.tokens_per_second);
  j.at(13).get_to(s.policy_version);
  j.at(14).get_to(s.weight_updates);
  j.at(15).get_to(s.cross_version_hits);
  j.at(16).get_to(s.lookahead_steps);
  return s;
}

// Bytes as hex digits in JSON (NCCL's unique id), and back.
std::string hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}
std::string unhex(const std::string& digits) {
  auto value = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::string out;
  for (size_t i = 0; i + 1 < digits.size(); i += 2)
    out += static_cast<char>(value(digits[i]) * 16 + value(digits[i + 1]));
  return out;
}

// Parses a message of the protocol; a malformed one is a bug of the other side, reported as such.
Result<json> parse(const std::string& bytes, const char* from) {
  json j = json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status(StatusCode::internal, std::string("a malformed remote-engine message from the ") + from);
  return j;
}

}  // namespace kiln::remote_wire
