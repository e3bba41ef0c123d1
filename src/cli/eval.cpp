// kiln eval: the evaluation tasks of eval/eval.h on the engine, results as JSON on stdout (and a
// table on stderr), with what makes two runs comparable: the model, the data's hash, the settings
// and kiln's version.
#include <cinttypes>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "cli/progress.h"
#include "core/sha256.h"
#include "eval/eval.h"

namespace kiln::cli {
namespace {

struct EvalFlags {
  ModelFlags model;
  EngineFlags engine;
  std::string task, data, details, output, split = "val", scorer = "answer", answer_field = "answer", pattern;
  int32_t context = 0, stride = 0, samples = 1, max_tokens = 256, max_in_flight = 1024;
  bool chat = false, ignore_eos = false;
  std::vector<int32_t> pass_at;
  std::vector<std::string> stop;
  SamplingFlags sampling{0.0f, 1.0f};
};

// The data's fingerprint: the file's sha256, or a preprocessed directory's meta.json's.
Result<std::string> data_sha256(const std::string& path) {
  if (std::filesystem::is_directory(path)) return sha256_file((std::filesystem::path(path) / "meta.json").string());
  return sha256_file(path);
}

void print_table(const nlohmann::ordered_json& results) {
  for (const auto& [key, value] : results.items()) {
    if (value.is_number_float())
      std::fprintf(stderr, "  %-22s %.6g\n", key.c_str(), value.get<double>());
    else
      std::fprintf(stderr, "  %-22s %s\n", key.c_str(), value.dump().c_str());
  }
}

int run_eval(EvalFlags& f) {
  if (f.task != "perplexity" && f.task != "choice" && f.task != "generate")
    return fail(invalid_argument("--task must be perplexity, choice or generate, not '" + f.task + "'"));
  if (f.max_in_flight < 1) return fail(invalid_argument("--max-in-flight must be at least 1"));
  if (f.context < 0 || f.stride < 0) return fail(invalid_argument("--context and --stride must not be negative"));
  GenerationRequest sampling;
  if (f.task == "generate") {
    Status s = f.sampling.apply(&sampling);
    if (!s.ok()) return fail(s);
    if (f.max_tokens < 1) return fail(invalid_argument("--max-tokens must be at least 1"));
    sampling.max_tokens = f.max_tokens;
    sampling.ignore_eos = f.ignore_eos;
    for (const std::string& s : f.stop)
      if (s.empty()) return fail(invalid_argument("--stop must not be empty"));
    sampling.stop = f.stop;
  }
  Result<std::string> sha = data_sha256(f.data);
  if (!sha.ok()) return fail(sha.status());
  Result<std::unique_ptr<EngineSession>> session = start_engine(f.model, f.engine, /*need_text=*/false);
  if (!session.ok()) return fail(session.status());
  EngineSession& s = **session;

  std::optional<ProgressBar> bar;
  eval::EvalContext ctx;
  ctx.engine = s.engine.get();
  ctx.text = s.text ? &*s.text : nullptr;
  ctx.config = &s.model->config();
  ctx.model_dir = f.model.model_dir;
  ctx.max_in_flight = f.max_in_flight;
  const char* unit = f.task == "perplexity" ? "windows" : f.task == "choice" ? "questions" : "prompts";
  ctx.progress = [&](int64_t done, int64_t total) {
    if (!bar) bar.emplace("eval " + f.task, static_cast<double>(total), 1.0, unit);
    bar->update(static_cast<double>(done), "");
  };
  nlohmann::ordered_json settings;
  const auto t0 = std::chrono::steady_clock::now();
  Result<eval::TaskOutput> out = Status::Ok();
  if (f.task == "perplexity") {
    eval::PerplexityOptions o{f.data, f.split, f.context, f.stride};
    settings = {{"context", f.context}, {"stride", f.stride}, {"split", f.split}};
    out = eval::perplexity(ctx, o);
  } else if (f.task == "choice") {
    settings = {{"context", f.context}};
    out = eval::choice(ctx, eval::ChoiceOptions{f.data, f.context});
  } else {
    eval::GenerateOptions o;
    o.data = f.data;
    o.chat = f.chat;
    o.scorer = f.scorer;
    o.answer_field = f.answer_field;
    o.pattern = f.pattern;
    o.samples = f.samples;
    o.pass_at = f.pass_at;
    o.sampling = sampling;
    settings = {{"scorer", f.scorer}, {"answer_field", f.answer_field}, {"pattern", f.pattern}, {"chat", f.chat},
                {"samples", f.samples}, {"max_tokens", f.max_tokens}, {"temperature", sampling.temperature},
                {"top_k", sampling.top_k}, {"top_p", sampling.top_p}, {"seed", sampling.seed}, {"stop", f.stop},
                {"ignore_eos", f.ignore_eos}};
    out = eval::generate(ctx, o);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (bar) bar->clear();
  if (!out.ok()) return fail(out.status());

  nlohmann::ordered_json j;
  j["kiln"] = version_text();
  j["task"] = f.task;
  const ModelConfig& c = s.model->config();
  j["model"] = {{"path", std::filesystem::absolute(f.model.model_dir).lexically_normal().string()},
                {"architecture", c.architecture_class},
                {"parameters", s.model->parameter_count()},
                {"dtype", dtype_name(s.model->compute_dtype())},
                {"device", f.model.device},
                {"random_weights", f.model.random_weights}};
  j["data"] = {{"path", f.data}, {"sha256", *sha}};
  j["settings"] = settings;
  j["results"] = out->results;
  const EngineStats st = s.engine->stats();
  j["engine"] = {{"prompt_tokens", st.prompt_tokens},
                 {"cached_prompt_tokens", st.prefix_hit_tokens},
                 {"generated_tokens", st.generated_tokens},
                 {"steps", st.steps},
                 {"preemptions", st.preemptions}};
  j["items"] = out->items;
  j["seconds"] = seconds;
  j["items_per_second"] = seconds > 0 ? static_cast<double>(out->items) / seconds : 0.0;
  const std::string text = j.dump(2) + "\n";
  std::fputs(text.c_str(), stdout);
  if (!f.output.empty()) {
    std::ofstream o(f.output, std::ios::binary | std::ios::trunc);
    if (!(o << text)) return fail(io_error("cannot write the results to " + f.output));
  }
  if (!f.details.empty()) {
    std::ofstream o(f.details, std::ios::binary | std::ios::trunc);
    for (const nlohmann::ordered_json& d : out->details) o << d.dump() << "\n";
    if (!o) return fail(io_error("cannot write the per-item records to " + f.details));
  }
  std::fprintf(stderr, "kiln eval %s: %" PRId64 " %s in %.1f s\n", f.task.c_str(), out->items,
               f.task == "perplexity" ? "documents" : f.task == "choice" ? "questions" : "prompts", seconds);
  print_table(out->results);
  return 0;
}

}  // namespace

Runner add_eval(CLI::App& app) {
  auto f = std::make_shared<EvalFlags>();
  CLI::App* e = app.add_subcommand("eval", "evaluate a model: perplexity, multiple choice or generation tasks; prints JSON");
  f->model.add(e, "");
  e->get_option("--model")->required();
  e->add_option("--task", f->task, "perplexity, choice or generate")->required();
  e->add_option("--data", f->data,
                "the task's data: JSONL lines (perplexity: {\"text\"} lines of a .jsonl file, lines of any other file, "
                "or a kiln preprocess directory; choice: {\"context\" or \"messages\", \"choices\", \"answer\"}; "
                "generate: {\"prompt\" or \"messages\" or \"prompt_ids\", \"answer\", optional \"stop\"})")
      ->required();
  e->add_option("--context", f->context, "longest scored sequence in tokens (default: the engine's longest)");
  e->add_option("--stride", f->stride, "perplexity: tokens each window advances (default: the context)");
  e->add_option("--split", f->split, "perplexity over a preprocessed directory: its split")->capture_default_str();
  e->add_flag("--chat", f->chat, "generate: \"prompt\" text goes through the chat template as a user message");
  e->add_option("--scorer", f->scorer, "generate: answer (numeric answer match, as RL's answer reward) or regex")
      ->capture_default_str();
  e->add_option("--answer-field", f->answer_field, "generate: the field holding the reference answer")->capture_default_str();
  e->add_option("--pattern", f->pattern, "generate with --scorer regex: a completion is right when this PCRE2 pattern matches");
  e->add_option("--samples", f->samples, "generate: completions per prompt (pass@k)")->capture_default_str();
  e->add_option("--pass-at", f->pass_at, "generate: k values of pass@k (default: 1 and --samples)")->delimiter(',');
  e->add_option("--max-tokens", f->max_tokens, "generate: new tokens per completion at most")->capture_default_str();
  e->add_option("--stop", f->stop, "generate: a stop string (repeatable; lines may add their own \"stop\")");
  e->add_flag("--ignore-eos", f->ignore_eos, "generate: do not stop at the model's EOS tokens");
  f->sampling.seed = "0";
  f->sampling.add(e);
  e->add_option("--details", f->details, "write one JSON record per item (scores, predictions, completions) to this file");
  e->add_option("--output", f->output, "also write the results JSON to this file");
  e->add_option("--max-in-flight", f->max_in_flight, "requests submitted to the engine at once at most")->capture_default_str();
  f->engine.options.max_score_rows = 1024;
  f->engine.add(e);
  e->add_option("--max-score-rows", f->engine.options.max_score_rows,
                "prompt positions scored per engine step (logit rows; memory: rows x vocabulary x 4 bytes)")
      ->capture_default_str();
  return [f] { return run_eval(*f); };
}

}  // namespace kiln::cli
