// The CPU twin of ops::sample (kernels/cpu/sampling.cpp) against references written here: a
// straightforward sort-based implementation of the same definition in double (the whole vocabulary
// sorted, exact exp, real-valued masses), exact distributions of small rows checked by the
// frequencies of many draws, hand-built top-k / top-p / min-p boundaries with ties, penalties,
// greedy ties and NaN, log-probabilities against a double log-softmax, and the counts table.
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

#include "kernels/rng.h"
#include "kernels/sampling_math.h"
#include "sampler_util.h"
#include "test_util.h"

namespace kiln {
namespace {

using test::SamplerCall;
using test::SamplerOutputs;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int K = ops::kMaxTopLogprobs;

ops::SamplingRow row(float temperature, int32_t top_k = 0, float top_p = 1.0f, float min_p = 0.0f, uint64_t seed = 1) {
  ops::SamplingRow r;
  r.temperature = temperature;
  r.top_k = top_k;
  r.top_p = top_p;
  r.min_p = min_p;
  ops::set_sampling_seed(r, seed);
  return r;
}

SamplerCall one_row(const std::vector<float>& logits, const ops::SamplingRow& r) {
  SamplerCall c;
  c.B = 1;
  c.V = static_cast<int64_t>(logits.size());
  c.logits = logits;
  c.rows = {r};
  return c;
}

// Random logits: N(0, scale^2), seeded.
std::vector<float> random_logits(int64_t n, uint64_t seed, float scale) {
  TensorBuffer t = test::random_host(Shape{n}, DType::f32, seed, scale);
  return std::vector<float>(t.ptr<float>(), t.ptr<float>() + n);
}

// ---------------------------------------------------------------------------------------------
// The reference: the documented definition, written directly (sorting everything, in double).

float ref_clean(float x) { return std::isnan(x) ? -kInf : x; }

float ref_penalised(float logit, int32_t count, const ops::SamplingRow& p) {
  float x = ref_clean(logit);
  if (count != 0) x = x > 0 ? x / p.repetition_penalty : x * p.repetition_penalty;
  const int32_t out = count & (ops::kPromptBit - 1);
  if (out > 0) {
    const float f = p.frequency_penalty * static_cast<float>(out);
    x = x - f;
    x = x - p.presence_penalty;
  }
  return ref_clean(x);
}

int32_t ref_first_max(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());  // first of the maxima
}

// The kept set of a sampled row (temperature > 0) with a finite maximum, by the definition: z = the
// penalised logits over the temperature (f32 operations, as the op defines them), the whole order
// sorted (z descending, ties by lower index), relative probabilities e^(z - max z) in double, top-k,
// top-p of the top-k mass, min-p relative to the maximum.
struct RefKept {
  std::vector<double> prob;   // [V] e^(z_i - max z), before any cut
  std::vector<int32_t> kept;  // ascending index; empty when min-p keeps nothing
  double margin = kInf;       // the smallest relative distance of a top-p or min-p decision to its boundary
};

RefKept reference_kept(const std::vector<float>& z, const ops::SamplingRow& p, double m) {
  const int64_t V = static_cast<int64_t>(z.size());
  RefKept k;
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
  k.prob.resize(V);
  for (int64_t i = 0; i < V; ++i) k.prob[i] = std::exp(static_cast<double>(z[i]) - m);
  const std::vector<double>& prob = k.prob;
  size_t n = static_cast<size_t>(V);
  if (p.top_k > 0) n = std::min(n, static_cast<size_t>(p.top_k));
  if (p.top_p < 1.0f) {
    double mass = 0;
    for (size_t r = 0; r < n; ++r) mass += prob[order[r]];
    const double target = static_cast<double>(p.top_p) * mass;
    double run = 0;
    size_t q = 0;
    while (q < n) {
      run += prob[order[q++]];
      if (run >= target) break;
    }
    k.margin = std::min({k.margin, (run - target) / mass, (target - (run - prob[order[q - 1]])) / mass});
    n = q;
  }
  for (size_t r = 0; r < n; ++r) {
    const int32_t i = order[r];
    if (p.min_p > 0) k.margin = std::min(k.margin, std::fabs(prob[i] - p.min_p));
    if (prob[i] >= p.min_p) k.kept.push_back(i);
  }
  std::sort(k.kept.begin(), k.kept.end());
  return k;
}

// z of a row: the penalised logits, over the temperature when it is positive.
std::vector<float> reference_values(const float* logits, const int32_t* counts, const ops::SamplingRow& p, int64_t V) {
  std::vector<float> z(V);
  for (int64_t i = 0; i < V; ++i) {
    const float x = counts ? ref_penalised(logits[i], counts[i], p) : ref_clean(logits[i]);
    z[i] = p.temperature > 0 ? ref_clean(x / p.temperature) : x;
  }
  return z;
}

struct RefDraw {
  int32_t token;
  double margin;  // the smallest relative distance of a decision to its boundary
};

RefDraw reference(const float* logits, const int32_t* counts, const ops::SamplingRow& p, int64_t V) {
  const std::vector<float> z = reference_values(logits, counts, p, V);
  const int32_t first = ref_first_max(z);
  if (!(p.temperature > 0)) return {first, kInf};
  const double m = z[first];
  if (!std::isfinite(m)) return {first, kInf};
  const RefKept k = reference_kept(z, p, m);
  if (k.kept.empty()) return {first, k.margin};
  double total = 0;
  for (int32_t i : k.kept) total += k.prob[i];
  const double u = ops::sampling_uniform(ops::sampling_seed(p), static_cast<uint64_t>(p.position));
  double run = 0;
  for (int32_t i : k.kept) {
    const double q = k.prob[i] / total;
    run += q;
    if (run > u) return {i, std::min({k.margin, run - u, u - (run - q)})};
  }
  return {k.kept.back(), 0.0};
}

// Frequencies of the tokens of `steps` draws of one row at positions 0 .. steps-1.
std::vector<double> frequencies(Backend& be, const std::vector<float>& logits, ops::SamplingRow r, int steps) {
  SamplerCall c;
  c.B = steps;
  c.V = static_cast<int64_t>(logits.size());
  c.logprob_outputs = false;
  for (int s = 0; s < steps; ++s) {
    c.logits.insert(c.logits.end(), logits.begin(), logits.end());
    r.position = s;
    c.rows.push_back(r);
  }
  const SamplerOutputs o = test::run_sampler(be, c);
  std::vector<double> f(logits.size(), 0.0);
  for (int32_t t : o.tokens) {
    EXPECT_TRUE(t >= 0 && t < c.V);
    f[t] += 1.0 / steps;
  }
  return f;
}

// Each frequency within 4.5 standard deviations of the exact probability (0 exactly for 0).
void expect_distribution(const std::vector<double>& got, std::vector<double> want, int steps) {
  double s = 0;
  for (double w : want) s += w;
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const double p = want[i] / s;
    if (p == 0) {
      EXPECT_EQ(got[i], 0.0) << "token " << i;
    } else {
      EXPECT_NEAR(got[i], p, 4.5 * std::sqrt(p * (1 - p) / steps) + 1e-9) << "token " << i;
    }
  }
}

