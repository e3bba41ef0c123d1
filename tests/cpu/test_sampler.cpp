// The CPU twin of ops::sample (kernels/cpu/sampling.cpp) against references written here: a
// straightforward sort-based implementation of the same definition in double (the whole vocabulary
// sorted, exact exp, real-valued masses), exact distributions of small rows checked by the
// frequencies of many draws, hand-built top-k / top-p / min-p boundaries with ties, penalties,
// greedy ties and NaN (log-probabilities and the counts table: test_sampler_logprobs.cpp; the
// references and shared helpers: sampler_reference.h).
//
// Where the twin and the double reference can disagree: the twin's weights are floor(e^d * 2^40)
// from an f32 exponential (a few ulp) and weights below e^-27 are dropped, so a decision within
// ~1e-6 (relative) of its boundary may go either way. Random comparisons therefore allow a
// mismatch only where the reference's own margin to a boundary is below 1e-5, and at most a few.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "sampler_reference.h"

namespace kiln::test {
namespace {

// ---------------------------------------------------------------------------------------------
// Shared arithmetic

TEST(SamplerMath, ExpIsWithinFourUlpOfLibm) {
  for (int k = 0; k <= 200000; ++k) {
    const float d = -86.0f * static_cast<float>(k) / 200000.0f;
    const double want = std::exp(static_cast<double>(d));
    const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    ASSERT_LE(std::fabs(sampling::exp_nonpos(d) - want), 4 * ulp) << "d = " << d;
  }
  EXPECT_EQ(sampling::exp_nonpos(0.0f), 1.0f);
  EXPECT_EQ(sampling::exp_nonpos(-0.0f), 1.0f);
  EXPECT_EQ(sampling::exp_nonpos(-87.0f), 0.0f);
  EXPECT_EQ(sampling::exp_nonpos(-kInf), 0.0f);
  EXPECT_EQ(sampling::exp_nonpos(kNaN), 0.0f);
  EXPECT_EQ(sampling::weight(0.0f), sampling::kWeightOne);
  EXPECT_GT(sampling::weight(-27.0f), 0u);
  EXPECT_EQ(sampling::weight(std::nextafter(-27.0f, -kInf)), 0u);
}

TEST(SamplerMath, OrderKeysAndBucketsFollowTheValues) {
  std::vector<float> v = random_logits(4000, 3, 30.0f);
  v.insert(v.end(), {0.0f, -0.0f, kInf, -kInf, 1e-30f, -1e-30f, 3.0f, 3.0f});
  for (size_t a = 0; a < v.size(); a += 7)
    for (size_t b = 0; b < v.size(); ++b) {
      ASSERT_EQ(v[a] < v[b], sampling::order_key(v[a]) < sampling::order_key(v[b])) << v[a] << " " << v[b];
      ASSERT_EQ(v[a] == v[b], sampling::order_key(v[a]) == sampling::order_key(v[b]));
    }
  for (float x : v) EXPECT_EQ(sampling::key_value(sampling::order_key(x)), x == 0 ? 0.0f : x);
  std::vector<float> d(v.size());
  for (size_t i = 0; i < v.size(); ++i) d[i] = -std::fabs(v[i]);
  std::sort(d.begin(), d.end(), std::greater<float>());
  for (size_t i = 1; i < d.size(); ++i) {
    const int b = sampling::bucket(d[i]);
    EXPECT_LE(sampling::bucket(d[i - 1]), b);
    EXPECT_EQ(b == sampling::kZeroBucket, sampling::weight(d[i]) == 0);
    EXPECT_TRUE(b <= 216 || b == sampling::kZeroBucket);
  }
}

TEST(SamplerMath, Targets) {
  const uint64_t M = 3 * sampling::kWeightOne + 12345;
  EXPECT_EQ(sampling::top_p_target(0.0f, M), 1u);
  EXPECT_EQ(sampling::top_p_target(1.0f, M), M);
  EXPECT_EQ(sampling::top_p_target(0.5f, 10), 5u);
  EXPECT_EQ(sampling::top_p_target(0.51f, 10), 6u);
  EXPECT_EQ(sampling::min_p_floor(0.0f), 0u);
  EXPECT_EQ(sampling::min_p_floor(-1.0f), 0u);
  EXPECT_EQ(sampling::min_p_floor(1.0f), sampling::kWeightOne);
  EXPECT_EQ(sampling::min_p_floor(0.25f), sampling::kWeightOne / 4);
  EXPECT_EQ(sampling::draw_target(0.0, M), 0u);
  EXPECT_EQ(sampling::draw_target(std::nextafter(1.0, 0.0), M), M - 1);
  EXPECT_EQ(sampling::draw_target(0.5, 10), 5u);
}

// ---------------------------------------------------------------------------------------------
// Greedy

TEST_F(Sampler, GreedyIsTheFirstMaximumWithNanAsMinusInfinity) {
  for (bool full : {true, false}) {
    EXPECT_EQ(token({1, 3, 3, 2}, row(0.0f), full), 1);
    EXPECT_EQ(token({1, 3, 3, 2}, row(-1.0f), full), 1);
    EXPECT_EQ(token({-kInf, -5, -kInf}, row(0.0f), full), 1);
    EXPECT_EQ(token({kNaN, 1, kNaN, 0}, row(0.0f), full), 1);
    EXPECT_EQ(token({-kInf, -kInf, -kInf}, row(0.0f), full), 0);
    EXPECT_EQ(token({kNaN, kNaN}, row(0.0f), full), 0);
    EXPECT_EQ(token({kNaN, kInf, 2, kInf}, row(0.0f), full), 1);
    EXPECT_EQ(token({5}, row(0.0f), full), 0);
  }
  SamplerCall c;
  c.B = 7, c.V = 1001;
  c.logits = random_logits(c.B * c.V, 80, 1.0f);
  c.rows.assign(7, row(0.0f));
  for (bool full : {true, false}) {
    const SamplerOutputs o = test::run_sampler(*be, c, full);
    for (int64_t b = 0; b < c.B; ++b) {
      const std::vector<float> l(c.logits.begin() + b * c.V, c.logits.begin() + (b + 1) * c.V);
      EXPECT_EQ(o.tokens[b], ref_first_max(l));
    }
  }
}

TEST_F(Sampler, GreedyUsesThePenalisedLogits) {
  // token 0: in the prompt only; token 1: generated 3 times; token 2: fresh.
  SamplerCall c = one_row({2.0f, 1.9f, -0.5f, 1.0f}, row(0.0f));
  c.count_rows = 2;
  c.counts = {0, 0, 0, 0, ops::kPromptBit, 3, 0, 0};
  c.rows[0].counts_row = 1;
  auto greedy = [&](float rep, float freq, float pres) {
    c.rows[0].repetition_penalty = rep, c.rows[0].frequency_penalty = freq, c.rows[0].presence_penalty = pres;
    return test::run_sampler(*be, c).tokens[0];
  };
  EXPECT_EQ(greedy(1.0f, 0.0f, 0.0f), 0);
  EXPECT_EQ(greedy(1.1f, 0.0f, 0.0f), 0);  // 2.0 / 1.1 = 1.82 > 1.9 / 1.1 = 1.73 > 1.0
  EXPECT_EQ(greedy(1.0f, 0.2f, 0.0f), 0);  // 1.9 - 0.6
  EXPECT_EQ(greedy(1.0f, -0.1f, 0.0f), 1);  // 1.9 + 0.3 > 2.0: a negative frequency penalty rewards
  EXPECT_EQ(greedy(1.0f, 0.0f, -0.2f), 1);  // presence only for generated tokens: 2.1 > 2.0
  EXPECT_EQ(greedy(3.0f, 0.0f, 0.0f), 3);   // 0.67 and 0.63 < 1.0
  // The prompt bit is not a count: frequency and presence leave token 0 alone.
  c.logits = {2.0f, 0.0f, 0.0f, 1.99f};
  EXPECT_EQ(greedy(1.0f, 5.0f, 5.0f), 0);
  // Negative logits are multiplied: -0.5 * 4 = -2 < -1.
  c.logits = {-0.5f, -100.0f, -1.0f, -100.0f};
  c.counts = {0, 0, 0, 0, ops::kPromptBit, 0, 0, 0};
  EXPECT_EQ(greedy(4.0f, 0.0f, 0.0f), 2);
}

// ---------------------------------------------------------------------------------------------
// Exact distributions


TEST_F(Sampler, FrequenciesFollowTheTemperedDistribution) {
  expect_distribution(frequencies(*be, kFour, row(1.0f), kSteps), {0.3, 0.1, 0.4, 0.2}, kSteps);
  expect_distribution(frequencies(*be, kFour, row(2.0f, 0, 1.0f, 0.0f, 9), kSteps),
                      {std::sqrt(0.3), std::sqrt(0.1), std::sqrt(0.4), std::sqrt(0.2)}, kSteps);
  expect_distribution(frequencies(*be, kFour, row(0.5f, 0, 1.0f, 0.0f, 10), kSteps), {0.09, 0.01, 0.16, 0.04},
                      kSteps);
}

TEST_F(Sampler, TopKTopPMinPCutTheOrder) {
  // top_k = 2 keeps 0.4 and 0.3.
  expect_distribution(frequencies(*be, kFour, row(1.0f, 2), kSteps), {0.3, 0, 0.4, 0}, kSteps);
  // top_p = 0.65: 0.4 < 0.65 <= 0.7.
  expect_distribution(frequencies(*be, kFour, row(1.0f, 0, 0.65f), kSteps), {0.3, 0, 0.4, 0}, kSteps);
  // top_p = 0.75: 0.7 < 0.75 <= 0.9.
  expect_distribution(frequencies(*be, kFour, row(1.0f, 0, 0.75f), kSteps), {0.3, 0, 0.4, 0.2}, kSteps);
  // top_k = 3, then top_p = 0.72 of the top-k mass 0.9: 0.7 / 0.9 = 0.78 >= 0.72 keeps two.
  expect_distribution(frequencies(*be, kFour, row(1.0f, 3, 0.72f), kSteps), {0.3, 0, 0.4, 0}, kSteps);
  // min_p = 0.4: p >= 0.16 keeps 0.4, 0.3, 0.2.
  expect_distribution(frequencies(*be, kFour, row(1.0f, 0, 1.0f, 0.4f), kSteps), {0.3, 0, 0.4, 0.2}, kSteps);
  // min_p = 0.8 keeps only the largest; tiny top_p too; top_k = 1 too.
  for (const ops::SamplingRow& r : {row(1.0f, 0, 1.0f, 0.8f), row(1.0f, 0, 1e-6f), row(1.0f, 1), row(1.0f, 0, 0.0f)})
    expect_distribution(frequencies(*be, kFour, r, 2000), {0, 0, 1, 0}, 2000);
  // min_p > 1 keeps nothing: the head of the order.
  EXPECT_EQ(token(kFour, row(1.0f, 0, 1.0f, 1.5f)), 2);
}

TEST_F(Sampler, CutsTakeTiesInIndexOrder) {
  // Values 1, 2, 2, 2, 0: top_k = 2 keeps indices 1 and 2 (value 2 ties: lower index first).
  const std::vector<float> ties = {1, 2, 2, 2, 0};
  expect_distribution(frequencies(*be, ties, row(1.0f, 2), kSteps), {0, 1, 1, 0, 0}, kSteps);
  expect_distribution(frequencies(*be, ties, row(1.0f, 4), kSteps), {std::exp(-1.0), 1, 1, 1, 0}, kSteps);
  // Probabilities 0.4, 0.2, 0.2, 0.2: top_p = 0.7 needs 0.4 + 0.2 + 0.2 (0.6 < 0.7).
  const std::vector<float> four = {std::log(0.4f), std::log(0.2f), std::log(0.2f), std::log(0.2f)};
  expect_distribution(frequencies(*be, four, row(1.0f, 0, 0.7f), kSteps), {0.4, 0.2, 0.2, 0}, kSteps);
  // 0.5 and five ties of 0.1: top_p = 0.75 needs three of the ties (0.7 < 0.75 <= 0.8).
  const float t = std::log(0.1f);
  const std::vector<float> six = {t, t, std::log(0.5f), t, t, t};
  expect_distribution(frequencies(*be, six, row(1.0f, 0, 0.75f), kSteps), {0.1, 0.1, 0.5, 0.1, 0, 0}, kSteps);
  // The same with top_k = 4 first (mass 0.8): 0.7 * 0.8 = 0.56 needs one tie (0.5 < 0.56 <= 0.6).
  expect_distribution(frequencies(*be, six, row(1.0f, 4, 0.7f), kSteps), {0.1, 0, 0.5, 0, 0, 0}, kSteps);
}

TEST_F(Sampler, ACutEndingItsBucketKeepsNothingBelow) {
  // Buckets (max 0.3): 0.3 -> 0; -0.7 and b2 -> 8; c and -0.9 -> 9, where c is just below the
  // boundary of buckets 8 and 9 and b2 just above it, close enough that the key digit selecting b2
  // also spans c. top_k = 4 puts bucket 9 in the candidate list; top_p = 0.75 of the top-4 mass
  // ends exactly at b2, the end of bucket 8: c must not be kept.
  const float b2 = -0.824982047f, c = -0.824999928f;
  ASSERT_EQ(sampling::bucket(sampling::fsub(b2, 0.3f)), 8);
  ASSERT_EQ(sampling::bucket(sampling::fsub(c, 0.3f)), 9);
  const std::vector<float> l = {0.3f, -0.7f, b2, c, -0.9f};
  expect_distribution(frequencies(*be, l, row(1.0f, 4, 0.75f), kSteps),
                      {1, std::exp(-1.0), std::exp(double(b2) - 0.3), 0, 0}, kSteps);
}

TEST_F(Sampler, EqualLogitsDrawFloorOfVTimesU) {
  // Equal weights 2^40: R = floor(u * 4 * 2^40), the token is floor(R / 2^40) = floor(4u) exactly.
  for (int32_t pos = 0; pos < 300; ++pos) {
    ops::SamplingRow r = row(1.0f, 0, 1.0f, 0.0f, 11);
    r.position = pos;
    EXPECT_EQ(token({0.5f, 0.5f, 0.5f, 0.5f}, r), static_cast<int32_t>(4 * ops::sampling_uniform(11, pos)));
  }
}

TEST_F(Sampler, MaskedNanAndInfiniteLogits) {
  expect_distribution(frequencies(*be, {-kInf, 0.0f, kNaN, 0.0f}, row(1.0f), 4000), {0, 1, 0, 1}, 4000);
  EXPECT_EQ(token({1.0f, kInf, 3.0f, kInf}, row(0.7f, 2, 0.5f)), 1);  // no finite distribution: the head
  EXPECT_EQ(token({-kInf, -kInf, -kInf}, row(1.0f)), 0);
  EXPECT_EQ(token({kNaN, kNaN}, row(1.0f)), 0);
  // A temperature so small that finite logits overflow to +-inf: the greedy token, the limit of
  // sampling as the temperature goes to 0 (it was the first index that overflowed: token 0 in the
  // first and third rows).
  for (float t : {1e-45f, 1e-40f}) {
    EXPECT_EQ(token({1.0f, 3.0f, 2.0f, 3.0f}, row(t)), 1) << t;
    EXPECT_EQ(token({1.0f, 3.0f, 2.0f, 3.0f}, row(t, 2, 0.5f, 0.1f)), 1) << t;
    EXPECT_EQ(token({-3.0f, -1.0f, -2.0f}, row(t)), 1) << t;
    EXPECT_EQ(token({-kInf, -1.0f, kNaN, -0.5f}, row(t)), 3) << t;
  }
  for (int32_t pos = 0; pos < 20; ++pos) {
    ops::SamplingRow r = row(1.3f, 3, 0.9f, 0.1f);
    r.position = pos;
    EXPECT_EQ(token({0.25f}, r), 0);
  }
}

// ops::adjust_logits on the CPU, against values worked out here: the mask first (a masked token
// stays -inf whatever its bias), then each bias added to its token's logit; ids outside the
// vocabulary are skipped.
TEST_F(Sampler, AdjustLogitsMasksThenBiases) {
  TensorBuffer logits = host_empty(Shape{2, 4}, DType::f32);
  const float l[8] = {1, 2, 3, 4, 1, 2, 3, 4};
  std::memcpy(logits.ptr<float>(), l, sizeof(l));
  TensorBuffer words = host_empty(Shape{1 + 2 * 4 + 2}, DType::i32);
  int32_t* w = words.ptr<int32_t>();
  w[0] = 0b1101;  // tokens 0, 2, 3 allowed
  const std::pair<int32_t, float> bias[4] = {{1, 10.0f}, {2, -1.5f}, {3, 0.5f}, {7, 1.0f}};
  for (int k = 0; k < 4; ++k) {
    w[1 + 2 * k] = bias[k].first;
    std::memcpy(&w[2 + 2 * k], &bias[k].second, 4);
  }
  w[9] = 0;
  const float second = -3.0f;
  std::memcpy(&w[10], &second, 4);
  std::vector<ops::SamplingRow> rows(2);
  rows[0].mask_offset = 0, rows[0].bias_offset = 1, rows[0].bias_count = 4;
  rows[1].bias_offset = 9, rows[1].bias_count = 1;
  TensorBuffer params = host_empty(Shape{2, ops::kSamplingRowWords}, DType::i32);
  std::memcpy(params.ptr<int32_t>(), rows.data(), rows.size() * sizeof(ops::SamplingRow));
  ops::adjust_logits(*be, logits, params, words);
  const std::vector<float> got(logits.ptr<float>(), logits.ptr<float>() + 8);
  EXPECT_EQ(got, (std::vector<float>{1, -kInf, 1.5f, 4.5f, -2, 2, 3, 4}));
}

// ---------------------------------------------------------------------------------------------
// Random rows against the reference

void expect_matches_reference(Backend& be, const SamplerCall& c, int max_mismatches) {
  const SamplerOutputs o = test::run_sampler(be, c);
  int mismatches = 0;
  for (int64_t b = 0; b < c.B; ++b) {
    const ops::SamplingRow& p = c.rows[b];
    const int32_t* counts = p.counts_row >= 0 ? c.counts.data() + p.counts_row * c.V : nullptr;
    const RefDraw ref = reference(c.logits.data() + b * c.V, counts, p, c.V);
    if (o.tokens[b] == ref.token) continue;
    ++mismatches;
    EXPECT_LT(ref.margin, 1e-5) << "row " << b << ": token " << o.tokens[b] << ", reference " << ref.token
                                << " (T " << p.temperature << " k " << p.top_k << " p " << p.top_p << " min_p "
                                << p.min_p << ")";
  }
  EXPECT_LE(mismatches, max_mismatches) << "of " << c.B << " rows";
}

TEST_F(Sampler, MatchesTheSortingReferenceOnRandomRows) {
  expect_matches_reference(*be, random_call(1500, 37, 1), 3);
  expect_matches_reference(*be, random_call(600, 1000, 2), 3);
  expect_matches_reference(*be, random_call(60, 20000, 3), 2);
  expect_matches_reference(*be, random_call(6, 151936, 4), 1);
}

TEST_F(Sampler, RowsAreIndependentAndDeterministic) {
  const SamplerCall c = random_call(40, 500, 5);
  const SamplerOutputs all = test::run_sampler(*be, c);
  EXPECT_EQ(test::run_sampler(*be, c).tokens, all.tokens);
  // Reversed batch order: the same token per row.
  SamplerCall rev = c;
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t s = c.B - 1 - b;
    std::copy(c.logits.begin() + s * c.V, c.logits.begin() + (s + 1) * c.V, rev.logits.begin() + b * c.V);
    rev.rows[b] = c.rows[s];
  }
  const SamplerOutputs r = test::run_sampler(*be, rev);
  for (int64_t b = 0; b < c.B; ++b) EXPECT_EQ(r.tokens[c.B - 1 - b], all.tokens[b]);
  // The draw moves with the position and the seed.
  std::vector<float> flat(50, 0.0f);
  std::vector<int32_t> seen;
  for (int32_t pos = 0; pos < 100; ++pos) {
    ops::SamplingRow p = row(1.0f);
    p.position = pos;
    seen.push_back(token(flat, p));
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_GT(std::unique(seen.begin(), seen.end()) - seen.begin(), 30);
}

}  // namespace
}  // namespace kiln::test
