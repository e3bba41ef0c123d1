#include "rl/losses.h"

#include <algorithm>
#include <cmath>

namespace kiln::rl {

Result<LossAggregation> parse_loss_aggregation(const std::string& s) {
  if (s == "token-mean") return LossAggregation::token_mean;
  if (s == "seq-mean") return LossAggregation::seq_mean;
  return invalid_argument("unknown loss aggregation '" + s + "'; use token-mean or seq-mean");
}

GrpoValue grpo_loss(const std::vector<PolicyToken>& tokens, const std::vector<float>& logprobs, const GrpoOptions& o,
                    bool proximal_is_current) {
  KILN_ASSERT(tokens.size() == logprobs.size());
  GrpoValue v;
  v.grad.resize(tokens.size());
  v.tokens = static_cast<int64_t>(tokens.size());
  for (size_t t = 0; t < tokens.size(); ++t) {
    const PolicyToken& k = tokens[t];
    const double logp = logprobs[t];
    const double prox = proximal_is_current ? logp : static_cast<double>(k.proximal_logprob);
    const double a = k.advantage;
    const double r = std::exp(logp - prox);
    const double clipped_r = std::clamp(r, 1.0 - o.clip_low, 1.0 + o.clip_high);
    const double unclipped = a * r, clipped = a * clipped_r;
    // d/dlogp of min(A r, A clip(r)): A r through the unclipped branch, or through the clipped one
    // while r is inside the bounds (there clip(r) = r); zero where the clipped branch is flat.
    const bool flat = clipped < unclipped && clipped_r != r;
    const double pg = -std::min(unclipped, clipped);
    const double dpg = flat ? 0.0 : -a * r;
    double w = 1.0;
    if (o.tis_cap > 0.0) {
      w = std::exp(prox - static_cast<double>(k.behaviour_logprob));
      if (w > o.tis_cap) {
        w = o.tis_cap;
        ++v.importance_truncated;
      }
    }
    double loss = w * pg, grad = w * dpg;
    if (o.kl_coef != 0.0) {
      const double d = static_cast<double>(k.reference_logprob) - logp;
      const double kl = std::exp(d) - d - 1.0;
      loss += o.kl_coef * kl;
      grad += o.kl_coef * (1.0 - std::exp(d));
      v.kl_sum += kl;
    }
    v.loss += k.weight * loss;
    v.grad[t] = static_cast<float>(k.weight * grad);
    v.clipped += flat ? 1 : 0;
    v.importance_weight_sum += w;
    v.ratio_sum += r;
    v.behaviour_gap_sum += prox - static_cast<double>(k.behaviour_logprob);
  }
  return v;
}

std::vector<double> group_advantages(const std::vector<double>& rewards, int32_t group_size, bool scale_by_std,
                                     double eps) {
  KILN_ASSERT(group_size > 0 && rewards.size() % static_cast<size_t>(group_size) == 0);
  std::vector<double> adv(rewards.size(), 0.0);
  for (size_t g = 0; g < rewards.size(); g += group_size) {
    if (group_size < 2) continue;
    double mean = 0.0;
    for (int32_t i = 0; i < group_size; ++i) mean += rewards[g + i];
    mean /= group_size;
    double var = 0.0;
    for (int32_t i = 0; i < group_size; ++i) var += (rewards[g + i] - mean) * (rewards[g + i] - mean);
    const double std_dev = std::sqrt(var / (group_size - 1));
    for (int32_t i = 0; i < group_size; ++i)
      adv[g + i] = scale_by_std ? (rewards[g + i] - mean) / (std_dev + eps) : rewards[g + i] - mean;
  }
  return adv;
}

DpoValue dpo_loss(const std::vector<PreferencePair>& pairs, const std::vector<float>& logprobs, double beta) {
  DpoValue v;
  v.grad.assign(logprobs.size(), 0.0f);
  auto sum = [&](int64_t b, int64_t e) {
    double s = 0.0;
    for (int64_t i = b; i < e; ++i) s += logprobs[i];
    return s;
  };
  for (const PreferencePair& p : pairs) {
    KILN_ASSERT(p.chosen_begin <= p.chosen_end && p.chosen_end <= static_cast<int64_t>(logprobs.size()));
    KILN_ASSERT(p.rejected_begin <= p.rejected_end && p.rejected_end <= static_cast<int64_t>(logprobs.size()));
    const double margin =
        (sum(p.chosen_begin, p.chosen_end) - p.reference_chosen) - (sum(p.rejected_begin, p.rejected_end) - p.reference_rejected);
    const double z = beta * margin;
    // -log sigmoid(z) = softplus(-z), computed without overflow; its derivative is -sigmoid(-z).
    const double loss = z > 0 ? std::log1p(std::exp(-z)) : -z + std::log1p(std::exp(z));
    const double sig_neg = 1.0 / (1.0 + std::exp(z));
    v.loss += p.weight * loss;
    const float gc = static_cast<float>(-p.weight * beta * sig_neg);
    for (int64_t i = p.chosen_begin; i < p.chosen_end; ++i) v.grad[i] += gc;
    for (int64_t i = p.rejected_begin; i < p.rejected_end; ++i) v.grad[i] -= gc;
    ++v.pairs;
    v.correct += z > 0 ? 1 : 0;
    v.margin_sum += margin;
  }
  return v;
}

}  // namespace kiln::rl
