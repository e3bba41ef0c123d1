// The RL losses (rl/losses.h) on their own and end to end through tiny-llama on the CPU in f32:
//   * RlLoss: grpo_loss's and dpo_loss's derivatives against central finite differences of the
//     losses they return (random inputs with clipped ratios and truncated importance weights),
//     small cases worked by hand, group_advantages (constant groups and groups of one give 0).
//   * RlLossFixture: testdata/rl/rl_losses.safetensors (tests/reference/make_rl_loss_fixture.py:
//     the same formulas in torch over transformers' LlamaForCausalLM): per case the completion
//     tokens' log-probabilities under softmax(logits / T), the loss and every parameter's gradient
//     from TrainModel::forward_backward_token_loss with a TokenLoss that evaluates rl::grpo_loss /
//     rl::dpo_loss on the fixture's inputs.
// Tolerances: log-probabilities 1e-5 absolute, the loss 1e-5 relative, each gradient tensor 1e-4
// relative L2 (the fp32 training tolerances of testdata/FIXTURES.md).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/safetensors.h"
#include "rl/losses.h"
#include "test_util.h"
#include "train/parameters.h"
#include "train/train_model.h"

namespace kiln::test {
namespace {

using rl::DpoValue;
using rl::GrpoOptions;
using rl::GrpoValue;
using rl::PolicyToken;
using rl::PreferencePair;

// ---------------------------------------------------------------------------------------------
// Unit tests of the host arithmetic.

// Central differences of `loss` in each logprob, the step taken as the difference of the floats
// actually passed (logprobs are f32).
template <class F>
std::vector<double> finite_differences(const std::vector<float>& lp, F loss, float h = 1e-3f) {
  std::vector<double> out(lp.size());
  for (size_t t = 0; t < lp.size(); ++t) {
    std::vector<float> up = lp, down = lp;
    up[t] = lp[t] + h;
    down[t] = lp[t] - h;
    out[t] = (loss(up) - loss(down)) / (static_cast<double>(up[t]) - down[t]);
  }
  return out;
}

// Random GRPO tokens: advantages of both signs (some 0), proximal log-probs whose ratios fall on
// both sides of the clip range but never within 2% of a bound (so that the finite difference does
// not straddle a kink), behaviour log-probs that put some importance weights above tis_cap.
struct RandomGrpo {
  std::vector<PolicyToken> tokens;
  std::vector<float> logprobs;
};
RandomGrpo random_grpo(const GrpoOptions& o, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::normal_distribution<double> g(0.0, 1.0);
  RandomGrpo r;
  for (int t = 0; t < n; ++t) {
    PolicyToken k;
    const double lp = -0.05 - 4.0 * u(rng);
    k.advantage = t % 7 == 3 ? 0.0 : 1.5 * g(rng);
    k.weight = 0.01 + 0.1 * u(rng);
    double ratio;
    do {
      ratio = std::exp(0.35 * g(rng));
    } while (std::abs(ratio - (1 - o.clip_low)) < 0.02 || std::abs(ratio - (1 + o.clip_high)) < 0.02);
    k.proximal_logprob = static_cast<float>(lp - std::log(ratio));
    double gap;  // prox - mu
    do {
      gap = 0.5 * g(rng);
    } while (o.tis_cap > 0 && std::abs(std::exp(gap) - o.tis_cap) < 0.02);
    k.behaviour_logprob = static_cast<float>(k.proximal_logprob - gap);
    k.reference_logprob = static_cast<float>(lp + 0.3 * g(rng));
    r.tokens.push_back(k);
    r.logprobs.push_back(static_cast<float>(lp));
  }
  return r;
}

TEST(RlLoss, GrpoDerivativeIsFiniteDifferenceOfLoss) {
  for (const double kl : {0.0, 0.07}) {
    for (const double cap : {0.0, 1.3}) {
      GrpoOptions o;
      o.clip_low = 0.2;
      o.clip_high = 0.28;
      o.tis_cap = cap;
      o.kl_coef = kl;
      SCOPED_TRACE("kl_coef " + std::to_string(kl) + " tis_cap " + std::to_string(cap));
      const RandomGrpo in = random_grpo(o, 64, 11 + static_cast<uint64_t>(kl * 100 + cap * 10));
      const GrpoValue v = rl::grpo_loss(in.tokens, in.logprobs, o, /*proximal_is_current=*/false);
      ASSERT_EQ(v.grad.size(), in.logprobs.size());
      EXPECT_GT(v.clipped, 3);
      if (cap > 0) {
        EXPECT_GT(v.importance_truncated, 3);
      }
      const std::vector<double> fd = finite_differences(
          in.logprobs, [&](const std::vector<float>& lp) { return rl::grpo_loss(in.tokens, lp, o, false).loss; });
      for (size_t t = 0; t < fd.size(); ++t)
        EXPECT_NEAR(v.grad[t], fd[t], 1e-5 + 1e-4 * std::abs(fd[t])) << "token " << t;
    }
  }
}

// With prox = logp the ratio is 1 at every logp, and the importance weight exp(logp - mu) is a
// constant of the gradient (stop-gradient): the derivative is w (-A) + kl' per token. Where w is
// below tis_cap that is also the finite difference of the loss (d/dlogp of exp(logp - mu) (-A) is
// w (-A)); where w is truncated the loss is flat in the weight and only the formula applies (tokens
// within 1% of the cap are left out of the finite-difference check: the step could straddle it).
TEST(RlLoss, GrpoProximalCurrentDerivative) {
  GrpoOptions o;
  o.tis_cap = 1.3;
  o.kl_coef = 0.05;
  const RandomGrpo in = random_grpo(o, 64, 5);
  const GrpoValue v = rl::grpo_loss(in.tokens, in.logprobs, o, /*proximal_is_current=*/true);
  EXPECT_EQ(v.clipped, 0);
  EXPECT_GT(v.importance_truncated, 3);
  EXPECT_NEAR(v.ratio_sum, 64.0, 1e-12);
  const std::vector<double> fd = finite_differences(
      in.logprobs, [&](const std::vector<float>& lp) { return rl::grpo_loss(in.tokens, lp, o, true).loss; });
  for (size_t t = 0; t < fd.size(); ++t) {
    const PolicyToken& k = in.tokens[t];
    const double w_raw = std::exp(static_cast<double>(in.logprobs[t]) - k.behaviour_logprob);
    const double w = std::min(w_raw, o.tis_cap);
    const double d = static_cast<double>(k.reference_logprob) - in.logprobs[t];
    const double want = k.weight * (-k.advantage * w + o.kl_coef * (1.0 - std::exp(d)));
    EXPECT_NEAR(v.grad[t], want, 1e-6 * (1 + std::abs(want))) << "token " << t;
    if (w_raw < 0.99 * o.tis_cap) {
      EXPECT_NEAR(v.grad[t], fd[t], 1e-5 + 1e-4 * std::abs(fd[t])) << "token " << t;
    }
  }
}

TEST(RlLoss, GrpoHandComputed) {
  GrpoOptions o;
  o.clip_low = 0.2;
  o.clip_high = 0.2;
  o.tis_cap = 2.0;
  auto tok = [](double a, double weight, float mu, float prox) {
    PolicyToken k;
    k.advantage = a;
    k.weight = weight;
    k.behaviour_logprob = mu;
    k.proximal_logprob = prox;
    return k;
  };
  const float l15 = std::log(1.5f), l05 = std::log(0.5f), l3 = std::log(3.0f);
  // 0: A 1, r 1.5 above 1.2: the clipped branch (1.2) is the minimum and flat; w = min(3, 2) = 2.
  // 1: A -1, r 1.5: min(-1.5, -1.2) = -1.5 through the unclipped branch: pg 1.5, d = -A r = 1.5.
  // 2: A -1, r 0.5 below 0.8: min(-0.5, -0.8) = -0.8, flat: pg 0.8, no gradient.
  // 3: A 2, r 0.5: min(1.0, 1.6) = 1.0 unclipped: pg -1, d = -A r = -1; w = exp(0.5) under the cap.
  // 4: A 1, r 1 (inside): pg -1, d = -1.
  const std::vector<PolicyToken> tokens = {tok(1, 0.5, -l3, 0), tok(-1, 1, 0, 0), tok(-1, 1, 0, 0),
                                           tok(2, 0.25, -0.5f, 0), tok(1, 1, -1.0f, -1.0f)};
  const std::vector<float> lp = {l15, l15, l05, l05, -1.0f};
  const GrpoValue v = rl::grpo_loss(tokens, lp, o, false);
  const double e05 = std::exp(0.5);
  EXPECT_NEAR(v.loss, 0.5 * 2 * -1.2 + 1.5 + 0.8 + 0.25 * e05 * -1.0 + -1.0, 1e-6);
  const std::vector<double> want = {0.0, 1.5, 0.0, 0.25 * e05 * -1.0, -1.0};
  for (size_t t = 0; t < want.size(); ++t) EXPECT_NEAR(v.grad[t], want[t], 1e-6) << t;
  EXPECT_EQ(v.tokens, 5);
  EXPECT_EQ(v.clipped, 2);
  EXPECT_EQ(v.importance_truncated, 1);
  EXPECT_NEAR(v.importance_weight_sum, 2 + 1 + 1 + e05 + 1, 1e-6);
  EXPECT_NEAR(v.ratio_sum, 1.5 + 1.5 + 0.5 + 0.5 + 1, 1e-6);
  EXPECT_NEAR(v.behaviour_gap_sum, l3 + 0.5, 1e-6);
  EXPECT_EQ(v.kl_sum, 0.0);

  // k3 KL alone: ref - logp = ln 2 gives kl = 2 - ln 2 - 1 and d kl / d logp = 1 - 2; with tis_cap
  // 0 the weight is 1 whatever mu is; A 0 leaves only the KL.
  GrpoOptions k = o;
  k.tis_cap = 0;
  k.kl_coef = 0.1;
  PolicyToken t = tok(0, 0.5, -7.0f, 0);
  t.reference_logprob = -1.0f + std::log(2.0f);
  const GrpoValue kv = rl::grpo_loss({t}, {-1.0f}, k, true);
  EXPECT_NEAR(kv.loss, 0.5 * 0.1 * (1 - std::log(2.0)), 1e-7);
  EXPECT_NEAR(kv.grad[0], 0.5 * 0.1 * -1.0, 1e-7);
  EXPECT_NEAR(kv.kl_sum, 1 - std::log(2.0), 1e-6);
  EXPECT_EQ(kv.importance_truncated, 0);
  EXPECT_EQ(kv.importance_weight_sum, 1.0);
}

TEST(RlLoss, DpoDerivativeIsFiniteDifferenceOfLoss) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> g(0.0, 1.0);
  std::vector<float> lp(40);
  for (float& x : lp) x = static_cast<float>(-2.0 + 0.8 * g(rng));
  // Pairs over ranges of different lengths; tokens 38, 39 belong to no pair.
  const std::vector<std::array<int64_t, 4>> ranges = {{0, 5, 5, 12}, {12, 14, 14, 23}, {23, 31, 31, 38}, {2, 4, 30, 33}};
  std::vector<PreferencePair> pairs;
  for (const auto& r : ranges) {
    PreferencePair p;
    p.chosen_begin = r[0];
    p.chosen_end = r[1];
    p.rejected_begin = r[2];
    p.rejected_end = r[3];
    p.reference_chosen = -2.0 * (r[1] - r[0]) + 3 * g(rng);
    p.reference_rejected = -2.0 * (r[3] - r[2]) + 3 * g(rng);
    p.weight = 1.0 / ranges.size();
    pairs.push_back(p);
  }
  const double beta = 0.3;
  const DpoValue v = rl::dpo_loss(pairs, lp, beta);
  EXPECT_EQ(v.pairs, 4);
  EXPECT_GT(v.correct, 0);
  EXPECT_LT(v.correct, 4);
  const std::vector<double> fd =
      finite_differences(lp, [&](const std::vector<float>& x) { return rl::dpo_loss(pairs, x, beta).loss; });
  for (size_t t = 0; t < fd.size(); ++t) EXPECT_NEAR(v.grad[t], fd[t], 1e-6 + 1e-4 * std::abs(fd[t])) << "token " << t;
  EXPECT_EQ(v.grad[38], 0.0f);
  EXPECT_EQ(v.grad[39], 0.0f);
}

TEST(RlLoss, DpoHandComputed) {
  // Pair 0: margin (-3 - -4) - (-3 - -2) = 2, z = 1: loss log(1 + e^-1), d chosen -beta sigmoid(-1).
  // Pair 1: margin (-2 - 0) - (-1 - 0) = -1, z = -0.5: loss log(1 + e^0.5).
  const std::vector<float> lp = {-1, -2, -3, -2, -1};
  PreferencePair a{0, 2, 2, 3, -4.0, -2.0, 0.5}, b{3, 4, 4, 5, 0.0, 0.0, 0.5};
  const DpoValue v = rl::dpo_loss({a, b}, lp, 0.5);
  const double s1 = 1 / (1 + std::exp(1.0)), s2 = 1 / (1 + std::exp(-0.5));  // sigmoid(-z)
  EXPECT_NEAR(v.loss, 0.5 * std::log1p(std::exp(-1.0)) + 0.5 * std::log1p(std::exp(0.5)), 1e-12);
  const std::vector<double> want = {-0.25 * s1, -0.25 * s1, 0.25 * s1, -0.25 * s2, 0.25 * s2};
  for (size_t t = 0; t < want.size(); ++t) EXPECT_NEAR(v.grad[t], want[t], 1e-7) << t;
  EXPECT_EQ(v.pairs, 2);
  EXPECT_EQ(v.correct, 1);
  EXPECT_NEAR(v.margin_sum, 1.0, 1e-12);
  // Large margins stay finite: softplus(-z) ~ e^-z for z >> 0 and -z for z << 0.
  const DpoValue big = rl::dpo_loss({PreferencePair{0, 1, 1, 2, 0, 0, 1}}, {0.0f, -8000.0f}, 0.1);
  EXPECT_NEAR(big.loss, 0.0, 1e-300);
  EXPECT_EQ(big.grad[0], -0.0f);
  const DpoValue neg = rl::dpo_loss({PreferencePair{0, 1, 1, 2, 0, 0, 1}}, {-8000.0f, 0.0f}, 0.1);
  EXPECT_NEAR(neg.loss, 800.0, 1e-9);
  EXPECT_NEAR(neg.grad[0], -0.1, 1e-7);
  EXPECT_NEAR(neg.grad[1], 0.1, 1e-7);
}

TEST(RlLoss, GroupAdvantages) {
  // [1, 0, 0]: mean 1/3, unbiased std sqrt(1/3); [2, 2, 2]: constant, 0.
  const std::vector<double> a = rl::group_advantages({1, 0, 0, 2, 2, 2}, 3, true);
  const double sd = std::sqrt(1.0 / 3.0) + 1e-4;
  const std::vector<double> want = {(2.0 / 3) / sd, (-1.0 / 3) / sd, (-1.0 / 3) / sd, 0, 0, 0};
  ASSERT_EQ(a.size(), want.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], want[i], 1e-12) << i;
  const std::vector<double> c = rl::group_advantages({0, 2, 5, 5}, 2, true, 0.5);
  EXPECT_NEAR(c[0], -1 / (std::sqrt(2.0) + 0.5), 1e-12);
  EXPECT_NEAR(c[1], 1 / (std::sqrt(2.0) + 0.5), 1e-12);
  EXPECT_EQ(c[2], 0.0);
  EXPECT_EQ(c[3], 0.0);
  const std::vector<double> u = rl::group_advantages({1, 0, 0, 3, 2, 2}, 3, false);
  const std::vector<double> want_u = {2.0 / 3, -1.0 / 3, -1.0 / 3, 2.0 / 3, -1.0 / 3, -1.0 / 3};
  for (size_t i = 0; i < u.size(); ++i) EXPECT_NEAR(u[i], want_u[i], 1e-12) << i;
  for (const bool scale : {true, false}) {
    const std::vector<double> one = rl::group_advantages({0.3, 7, -2}, 1, scale);
    for (double x : one) EXPECT_EQ(x, 0.0);
    const std::vector<double> constant = rl::group_advantages({0.7, 0.7, 0.7, 0.7}, 4, scale);
    for (double x : constant) EXPECT_EQ(x, 0.0);
  }
}

