// The CPU twin of ops::sample's log-probabilities against a double log-softmax (raw ones, and the
// behaviour log-probabilities of the drawn distribution), and the counts table the penalties read.
// References and shared helpers: sampler_reference.h (test_sampler.cpp has the draws).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "sampler_reference.h"

namespace kiln::test {
namespace {

// ---------------------------------------------------------------------------------------------
// Log-probabilities

TEST_F(Sampler, LogprobsAreTheRawLogSoftmax) {
  SamplerCall c = random_call(12, 1000, 6);
  for (int64_t b = 0; b < c.B; ++b) {
    c.rows[b].logprobs = b % 3 != 2;
    c.rows[b].top_logprobs = b % 4 == 0 ? 0 : b % 4 == 1 ? 5 : b % 4 == 2 ? K : 1;
  }
  // Ties in row 1 and 2, so the top-N order must break them by index.
  for (int64_t i = 0; i < c.V; i += 3) c.logits[1 * c.V + i] = c.logits[2 * c.V + i] = 2.5f;
  const SamplerOutputs o = test::run_sampler(*be, c);
  for (int64_t b = 0; b < c.B; ++b) {
    const float* l = c.logits.data() + b * c.V;
    double mx = -kInf, s = 0;
    for (int64_t i = 0; i < c.V; ++i) mx = std::max<double>(mx, l[i]);
    for (int64_t i = 0; i < c.V; ++i) s += std::exp(l[i] - mx);
    auto ref = [&](int32_t i) { return l[i] - mx - std::log(s); };
    const bool asks = c.rows[b].logprobs || c.rows[b].top_logprobs > 0;
    if (asks)
      EXPECT_NEAR(o.logprobs[b], ref(o.tokens[b]), 1e-5) << "row " << b;
    else
      EXPECT_EQ(o.logprobs[b], test::kUntouchedLogprob);
    std::vector<int32_t> order(c.V);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return l[x] > l[y] || (l[x] == l[y] && x < y); });
    const int n = c.rows[b].top_logprobs;
    for (int r = 0; r < K; ++r) {
      if (r < n) {
        EXPECT_EQ(o.top_ids[b * K + r], order[r]) << "row " << b << " rank " << r;
        EXPECT_NEAR(o.top_logprobs[b * K + r], ref(order[r]), 1e-5);
      } else {
        EXPECT_EQ(o.top_ids[b * K + r], test::kUntouchedId);
        EXPECT_EQ(o.top_logprobs[b * K + r], test::kUntouchedLogprob);
      }
    }
  }
}

TEST_F(Sampler, LogprobsOfShortAndDegenerateRows) {
  SamplerCall c = one_row({1.0f, 3.0f, 3.0f, -kInf, kNaN, 0.0f, 2.0f}, row(0.0f));
  c.rows[0].top_logprobs = 10;
  SamplerOutputs o = test::run_sampler(*be, c);
  EXPECT_EQ(o.tokens[0], 1);
  const std::vector<int32_t> want = {1, 2, 6, 0, 5, 3, 4, -1, -1, -1};
  const double lse = 3.0 + std::log(2 + std::exp(-1.0) + std::exp(-2.0) + std::exp(-3.0));
  for (int r = 0; r < 10; ++r) {
    EXPECT_EQ(o.top_ids[r], want[r]) << r;
    const double v = (want[r] < 0 || want[r] == 3 || want[r] == 4) ? -kInf : c.logits[want[r]] - lse;
    if (std::isinf(v))
      EXPECT_EQ(o.top_logprobs[r], -kInf) << r;
    else
      EXPECT_NEAR(o.top_logprobs[r], v, 1e-6) << r;
  }
  EXPECT_NEAR(o.logprobs[0], 3.0 - lse, 1e-6);
  // No finite maximum: 0 for the tokens at the maximum, -inf for the others.
  c = one_row({1.0f, kInf, kInf}, row(0.0f));
  c.rows[0].logprobs = 1;
  c.rows[0].top_logprobs = 2;
  o = test::run_sampler(*be, c);
  EXPECT_EQ(o.tokens[0], 1);
  EXPECT_EQ(o.logprobs[0], 0.0f);
  EXPECT_EQ(o.top_ids[0], 1);
  EXPECT_EQ(o.top_ids[1], 2);
}

