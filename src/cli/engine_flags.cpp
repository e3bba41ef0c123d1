#include "cli/engine_flags.h"

#include <cstdio>
#include <filesystem>
#include <string>

namespace kiln::cli {

void EngineFlags::add(CLI::App* cmd) {
  cmd->add_option("--max-running", options.max_running, "requests decoded together at most")->capture_default_str();
  cmd->add_option("--max-step-tokens", options.max_step_tokens,
                  "tokens per engine step (prefill chunks + decodes); 0: " + std::to_string(kAutoStepTokensCuda) +
                      " on CUDA, " + std::to_string(kAutoStepTokensCpu) + " on the CPU")
      ->capture_default_str();
  cmd->add_option("--mixed-step-tokens", options.mixed_step_tokens,
                  "tokens per engine step while requests are decoding (a long prompt's chunks hold their next tokens "
                  "for shorter steps); within [--max-running, --max-step-tokens]")
      ->capture_default_str();
  cmd->add_option("--kv-tokens", options.kv_tokens,
                  "KV pool capacity in tokens (default: most of the GPU memory left after the weights; on the CPU "
                  "four full-length sequences within 2 GiB)");
  cmd->add_option("--kv-memory", options.kv_memory, "KV pool size in bytes (instead of --kv-tokens)");
  cmd->add_option("--page-size", options.page_size,
                  "KV page size in tokens (0: " + std::to_string(kAutoPageSizeCuda) +
                      " on CUDA, where longer pages make prefill faster; " + std::to_string(kAutoPageSizeCpu) +
                      " on the CPU)")
      ->capture_default_str();
  cmd->add_flag("--no-prefix-cache", no_prefix_cache, "do not reuse the KV of earlier requests' prefixes");
  cmd->add_flag("--no-graphs", no_graphs, "run every step eagerly (no CUDA graph replay)");
  cmd->add_flag("--no-lookahead", no_lookahead,
                "launch each decode step only after the one before it has finished (no overlap of the host's "
                "planning with the device)");
}

void EngineFlags::add_generation_config(CLI::App* cmd) {
  generation_config = "auto";
  cmd->add_option("--generation-config", generation_config,
                  "auto: the sampling parameters the model folder's generation_config.json recommends (temperature, "
                  "top_k, top_p, min_p, repetition_penalty, max_new_tokens) where a request leaves them out; none: "
                  "kiln's own defaults")
      ->check(CLI::IsMember({"auto", "none"}))
      ->capture_default_str();
}

EngineOptions EngineFlags::engine_options() const {
  EngineOptions o = options;
  o.prefix_cache = !no_prefix_cache;
  o.use_graphs = !no_graphs;
  o.lookahead = !no_lookahead;
  return o;
}

Result<std::unique_ptr<EngineSession>> start_engine(const ModelFlags& model_flags, const EngineFlags& engine_flags,
                                                    bool need_text) {
  auto s = std::make_unique<EngineSession>();
  const bool has_tokenizer = std::filesystem::exists(std::filesystem::path(model_flags.model_dir) / "tokenizer.json");
  if (need_text || has_tokenizer) {
    KILN_ASSIGN_OR_RETURN(ModelText text, ModelText::load(model_flags.model_dir));
    s->text = std::move(text);
  }
  if (engine_flags.generation_config == "auto" && !model_flags.model_dir.empty()) {
    KILN_ASSIGN_OR_RETURN(s->sampling_defaults, load_sampling_defaults(model_flags.model_dir));
    if (!s->sampling_defaults.empty())
      std::fprintf(stderr, "kiln: sampling defaults from %s: %s (--generation-config none: kiln's own)\n",
                   s->sampling_defaults.source.c_str(), s->sampling_defaults.describe().c_str());
  }
  KILN_ASSIGN_OR_RETURN(LoadedModel loaded, load_model(model_flags));
  s->backend = std::move(loaded.backend);
  s->model = std::shared_ptr<const Transformer>(std::move(loaded.model));
  std::vector<int32_t> eos = s->model->config().eos_token_ids;
  if (s->text)
    for (int32_t id : s->text->stop_ids())
      if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
  KILN_ASSIGN_OR_RETURN(s->engine, Engine::create(s->model, s->text ? &s->text->tokenizer() : nullptr, eos,
                                                  engine_flags.engine_options()));
  return s;
}

}  // namespace kiln::cli
