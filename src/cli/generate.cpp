// kiln generate and kiln score.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "cli/common.h"
#include "infer/generator.h"

namespace kiln::cli {
namespace {

#ifndef KILN_DEFAULT_MODEL
#define KILN_DEFAULT_MODEL "testdata/tiny-llama"
#endif

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
  bool no_graphs = false;
};

int run_generate(const GenerateFlags& f) {
  Result<ops::SamplingRow> sampling = f.sampling.params();
  if (!sampling.ok()) return fail(sampling.status());
  if (f.max_tokens < 0) return fail(invalid_argument("--max-tokens must be >= 0"));
  auto t0 = std::chrono::steady_clock::now();
  Result<LoadedModel> l = load_model(f.model);
  if (!l.ok()) return fail(l.status());

  // Text in and out when --prompt is given: the folder's tokenizer encodes it as transformers'
  // tokenizer(text) does (special tokens added by the post-processor) and the reply streams.
  std::optional<ModelText> text;
  std::vector<int32_t> prompt;
  if (f.prompt_given) {
    Result<ModelText> t = ModelText::load(f.model.model_dir);
    if (!t.ok()) return fail(t.status());
    text = std::move(t).value();
    Result<std::vector<int32_t>> ids = text->tokenizer().encode(f.prompt_text, /*add_special_tokens=*/true);
    if (!ids.ok()) return fail(ids.status());
    prompt = std::move(ids).value();
  } else {
    Result<std::vector<int32_t>> ids = parse_ids(f.prompt_ids, "--prompt-ids");
    if (!ids.ok()) return fail(ids.status());
    prompt = std::move(ids).value();
  }
  Status ids_ok = check_token_ids(prompt, l->model->config().vocab_size, f.prompt_given ? "--prompt" : "--prompt-ids");
  if (!ids_ok.ok()) return fail(ids_ok);
  double load_s = seconds_since(t0);

  GenerateOptions opts;
  opts.max_new_tokens = f.max_tokens;
  opts.sampling = *sampling;
  opts.use_graphs = !f.no_graphs;
  if (!f.ignore_eos) {
    opts.stop_ids = l->model->config().eos_token_ids;
    if (text)
      for (int32_t id : text->stop_ids()) opts.stop_ids.push_back(id);
  }
  const int32_t context = static_cast<int32_t>(prompt.size()) + std::max(f.max_tokens, 1);
  Result<std::unique_ptr<Generator>> gen = Generator::create(*l->model, context);
  if (!gen.ok()) return fail(gen.status());

  std::optional<TextStreamer> stream;
  if (text && !f.json) stream.emplace(text->tokenizer());
  auto on_token = [&](int32_t id) { return stream ? stream->push(id) : true; };
  auto t1 = std::chrono::steady_clock::now();
  Result<GenerateResult> r = (*gen)->generate(prompt, opts, on_token);
  if (!r.ok()) return fail(r.status());
  if (stream && !stream->status().ok()) return fail(stream->status());
  double gen_s = seconds_since(t1);
  if (stream) {
    stream->finish();
    std::fprintf(stderr, "kiln: %zu prompt tokens, %zu new tokens (%s) in %.3f s\n", prompt.size(), r->tokens.size(),
                 r->finish_reason.c_str(), gen_s);
    return 0;
  }
  nlohmann::json out = {{"model", f.model.model_dir},
                        {"device", l->backend->device().str()},
                        {"prompt_ids", prompt},
                        {"ids", r->tokens},
                        {"finish_reason", r->finish_reason},
                        {"seed", ops::sampling_seed(opts.sampling)},
                        {"load_seconds", load_s},
                        {"generate_seconds", gen_s}};
  if (text) {
    Result<std::string> decoded = text->tokenizer().decode(r->tokens, /*skip_special_tokens=*/true);
    if (!decoded.ok()) return fail(decoded.status());
    out["text"] = *decoded;
  }
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
  f->model.add(g, KILN_DEFAULT_MODEL);
  g->add_option("--prompt-ids", f->prompt_ids, "prompt token ids, comma separated")->capture_default_str();
  g->add_option("--prompt", f->prompt_text, "prompt text: encoded with the folder's tokenizer, the reply streams as text");
  g->add_flag("--json", f->json, "with --prompt: print JSON (ids and text) instead of streaming text");
  g->add_option("--max-tokens", f->max_tokens, "new tokens to generate")->capture_default_str();
  f->sampling.add(g);
  g->add_flag("--ignore-eos", f->ignore_eos, "do not stop at the model's EOS token");
  g->add_flag("--no-graphs", f->no_graphs, "run every decode step eagerly (no CUDA graph replay)");
  return [f, g] {
    f->prompt_given = g->count("--prompt") > 0;
    return run_generate(*f);
  };
}

Runner add_score(CLI::App& app) {
  auto f = std::make_shared<ScoreFlags>();
  CLI::App* s = app.add_subcommand("score", "log-probability of every token given its prefix; prints JSON");
  f->model.add(s, KILN_DEFAULT_MODEL);
  s->add_option("--ids", f->ids, "token ids, comma separated")->required();
  s->add_option("--top-logprobs", f->top_logprobs, "also list the K most likely tokens per position");
  return [f] { return run_score(*f); };
}

}  // namespace kiln::cli
