// kiln generate and kiln score.
#include <nlohmann/json.hpp>

#include <cctype>
#include <chrono>
#include <cmath>
#include <optional>
#include <cstdio>
#include <iostream>

#include "cli/common.h"
#include "cli/requests.h"
#include "cli/engine_flags.h"
#include "infer/score.h"

namespace kiln::cli {
namespace {


double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct GenerateFlags {
  ModelFlags model;
  std::string prompt_ids = "1,15,42,7,99";
  std::string prompt_text, prompt_file;
  bool prompt_given = false;
  bool json = false;
  int32_t max_tokens = 16;
  SamplingFlags sampling{0.0f, 1.0f};
  bool ignore_eos = false;
  std::string json_schema;  // a JSON schema file: structured output
  EngineFlags engine;
  RequestsFlags requests;
};

// One prompt through the engine: JSON (ids, text when a tokenizer exists) or, with --prompt, the
// reply streamed as text.
int run_generate(const GenerateFlags& f) {
  GenerationRequest request;
  Status st = f.sampling.apply(&request);
  if (!st.ok()) return fail(st);
  if (f.max_tokens < 0) return fail(invalid_argument("--max-tokens must be >= 0"));
  request.max_tokens = f.max_tokens;
  request.ignore_eos = f.ignore_eos;
  if (!f.json_schema.empty()) {
    Result<std::string> text = read_text(f.json_schema);
    if (!text.ok()) return fail(text.status());
    const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return fail(invalid_argument("--json-schema " + f.json_schema + ": not valid JSON"));
    Result<std::shared_ptr<const structured::JsonSchema>> schema = structured::JsonSchema::compile(j);
    if (!schema.ok()) return fail(invalid_argument("--json-schema " + f.json_schema + ": " + schema.status().message()));
    request.json_schema = *schema;
  }
  std::vector<int32_t> prompt_ids;
  if (!f.prompt_given) {
    std::string listed = f.prompt_ids;
    if (listed == "-") {  // the ids from stdin
      Result<std::string> t = read_text("-");
      if (!t.ok()) return fail(t.status());
      listed = std::move(t).value();
      while (!listed.empty() && std::isspace(static_cast<unsigned char>(listed.back()))) listed.pop_back();
    }
    Result<std::vector<int32_t>> ids = parse_ids(listed, "--prompt-ids");
    if (!ids.ok()) return fail(ids.status());
    prompt_ids = std::move(ids).value();
  }
  auto t0 = std::chrono::steady_clock::now();
  Result<std::unique_ptr<EngineSession>> started =
      start_engine(f.model, f.engine, f.prompt_given || request.json_schema != nullptr);
  if (!started.ok()) return fail(started.status());
  EngineSession& s = **started;
  f.sampling.prefer_model_defaults(s.sampling_defaults, &request);
  if (f.prompt_given) {
    // The folder's tokenizer encodes the text as transformers' tokenizer(text) does (special tokens
    // added by the post-processor).
    Result<std::vector<int32_t>> ids = s.text->tokenizer().encode(f.prompt_text, /*add_special_tokens=*/true);
    if (!ids.ok()) return fail(ids.status());
    prompt_ids = std::move(ids).value();
  }
  st = check_token_ids(prompt_ids, s.model->config().vocab_size, f.prompt_given ? "--prompt" : "--prompt-ids");
  if (!st.ok()) return fail(st);
  const double load_s = seconds_since(t0);
  request.prompt = prompt_ids;
  const uint64_t seed = request.seed;

  auto t1 = std::chrono::steady_clock::now();
  Result<std::shared_ptr<RequestStream>> stream = s.engine->submit(std::move(request));
  if (!stream.ok()) return fail(stream.status());
  const bool streaming = f.prompt_given && !f.json;
  std::vector<int32_t> ids;
  std::string text, finish_reason, error;
  while (std::optional<EngineEvent> e = (*stream)->next()) {
    for (const GeneratedToken& t : e->tokens) ids.push_back(t.id);
    text += e->text;
    if (streaming && !e->text.empty()) {
      std::fwrite(e->text.data(), 1, e->text.size(), stdout);
      std::fflush(stdout);
    }
    if (e->finished) finish_reason = e->finish_reason, error = e->error;
  }
  if (!error.empty()) return fail(Status(StatusCode::internal, error));
  const double gen_s = seconds_since(t1);
  if (streaming) {
    std::fputc('\n', stdout);
    std::fprintf(stderr, "kiln: %zu prompt tokens, %zu new tokens (%s) in %.3f s\n", prompt_ids.size(), ids.size(),
                 finish_reason.c_str(), gen_s);
    return 0;
  }
  nlohmann::json out = {{"model", f.model.model_dir},
                        {"device", s.backend->device().str()},
                        {"prompt_ids", prompt_ids},
                        {"ids", ids},
                        {"finish_reason", finish_reason},
                        {"seed", seed},
                        {"load_seconds", load_s},
                        {"generate_seconds", gen_s}};
  if (s.text) out["text"] = text;
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  return 0;
}

struct ScoreFlags {
  ModelFlags model;
  std::string ids, text, file;
  int32_t top_logprobs = 0;
};

// The tokens to score: --ids (or "-": ids from stdin), or --text / --file (or "-": stdin) encoded
// with the folder's tokenizer as transformers' tokenizer(text) does (special tokens added).
Result<std::vector<int32_t>> score_input(const ScoreFlags& f, std::optional<ModelText>* text_model) {
  if (f.ids.empty() && f.text.empty() && f.file.empty())
    return invalid_argument("kiln score needs what to score: --ids, --text or --file");
  if (!f.text.empty() || !f.file.empty()) {
    std::string text = f.text;
    if (!f.file.empty()) {
      KILN_ASSIGN_OR_RETURN(text, read_text(f.file));
    }
    KILN_ASSIGN_OR_RETURN(ModelText t, ModelText::load(f.model.model_dir));
    KILN_ASSIGN_OR_RETURN(std::vector<int32_t> ids, t.tokenizer().encode(text, /*add_special_tokens=*/true));
    *text_model = std::move(t);
    return ids;
  }
  if (f.ids == "-") {
    KILN_ASSIGN_OR_RETURN(std::string ids, read_text("-"));
    while (!ids.empty() && std::isspace(static_cast<unsigned char>(ids.back()))) ids.pop_back();
    return parse_ids(ids, "--ids");
  }
  return parse_ids(f.ids, "--ids");
}

int run_score(const ScoreFlags& f) {
  std::optional<ModelText> text_model;
  Result<std::vector<int32_t>> ids = score_input(f, &text_model);
  if (!ids.ok()) return fail(ids.status());
  if (ids->size() < 2) return fail(invalid_argument("scoring needs at least two tokens (the first has no prefix to score it by)"));
  Result<LoadedModel> l = load_model(f.model);
  if (!l.ok()) return fail(l.status());
  Result<ScoreResult> r = score(*l->model, *ids, f.top_logprobs);
  if (!r.ok()) return fail(r.status());
  // Totals over the scored positions (1..n-1): the sum of log-probabilities, their mean, and the
  // perplexity exp(-mean).
  double sum = 0;
  for (float lp : r->logprobs) sum += lp;
  const double mean = sum / static_cast<double>(r->logprobs.size());
  nlohmann::json out = {{"model", f.model.model_dir}, {"device", l->backend->device().str()}, {"ids", *ids},
                        {"logprobs", r->logprobs}};
  if (text_model) {
    nlohmann::json tokens = nlohmann::json::array();
    for (int32_t id : *ids) tokens.push_back(text_model->tokenizer().id_to_token(id).value_or(""));
    out["tokens"] = tokens;
  }
  out["sum_logprob"] = sum;
  out["mean_logprob"] = mean;
  out["perplexity"] = std::exp(-mean);
  if (f.top_logprobs > 0) {
    nlohmann::json top = nlohmann::json::array();
    for (const auto& row : r->top) {
      nlohmann::json entries = nlohmann::json::array();
      for (const auto& [id, lp] : row) entries.push_back({{"id", id}, {"logprob", lp}});
      top.push_back(entries);
    }
    out["top_logprobs"] = top;
  }
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  return 0;
}

}  // namespace

Runner add_generate(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  CLI::App* g = app.add_subcommand("generate", "generate a continuation of a prompt (ids as JSON, or streamed text)");
  f->model.add(g, bundled_model_dir());
  CLI::Option* ids = g->add_option("--prompt-ids", f->prompt_ids, "prompt token ids, comma separated (- reads them from stdin)")->capture_default_str();
  CLI::Option* text =
      g->add_option("--prompt", f->prompt_text, "prompt text: encoded with the folder's tokenizer, the reply streams as text");
  CLI::Option* text_file = g->add_option("--prompt-file", f->prompt_file,
                                         "a file holding the prompt text (- for stdin), used like --prompt");
  text->excludes(ids);
  text_file->excludes(ids)->excludes(text);
  g->add_flag("--json", f->json, "with --prompt: print JSON (ids and text) instead of streaming text");
  g->add_option("--max-tokens", f->max_tokens, "new tokens to generate")->capture_default_str();
  f->sampling.add(g);
  g->add_flag("--ignore-eos", f->ignore_eos, "do not stop at the model's EOS token");
  CLI::Option* schema = g->add_option("--json-schema", f->json_schema,
                                      "structured output: the reply is a JSON value of this JSON schema (a file; "
                                      "{\"type\": \"object\"} for any object); needs the folder's tokenizer");
  CLI::Option* requests = g->add_option("--requests", f->requests.requests,
                                         "a JSONL file of requests run together through the engine (one result line each, in order)");
  requests->excludes(ids)->excludes(text)->excludes(text_file)->excludes(schema);
  g->add_option("--output", f->requests.output, "with --requests: write the results here instead of stdout")->needs(requests);
  f->engine.add(g);
  f->engine.add_generation_config(g);
  return [f, g] {
    f->prompt_given = g->count("--prompt") > 0 || g->count("--prompt-file") > 0;
    if (f->json && !f->prompt_given) return fail(invalid_argument("--json requires --prompt or --prompt-file"));
    if (!f->prompt_file.empty()) {
      Result<std::string> t = read_text(f->prompt_file);
      if (!t.ok()) return fail(t.status());
      f->prompt_text = std::move(t).value();
    }
    if (!f->requests.requests.empty()) {  // --prompt and --prompt-ids exclude it (CLI)
      f->requests.default_max_tokens = f->max_tokens;
      return run_requests(f->model, f->engine, f->requests);
    }
    return run_generate(*f);
  };
}

Runner add_score(CLI::App& app) {
  auto f = std::make_shared<ScoreFlags>();
  CLI::App* s = app.add_subcommand("score", "log-probability of every token given its prefix; prints JSON");
  f->model.add(s, bundled_model_dir());
  CLI::Option* ids = s->add_option("--ids", f->ids, "token ids, comma separated (- reads them from stdin)");
  CLI::Option* text = s->add_option("--text", f->text, "text to score, encoded with the folder's tokenizer");
  CLI::Option* file = s->add_option("--file", f->file, "a file of text to score (- for stdin), encoded like --text");
  ids->excludes(text)->excludes(file);
  text->excludes(file);
  s->add_option("--top-logprobs", f->top_logprobs, "also list the K most likely tokens per position");
  return [f] { return run_score(*f); };
}

}  // namespace kiln::cli
