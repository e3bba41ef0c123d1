#include "rl/policy_step.h"

#include <algorithm>

namespace kiln::rl {

namespace {

// Log-probabilities of every sample's completion under `model` (no gradient), in sample order.
Result<std::vector<std::vector<float>>> score_samples(TrainModel& model, const std::vector<SequenceRef>& seqs,
                                                      int32_t micro, float logit_scale) {
  std::vector<std::vector<float>> out;
  for (size_t b = 0; b < seqs.size(); b += micro) {
    const std::vector<SequenceRef> part(seqs.begin() + b, seqs.begin() + std::min(seqs.size(), b + micro));
    KILN_ASSIGN_OR_RETURN(DeviceBatch db, model.upload(sequence_batch(part)));
    TokenScoreOptions so;
    so.logit_scale = logit_scale;
    KILN_ASSIGN_OR_RETURN(TokenScores scores, model.target_scores(db, so));
    size_t k = 0;
    for (const SequenceRef& s : part) {
      out.emplace_back(scores.logprobs.begin() + k, scores.logprobs.begin() + k + s.completion->size());
      k += s.completion->size();
    }
  }
  return out;
}

}  // namespace

Status train_grpo_step(Trainer& trainer, TrainModel& model, TrainModel* reference, const RlOptions& o_,
                       const std::vector<Rollout*>& all, RlStepReport& rep) {
  std::vector<Rollout*> samples;
  for (Rollout* r : all)
    if (!r->completion_ids.empty()) samples.push_back(r);
  rep.samples = static_cast<int64_t>(samples.size());
  if (samples.empty()) return Status::Ok();
  const float scale = 1.0f / o_.temperature;
  std::vector<SequenceRef> seqs;
  for (Rollout* r : samples) seqs.push_back({&r->prompt_ids, &r->completion_ids});
  // The proximal policy: the trainer before this batch's updates (one update: the same pass).
  std::vector<std::vector<float>> prox, ref;
  if (o_.minibatches > 1) {
    KILN_ASSIGN_OR_RETURN(prox, score_samples(model, seqs, o_.micro_batch, scale));
  }
  if (o_.grpo.kl_coef != 0.0) {
    KILN_ASSIGN_OR_RETURN(ref, score_samples(*reference, seqs, o_.micro_batch, scale));
  }
  rep.oldest_version = UINT64_MAX;
  for (Rollout* r : samples) {
    rep.oldest_version = std::min(rep.oldest_version, r->oldest_version());
    rep.newest_version = std::max(rep.newest_version, *std::max_element(r->token_versions.begin(), r->token_versions.end()));
  }
  GrpoValue totals;
  double entropy_sum = 0;
  const size_t per = (samples.size() + o_.minibatches - 1) / o_.minibatches;
  for (size_t m0 = 0; m0 < samples.size(); m0 += per) {
    const size_t m1 = std::min(samples.size(), m0 + per);
    int64_t mb_tokens = 0;
    for (size_t i = m0; i < m1; ++i) mb_tokens += static_cast<int64_t>(samples[i]->completion_ids.size());
    std::vector<HostBatch> micro;
    std::vector<TokenLoss> losses;
    for (size_t b = m0; b < m1; b += o_.micro_batch) {
      const size_t e = std::min(m1, b + o_.micro_batch);
      std::vector<PolicyToken> tokens;
      for (size_t i = b; i < e; ++i) {
        const Rollout& r = *samples[i];
        const size_t n = r.completion_ids.size();
        const double w = o_.aggregation == LossAggregation::token_mean
                             ? 1.0 / static_cast<double>(mb_tokens)
                             : 1.0 / (static_cast<double>(m1 - m0) * static_cast<double>(n));
        for (size_t t = 0; t < n; ++t) {
          PolicyToken k;
          k.advantage = r.advantage;
          k.weight = w;
          k.behaviour_logprob = r.logprobs[t];
          if (!prox.empty()) k.proximal_logprob = prox[i][t];
          if (!ref.empty()) k.reference_logprob = ref[i][t];
          tokens.push_back(k);
        }
      }
      micro.push_back(sequence_batch(std::vector<SequenceRef>(seqs.begin() + b, seqs.begin() + e)));
      const bool current = o_.minibatches == 1;
      const GrpoOptions opts = o_.grpo;
      losses.push_back([tokens = std::move(tokens), opts, current, &totals](const std::vector<float>& logprobs,
                                                       const std::vector<float>&) -> Result<TokenLossValue> {
        GrpoValue v = grpo_loss(tokens, logprobs, opts, current);
        totals.tokens += v.tokens;
        totals.clipped += v.clipped;
        totals.kl_sum += v.kl_sum;
        totals.importance_weight_sum += v.importance_weight_sum;
        return TokenLossValue{v.loss, std::move(v.grad)};
      });
    }
    TokenScoreOptions so;
    so.logit_scale = scale;
    so.entropies = true;
    std::vector<TokenScores> scores;
    KILN_ASSIGN_OR_RETURN(StepReport sr, trainer.step_token_loss(micro, losses, so, &scores));
    for (const TokenScores& sc : scores)
      for (float h : sc.entropies) entropy_sum += h;
    rep.loss += sr.loss;
    rep.grad_norm = sr.grad_norm;
    rep.lr = sr.lr;
    rep.tokens_trained += sr.tokens;
  }
  const double n = static_cast<double>(std::max<int64_t>(totals.tokens, 1));
  rep.kl = totals.kl_sum / n;
  rep.entropy = entropy_sum / n;
  rep.clip_fraction = static_cast<double>(totals.clipped) / n;
  rep.importance_weight = totals.importance_weight_sum / n;
  rep.response_length = n / static_cast<double>(samples.size());
  rep.tokens_attributed = totals.tokens;
  return Status::Ok();
}

Status train_dpo_step(Trainer& trainer, TrainModel& reference, const RlOptions& o_,
                      const std::vector<std::pair<SequenceRef, SequenceRef>>& pairs, RlStepReport& rep) {
  rep.samples = static_cast<int64_t>(pairs.size());
  if (pairs.empty()) return Status::Ok();
  std::vector<SequenceRef> seqs;  // chosen, rejected, chosen, rejected, ...
  for (const auto& [c, r] : pairs) {
    seqs.push_back(c);
    seqs.push_back(r);
  }
  const int32_t micro_rows = std::max<int32_t>(2, o_.micro_batch / 2 * 2);
  KILN_ASSIGN_OR_RETURN(std::vector<std::vector<float>> ref, score_samples(reference, seqs, micro_rows, 1.0f));
  auto sum = [](const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += x;
    return s;
  };
  std::vector<HostBatch> micro;
  std::vector<TokenLoss> losses;
  DpoValue totals;
  for (size_t b = 0; b < seqs.size(); b += micro_rows) {
    const size_t e = std::min(seqs.size(), b + micro_rows);
    std::vector<PreferencePair> mp;
    int64_t off = 0;
    for (size_t i = b; i < e; i += 2) {
      PreferencePair p;
      p.chosen_begin = off;
      p.chosen_end = off += static_cast<int64_t>(seqs[i].completion->size());
      p.rejected_begin = off;
      p.rejected_end = off += static_cast<int64_t>(seqs[i + 1].completion->size());
      p.reference_chosen = sum(ref[i]);
      p.reference_rejected = sum(ref[i + 1]);
      p.weight = 1.0 / static_cast<double>(pairs.size());
      mp.push_back(p);
    }
    micro.push_back(sequence_batch(std::vector<SequenceRef>(seqs.begin() + b, seqs.begin() + e)));
    const double beta = o_.dpo_beta;
    losses.push_back([mp = std::move(mp), beta, &totals](const std::vector<float>& logprobs,
                                         const std::vector<float>&) -> Result<TokenLossValue> {
      DpoValue v = dpo_loss(mp, logprobs, beta);
      totals.pairs += v.pairs;
      totals.correct += v.correct;
      totals.margin_sum += v.margin_sum;
      return TokenLossValue{v.loss, std::move(v.grad)};
    });
  }
  KILN_ASSIGN_OR_RETURN(StepReport sr, trainer.step_token_loss(micro, losses, TokenScoreOptions{}));
  rep.loss = sr.loss;
  rep.grad_norm = sr.grad_norm;
  rep.lr = sr.lr;
  rep.tokens_trained = sr.tokens;
  rep.dpo_accuracy = static_cast<double>(totals.correct) / static_cast<double>(std::max<int64_t>(totals.pairs, 1));
  rep.dpo_margin = totals.margin_sum / static_cast<double>(std::max<int64_t>(totals.pairs, 1));
  return Status::Ok();
}

}  // namespace kiln::rl
