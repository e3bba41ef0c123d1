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
//     optimizer/<state>.rank-<r>-of-<R>.safetensors      instead, with a sharded optimizer (ZeRO >= 1),
//                                                        each rank's shard of it
//     trainer_state.json                                 step, policy version, optimizer steps, the
//                                                        sampler's position, the resolved run
//                                                        configuration, a fingerprint of the model's
//                                                        tensor layout, the manifest of the optimizer
//                                                        state's pieces (file, state, element range),
//                                                        and every file's size and CRC-32
//
// Data parallel runs (`collectives` with several ranks) save and load together: every rank calls
// these functions; rank 0 writes the model, the master weights and the manifest, and each rank
// writes its own optimizer shard (the run directory must be on a file system every rank sees).
// Loading reads, for each rank, the pieces of the manifest that overlap the elements it holds, so a
// checkpoint written by N ranks, sharded or not, resumes on M ranks with any --zero (resharding):
// the flat layout of the parameters does not depend on the rank count except for the zero padding
// at its end.
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
#include "backend/collectives.h"
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
// `collectives`: null for one process.
Result<std::string> save_training_checkpoint(Backend& be, const ParameterSet& params, const Optimizer& optimizer,
                                             const TrainingState& state, const std::string& model_dir,
                                             const std::string& run_dir, DType save_dtype, int32_t keep_last,
                                             Collectives* collectives = nullptr);

// The newest complete checkpoint under `run_dir` ("" when there is none).
std::string latest_checkpoint(const std::string& run_dir);
// `path` itself when it is a checkpoint, else the newest one under it; an error when neither.
Result<std::string> resolve_checkpoint(const std::string& path);

// Verifies the checkpoint's files, then loads its master weights and optimizer state into
// `params` and `optimizer` (same model layout and optimizer kind, or an error saying what differs):
// the parts this process holds, from whichever pieces hold them.
Result<TrainingState> load_training_checkpoint(Backend& be, ParameterSet& params, Optimizer& optimizer,
                                               const std::string& checkpoint_dir);

}  // namespace kiln
