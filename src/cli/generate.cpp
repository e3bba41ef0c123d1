// kiln generate and kiln score.
#include <nlohmann/json.hpp>

#include <chrono>
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
  std::string prompt_text;
  bool prompt_given = false;
  bool json = false;
  int32_t max_tokens = 16;
  SamplingFlags sampling{0.0f, 1.0f};
  bool ignore_eos = false;
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
  std::vector<int32_t> prompt_ids;
  if (!f.prompt_given) {
    Result<std::vector<int32_t>> ids = parse_ids(f.prompt_ids, "--prompt-ids");
    if (!ids.ok()) return fail(ids.status());
    prompt_ids = std::move(ids).value();
  }
  auto t0 = std::chrono::steady_clock::now();
  Result<std::unique_ptr<EngineSession>> started = start_engine(f.model, f.engine, f.prompt_given);
  if (!started.ok()) return fail(started.status());
  EngineSession& s = **started;
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
  std::string ids;
  int32_t top_logprobs = 0;
};

int run_score(const ScoreFlags& f) {
  Result<std::vector<int32_t>> ids = parse_ids(f.ids, "--ids");
  if (!ids.ok()) return fail(ids.status());
  Result<LoadedModel> l = load_model(f.model);
  if (!l.ok()) return fail(l.status());
  Result<ScoreResult> r = score(*l->model, *ids, f.top_logprobs);
  if (!r.ok()) return fail(r.status());
  nlohmann::json out = {{"model", f.model.model_dir}, {"device", l->backend->device().str()}, {"ids", *ids},
                        {"logprobs", r->logprobs}};
  if (f.top_logprobs > 0) {
    nlohmann::json top = nlohmann::json::array();
    for (const auto& row : r->top) {
      nlohmann::json entries = nlohmann::json::array();
      for (const auto& [id, lp] : row) entries.push_back({{"id", id}, {"logprob", lp}});
      top.push_back(entries);
    }
    out["top_logprobs"] = top;
  }
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace

Runner add_generate(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  CLI::App* g = app.add_subcommand("generate", "generate a continuation of a prompt (ids as JSON, or streamed text)");
  f->model.add(g, bundled_model_dir());
  CLI::Option* ids = g->add_option("--prompt-ids", f->prompt_ids, "prompt token ids, comma separated")->capture_default_str();
  CLI::Option* text =
      g->add_option("--prompt", f->prompt_text, "prompt text: encoded with the folder's tokenizer, the reply streams as text");
  text->excludes(ids);
  g->add_flag("--json", f->json, "with --prompt: print JSON (ids and text) instead of streaming text")->needs(text);
  g->add_option("--max-tokens", f->max_tokens, "new tokens to generate")->capture_default_str();
  f->sampling.add(g);
  g->add_flag("--ignore-eos", f->ignore_eos, "do not stop at the model's EOS token");
  CLI::Option* requests = g->add_option("--requests", f->requests.requests,
                                         "a JSONL file of requests run together through the engine (one result line each, in order)");
  requests->excludes(ids)->excludes(text);
  g->add_option("--output", f->requests.output, "with --requests: write the results here instead of stdout")->needs(requests);
  f->engine.add(g);
  return [f, g] {
    f->prompt_given = g->count("--prompt") > 0;
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
  s->add_option("--ids", f->ids, "token ids, comma separated")->required();
  s->add_option("--top-logprobs", f->top_logprobs, "also list the K most likely tokens per position");
  return [f] { return run_score(*f); };
}

}  // namespace kiln::cli
