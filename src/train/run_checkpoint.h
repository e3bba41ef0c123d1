// Training checkpoints: everything a run needs to continue exactly where it stopped.
//
//   RUN_DIR/checkpoint-<step>/
//     config.json, model.safetensors, tokenizer files   the model, loadable by transformers
//                                                        (in the run's --save-dtype)
//     optimizer/master.safetensors                       f32 master weights (absent when the model
//                                                        itself was saved in f32)
//     optimizer/<state>.safetensors                      each optimizer state (AdamW moments, Muon
//                                                        momentum) as the one flat f32 tensor the
//                                                        optimizer keeps (its layout is the
//                                                        parameters', fingerprinted)
//     trainer_state.json                                 step, policy version, optimizer steps, the
//                                                        sampler's position, the resolved run
//                                                        configuration, a fingerprint of the model's
//                                                        tensor layout, and every file's size and CRC-32
//
// A checkpoint is written into RUN_DIR/.checkpoint-<step>.partial, every file flushed to disk, then
// renamed into place and the run directory flushed: a crash at any moment leaves either the new
// checkpoint complete or none of it, and the previous checkpoints intact. Loading checks every
// file's size and CRC-32, so a damaged or truncated checkpoint is an error, never silently used.
// The run has no random state beyond the sampler's (seed, epoch, cursor): no dropout, and the
// sampler's shuffles are pure functions of them.
//
// Thread safety: no shared state; one thread drives these with the backend.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/status.h"
#include "train/optimizer.h"
#include "train/parameters.h"

namespace kiln {

struct TrainingState {
  int64_t step = 0;             // training steps taken (a step without targets included)
  uint64_t policy_version = 0;  // committed optimizer updates
  int64_t optimizer_steps = 0;  // the optimizer's own count (bias correction)
  nlohmann::json sampler;       // Sampler::state()
  nlohmann::json config;        // the run's resolved flags
};

// Identifies a model's trainable tensors (Hugging Face names and shapes).
std::string layout_fingerprint(const ParameterSet& params);

// Writes RUN_DIR/checkpoint-<state.step>/ atomically (replacing one of that step), then removes
// all but the newest `keep_last` checkpoints (0: keep all). Returns the checkpoint's path.
Result<std::string> save_training_checkpoint(Backend& be, const ParameterSet& params, const Optimizer& optimizer,
                                             const TrainingState& state, const std::string& model_dir,
                                             const std::string& run_dir, DType save_dtype, int32_t keep_last);

// The newest complete checkpoint under `run_dir` ("" when there is none).
std::string latest_checkpoint(const std::string& run_dir);
// `path` itself when it is a checkpoint, else the newest one under it; an error when neither.
Result<std::string> resolve_checkpoint(const std::string& path);

// Verifies the checkpoint's files, then loads its master weights and optimizer state into
// `params` and `optimizer` (same model layout and optimizer kind, or an error saying what differs).
Result<TrainingState> load_training_checkpoint(Backend& be, ParameterSet& params, Optimizer& optimizer,
                                               const std::string& checkpoint_dir);

}  // namespace kiln
