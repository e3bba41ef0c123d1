// The model the inference benchmarks measure: a Hugging Face config.json built with seeded random
// weights on a device, and the engine flags they share (bench_engine, bench_serve).
// Header-only; the result owns its backend and model. Thread safety: call from one thread.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "backend/backend.h"
#include "infer/engine.h"
#include "model/config.h"
#include "model/transformer.h"

namespace kiln::bench {

struct RandomModel {
  std::unique_ptr<Backend> backend;
  std::shared_ptr<const Transformer> model;
};

inline Result<RandomModel> random_model(const std::string& config_path, const std::string& device_name) {
  KILN_ASSIGN_OR_RETURN(ModelConfig config, load_model_config_file(config_path));
  KILN_ASSIGN_OR_RETURN(Device device, parse_device(device_name));
  RandomModel m;
  KILN_ASSIGN_OR_RETURN(m.backend, make_backend(device));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> model, Transformer::random(*m.backend, config, 1234));
  m.model = std::move(model);
  return m;
}

// --max-running, --max-step-tokens, --mixed-step-tokens, --page-size, --kv-tokens, --no-graphs and --no-lookahead into
// `options` (--no-graphs sets *no_graphs: apply it after parsing).
inline void add_engine_flags(CLI::App& app, EngineOptions& options, bool* no_graphs) {
  app.add_option("--max-running", options.max_running, "engine: requests decoded together at most");
  app.add_option("--max-step-tokens", options.max_step_tokens, "engine: tokens per step (0: the engine's default)");
  app.add_option("--mixed-step-tokens", options.mixed_step_tokens, "engine: tokens per step while requests decode");
  app.add_option("--page-size", options.page_size, "engine: KV page size");
  app.add_option("--kv-tokens", options.kv_tokens, "engine: KV pool tokens (default: from free memory)");
  app.add_flag("--no-graphs", *no_graphs, "run every step eagerly");
  app.add_flag("--no-lookahead{false}", options.lookahead, "launch each step after the one before it finished");
}

}  // namespace kiln::bench
