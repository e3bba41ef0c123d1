// Token sampling, one row of logits at a time. logits: [B, V] (f32; bf16/f16 read as f32),
// tokens: [B] i32, params: B entries. The CUDA twin mirrors this algorithm exactly:
//
//   0. NaN logits are treated as -inf.
//   1. Greedy: temperature <= 0 -> the index of the largest logit, lowest index on ties.
//      (Also used when the largest logit is +inf or every logit is -inf: no finite distribution.)
//   2. Order: token indices sorted by descending logit, ties by ascending index. Since
//      logit / temperature is monotone, this is the descending-probability order (ties: lower
//      index first). Probabilities, all in double:
//         z_i = (double)logit_i / (double)temperature,  m = max_i z_i,
//         p_i = exp(z_i - m) / sum_j exp(z_j - m).
//   3. Top-k: if top_k > 0, keep the first min(top_k, V) tokens of the order.
//   4. Top-p: if top_p < 1, renormalise the kept probabilities to q = p / sum(kept p) and keep,
//      scanning the order, every token whose cumulative q mass BEFORE it is < top_p (so the
//      first token is always kept): the smallest prefix whose mass reaches top_p.
//   5. Draw: r = the kept probabilities renormalised to sum 1; u = ops::sampling_uniform(seed,
//      step) in [0, 1); the result is the first kept token (in order) whose cumulative r mass is
//      > u. If rounding leaves u >= the total, the result is the last kept token whose r is > 0.
//
// Cumulative sums run in double, in the order of step 2.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_ops.h"

namespace kiln::cpu {
namespace {

int32_t argmax(const std::vector<float>& x) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(x.size()); ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

int32_t sample_row(std::vector<float>& logits, const ops::SamplingParams& p) {
  for (float& v : logits)
    if (std::isnan(v)) v = -INFINITY;
  const int32_t best = argmax(logits);
  if (p.temperature <= 0.0f || std::isinf(logits[best])) return best;

  const int64_t V = static_cast<int64_t>(logits.size());
  // Step 2: descending logit, ties by ascending index.
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  int64_t kept = V;
  if (p.top_k > 0 && p.top_k < V) {
    kept = p.top_k;
    std::partial_sort(order.begin(), order.begin() + kept, order.end(), before);
  } else {
    std::sort(order.begin(), order.end(), before);
  }

  const double temperature = static_cast<double>(p.temperature);
  const double m = static_cast<double>(logits[best]) / temperature;
  double total = 0.0;
  for (int64_t i = 0; i < V; ++i) total += std::exp(static_cast<double>(logits[i]) / temperature - m);
  // Probabilities of the kept prefix, in order (step 3 already applied through `kept`).
  std::vector<double> prob(static_cast<size_t>(kept));
  for (int64_t r = 0; r < kept; ++r) prob[r] = std::exp(static_cast<double>(logits[order[r]]) / temperature - m) / total;

  // Step 4: nucleus cut over the renormalised kept mass.
  if (p.top_p < 1.0f) {
    double kept_mass = 0.0;
    for (int64_t r = 0; r < kept; ++r) kept_mass += prob[r];
    const double top_p = static_cast<double>(p.top_p);
    double cum = 0.0;
    int64_t n = 0;
    while (n < kept && (n == 0 || cum < top_p)) {
      cum += prob[n] / kept_mass;
      ++n;
    }
    kept = n;
  }

  // Step 5: draw.
  double mass = 0.0;
  for (int64_t r = 0; r < kept; ++r) mass += prob[r];
  const double u = ops::sampling_uniform(p.seed, p.step);
  double cum = 0.0;
  int64_t last_positive = 0;
  for (int64_t r = 0; r < kept; ++r) {
    const double q = prob[r] / mass;
    if (q > 0.0) last_positive = r;
    cum += q;
    if (cum > u) return order[r];
  }
  return order[last_positive];
}

}  // namespace

void sample(Tensor tokens, Tensor logits, const std::vector<ops::SamplingParams>& params) {
  detail::check_float(logits);
  detail::check_i32(tokens);
  KILN_ASSERT(logits.ndim() == 2 && tokens.ndim() == 1);
  const int64_t B = logits.size(0), V = logits.size(1);
  KILN_ASSERT(tokens.size(0) == B && static_cast<int64_t>(params.size()) == B && V > 0);
  KILN_ASSERT(V <= INT32_MAX);

  std::vector<float> row(static_cast<size_t>(V));
  for (int64_t b = 0; b < B; ++b) {
    detail::load_f32(logits, b * V, V, row.data());
    tokens.ptr<int32_t>()[b] = sample_row(row, params[b]);
  }
}

}  // namespace kiln::cpu
