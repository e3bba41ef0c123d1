// The CPU sampler tests' shared parts (test_sampler.cpp, test_sampler_logprobs.cpp): rows and
// calls, random logits and random batches of every parameter, the sort-based double reference of the
// sampling definition, exact-distribution checks by frequencies, and the CPU fixture.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <vector>

#include "kernels/rng.h"
#include "kernels/sampling_math.h"
#include "sampler_util.h"
#include "test_util.h"

namespace kiln::test {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int K = ops::kMaxTopLogprobs;
// Probabilities 0.3, 0.1, 0.4, 0.2 (not in order), and the draws that check a distribution.
inline const std::vector<float> kFour = {std::log(0.3f), std::log(0.1f), std::log(0.4f), std::log(0.2f)};
constexpr int kSteps = 40000;

inline ops::SamplingRow row(float temperature, int32_t top_k = 0, float top_p = 1.0f, float min_p = 0.0f, uint64_t seed = 1) {
  ops::SamplingRow r;
  r.temperature = temperature;
  r.top_k = top_k;
  r.top_p = top_p;
  r.min_p = min_p;
  ops::set_sampling_seed(r, seed);
  return r;
}

inline SamplerCall one_row(const std::vector<float>& logits, const ops::SamplingRow& r) {
  SamplerCall c;
  c.B = 1;
  c.V = static_cast<int64_t>(logits.size());
  c.logits = logits;
  c.rows = {r};
  return c;
}

// Random logits: N(0, scale^2), seeded.
inline std::vector<float> random_logits(int64_t n, uint64_t seed, float scale) {
  TensorBuffer t = test::random_host(Shape{n}, DType::f32, seed, scale);
  return std::vector<float>(t.ptr<float>(), t.ptr<float>() + n);
}

// ---------------------------------------------------------------------------------------------
// The reference: the documented definition, written directly (sorting everything, in double).

inline float ref_clean(float x) { return std::isnan(x) ? -kInf : x; }

inline float ref_penalised(float logit, int32_t count, const ops::SamplingRow& p) {
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

inline int32_t ref_first_max(const std::vector<float>& v) {
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

inline RefKept reference_kept(const std::vector<float>& z, const ops::SamplingRow& p, double m) {
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
inline std::vector<float> reference_values(const float* logits, const int32_t* counts, const ops::SamplingRow& p, int64_t V) {
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

inline RefDraw reference(const float* logits, const int32_t* counts, const ops::SamplingRow& p, int64_t V) {
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
inline std::vector<double> frequencies(Backend& be, const std::vector<float>& logits, ops::SamplingRow r, int steps) {
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
inline void expect_distribution(const std::vector<double>& got, std::vector<double> want, int steps) {
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

// Row b of c's token-count table drawn at random (seeded): about 10% of the tokens in the prompt,
// 15% generated 1 to 6 times.
inline void random_counts_row(SamplerCall& c, int64_t b, uint64_t seed) {
  for (int64_t i = 0; i < c.V; ++i) {
    const double h = rng::uniform(seed + 7, static_cast<uint64_t>(b * c.V + i));
    const int32_t out = h > 0.85 ? static_cast<int32_t>(1 + 40 * (h - 0.85)) : 0;
    c.counts[b * c.V + i] = (h < 0.1 ? ops::kPromptBit : 0) + out;
  }
}

// A batch of rows with every parameter drawn at random (seeded): greedy, temperature, top-k,
// top-p, min-p and penalties from a counts table, mixed.
inline SamplerCall random_call(int64_t B, int64_t V, uint64_t seed) {
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
      random_counts_row(c, b, seed);
    }
    ops::set_sampling_seed(r, 0x9e3779b97f4a7c15ull * (b + 1));
    r.position = static_cast<int32_t>(u(k + 14) * 100000);
    c.rows.push_back(r);
  }
  return c;
}

}  // namespace kiln::test
