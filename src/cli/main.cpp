// The kiln binary: subcommands parse flags and call the layers below; nothing else lives here.
// Every failure prints "kiln: error: <what to do>" on stderr and exits non-zero (2 for bad flags).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "infer/generator.h"
#include "model/transformer.h"

namespace kiln {
namespace {

#ifndef KILN_DEFAULT_MODEL
#define KILN_DEFAULT_MODEL "testdata/tiny-llama"
#endif

int fail(const Status& s) {
  std::fprintf(stderr, "kiln: error: %s\n", s.message().c_str());
  return 1;
}

Result<std::vector<int32_t>> parse_ids(const std::string& text, const char* flag) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    char* end = nullptr;
    errno = 0;
    long long v = item.empty() ? 0 : std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0 || v < INT32_MIN || v > INT32_MAX)
      return invalid_argument(std::string(flag) + ": '" + item + "' is not an integer token id (expected e.g. 1,2,3)");
    ids.push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return ids;
}

struct ModelFlags {
  std::string model_dir = KILN_DEFAULT_MODEL;
  std::string device = "cpu";
  bool random_weights = false;
  uint64_t weight_seed = 0;

  void add(CLI::App* cmd) {
    cmd->add_option("--model", model_dir, "Hugging Face model folder (config.json + safetensors)")
        ->capture_default_str();
    cmd->add_option("--device", device, "cpu, cuda or cuda:N")->capture_default_str();
    cmd->add_flag("--random-weights", random_weights, "build the model from config.json alone with seeded random weights");
    cmd->add_option("--weight-seed", weight_seed, "seed of --random-weights");
  }
};

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Transformer> model;
};

Result<Loaded> load(const ModelFlags& f) {
  Loaded l;
  KILN_ASSIGN_OR_RETURN(Device device, parse_device(f.device));
  KILN_ASSIGN_OR_RETURN(l.backend, make_backend(device));
  ModelLoadOptions opts;
  opts.random_weights = f.random_weights;
  opts.seed = f.weight_seed;
  KILN_ASSIGN_OR_RETURN(l.model, Transformer::load(*l.backend, f.model_dir, opts));
  return l;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct GenerateFlags {
  ModelFlags model;
  std::string prompt_ids = "1,15,42,7,99";
  std::string prompt_text;
  int32_t max_tokens = 16;
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  int64_t seed = -1;
  bool ignore_eos = false;
  bool no_graphs = false;
};

int run_generate(const GenerateFlags& f) {
  if (!f.prompt_text.empty())
    return fail(unsupported("--prompt TEXT needs a tokenizer, which kiln does not read yet; pass --prompt-ids 1,2,3"));
  Result<std::vector<int32_t>> prompt = parse_ids(f.prompt_ids, "--prompt-ids");
  if (!prompt.ok()) return fail(prompt.status());
  if (f.temperature < 0) return fail(invalid_argument("--temperature must be >= 0 (0 is greedy)"));
  if (f.top_p <= 0 || f.top_p > 1) return fail(invalid_argument("--top-p must be in (0, 1]"));
  if (f.max_tokens < 0) return fail(invalid_argument("--max-tokens must be >= 0"));
  auto t0 = std::chrono::steady_clock::now();
  Result<Loaded> l = load(f.model);
  if (!l.ok()) return fail(l.status());
  Status ids_ok = check_token_ids(*prompt, l->model->config().vocab_size, "--prompt-ids");
  if (!ids_ok.ok()) return fail(ids_ok);
  double load_s = seconds_since(t0);

  GenerateOptions opts;
  opts.max_new_tokens = f.max_tokens;
  opts.sampling.temperature = f.temperature;
  opts.sampling.top_k = f.top_k;
  opts.sampling.top_p = f.top_p;
  opts.sampling.seed = f.seed >= 0 ? static_cast<uint64_t>(f.seed) : std::random_device{}();
  opts.use_graphs = !f.no_graphs;
  if (!f.ignore_eos) opts.stop_ids = l->model->config().eos_token_ids;
  const int32_t context = static_cast<int32_t>(prompt->size()) + std::max(f.max_tokens, 1);
  Result<std::unique_ptr<Generator>> gen = Generator::create(*l->model, context);
  if (!gen.ok()) return fail(gen.status());
  auto t1 = std::chrono::steady_clock::now();
  Result<GenerateResult> r = (*gen)->generate(*prompt, opts);
  if (!r.ok()) return fail(r.status());
  double gen_s = seconds_since(t1);
  nlohmann::json out = {{"model", f.model.model_dir},
                        {"device", l->backend->device().str()},
                        {"prompt_ids", *prompt},
                        {"ids", r->tokens},
                        {"finish_reason", r->finish_reason},
                        {"seed", opts.sampling.seed},
                        {"load_seconds", load_s},
                        {"generate_seconds", gen_s}};
  std::cout << out.dump() << std::endl;
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
  Result<Loaded> l = load(f.model);
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

int run(int argc, char** argv) {
  CLI::App app{"kiln: train, align and serve large language models"};
  app.require_subcommand(1);

  GenerateFlags gen;
  CLI::App* g = app.add_subcommand("generate", "generate a continuation of a prompt; prints JSON with the new ids");
  gen.model.add(g);
  g->add_option("--prompt-ids", gen.prompt_ids, "prompt token ids, comma separated")->capture_default_str();
  g->add_option("--prompt", gen.prompt_text, "prompt text (needs a tokenizer)");
  g->add_option("--max-tokens", gen.max_tokens, "new tokens to generate")->capture_default_str();
  g->add_option("--temperature", gen.temperature, "sampling temperature; 0 is greedy")->capture_default_str();
  g->add_option("--top-k", gen.top_k, "keep the k most likely tokens (0: all)")->capture_default_str();
  g->add_option("--top-p", gen.top_p, "nucleus sampling mass")->capture_default_str();
  g->add_option("--seed", gen.seed, "sampling seed (default: random)");
  g->add_flag("--ignore-eos", gen.ignore_eos, "do not stop at the model's EOS token");
  g->add_flag("--no-graphs", gen.no_graphs, "run every decode step eagerly (no CUDA graph replay)");

  ScoreFlags sc;
  CLI::App* s = app.add_subcommand("score", "log-probability of every token given its prefix; prints JSON");
  sc.model.add(s);
  s->add_option("--ids", sc.ids, "token ids, comma separated")->required();
  s->add_option("--top-logprobs", sc.top_logprobs, "also list the K most likely tokens per position");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (g->parsed()) return run_generate(gen);
  if (s->parsed()) return run_score(sc);
  return 2;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::run(argc, argv); }