TEST(RlLoss, ParseLossAggregation) {
  EXPECT_EQ(*rl::parse_loss_aggregation("token-mean"), rl::LossAggregation::token_mean);
  EXPECT_EQ(*rl::parse_loss_aggregation("seq-mean"), rl::LossAggregation::seq_mean);
  Result<rl::LossAggregation> bad = rl::parse_loss_aggregation("sum");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("sum"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// The torch fixture, end to end through tiny-llama.

struct RlFixture {
  SafetensorsFile file;
  nlohmann::json j;
  std::vector<float> get(const std::string& name) const {
    Result<TensorInfo> t = file.find(name);
    KILN_ASSERT(t.ok() && t->dtype == DType::f32, name);
    std::vector<float> out(static_cast<size_t>(t->shape.numel()));
    std::memcpy(out.data(), t->data, out.size() * sizeof(float));
    return out;
  }
};

const RlFixture& rl_fixture() {
  static const RlFixture* f = [] {
    Result<SafetensorsFile> file = SafetensorsFile::open(testdata_dir() + "/rl/rl_losses.safetensors");
    KILN_ASSERT(file.ok());
    nlohmann::json j = nlohmann::json::parse(file->metadata().at("fixture"));
    return new RlFixture{std::move(*file), std::move(j)};
  }();
  return *f;
}

// One row per sequence, padded to the longest (segment -1, target -100); the targets are the next
// token at the positions that predict a completion token, so the labelled rows are the completion
// tokens in order.
HostBatch completion_batch(const std::vector<std::vector<int32_t>>& seqs, const std::vector<int32_t>& prompt_lens) {
  HostBatch b;
  b.batch = static_cast<int32_t>(seqs.size());
  for (const auto& s : seqs) b.seq_len = std::max<int32_t>(b.seq_len, static_cast<int32_t>(s.size()));
  const size_t n = static_cast<size_t>(b.batch) * b.seq_len;
  b.ids.assign(n, 0);
  b.positions.assign(n, 0);
  b.segments.assign(n, -1);
  b.targets.assign(n, -100);
  for (size_t r = 0; r < seqs.size(); ++r) {
    const size_t base = r * b.seq_len, len = seqs[r].size();
    for (size_t t = 0; t < len; ++t) {
      b.ids[base + t] = seqs[r][t];
      b.positions[base + t] = static_cast<int32_t>(t);
      b.segments[base + t] = 0;
      if (t + 1 >= static_cast<size_t>(prompt_lens[r]) && t + 1 < len) b.targets[base + t] = seqs[r][t + 1];
    }
  }
  return b;
}

class RlLossFixture : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    be_ = make_cpu_backend().release();
    Result<std::unique_ptr<TrainModel>> m = TrainModel::load(*be_, testdata_dir() + "/tiny-llama", {});
    KILN_ASSERT(m.ok(), m.status().message());
    model_ = m->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete be_;
    model_ = nullptr;
    be_ = nullptr;
  }

  // Runs the token loss over `hb` from zero gradients and compares the log-probabilities, the loss
  // and every gradient with the fixture's case `name`.
  void check(const std::string& name, const HostBatch& hb, float temperature, const TokenLoss& loss) {
    check_with(*model_, name, hb, temperature, loss);
  }
  static void check_with(TrainModel& m, const std::string& name, const HostBatch& hb, float temperature,
                         const TokenLoss& loss) {
    SCOPED_TRACE(name);
    const RlFixture& f = rl_fixture();
    be_->zero(m.params().grads());
    Result<DeviceBatch> db = m.upload(hb);
    ASSERT_TRUE(db.ok()) << db.status().message();
    TokenScoreOptions so;
    so.logit_scale = 1.0f / temperature;
    TokenScores scores;
    Result<double> got = m.forward_backward_token_loss(*db, loss, so, &scores);
    ASSERT_TRUE(got.ok()) << got.status().message();
    const std::vector<float> want_lp = f.get(name + ".logprobs");
    ASSERT_EQ(scores.logprobs.size(), want_lp.size());
    const double lp_err = max_abs_diff(scores.logprobs, want_lp);
    EXPECT_LE(lp_err, 1e-5);
    const double want_loss = f.j.at("cases").at(name).at("loss").get<double>();
    const double loss_err = std::abs(*got - want_loss) / std::abs(want_loss);
    EXPECT_LE(loss_err, 1e-5) << *got << " vs " << want_loss;
    const ParameterSet& P = m.params();
    size_t in_fixture = 0;  // every parameter of the reference is compared
    for (const std::string& n : f.file.names()) in_fixture += n.rfind(name + ".grad.", 0) == 0 ? 1 : 0;
    EXPECT_EQ(in_fixture, P.layout().hf.size());
    double worst = 0;
    std::string worst_name;
    for (const HfTensor& t : P.layout().hf) {
      const double e = rel_error(to_f32(*be_, P.hf_view(P.grads(), t)), f.get(name + ".grad." + t.name));
      EXPECT_LE(e, 1e-4) << t.name;
      if (e >= worst) {
        worst = e;
        worst_name = t.name;
      }
    }
    std::printf("  %s: logprobs max abs %.2e, loss rel %.2e, worst grad rel %.2e (%s)\n", name.c_str(), lp_err, loss_err,
                worst, worst_name.c_str());
  }

  void check_grpo(const std::string& name, TrainModel* model = nullptr) {
    const nlohmann::json& g = rl_fixture().j.at("grpo");
    const nlohmann::json& c = rl_fixture().j.at("cases").at(name);
    const auto seqs = g.at("ids").get<std::vector<std::vector<int32_t>>>();
    const auto prompts = g.at("prompt_lengths").get<std::vector<int32_t>>();
    const auto adv = g.at("advantages").get<std::vector<double>>();
    const auto mu = g.at("behaviour_logprobs").get<std::vector<float>>();
    const auto ref = g.at("reference_logprobs").get<std::vector<float>>();
    const auto prox = g.at("proximal_logprobs").get<std::vector<float>>();
    // The advantages the fixture used are group_advantages' of its rewards.
    const std::vector<double> mine = rl::group_advantages(g.at("rewards").get<std::vector<double>>(),
                                                          g.at("group_size").get<int32_t>(), g.at("scale_by_std").get<bool>(),
                                                          g.at("eps").get<double>());
    ASSERT_EQ(mine.size(), adv.size());
    for (size_t i = 0; i < adv.size(); ++i) EXPECT_NEAR(mine[i], adv[i], 1e-12) << i;

    GrpoOptions o;
    o.clip_low = g.at("clip_low").get<double>();
    o.clip_high = g.at("clip_high").get<double>();
    o.tis_cap = c.at("tis_cap").get<double>();
    o.kl_coef = c.at("kl_coef").get<double>();
    const bool current = c.at("proximal").get<std::string>() == "current";
    Result<rl::LossAggregation> agg = rl::parse_loss_aggregation(c.at("aggregation").get<std::string>());
    ASSERT_TRUE(agg.ok());
    int64_t total = 0;
    for (size_t i = 0; i < seqs.size(); ++i) total += static_cast<int64_t>(seqs[i].size()) - prompts[i];
    std::vector<PolicyToken> tokens;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t len = static_cast<int64_t>(seqs[i].size()) - prompts[i];
      for (int64_t t = 0; t < len; ++t) {
        PolicyToken k;
        const size_t n = tokens.size();
        k.advantage = adv[i];
        k.weight = *agg == rl::LossAggregation::token_mean ? 1.0 / total
                                                           : 1.0 / (static_cast<double>(seqs.size()) * len);
        k.behaviour_logprob = mu[n];
        k.proximal_logprob = prox[n];
        k.reference_logprob = ref[n];
        tokens.push_back(k);
      }
    }
    ASSERT_EQ(tokens.size(), mu.size());
    GrpoValue seen;
    const TokenLoss loss = [&](const std::vector<float>& lp, const std::vector<float>&) -> Result<TokenLossValue> {
      if (lp.size() != tokens.size()) return invalid_argument("labelled rows != completion tokens");
      seen = rl::grpo_loss(tokens, lp, o, current);
      return TokenLossValue{seen.loss, seen.grad};
    };
    check_with(model ? *model : *model_, name, completion_batch(seqs, prompts), g.at("temperature").get<float>(), loss);
    // The same branches as torch's: clipped (flat) tokens and truncated importance weights.
    EXPECT_EQ(seen.clipped, c.at("clipped").get<int64_t>());
    EXPECT_EQ(seen.importance_truncated, c.at("truncated").get<int64_t>());
  }

  static Backend* be_;
  static TrainModel* model_;
};
Backend* RlLossFixture::be_ = nullptr;
TrainModel* RlLossFixture::model_ = nullptr;

