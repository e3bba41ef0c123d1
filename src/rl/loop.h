// The RL loop of `kiln rl`: one process, the trainer and its inference engine on one device (each
// with its own backend: on the CPU the engine's is batch-invariant, so rollouts do not depend on
// how requests were batched or on the prefix cache).
//
// Every step:
//   generate   GRPO: group_size completions of each of prompts_per_step prompts on the engine,
//              with behaviour log-probabilities (the sampler's own) and per-token versions;
//              offline DPO generates nothing; online DPO samples a group and pairs its best and
//              worst completions by reward
//   reward     the reward (rl/reward.h) scores the rollouts; a failure stops the run naming the sample
//   train      GRPO: advantages within each group, the clipped importance-weighted loss of
//              rl/losses.h over `minibatches` optimizer steps (each advances the policy version);
//              DPO: the sigmoid loss against the frozen reference model
//   update     the engine's weights become the trainer's, acknowledged as the new version
// Modes:
//   sync   generation for version v + 1 starts only after the engine acknowledged v; the engine
//          borrows the trainer's compute weights (zero copy: the engine is idle while they change).
//          On the CPU a sync run is bitwise reproducible from its seed, and identical with the
//          prefix cache on and off.
//   async  the engine keeps generating while the trainer steps (its own copy of the weights, updated
//          with update_mode); admission is throttled so that at most (max_staleness / m + step + 1)
//          * batch samples are ever submitted by RL step `step` (AReaL's rule in steps; a step
//          advances the version by m, its optimizer steps: GRPO's minibatches, else 1), so no
//          sample is ever more than max_staleness versions behind the trainer; one that were would
//          be dropped before training (dropped_stale in the metrics).
// Checkpoints (trainer checkpoints, train/run_checkpoint.h) are named by policy version:
// OUTPUT/checkpoint-<version>/, holding the RL step as the data position; resume restores the
// trainer, the engine's version and the prompt order.
// Ownership: run_rl owns everything it creates for the call. Thread safety: one caller; `stop` may be
// set from a signal handler.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/collectives.h"
#include "infer/engine.h"
#include "rl/losses.h"
#include "rl/reward.h"
#include "train/trainer.h"

namespace kiln::rl {

struct RlOptions {
  std::string model_dir, prompts, output, dump_rollouts, device = "cpu";
  // Benchmarks: a config.json to build the model from with seeded random weights (model_dir is then
  // only the source of the files copied into checkpoints), and whether the run ends with a checkpoint.
  std::string random_config;
  bool final_checkpoint = true;
  std::string algorithm = "grpo";    // grpo, dpo (offline: prompts are preference lines), online-dpo
  std::string mode = "sync";         // sync, async
  WeightUpdateMode update_mode = WeightUpdateMode::sync;  // how async updates treat requests in flight
  int32_t group_size = 4, prompts_per_step = 8, max_tokens = 64, micro_batch = 16, minibatches = 1;
  int64_t steps = 10;
  int32_t max_staleness = 1;
  float temperature = 1.0f, top_p = 1.0f;
  int32_t top_k = 0;
  bool prefix_cache = true, scale_rewards = true;
  uint64_t seed = 0;
  LossAggregation aggregation = LossAggregation::token_mean;
  GrpoOptions grpo;
  double dpo_beta = 0.1;
  TrainerOptions trainer;
  RewardOptions reward;
  // max_running, KV pool, page size (prefix_cache and version are set by the run). The trainer
  // shares the device: by default the KV pool takes 30% of the memory free when the engine starts.
  EngineOptions engine = [] {
    EngineOptions e;
    e.kv_memory_fraction = 0.3;
    return e;
  }();
  // Engines in other processes (under mpirun: infer/remote_engine.h): the ranks serving them
  // (serve_rl_engine), each fed the trainer's weights over `link` at every update; the prompts' groups
  // are dealt to them in turn. Empty: one engine in this process. Remote engines always hold their
  // own copy of the weights (no zero copy), in every mode.
  std::vector<int32_t> engine_ranks;
  Collectives* link = nullptr;  // not owned
  // How the weights reach remote engines: "auto" (NCCL from GPU to GPU where the trainer and an
  // engine are on different GPUs, else MPI messages), "nccl" or "mpi" (remote_engine.h).
  std::string weight_transport = "auto";
  int64_t save_every = 0;    // steps; 0: only at the end and when stopped
  int32_t keep_last = 0;
  std::string resume;        // "", "auto" or a checkpoint / run directory
  DType save_dtype = DType::f32;
  nlohmann::json config;     // the resolved flags, recorded in checkpoints
};

struct RlStepReport {
  int64_t step = 0, steps = 0;
  uint64_t version = 0;           // after the step's updates, acknowledged by the engine
  double reward_mean = 0, reward_std = 0, accuracy = -1;  // accuracy -1: the reward has none
  double loss = 0, grad_norm = 0, lr = 0, kl = 0, entropy = 0, clip_fraction = 0, importance_weight = 0;
  double response_length = 0;     // mean completion tokens
  int64_t samples = 0, dropped_stale = 0, tokens_generated = 0, tokens_trained = 0;
  int64_t tokens_attributed = 0;  // completion tokens trained on, each with its version
  std::map<int64_t, int64_t> staleness;  // trainer version - oldest token version -> samples
  uint64_t oldest_version = 0, newest_version = 0;  // over the trained samples' tokens
  double generate_seconds = 0, train_seconds = 0, update_seconds = 0, ack_seconds = 0;
  int64_t prefix_hit_tokens = 0, cross_version_hits = 0;  // the engine's, so far
  double dpo_accuracy = -1, dpo_margin = 0;
};

struct RlSummary {
  int64_t steps_done = 0;
  bool stopped = false;
  uint64_t version = 0;
  int64_t tokens_attributed = 0;   // completion tokens trained on, each with its version
  int64_t cross_version_hits = 0;  // prefix pages of another version matched: 0
  std::string last_checkpoint;
};

struct RlEvents {
  std::function<void(const std::string&)> info;
  std::function<void(const RlStepReport&)> step;
  const std::atomic<bool>* stop = nullptr;  // checked between steps
};

// Checks options for what no later stage would catch clearly (ranges, combinations).
Status validate_rl_options(const RlOptions& o);

Result<RlSummary> run_rl(const RlOptions& options, const RlEvents& events);

// An engine rank of a run with options.engine_ranks: builds the model of options' --model (or
// random config) on options' device and serves the trainer's remote engine until the run ends.
Status serve_rl_engine(const RlOptions& options, Collectives& link);

}  // namespace kiln::rl
