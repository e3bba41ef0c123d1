// Trainer: one optimizer step at a time over micro-batches a caller supplies (the CLI's data
// stream today; RL's rollouts later): forward and backward of each micro-batch with the loss
// normalised over the step's labelled tokens, the gradient-norm check, the learning rate of the
// schedule at the current policy version, the optimizer update.
//
// The policy version is the one clock of training: it counts committed optimizer steps, starts at
// 0 for the weights a run loads, advances by exactly one when a step's update is applied (a step
// refused for a non-finite loss or gradient leaves it, and the weights, unchanged), and the LR
// schedule is evaluated at it. Checkpoints and every progress line carry it; the RL issue's engine
// weights and rollout tokens are stamped with it.
//
// Ownership: refers to the TrainModel (which must outlive it) and owns the optimizer state.
// Thread safety: none; one thread drives a Trainer.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>
#include <vector>

#include "backend/collectives.h"
#include "core/status.h"
#include "train/optimizer.h"
#include "train/schedule.h"
#include "train/train_model.h"

namespace kiln {

struct TrainerOptions {
  OptimizerOptions optimizer;  // optimizer.lr is the base learning rate the schedule multiplies
  LrSchedule schedule;
  // Data parallel (not owned; null: one process): every rank steps over its own rows of the step's
  // micro-batches; the labelled-token count that normalises the loss, the loss and the gradients
  // are summed over the ranks before the update, so every rank applies the same update (the
  // gradient-norm clip and the non-finite checks are global) and the weights stay identical.
  Collectives* collectives = nullptr;
  // ZeRO stage (data parallel only): 0 replicates the optimizer state and all-reduces the gradients
  // once per step, each layer's as soon as the last micro-batch's backward is past it (with NCCL on
  // a stream of its own, overlapping the backward of the layers below); 1 shards the optimizer
  // state (and, with mixed precision, the master weights) over the ranks: the gradients are reduced
  // once per step, layer by layer in the same way, each piece to the rank owning it, each rank
  // updates its shard and the updated weights are all-gathered; 2 also keeps only the owner's shard
  // of the accumulated gradients (ParameterSet::shard_gradients, done here): every micro-batch's
  // backward writes into scratch buffers reduced to the owners layer by layer.
  // 1 and 2 need the TrainModel's parameters laid out in as many shards as there are ranks.
  int32_t zero = 0;
};

struct StepReport {
  uint64_t policy_version = 0;  // after the step (unchanged when skipped)
  bool skipped = false;         // no labelled token in the step: no update
  double loss = 0.0;            // mean loss over the step's labelled tokens
  double grad_norm = 0.0;       // before clipping
  double lr = 0.0;              // the learning rate the update used
  int64_t tokens = 0, labelled = 0;
  double seconds = 0.0;
  double mfu = 0.0;         // model FLOP utilisation (CUDA; 0 when unknown)
  double memory_gib = 0.0;  // device memory held by the backend's allocator (CUDA; 0 when unknown)
  double tokens_per_s() const { return seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0; }
};
// (tokens and labelled count every rank's rows in a data-parallel run.)

class Trainer {
 public:
  static Result<Trainer> create(Backend& be, TrainModel& model, const TrainerOptions& options);

  // One optimizer step over `micro` (its micro-batches' gradients accumulated). A non-finite loss
  // or gradient is an error naming the step; the weights and the version stay as they were.
  Result<StepReport> step(const std::vector<HostBatch>& micro);

  // One optimizer step of a loss of the labelled tokens' log-probabilities (RL objectives):
  // micro[i]'s gradients from losses[i], each already normalised for the whole step (the step's
  // loss is their sum). `scores`, when given, receives each micro-batch's log-probabilities.
  Result<StepReport> step_token_loss(const std::vector<HostBatch>& micro, const std::vector<TokenLoss>& losses,
                                     const TokenScoreOptions& options, std::vector<TokenScores>* scores = nullptr);

  uint64_t policy_version() const { return version_; }
  // Resuming from a checkpoint: the version it recorded (its optimizer state is loaded separately).
  void restore_policy_version(uint64_t version) { version_ = version; }
  Optimizer& optimizer() { return optimizer_; }
  const Optimizer& optimizer() const { return optimizer_; }
  // The learning rate the next step will use.
  double next_lr() const;
  const TrainerOptions& options() const { return options_; }

 private:
  // A step's report before any work: the version, token counts (over every rank), skipped when
  // nothing is labelled.
  Result<StepReport> begin_step(const std::vector<HostBatch>& micro) const;
  // Data parallel. Whether the backward of micro-batch `i` of `n` reduces the gradients (ZeRO-2:
  // every one; else the last), each layer's started as soon as the backward is past it.
  bool reduces_after(size_t i, size_t n) const { return data_parallel() && (options_.zero == 2 || i + 1 == n); }
  // Starts the reduction of layer `layer`'s gradients (overlapping what follows on the stream):
  // ZeRO-0 an all-reduce; ZeRO-1/2 a reduce of each piece to the rank whose shard holds it.
  Status reduce_layer(int64_t layer);
  Status reduce_span(const ParameterSet::GradientSpan& span);
  // ZeRO-2 (sharded gradients): adds this rank's part of a reduced scratch to its shard and clears
  // the scratch.
  void collect(int64_t layer);
  // After a reducing backward: the reductions of layers [0, below) (those the backward had not
  // started) and of the other parameters, then a join (ZeRO-2: and the last collects).
  Status finish_reduction(int64_t below);
  // Collectives in use: several ranks, or NCCL asked for on one (its overhead measured).
  bool data_parallel() const {
    return options_.collectives && std::string_view(options_.collectives->transport()) != "none";
  }
  // The update after the gradients of a step are in: the finite-loss check, the optimizer step at
  // the schedule's rate, the version.
  Result<StepReport> commit(StepReport r, std::chrono::steady_clock::time_point start);
  Trainer(TrainModel& model, Optimizer optimizer, const TrainerOptions& options)
      : model_(&model), optimizer_(std::move(optimizer)), options_(options) {}

  TrainModel* model_;
  Optimizer optimizer_;
  TrainerOptions options_;
  uint64_t version_ = 0;
  static constexpr int64_t kNoLayer = -2;
  int64_t pending_layer_ = kNoLayer;  // ZeRO-2: the layer whose reduction is in flight
};

}  // namespace kiln