// ---------------------------------------------------------------------------------------------
// Behaviour log-probabilities (SamplingRow::logprobs == kLogprobsSampled)

// Random logits N(0, scale^2) pushed apart so that neighbours in value order differ by >= gap.
std::vector<float> separated_logits(int64_t n, uint64_t seed, float scale, float gap) {
  std::vector<float> l = random_logits(n, seed, scale);
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] < l[b] || (l[a] == l[b] && a < b); });
  for (int64_t r = 1; r < n; ++r) l[order[r]] = std::max(l[order[r]], l[order[r - 1]] + gap);
  return l;
}

// The raw log-softmax of row l at token v, in double.
double raw_logprob(const float* l, int64_t V, int32_t v) {
  double mx = -kInf, s = 0;
  for (int64_t i = 0; i < V; ++i) mx = std::max<double>(mx, l[i]);
  for (int64_t i = 0; i < V; ++i) s += std::exp(l[i] - mx);
  return l[v] - mx - std::log(s);
}

// Sampled rows (temperature 0.5 .. 1.5 with top-k, top-p, min-p and penalties mixed) asking for
// the behaviour log-prob: e^logprob is the probability of the token under the distribution of the
// definition, computed here in double (softmax of the penalised, tempered logits over the kept set
// of the reference's own sort, renormalised). Logits are distinct with gaps >= 1.5e-3; rows where a
// top-p or min-p decision lies within 1e-5 of its boundary (the fixed-point cut may then differ
// from the real-valued one) are skipped, and there must be few.
TEST_F(Sampler, SampledLogprobsAreTheDrawnDistribution) {
  int checked = 0, skipped = 0;
  double worst = 0;
  uint64_t seed = 40;
  for (int64_t V : {50, 97, 500, 1200, 3000}) {
    SamplerCall c;
    c.B = 300, c.V = V, c.count_rows = c.B;
    c.counts.assign(c.B * V, 0);
    auto u = [&](uint64_t k) { return rng::uniform(seed, k); };
    for (int64_t b = 0; b < c.B; ++b) {
      const uint64_t k = 100 * static_cast<uint64_t>(b);
      const std::vector<float> l =
          separated_logits(V, seed * 1000 + b, static_cast<float>(0.5 + 5 * u(k)), 1.5e-3f);
      c.logits.insert(c.logits.end(), l.begin(), l.end());
      ops::SamplingRow r = row(static_cast<float>(0.5 + u(k + 1)));
      if (u(k + 2) < 0.5) r.top_k = 1 + static_cast<int32_t>(u(k + 3) * std::min<int64_t>(V, 300));
      if (u(k + 4) < 0.5) r.top_p = static_cast<float>(0.1 + 0.89 * u(k + 5));
      if (u(k + 6) < 0.3) r.min_p = static_cast<float>(0.3 * u(k + 7));
      if (u(k + 8) < 0.4) {
        r.counts_row = static_cast<int32_t>(b);
        r.repetition_penalty = static_cast<float>(0.8 + 0.7 * u(k + 9));
        r.frequency_penalty = static_cast<float>(u(k + 10) - 0.3);
        r.presence_penalty = static_cast<float>(u(k + 11) - 0.3);
        random_counts_row(c, b, seed);
      }
      r.logprobs = ops::kLogprobsSampled;
      r.top_logprobs = b % 5 == 0 ? 3 : 0;  // the top-N do not change the behaviour log-prob
      ops::set_sampling_seed(r, 0x9e3779b97f4a7c15ull * (b + 1) + seed);
      r.position = static_cast<int32_t>(u(k + 12) * 100000);
      c.rows.push_back(r);
    }
    ++seed;
    const SamplerOutputs o = test::run_sampler(*be, c);
    // The log-prob mode never changes the draw.
    SamplerCall plain = c;
    for (ops::SamplingRow& r : plain.rows) r.logprobs = ops::kLogprobsOff, r.top_logprobs = 0;
    EXPECT_EQ(test::run_sampler(*be, plain).tokens, o.tokens) << "V=" << V;

    for (int64_t b = 0; b < c.B; ++b) {
      const ops::SamplingRow& p = c.rows[b];
      const int32_t* counts = p.counts_row >= 0 ? c.counts.data() + p.counts_row * V : nullptr;
      const std::vector<float> z = reference_values(c.logits.data() + b * V, counts, p, V);
      const RefKept k = reference_kept(z, p, z[ref_first_max(z)]);
      if (k.margin < 1e-5) {
        ++skipped;
        continue;
      }
      const int32_t t = o.tokens[b];
      ASSERT_TRUE(std::binary_search(k.kept.begin(), k.kept.end(), t)) << "V=" << V << " row " << b << " token " << t;
      double total = 0;
      for (int32_t i : k.kept) total += k.prob[i];
      const double want = k.prob[t] / total;
      const double got = std::exp(static_cast<double>(o.logprobs[b]));
      ASSERT_LE(o.logprobs[b], 0.0f);
      if (want <= 1e-6) continue;
      const double rel = std::fabs(got - want) / want;
      worst = std::max(worst, rel);
      ++checked;
      EXPECT_LE(rel, 1e-6) << "V=" << V << " row " << b << ": logprob " << o.logprobs[b] << ", reference "
                           << std::log(want) << " (T " << p.temperature << " k " << p.top_k << " p " << p.top_p
                           << " min_p " << p.min_p << " counts_row " << p.counts_row << ")";
    }
  }
  EXPECT_LE(skipped, 15);
  EXPECT_GE(checked, 1400);
  char summary[96];
  std::snprintf(summary, sizeof(summary), "%d rows checked, %d skipped, worst relative error %.3g", checked, skipped,
                worst);
  RecordProperty("summary", summary);
}

