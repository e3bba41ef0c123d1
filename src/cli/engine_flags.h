// Engine flags shared by every generating command (generate, chat; later serve and rl).
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "cli/common.h"
#include "infer/engine.h"
#include "infer/sampling_defaults.h"

namespace kiln::cli {

struct EngineFlags {
  EngineOptions options;
  bool no_prefix_cache = false;
  bool no_graphs = false;
  bool no_lookahead = false;
  // "auto": sampling defaults from the model's generation_config.json; "none": kiln's own. Commands
  // that sample for a user register the flag (and default to auto); the others never read the file.
  std::string generation_config = "none";
  void add(CLI::App* cmd);
  void add_generation_config(CLI::App* cmd);
  EngineOptions engine_options() const;
};

// A loaded model with its engine (and its text side when the folder has a tokenizer). Members are
// destroyed in reverse order: the engine thread stops before the model and the backend go.
struct EngineSession {
  std::unique_ptr<Backend> backend;
  std::shared_ptr<const Transformer> model;
  std::optional<ModelText> text;
  std::unique_ptr<Engine> engine;
  SamplingDefaults sampling_defaults;  // empty unless --generation-config auto found some
};
// Loads the model of `model_flags` (its text side when `need_text`, or when present if not) and
// starts an engine on it. EOS ids: config.json's, generation_config.json's and the tokenizer's.
Result<std::unique_ptr<EngineSession>> start_engine(const ModelFlags& model_flags, const EngineFlags& engine_flags,
                                                    bool need_text);

}  // namespace kiln::cli
