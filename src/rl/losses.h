// The RL objectives as functions of the trained policy's per-token log-probabilities: GRPO's
// clipped, importance-weighted policy-gradient loss and DPO's sigmoid preference loss, each with
// its analytic derivative d loss / d logprob per token (what TrainModel::forward_backward_token_loss
// turns into parameter gradients), and GRPO's group advantages. Plain host arithmetic in double.
//
// GRPO, per completion token t of sample i (advantage A_i), with logp the trained policy's
// log-probability (the only quantity with a gradient), prox the proximal policy's (the trainer's
// weights before this batch's updates, no gradient), mu the behaviour policy's (the engine's, that
// sampled the token) and ref a frozen reference model's:
//   r_t  = exp(logp_t - prox_t)
//   pg_t = -min(A_i r_t, A_i clip(r_t, 1 - clip_low, 1 + clip_high))
//   w_t  = min(exp(prox_t - mu_t), tis_cap)            (truncated importance weight; 1 when tis_cap <= 0)
//   kl_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1  (the k3 estimator of KL(pi || ref))
//   loss = sum_t agg_t (w_t pg_t + kl_coef kl_t)
// agg_t aggregates: token-mean 1 / (completion tokens of the step), seq-mean 1 / (samples of the
// step * tokens of sample i). With prox = logp (one update per batch) r = 1 and the gradient is
// A w grad(logp): the policy gradient corrected from the behaviour policy mu to the current one
// (decoupled PPO: the trainer/engine numerical mismatch and, in asynchronous runs, staleness).
//
// DPO, per pair (chosen c, rejected r) with sequence log-probabilities (sums over completion
// tokens) and the reference's:
//   z = beta ((logp_c - ref_c) - (logp_r - ref_r)),  loss = mean over pairs of -log sigmoid(z)
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace kiln::rl {

enum class LossAggregation { token_mean, seq_mean };
Result<LossAggregation> parse_loss_aggregation(const std::string& s);  // "token-mean", "seq-mean"

struct GrpoOptions {
  double clip_low = 0.2, clip_high = 0.2;
  double tis_cap = 2.0;  // <= 0: no importance weight
  double kl_coef = 0.0;
};

// One completion token as the GRPO loss sees it.
struct PolicyToken {
  double advantage = 0.0;
  double weight = 0.0;  // agg_t
  float behaviour_logprob = 0.0f;
  float proximal_logprob = 0.0f;  // ignored when the caller passes prox = logp
  float reference_logprob = 0.0f; // read when kl_coef != 0
};

struct GrpoValue {
  double loss = 0.0;
  std::vector<float> grad;  // d loss / d logp per token
  // Sums over the tokens, for metrics.
  int64_t tokens = 0, clipped = 0;  // clipped: the clipped branch is the minimum and flat (no gradient)
  double kl_sum = 0.0, importance_weight_sum = 0.0, ratio_sum = 0.0, behaviour_gap_sum = 0.0;  // gap: prox - mu
  int64_t importance_truncated = 0;  // tokens whose weight hit tis_cap
};

// `proximal_is_current`: prox_t = logp_t (the same pass computed both; no gradient through prox).
GrpoValue grpo_loss(const std::vector<PolicyToken>& tokens, const std::vector<float>& logprobs, const GrpoOptions& o,
                    bool proximal_is_current);

// Advantages of rewards laid out in groups of `group_size` (one prompt's samples):
// A = (R - mean of the group) / (std of the group + eps) with the unbiased std, or without the
// division when !scale_by_std. A group of one sample has advantage 0.
std::vector<double> group_advantages(const std::vector<double>& rewards, int32_t group_size, bool scale_by_std,
                                     double eps = 1e-4);

// One preference pair: the tokens of its chosen and rejected completions are index ranges of the
// logprobs vector given to dpo_loss.
struct PreferencePair {
  int64_t chosen_begin = 0, chosen_end = 0, rejected_begin = 0, rejected_end = 0;
  double reference_chosen = 0.0, reference_rejected = 0.0;  // the reference's sequence log-probabilities
  double weight = 1.0;  // 1 / (pairs of the step)
};

struct DpoValue {
  double loss = 0.0;
  std::vector<float> grad;
  int64_t pairs = 0, correct = 0;  // pairs whose implicit reward ranks the chosen one higher (z > 0)
  double margin_sum = 0.0;         // sum of z / beta
};
DpoValue dpo_loss(const std::vector<PreferencePair>& pairs, const std::vector<float>& logprobs, double beta);

}  // namespace kiln::rl