// A small row by hand: probabilities 0.3, 0.1, 0.4, 0.2 cut to the top 3 and renormalised by 0.9,
// at temperature 2 (square roots), and a single kept token (log 1 = 0 exactly).
TEST_F(Sampler, SampledLogprobsOfASmallRow) {
  auto probs = [&](float temperature, std::vector<bool> kept) {
    std::vector<double> p(4);
    double s = 0;
    for (int i = 0; i < 4; ++i) s += p[i] = kept[i] ? std::exp(static_cast<double>(kFour[i]) / temperature) : 0.0;
    for (double& x : p) x /= s;
    return p;
  };
  struct Case {
    ops::SamplingRow r;
    std::vector<double> want;
  };
  const std::vector<Case> cases = {
      {row(1.0f), probs(1.0f, {true, true, true, true})},
      {row(1.0f, 3), probs(1.0f, {true, false, true, true})},
      {row(2.0f, 0, 0.75f), probs(2.0f, {true, false, true, true})},  // 0.33 + 0.28 < 0.75 <= + 0.23
      {row(0.7f, 0, 1.0f, 0.4f), probs(0.7f, {true, false, true, false})},  // (0.2 / 0.4)^(1 / 0.7) = 0.37
      {row(1.0f, 1), {0, 0, 1, 0}},
  };
  for (const Case& k : cases)
    for (int32_t pos = 0; pos < 50; ++pos) {
      SamplerCall c = one_row(kFour, k.r);
      c.rows[0].logprobs = ops::kLogprobsSampled;
      c.rows[0].position = pos;
      const SamplerOutputs o = test::run_sampler(*be, c);
      const double want = k.want[o.tokens[0]];
      ASSERT_GT(want, 0.0) << "token " << o.tokens[0];
      if (want == 1.0)
        EXPECT_EQ(o.logprobs[0], 0.0f);
      else
        EXPECT_NEAR(std::exp(static_cast<double>(o.logprobs[0])), want, 1e-6 * want) << "token " << o.tokens[0];
    }
}