TEST_F(RlLossFixture, GrpoProximalCurrentTokenMean) { check_grpo("grpo_a"); }
TEST_F(RlLossFixture, GrpoClippedTruncatedSeqMeanKl) { check_grpo("grpo_b"); }
TEST_F(RlLossFixture, GrpoNoImportanceWeightTokenMeanKl) { check_grpo("grpo_c"); }

// The same through a model that recomputes each layer's activations in the backward.
TEST_F(RlLossFixture, GrpoWithRecompute) {
  TrainModelOptions o;
  o.recompute = true;
  Result<std::unique_ptr<TrainModel>> m = TrainModel::load(*be_, testdata_dir() + "/tiny-llama", o);
  ASSERT_TRUE(m.ok()) << m.status().message();
  check_grpo("grpo_b", m->get());
}

TEST_F(RlLossFixture, Dpo) {
  const nlohmann::json& d = rl_fixture().j.at("dpo");
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int32_t> prompts;
  std::vector<PreferencePair> pairs;
  int64_t off = 0;
  const double n_pairs = static_cast<double>(d.at("pairs").size());
  for (const nlohmann::json& p : d.at("pairs")) {
    const auto prompt = p.at("prompt").get<std::vector<int32_t>>();
    PreferencePair pp;
    for (const char* part : {"chosen", "rejected"}) {
      std::vector<int32_t> s = prompt;
      const auto c = p.at(part).get<std::vector<int32_t>>();
      s.insert(s.end(), c.begin(), c.end());
      seqs.push_back(s);
      prompts.push_back(static_cast<int32_t>(prompt.size()));
      const int64_t end = off + static_cast<int64_t>(c.size());
      if (std::string(part) == "chosen") {
        pp.chosen_begin = off;
        pp.chosen_end = end;
      } else {
        pp.rejected_begin = off;
        pp.rejected_end = end;
      }
      off = end;
    }
    pp.reference_chosen = p.at("reference_chosen").get<double>();
    pp.reference_rejected = p.at("reference_rejected").get<double>();
    pp.weight = 1.0 / n_pairs;
    pairs.push_back(pp);
  }
  const double beta = d.at("beta").get<double>();
  DpoValue seen;
  const TokenLoss loss = [&](const std::vector<float>& lp, const std::vector<float>&) -> Result<TokenLossValue> {
    if (static_cast<int64_t>(lp.size()) != off) return invalid_argument("labelled rows != completion tokens");
    seen = rl::dpo_loss(pairs, lp, beta);
    return TokenLossValue{seen.loss, seen.grad};
  };
  check("dpo", completion_batch(seqs, prompts), d.at("temperature").get<float>(), loss);
  const auto z = rl_fixture().j.at("cases").at("dpo").at("z").get<std::vector<double>>();
  int64_t correct = 0;
  for (double x : z) correct += x > 0 ? 1 : 0;
  EXPECT_EQ(seen.pairs, static_cast<int64_t>(z.size()));
  EXPECT_EQ(seen.correct, correct);
}