class Sampler : public ::testing::Test {
 protected:
  int32_t token(const std::vector<float>& logits, const ops::SamplingRow& r, bool full = true) {
    return test::run_sampler(*be, one_row(logits, r), full).tokens[0];
  }
  std::unique_ptr<Backend> be = make_cpu_backend();
};

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

// Probabilities 0.3, 0.1, 0.4, 0.2 (not in order).
const std::vector<float> kFour = {std::log(0.3f), std::log(0.1f), std::log(0.4f), std::log(0.2f)};
constexpr int kSteps = 40000;

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
  for (int32_t pos = 0; pos < 20; ++pos) {
    ops::SamplingRow r = row(1.3f, 3, 0.9f, 0.1f);
    r.position = pos;
    EXPECT_EQ(token({0.25f}, r), 0);
  }
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

// A batch of rows with every parameter drawn at random (seeded): greedy, temperature, top-k,
// top-p, min-p and penalties from a counts table, mixed.
SamplerCall random_call(int64_t B, int64_t V, uint64_t seed) {
  SamplerCall c;
  c.B = B, c.V = V;
  c.count_rows = B;
  c.counts.assign(B * V, 0);
  auto u = [&](uint64_t k) { return rng::uniform(seed, k); };
  for (int64_t b = 0; b < B; ++b) {
    const uint64_t k = 100 * static_cast<uint64_t>(b);
    const float scale = static_cast<float>(0.5 + 6 * u(k));
    std::vector<float> l = random_logits(V, seed * 1000 + b, scale);
    if (u(k + 1) < 0.2)  // ties: values on a coarse grid
      for (float& x : l) x = std::round(x);
    c.logits.insert(c.logits.end(), l.begin(), l.end());
    ops::SamplingRow r = row(u(k + 2) < 0.1 ? 0.0f : static_cast<float>(0.2 + 1.8 * u(k + 3)));
    if (u(k + 4) < 0.5) r.top_k = 1 + static_cast<int32_t>(u(k + 5) * std::min<int64_t>(V, 200));
    if (u(k + 6) < 0.5) r.top_p = static_cast<float>(0.05 + 0.95 * u(k + 7));
    if (u(k + 8) < 0.3) r.min_p = static_cast<float>(0.3 * u(k + 9));
    if (u(k + 10) < 0.4) {
      r.counts_row = static_cast<int32_t>(b);
      r.repetition_penalty = static_cast<float>(0.8 + 0.7 * u(k + 11));
      r.frequency_penalty = static_cast<float>(u(k + 12) - 0.3);
      r.presence_penalty = static_cast<float>(u(k + 13) - 0.3);
      for (int64_t i = 0; i < V; ++i) {
        const double h = rng::uniform(seed + 7, static_cast<uint64_t>(b * V + i));
        const int32_t out = h > 0.85 ? static_cast<int32_t>(1 + 40 * (h - 0.85)) : 0;
        c.counts[b * V + i] = (h < 0.1 ? ops::kPromptBit : 0) + out;
      }
    }
    ops::set_sampling_seed(r, 0x9e3779b97f4a7c15ull * (b + 1));
    r.position = static_cast<int32_t>(u(k + 14) * 100000);
    c.rows.push_back(r);
  }
  return c;
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
        for (int64_t i = 0; i < V; ++i) {
          const double h = rng::uniform(seed + 7, static_cast<uint64_t>(b * V + i));
          const int32_t out = h > 0.85 ? static_cast<int32_t>(1 + 40 * (h - 0.85)) : 0;
          c.counts[b * V + i] = (h < 0.1 ? ops::kPromptBit : 0) + out;
        }
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
}  // namespace kiln