// Where no draw happens the distribution is a point mass: 0 for greedy rows (with penalties too),
// rows without a finite maximum and rows whose min-p keeps nothing. The top-N stay raw.
TEST_F(Sampler, SampledLogprobsOfUndrawnTokensAreZero) {
  SamplerCall c;
  c.B = 6, c.V = 1000, c.count_rows = 1;
  c.logits = random_logits(c.B * c.V, 81, 2.0f);
  c.counts.assign(c.V, 0);
  for (int64_t i = 0; i < c.V; i += 7) c.counts[i] = i % 2 ? ops::kPromptBit : 3;
  c.rows = {row(0.0f), row(-1.0f, 5, 0.5f, 0.1f), row(0.0f), row(0.8f), row(1.0f), row(1.0f, 0, 1.0f, 1.5f)};
  c.rows[2].counts_row = 0;  // greedy with penalties
  c.rows[2].repetition_penalty = 1.5f, c.rows[2].frequency_penalty = 0.5f;
  c.logits[3 * c.V + 17] = kInf;                                     // no finite maximum
  std::fill(c.logits.begin() + 4 * c.V, c.logits.begin() + 5 * c.V, -kInf);  // nor here
  for (ops::SamplingRow& r : c.rows) r.logprobs = ops::kLogprobsSampled, r.top_logprobs = 4;
  const SamplerOutputs o = test::run_sampler(*be, c);
  for (int64_t b = 0; b < c.B; ++b) EXPECT_EQ(o.logprobs[b], 0.0f) << "row " << b;
  EXPECT_EQ(o.tokens[3], 17);
  EXPECT_EQ(o.tokens[4], 0);
  EXPECT_EQ(o.tokens[5], ref_first_max(std::vector<float>(c.logits.begin() + 5 * c.V, c.logits.begin() + 6 * c.V)));
  // The same rows in raw mode: the same tokens and top-N, bit for bit.
  SamplerCall raw = c;
  for (ops::SamplingRow& r : raw.rows) r.logprobs = ops::kLogprobsRaw;
  const SamplerOutputs w = test::run_sampler(*be, raw);
  EXPECT_EQ(w.tokens, o.tokens);
  EXPECT_EQ(w.top_ids, o.top_ids);
  EXPECT_EQ(0, std::memcmp(w.top_logprobs.data(), o.top_logprobs.data(), o.top_logprobs.size() * sizeof(float)));
  // Rows asking for nothing stay untouched; the behaviour mode without top-N writes only logprobs[b].
  c.rows[0].logprobs = ops::kLogprobsOff, c.rows[0].top_logprobs = 0;
  c.rows[1].top_logprobs = 0;
  const SamplerOutputs n = test::run_sampler(*be, c);
  EXPECT_EQ(n.logprobs[0], test::kUntouchedLogprob);
  EXPECT_EQ(n.logprobs[1], 0.0f);
  for (int r = 0; r < K; ++r) EXPECT_EQ(n.top_ids[1 * K + r], test::kUntouchedId);
}

// Mode 1 (and top-N alone) stay the raw log-softmax whatever the temperature, cuts and penalties;
// mode 2 of the same rows differs.
TEST_F(Sampler, RawLogprobsIgnoreTheSamplingParameters) {
  SamplerCall c = random_call(40, 700, 9);
  for (int64_t b = 0; b < c.B; ++b) {
    c.rows[b].temperature = 0.5f;
    c.rows[b].top_k = 20;
    c.rows[b].logprobs = b % 2 ? ops::kLogprobsRaw : ops::kLogprobsOff;
    c.rows[b].top_logprobs = b % 2 ? 0 : 2;
  }
  const SamplerOutputs o = test::run_sampler(*be, c);
  SamplerCall sampled = c;
  for (ops::SamplingRow& r : sampled.rows) r.logprobs = ops::kLogprobsSampled;
  const SamplerOutputs s = test::run_sampler(*be, sampled);
  int differ = 0;
  for (int64_t b = 0; b < c.B; ++b) {
    const double want = raw_logprob(c.logits.data() + b * c.V, c.V, o.tokens[b]);
    EXPECT_NEAR(o.logprobs[b], want, 1e-5) << "row " << b;
    EXPECT_EQ(s.tokens[b], o.tokens[b]);
    differ += std::fabs(s.logprobs[b] - o.logprobs[b]) > 1e-3f;
  }
  EXPECT_GE(differ, c.B / 2);
}