// The gradients are accumulated (+=): the same case twice without zeroing doubles them, and
// zeroing in between gives the single case's again (what the fixture tests above rely on).
TEST_F(RlLossFixture, GradientsAccumulateAcrossCalls) {
  TrainModel& m = *model_;
  const nlohmann::json& g = rl_fixture().j.at("grpo");
  const HostBatch hb = completion_batch(g.at("ids").get<std::vector<std::vector<int32_t>>>(),
                                        g.at("prompt_lengths").get<std::vector<int32_t>>());
  Result<DeviceBatch> db = m.upload(hb);
  ASSERT_TRUE(db.ok());
  const TokenLoss loss = [](const std::vector<float>& lp, const std::vector<float>&) -> Result<TokenLossValue> {
    TokenLossValue v;
    v.dloss_dlogprob.assign(lp.size(), -1.0f / static_cast<float>(lp.size()));
    for (float x : lp) v.loss -= x / static_cast<double>(lp.size());
    return v;
  };
  be_->zero(m.params().grads());
  ASSERT_TRUE(m.forward_backward_token_loss(*db, loss, {}).ok());
  const std::vector<float> once = to_f32(*be_, m.params().grads());
  ASSERT_TRUE(m.forward_backward_token_loss(*db, loss, {}).ok());
  std::vector<float> twice = to_f32(*be_, m.params().grads());
  for (float& x : twice) x *= 0.5f;
  EXPECT_LE(rel_error(twice, once), 1e-6);
  // A token loss of the wrong size is refused.
  const TokenLoss wrong = [](const std::vector<float>& lp, const std::vector<float>&) -> Result<TokenLossValue> {
    return TokenLossValue{0.0, std::vector<float>(lp.size() + 1, 0.0f)};
  };
  EXPECT_FALSE(m.forward_backward_token_loss(*db, wrong, {}).ok());
  be_->zero(m.params().grads());
}

}  // namespace
}  // namespace kiln::test
