// The optimizer and learning-rate schedule flags shared by kiln train and kiln rl.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "train/trainer.h"

namespace kiln::cli {

struct OptimizerFlags {
  float lr = 1e-5f, eps = 1e-8f, weight_decay = 0.0f, clip_norm = 0.0f;
  std::string betas = "0.9,0.999";
  std::string optimizer = "adamw";
  std::string lr_schedule = "constant";
  int64_t warmup_steps = 0, decay_steps = 0;
  double min_lr_ratio = 0.0;
  float muon_momentum = 0.95f;
  std::string muon_adjust_lr = "original";

  void add(CLI::App* cmd);
  // The trainer's options (schedule.total_steps left 0 for the run to set); errors name the flag.
  Result<TrainerOptions> resolve() const;
  // The flags as checkpoints record them (keys: long flag names with '_').
  void record(nlohmann::json& config) const;
};

}  // namespace kiln::cli