// ---------------------------------------------------------------------------------------------
// Counts

TEST_F(Sampler, CountsFollowTheGeneratedTokens) {
  // Three requests over 12 steps, each step sampling the next token and counting it; the table then
  // equals a rebuild from (prompt, output), for the full and the greedy-only path.
  const int64_t V = 64;
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 2, 63}, {}, {5}};
  for (bool full : {true, false}) {
    SamplerCall c;
    c.B = 3, c.V = V, c.count_rows = 4;
    c.counts.assign(4 * V, 0);
    for (int b = 0; b < 3; ++b)
      for (int32_t id : prompts[b]) c.counts[(b + 1) * V + id] |= ops::kPromptBit;
    std::vector<std::vector<int32_t>> outputs(3);
    for (int step = 0; step < 12; ++step) {
      c.logits = random_logits(3 * V, 500 + step, 2.0f);
      c.rows.clear();
      for (int b = 0; b < 3; ++b) {
        ops::SamplingRow r = row(full ? 0.9f : 0.0f, 0, 1.0f, 0.0f, b + 1);
        r.counts_row = b == 1 ? -1 : b + 1;  // request 1 keeps no counts
        r.repetition_penalty = full ? 1.3f : 1.0f;
        r.position = step;
        c.rows.push_back(r);
      }
      const SamplerOutputs o = test::run_sampler(*be, c, full);
      for (int b = 0; b < 3; ++b) outputs[b].push_back(o.tokens[b]);
      c.counts = o.counts;
    }
    for (int b : {0, 2}) {
      TensorBuffer rebuilt = host_empty(Shape{V}, DType::i32);
      ops::reset_token_counts(*be, rebuilt, test::host_ints(prompts[b]), test::host_ints(outputs[b]));
      EXPECT_EQ(std::vector<int32_t>(c.counts.begin() + (b + 1) * V, c.counts.begin() + (b + 2) * V),
                std::vector<int32_t>(rebuilt.ptr<int32_t>(), rebuilt.ptr<int32_t>() + V));
    }
    for (int unused : {0, 2})  // no request's row, and the row of request 1 (counts_row -1)
      EXPECT_EQ(std::vector<int32_t>(c.counts.begin() + unused * V, c.counts.begin() + (unused + 1) * V),
                std::vector<int32_t>(V, 0));
  }
}

TEST_F(Sampler, ResetTokenCountsBuildsTheRow) {
  TensorBuffer r = host_empty(Shape{6}, DType::i32);
  for (int i = 0; i < 6; ++i) r.ptr<int32_t>()[i] = 99;
  ops::reset_token_counts(*be, r, test::host_ints({0, 3, 3, 7, -1}), test::host_ints({3, 5, 5, 5, 6}));
  EXPECT_EQ(std::vector<int32_t>(r.ptr<int32_t>(), r.ptr<int32_t>() + 6),
            (std::vector<int32_t>{ops::kPromptBit, 0, 0, ops::kPromptBit + 1, 0, 3}));
  ops::reset_token_counts(*be, r, Tensor{}, Tensor{});
  EXPECT_EQ(std::vector<int32_t>(r.ptr<int32_t>(), r.ptr<int32_t>() + 6), std::vector<int32_t>(6, 0));
}

}  // namespace
}  // namespace kiln::test
