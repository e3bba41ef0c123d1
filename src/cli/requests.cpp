// kiln generate --requests FILE.jsonl: every line of a file through the engine at once, one JSON
// result line per request in input order. A malformed line gets an error result naming its line;
// the others still run (the exit code is then 1).
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>
#include <thread>

#include "core/json_text.h"
#include "core/plural.h"
#include "cli/engine_flags.h"
#include "cli/requests.h"
#include "model/chat_template.h"
#include "serve/request_fields.h"

namespace kiln::cli {
namespace {

using Json = nlohmann::ordered_json;

using serve::integer_within;

// Reads an optional field of `line` into `out`, checking its JSON type and that the value fits T
// (a number beyond float's range is an error, not infinity).
template <typename T>
Status read_field(const Json& line, const char* key, T* out, const char* expected) {
  auto it = line.find(key);
  if (it == line.end() || it->is_null()) return Status::Ok();
  bool ok = false;
  if constexpr (std::is_same_v<T, bool>)
    ok = it->is_boolean();
  else if constexpr (std::is_integral_v<T>)
    ok = integer_within(*it, std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
  else if constexpr (std::is_floating_point_v<T>)
    ok = it->is_number() && std::fabs(it->template get<double>()) <= std::numeric_limits<T>::max();
  if (!ok && std::is_floating_point_v<T> && it->is_number())
    return invalid_argument(std::string("'") + key + "' is out of range (at most 3.4e38 in size): " + json_brief(*it));
  if (!ok) return invalid_argument(std::string("'") + key + "' must be " + expected + ", not " + json_brief(*it));
  *out = it->template get<T>();
  return Status::Ok();
}

Status read_ids(const Json& v, const char* key, std::vector<int32_t>* out) {
  if (!v.is_array()) return invalid_argument(std::string("'") + key + "' must be a list of token ids");
  for (const Json& x : v) {
    if (!integer_within(x, 0, INT32_MAX))
      return invalid_argument(std::string("'") + key + "' must hold token ids (integers >= 0), not " + json_brief(x));
    out->push_back(x.get<int32_t>());
  }
  return Status::Ok();
}

struct Parsed {
  GenerationRequest request;
  bool logprobs = false;
  int32_t top_logprobs = 0;
};

Result<Parsed> parse_line(const std::string& text, const EngineSession& s, int32_t default_max_tokens) {
  Json line = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (line.is_discarded()) return invalid_argument("not valid JSON");
  if (!line.is_object()) return invalid_argument("expected a JSON object");
  // Parts of the line are copied (a response_format into the schema's type), which recurses as deep
  // as they nest.
  const int64_t limit = TemplateLimits{}.max_context_depth - 1;
  KILN_RETURN_IF_ERROR(check_nesting(line, limit, "the line"));
  Parsed p;
  GenerationRequest& r = p.request;
  r.max_tokens = default_max_tokens;
  s.sampling_defaults.apply(&r);  // the model's recommended sampling, where the line gives none
  const int sources = static_cast<int>(line.contains("prompt_ids")) + static_cast<int>(line.contains("prompt")) +
                      static_cast<int>(line.contains("messages"));
  if (sources != 1) return invalid_argument("give exactly one of 'prompt_ids', 'prompt' or 'messages'");
  if (line.contains("prompt_ids")) {
    KILN_RETURN_IF_ERROR(read_ids(line["prompt_ids"], "prompt_ids", &r.prompt));
  } else {
    if (!s.text) return invalid_argument("'prompt' and 'messages' need the model folder's tokenizer.json");
    std::string prompt;
    bool add_special = true;
    if (line.contains("prompt")) {
      if (!line["prompt"].is_string()) return invalid_argument("'prompt' must be a string");
      prompt = line["prompt"].get<std::string>();
    } else {
      if (!line["messages"].is_array()) return invalid_argument("'messages' must be a list of {role, content} objects");
      KILN_ASSIGN_OR_RETURN(prompt, s.text->render_chat(line["messages"], nullptr, /*add_generation_prompt=*/true));
      add_special = false;  // the template writes the special tokens itself
    }
    KILN_ASSIGN_OR_RETURN(r.prompt, s.text->tokenizer().encode(prompt, add_special));
  }
  KILN_RETURN_IF_ERROR(read_field(line, "max_tokens", &r.max_tokens, "a 32-bit integer"));
  KILN_RETURN_IF_ERROR(read_field(line, "temperature", &r.temperature, "a number"));
  KILN_RETURN_IF_ERROR(read_field(line, "top_k", &r.top_k, "a 32-bit integer"));
  KILN_RETURN_IF_ERROR(read_field(line, "top_p", &r.top_p, "a number"));
  KILN_RETURN_IF_ERROR(read_field(line, "min_p", &r.min_p, "a number"));
  KILN_RETURN_IF_ERROR(read_field(line, "repetition_penalty", &r.repetition_penalty, "a number"));
  KILN_RETURN_IF_ERROR(read_field(line, "frequency_penalty", &r.frequency_penalty, "a number"));
  KILN_RETURN_IF_ERROR(read_field(line, "presence_penalty", &r.presence_penalty, "a number"));
  KILN_RETURN_IF_ERROR(read_field(line, "seed", &r.seed, "an integer within [0, 2^64)"));
  KILN_RETURN_IF_ERROR(read_field(line, "ignore_eos", &r.ignore_eos, "true or false"));
  KILN_RETURN_IF_ERROR(read_field(line, "logprobs", &p.logprobs, "true or false"));
  KILN_RETURN_IF_ERROR(read_field(line, "top_logprobs", &p.top_logprobs, "a 32-bit integer"));
  r.logprobs = p.logprobs;
  r.top_logprobs = p.top_logprobs;
  if (line.contains("stop_token_ids")) KILN_RETURN_IF_ERROR(read_ids(line["stop_token_ids"], "stop_token_ids", &r.stop_token_ids));
  if (line.contains("stop")) {
    const Json& st = line["stop"];
    if (st.is_string()) {
      r.stop.push_back(st.get<std::string>());
    } else if (st.is_array()) {
      for (const Json& x : st) {
        if (!x.is_string()) return invalid_argument("'stop' must be a string or a list of strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      return invalid_argument("'stop' must be a string or a list of strings");
    }
  }
  if (line.contains("logit_bias")) KILN_RETURN_IF_ERROR(serve::read_logit_bias(line["logit_bias"], &r.logit_bias));
  if (line.contains("response_format")) {
    KILN_ASSIGN_OR_RETURN(r.json_schema, structured::JsonSchema::from_response_format(line["response_format"]));
  }
  static const char* const kKnown[] = {"prompt_ids", "prompt", "messages", "max_tokens", "temperature", "top_k",
                                       "top_p", "min_p", "repetition_penalty", "frequency_penalty",
                                       "presence_penalty", "seed", "stop", "stop_token_ids", "ignore_eos",
                                       "logprobs", "top_logprobs", "response_format", "logit_bias"};
  for (auto it = line.begin(); it != line.end(); ++it)
    if (std::find(std::begin(kKnown), std::end(kKnown), it.key()) == std::end(kKnown))
      return invalid_argument("unknown field '" + it.key() + "'");
  return p;
}

struct Outcome {
  Json result;
  std::shared_ptr<RequestStream> stream;
  Parsed parsed;
};

// Drains one finished-or-running request's stream into its JSON result; true once it is final.
bool collect(Outcome& o) {
  Json& r = o.result;
  while (std::optional<EngineEvent> e = o.stream->poll()) {
    for (const GeneratedToken& t : e->tokens) {
      r["ids"].push_back(t.id);
      Json& versions = r["versions"];
      if (versions.empty() || versions.back()[1].get<uint64_t>() != t.policy_version)
        versions.push_back({static_cast<int64_t>(r["ids"].size()) - 1, t.policy_version});
      if (o.parsed.logprobs || o.parsed.top_logprobs > 0) r["logprobs"].push_back(t.logprob);
      if (o.parsed.top_logprobs > 0) {
        Json top = Json::array();
        for (const auto& [id, lp] : t.top) top.push_back({{"id", id}, {"logprob", lp}});
        r["top_logprobs"].push_back(top);
      }
    }
    if (r.contains("text")) r["text"] = r["text"].get<std::string>() + e->text;
    if (e->finished) {
      r["finish_reason"] = e->finish_reason;
      if (!e->error.empty()) r["error"] = e->error;
      r["usage"] = {{"prompt_tokens", e->usage.prompt_tokens},
                    {"cached_tokens", e->usage.cached_tokens},
                    {"completion_tokens", e->usage.completion_tokens}};
      return true;
    }
  }
  return false;
}

}  // namespace

int run_requests(const ModelFlags& model_flags, const EngineFlags& engine_flags, const RequestsFlags& f) {
  std::ifstream in(f.requests);
  if (!in) return fail(not_found("cannot read --requests " + f.requests));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::ofstream out_file;
  if (!f.output.empty()) {
    out_file.open(f.output, std::ios::trunc);
    if (!out_file) return fail(io_error("cannot write --output " + f.output));
  }
  std::ostream& out = f.output.empty() ? std::cout : out_file;

  Result<std::unique_ptr<EngineSession>> started = start_engine(model_flags, engine_flags, false);
  if (!started.ok()) return fail(started.status());
  EngineSession& s = **started;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Outcome> outcomes;
  int failures = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines count, run nothing
    Outcome o;
    o.result = {{"index", i}, {"ids", Json::array()}};
    if (s.text) o.result["text"] = "";
    Result<Parsed> parsed = parse_line(lines[i], s, f.default_max_tokens);
    Result<std::shared_ptr<RequestStream>> stream =
        parsed.ok() ? s.engine->submit(parsed->request) : Result<std::shared_ptr<RequestStream>>(parsed.status());
    if (!stream.ok()) {
      const std::string msg = f.requests + " line " + std::to_string(i + 1) + ": " + stream.status().message();
      std::fprintf(stderr, "kiln: error: %s\n", msg.c_str());
      o.result = {{"index", i}, {"error", msg}};
      ++failures;
    } else {
      o.parsed = std::move(parsed).value();
      o.stream = std::move(stream).value();
    }
    outcomes.push_back(std::move(o));
  }

  const bool progress = isatty(STDERR_FILENO);
  size_t done = 0, next_to_print = 0;
  std::vector<bool> final(outcomes.size(), false);
  for (size_t k = 0; k < outcomes.size(); ++k) final[k] = !outcomes[k].stream;
  while (next_to_print < outcomes.size()) {
    bool any = false;
    for (size_t k = next_to_print; k < outcomes.size(); ++k)
      if (!final[k] && collect(outcomes[k])) final[k] = true, any = true;
    while (next_to_print < outcomes.size() && final[next_to_print]) {
      Json& r = outcomes[next_to_print].result;
      if (r.contains("error") && outcomes[next_to_print].stream) ++failures;
      out << r.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
      ++next_to_print;
      ++done;
    }
    if (progress) {
      const EngineStats st = s.engine->stats();
      std::fprintf(stderr, "\r[%zu/%zu] requests  %.0f tokens/s  running %d  waiting %d ", done, outcomes.size(),
                   st.tokens_per_second, st.running, st.waiting);
    }
    if (!any && next_to_print < outcomes.size()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  out.flush();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const EngineStats st = s.engine->stats();
  if (progress) std::fputc('\n', stderr);
  std::fprintf(stderr, "kiln: %s, %s in %.2f s (%.1f tokens/s), %s, %s\n",
               count_of(static_cast<int64_t>(outcomes.size()), "request").c_str(),
               count_of(st.generated_tokens, "generated token").c_str(), secs,
               secs > 0 ? static_cast<double>(st.generated_tokens) / secs : 0.0,
               count_of(st.prefix_hit_tokens, "prefix-cached prompt token").c_str(),
               count_of(st.preemptions, "preemption").c_str());
  return failures > 0 ? 1 : 0;
}

}  // namespace kiln::cli
