// A training run: what `kiln train` does between parsing its flags and exiting. Opens the data
// (dataset.h) and the objective, drives the Trainer step after step from the Sampler, evaluates on
// the validation split every `eval_every` steps, writes metrics.jsonl, saves checkpoints
// (run_checkpoint.h) every `save_every` steps and when asked to stop, resumes from one, and writes
// the final model into the run directory (and, with `tensorboard`, the same scalars as TensorBoard
// event files).
//
// Resume: the checkpoint's recorded configuration must equal this run's, except for the keys that
// only change where and how often things are written (output, resume, save/eval frequency,
// tensorboard, device, config), and the training data's content hash must be the same; a mismatch
// names the flag and both values. On the CPU a resumed
// run ends bitwise equal to one that was never interrupted: the weights, the optimizer state, the
// policy version and the sampler position are restored exactly, and nothing else is random.
//
// Data parallel (options.trainer.collectives with more than one rank): every rank runs this with the
// same options and data. The sampler's rows of each micro-batch are split between the ranks in rank
// order (--batch-size stays the global batch and must be a multiple of the ranks), so the sampler,
// and with it the checkpointed data position, is the same on every rank and a run's result does
// not depend on the rank count; validation batches are shared out and their sums added. Only rank
// 0 prepares the output, writes metrics, TensorBoard, checkpoints and the model, and reports
// events; a stop request on any rank stops all of them at the same step.
//
// Ownership: borrows the backend and the model for the call. Thread safety: one thread; `stop` may
// be set from a signal handler.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/status.h"
#include "train/train_model.h"
#include "train/trainer.h"

namespace kiln {

struct RunOptions {
  std::string model_dir, data, val_data, output;
  int64_t steps = 0;  // 0: one pass over the data
  int32_t batch_size = 1, grad_accum = 1;
  bool shuffle = false;
  uint64_t seed = 0;
  std::string objective, objective_kwargs;  // objective.h ("" = from the data)
  TrainerOptions trainer;                   // schedule.total_steps is set to the run's steps
  int64_t eval_every = 0;                   // 0: evaluate only at the end (when there is val data)
  int64_t eval_rows = 0;                    // 0: the whole validation split
  int64_t save_every = 0;                   // 0: checkpoints only when stopped by a signal
  int32_t keep_last = 0;                    // 0: keep every checkpoint
  std::string resume;                       // "", "auto" or a checkpoint / run directory
  DType save_dtype = DType::f32;
  double peak_flops = 0.0;                  // for MFU; 0: not reported
  std::string tensorboard;                  // a folder for TensorBoard event files ("" = none)
  nlohmann::json config;                    // the resolved flags, recorded in checkpoints
};

struct RunEvents {
  std::function<void(const std::string&)> info;
  std::function<void(int64_t step, int64_t steps, const StepReport&)> step;
  std::function<void(int64_t step, double val_loss, int64_t val_tokens)> eval;
  const std::atomic<bool>* stop = nullptr;  // checked between steps
};

struct RunResult {
  int64_t steps_done = 0;
  bool stopped = false;  // by `stop`: a checkpoint was saved and the final model not written
  std::string last_checkpoint;
};

Result<RunResult> run_training(Backend& be, TrainModel& model, const RunOptions& options, const RunEvents& events);

// FLOPs of one forward + backward over `micro` (6 per parameter of the linear layers and per
// token, plus the causal attention products), for MFU.
double training_flops(const ModelConfig& config, const std::vector<HostBatch>& micro);

}  // namespace kiln
