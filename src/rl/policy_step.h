// One training step of the RL objectives over a batch of samples (rl/loop.h drives them): GRPO's
// clipped, importance-weighted token loss over `minibatches` optimizer steps, and DPO's sigmoid
// loss over preference pairs against the frozen reference model. Each fills the training part of
// the step's report (loss, grad norm, lr, KL, entropy, clip fraction, importance weight, lengths,
// versions, tokens).
// Thread safety: one thread drives the trainer and the models.
#pragma once

#include <utility>
#include <vector>

#include "rl/batches.h"
#include "rl/loop.h"
#include "rl/rollout.h"

namespace kiln::rl {

// `reference` is read when o.grpo.kl_coef != 0. Samples with empty completions are skipped.
Status train_grpo_step(Trainer& trainer, TrainModel& model, TrainModel* reference, const RlOptions& o,
                       const std::vector<Rollout*>& samples, RlStepReport& rep);

// pairs: (chosen, rejected) sequences; their prompts and completions stay alive for the call.
Status train_dpo_step(Trainer& trainer, TrainModel& reference, const RlOptions& o,
                      const std::vector<std::pair<SequenceRef, SequenceRef>>& pairs, RlStepReport& rep);

}  // namespace kiln::rl
