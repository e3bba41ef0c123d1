// Token sampling (ops::sample in kernels/sampling.h), the f32 reference. The CUDA twin
// (kernels/cuda/sampling.cu) takes the same steps with the same arithmetic (kernels/sampling_math.h:
// single IEEE f32 operations and exact integer masses), so the two give the same tokens bit for bit;
// it only spreads the work over the threads of a block, which cannot change a result: every sum is
// an exact integer and every choice is defined by the order below, never by a visiting order.
// This file is compiled with -ffp-contract=off (src/CMakeLists.txt) so that no f32 operation fuses.
//
// The algorithm, for row b with parameters P = params[b] and V logits:
//
//  1. Values. x_i = logit_i (NaN as -inf), penalised when P.counts_row >= 0 and counts are given
//     (sampling::penalise: repetition for tokens of the prompt or the output, then frequency and
//     presence for tokens of the output). Greedy rows (temperature <= 0 or NaN): the token is the
//     first index of the largest x_i; go to 10. Otherwise z_i = x_i / temperature (NaN as -inf).
//  2. Order: z descending, ties by ascending index; key_i = order_key(z_i) (a > b <=> key a > key b).
//     m = max z and `first` = the first index with z == m (the head of the order). If m is +-inf
//     there is no finite distribution (infinite or masked logits, or a temperature so small that
//     finite values overflowed): the token is the greedy one, the first index of the largest x_i
//     (the limit of sampling as the temperature goes to 0); go to 10.
//  3. Weights: d_i = z_i - m (f32), w_i = weight(d_i) = floor(exp_nonpos(d_i) * 2^40), 0 when
//     d_i < -27 (relative probability below 2e-12); w_first = 2^40. Masses are uint64 sums of weights
//     (exact, so independent of the summation order). Only positive weights can be drawn.
//  4. Buckets: bucket_i = floor(-8 d_i), in 0 .. 216 when w_i > 0, else 255. Monotone along the
//     order, so a bucket is a run of it. count[], mass[]: histograms of buckets 0 .. 254 over the
//     row; n_pos = their total count, W = their total mass.
//  5. Cuts, each keeping a prefix of the order:
//     top-k, effective when 0 < top_k < n_pos (otherwise it keeps every positive weight anyway):
//       the first top_k. Its bucket bk: the first bucket where the running count reaches top_k.
//     top-p, on when top_p < 1: T = top_p_target(top_p, Wk) = max(1, ceil(top_p * Wk)) (double
//       product), Wk = the mass of the top-k prefix (W without top-k); the shortest prefix whose mass
//       reaches T. It lies inside the top-k prefix (whose mass Wk >= T). Its bucket bp: the first
//       bucket where the running mass reaches T.
//     The kept prefix is the top-p one when top-p is on, else the top-k one, else all of 0 .. 254.
//  6. Candidates: the list of (key_i, i) with bucket_i <= bc, in index order, where bc = bk with
//     top-k, else bp with top-p, else 254: every element of the kept prefix and of the cut's bucket.
//     (Without a cut the CUDA twin skips the list and draws from the row: the same kept elements
//     in the same order.)
//  7. Selection of a cut inside its bucket b, for `need` relative to the bucket (top-k: the rank
//     top_k - count before b; top-p: the mass T - mass before b): lo, hi = the least and greatest
//     key in b. If lo == hi, K = lo. Otherwise the bits of the key below the common prefix of lo and
//     hi are chosen 8 at a time from the highest differing bit down: per digit, a histogram
//     (count, mass) over the entries of b that match the digits chosen so far; the chosen digit is
//     the first, from the highest down, where the running count (top-k) or mass (top-p) reaches
//     need, and need drops by what the digits above it hold. When the chosen digit's bin is kept
//     whole (need equals its count or mass, or it holds one entry), the cut is "every key >=
//     max(the bin's lowest key, lo)" and selection stops. Otherwise, once every bit is chosen, K is
//     exact, with n_eq entries of key K of equal weight w_K; t = need (top-k) or ceil(need / w_K)
//     (top-p) of them are kept: the t of lowest index. The cut (K, t) keeps key > K, and key == K
//     among the first t such entries in index order (all when t == n_eq). The mass it keeps in b is
//     what the digits above held plus t w_K (or the whole bin): with the mass before b, Wk of step 5.
//  8. Min-p: a kept element also needs w >= min_p_floor(min_p) = ceil(min_p * 2^40) (0 if min_p <= 0).
//  9. Draw: M = the mass of the kept elements; M == 0 (only when min_p > 1): the token is `first`.
//     Otherwise u = rng::uniform(seed_lo | seed_hi << 32, position), R = draw_target(u, M) =
//     min(floor(u * M), M - 1) (double product), and the token is the first kept element, in index
//     order, at which the running kept mass (index order) exceeds R: token v has probability w_v / M
//     (up to the 2^-53 granularity of u). The draw reports (w_token, M) for the behaviour log-prob;
//     every other exit (greedy, m = +-inf, M == 0) reports a point mass.
// 10. tokens[b] = the token; when P.counts_row >= 0 and counts are given, counts[counts_row][token] += 1.
//
// Log-probabilities (rows with logprobs != 0 or top_logprobs > 0) of the raw logits l (NaN as -inf):
// mx = max l; S = the sum of exp_nonpos(l_i - mx) (f32 terms) accumulated in double; lse = mx + log S;
// log p(v) = (double) l_v - lse rounded to f32 (when mx is not finite: 0 where l_v == mx, else -inf).
// Top-N: the first N = min(top_logprobs, kMaxTopLogprobs) elements of the order of l (descending, ties
// by lower index); slots past V get id -1 and log-prob -inf. The sum order differs on CUDA (a tree
// of doubles), so log-probabilities agree to f32 rounding, not bit for bit.
// Behaviour log-probability (P.logprobs == kLogprobsSampled), instead of the raw one for the chosen
// token: sampling::drawn_logprob(w_token, M) = (float)(log (double) w_token - log (double) M) with
// the kept weight of the token and the kept mass of step 9, 0 for a point mass (greedy, m = +-inf,
// M == 0). Both twins take it from the same integers with one double log each, so they differ at
// most by the rounding of log (an ulp of a double), nearly always not at all in f32. The top-N stay
// raw.
//
// `full` false (the host's promise that every row is greedy without penalties): the token is the
// first index of the largest raw logit (NaN as -inf), then step 10.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/sampling_math.h"

namespace kiln::cpu {
namespace {

namespace sm = kiln::sampling;

constexpr uint32_t kAllTies = 0xffffffffu;

// A cut of the order: keeps key > key, and key == key among the first `ties` entries of that key in
// index order (kAllTies: all of them).
struct Cut {
  uint32_t key = 0;
  uint32_t ties = kAllTies;
  uint64_t mass = 0;  // mass kept inside the bucket the cut was selected in
};

struct Candidates {
  std::vector<uint32_t> keys;
  std::vector<int32_t> index;
};

// The first bin, in scan order (ascending bins, or descending), where the running count or mass
// reaches need (1 <= need <= total), and what the bins before it hold.
struct Pick {
  int bin = -1;
  uint64_t count_before = 0, mass_before = 0;
};
Pick pick(const uint64_t* count, const uint64_t* mass, bool ascending, bool by_mass, uint64_t need) {
  Pick p;
  for (int o = 0; o < sm::kBins; ++o) {
    const int b = ascending ? o : sm::kBins - 1 - o;
    if ((by_mass ? p.mass_before + mass[b] : p.count_before + count[b]) >= need) {
      p.bin = b;
      return p;
    }
    p.count_before += count[b];
    p.mass_before += mass[b];
  }
  KILN_ASSERT(false && "need exceeds the histogram");
  return p;
}

// Step 7: the cut inside bucket b of the candidates. bucket_count: the entries of b.
Cut select_in_bucket(const Candidates& c, float m, int b, bool by_mass, uint64_t need, uint64_t bucket_count) {
  auto in_bucket = [&](uint32_t key) { return sm::bucket(sm::fsub(sm::key_value(key), m)) == b; };
  auto weight_of = [&](uint32_t key) { return sm::weight(sm::fsub(sm::key_value(key), m)); };
  uint32_t lo = 0xffffffffu, hi = 0;
  for (uint32_t key : c.keys)
    if (in_bucket(key)) lo = std::min(lo, key), hi = std::max(hi, key);

  uint64_t prefix = lo;  // the key bits chosen so far (all of them when lo == hi)
  uint64_t n_eq = bucket_count, mass_above = 0;
  if (lo != hi) {
    int low = 32 - std::countl_zero(lo ^ hi);  // bits below `low` are still open
    prefix = static_cast<uint64_t>(hi) >> low;
    while (low > 0) {
      const int width = std::min(low, 8), shift = low - width;
      uint64_t count[sm::kBins] = {}, mass[sm::kBins] = {};
      for (uint32_t key : c.keys) {
        if (!in_bucket(key) || (static_cast<uint64_t>(key) >> low) != prefix) continue;
        const uint32_t digit = (key >> shift) & ((1u << width) - 1);
        count[digit] += 1;
        mass[digit] += weight_of(key);
      }
      const Pick p = pick(count, mass, false, by_mass, need);
      need -= by_mass ? p.mass_before : p.count_before;
      mass_above += p.mass_before;
      prefix = (prefix << width) | static_cast<uint64_t>(p.bin);
      low = shift;
      const uint64_t bin_count = count[p.bin], bin_mass = mass[p.bin];
      if ((by_mass ? need == bin_mass : need == bin_count) || bin_count == 1)
        return Cut{std::max(static_cast<uint32_t>(prefix << shift), lo), kAllTies, mass_above + bin_mass};
      n_eq = bin_count;
    }
  }
  const uint32_t key = static_cast<uint32_t>(prefix);
  const uint64_t w = weight_of(key);
  const uint64_t t = by_mass ? (need + w - 1) / w : need;
  return Cut{key, t >= n_eq ? kAllTies : static_cast<uint32_t>(t), mass_above + t * w};
}

int32_t first_max(const std::vector<float>& v, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i)
    if (v[i] > v[best]) best = i;
  return static_cast<int32_t>(best);
}

// The outcome of steps 1-9: the token, and the probability the draw gave it, weight / mass
// (mass 0: no draw happened, a point mass).
struct Drawn {
  int32_t token = 0;
  uint64_t weight = 0, mass = 0;
};

// Steps 1-9 for one row. z and c are scratch.
Drawn sample_row(const float* logits, const int32_t* counts, const ops::SamplingRow& p, int64_t V,
                 std::vector<float>& z, Candidates& c) {
  const bool greedy = !(p.temperature > 0.0f);
  for (int64_t i = 0; i < V; ++i)
    z[i] = counts ? sm::penalise(logits[i], counts[i], p.repetition_penalty, p.frequency_penalty, p.presence_penalty)
                  : sm::clean(logits[i]);
  const int32_t greedy_first = first_max(z, V);  // of x
  if (greedy) return Drawn{greedy_first};
  for (int64_t i = 0; i < V; ++i) z[i] = sm::scaled(z[i], p.temperature);
  const int32_t first = first_max(z, V);
  const float m = z[first];
  if (!std::isfinite(m)) return Drawn{greedy_first};

  uint64_t count[sm::kBins] = {}, mass[sm::kBins] = {};
  uint64_t n_pos = 0, total = 0;
  for (int64_t i = 0; i < V; ++i) {
    const float d = sm::fsub(z[i], m);
    const int b = sm::bucket(d);
    if (b == sm::kZeroBucket) continue;
    const uint64_t w = sm::weight(d);
    count[b] += 1, mass[b] += w;
    n_pos += 1, total += w;
  }
  const bool k_on = p.top_k > 0 && static_cast<uint64_t>(p.top_k) < n_pos;
  const bool p_on = p.top_p < 1.0f;
  Pick bk, bp;
  int bc = sm::kZeroBucket - 1;
  if (k_on) {
    bk = pick(count, mass, true, false, static_cast<uint64_t>(p.top_k));
    bc = bk.bin;
  } else if (p_on) {
    bp = pick(count, mass, true, true, sm::top_p_target(p.top_p, total));
    bc = bp.bin;
  }

  c.keys.clear();
  c.index.clear();
  for (int64_t i = 0; i < V; ++i) {
    if (sm::bucket(sm::fsub(z[i], m)) > bc) continue;
    c.keys.push_back(sm::order_key(z[i]));
    c.index.push_back(static_cast<int32_t>(i));
  }
  const int64_t n = static_cast<int64_t>(c.keys.size());

  Cut cut;  // every candidate
  uint64_t kept_mass = total;
  if (k_on) {
    cut = select_in_bucket(c, m, bk.bin, false, static_cast<uint64_t>(p.top_k) - bk.count_before, count[bk.bin]);
    kept_mass = bk.mass_before + cut.mass;
  }
  if (p_on) {
    const uint64_t target = sm::top_p_target(p.top_p, kept_mass);
    bp = pick(count, mass, true, true, target);
    cut = select_in_bucket(c, m, bp.bin, true, target - bp.mass_before, count[bp.bin]);
  }

  // Entries of key == cut.key at positions <= tie_end are kept.
  int64_t tie_end = n;
  if (cut.ties != kAllTies) {
    uint32_t seen = 0;
    for (int64_t q = 0; q < n && tie_end == n; ++q)
      if (c.keys[q] == cut.key && ++seen == cut.ties) tie_end = q;
  }
  const uint64_t min_w = sm::min_p_floor(p.min_p);
  auto kept_weight = [&](int64_t q) -> uint64_t {
    const uint32_t key = c.keys[q];
    if (key < cut.key || (key == cut.key && q > tie_end)) return 0;
    const uint64_t w = sm::weight(sm::fsub(sm::key_value(key), m));
    return w >= min_w ? w : 0;
  };
  uint64_t kept = 0;
  for (int64_t q = 0; q < n; ++q) kept += kept_weight(q);
  if (kept == 0) return Drawn{first};
  const uint64_t r = sm::draw_target(sm::row_uniform(p), kept);
  uint64_t run = 0;
  for (int64_t q = 0; q < n; ++q) {
    const uint64_t w = kept_weight(q);
    run += w;
    if (run > r) return Drawn{c.index[q], w, kept};
  }
  KILN_ASSERT(false && "the draw ran past the kept mass");
  return Drawn{first};
}

// Raw log-probabilities of one row (see the header comment): the chosen token's when `logprob` is
// given, the top-N when top_ids is.
void logprobs_row(const float* l, int64_t V, int32_t token, const ops::SamplingRow& p, float* logprob,
                  int32_t* top_ids, float* top_logprobs) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, sm::clean(l[i]));
  double s = 0.0;
  for (int64_t i = 0; i < V; ++i) s += static_cast<double>(sm::exp_nonpos(sm::fsub(sm::clean(l[i]), mx)));
  const bool finite = std::isfinite(mx);
  const double lse = static_cast<double>(mx) + std::log(s);
  auto logp = [&](float v) -> float {
    if (!finite) return v == mx ? 0.0f : -INFINITY;
    return static_cast<float>(static_cast<double>(v) - lse);
  };
  if (logprob) *logprob = logp(sm::clean(l[token]));

  const int32_t n = std::clamp(p.top_logprobs, 0, ops::kMaxTopLogprobs);
  if (n == 0 || !top_ids) return;
  auto before = [&](int32_t a, int32_t b) {
    const float va = sm::clean(l[a]), vb = sm::clean(l[b]);
    return va > vb || (va == vb && a < b);
  };
  std::vector<int32_t> best;  // the first n of the order seen so far, in order
  for (int64_t i = 0; i < V; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    if (static_cast<int32_t>(best.size()) == n && !before(id, best.back())) continue;
    if (static_cast<int32_t>(best.size()) == n) best.pop_back();
    best.insert(std::upper_bound(best.begin(), best.end(), id, before), id);
  }
  for (int32_t r = 0; r < n; ++r) {
    const bool has = r < static_cast<int32_t>(best.size());
    top_ids[r] = has ? best[r] : -1;
    top_logprobs[r] = has ? logp(sm::clean(l[best[r]])) : -INFINITY;
  }
}

}  // namespace

void sample(const ops::SamplingBatch& s) {
  const int64_t B = s.logits.size(0), V = s.logits.size(1);
  const float* logits = s.logits.ptr<const float>();
  int32_t* counts = sm::present(s.counts) ? s.counts.ptr<int32_t>() : nullptr;
  const int64_t count_rows = counts ? s.counts.size(0) : 0;
  float* logprobs = sm::present(s.logprobs) ? s.logprobs.ptr<float>() : nullptr;
  int32_t* top_ids = sm::present(s.top_ids) ? s.top_ids.ptr<int32_t>() : nullptr;
  float* top_logprobs = sm::present(s.top_logprobs) ? s.top_logprobs.ptr<float>() : nullptr;
  std::vector<float> z(static_cast<size_t>(V));
  Candidates c;
  for (int64_t b = 0; b < B; ++b) {
    ops::SamplingRow p;
    std::memcpy(static_cast<void*>(&p), s.params.ptr<const int32_t>() + b * ops::kSamplingRowWords, sizeof(p));
    const float* row = logits + b * V;
    int32_t* crow = counts && p.counts_row >= 0 && p.counts_row < count_rows ? counts + p.counts_row * V : nullptr;
    int32_t token;
    if (s.full) {
      const Drawn d = sample_row(row, crow, p, V, z, c);
      token = d.token;
      // The chosen token's log-prob: the behaviour one here, or the raw one in logprobs_row.
      const bool behaviour = p.logprobs == ops::kLogprobsSampled;
      if (behaviour && logprobs) logprobs[b] = sm::drawn_logprob(d.weight, d.mass);
      const bool raw = !behaviour && (p.logprobs != 0 || p.top_logprobs > 0);
      if (raw || p.top_logprobs > 0)
        logprobs_row(row, V, token, p, raw && logprobs ? logprobs + b : nullptr,
                     top_ids ? top_ids + b * ops::kMaxTopLogprobs : nullptr,
                     top_logprobs ? top_logprobs + b * ops::kMaxTopLogprobs : nullptr);
    } else {
      for (int64_t i = 0; i < V; ++i) z[i] = sm::clean(row[i]);
      token = first_max(z, V);
    }
    s.tokens.ptr<int32_t>()[b] = token;
    if (crow) crow[token] += 1;
  }
}

void reset_token_counts(Tensor counts_row, Tensor prompt, Tensor output) {
  const int64_t V = counts_row.numel();
  int32_t* row = counts_row.ptr<int32_t>();
  std::fill(row, row + V, 0);
  for (int64_t i = 0; i < (sm::present(prompt) ? prompt.numel() : 0); ++i) {
    const int32_t id = prompt.ptr<const int32_t>()[i];
    if (id >= 0 && id < V) row[id] |= ops::kPromptBit;
  }
  for (int64_t i = 0; i < (sm::present(output) ? output.numel() : 0); ++i) {
    const int32_t id = output.ptr<const int32_t>()[i];
    if (id >= 0 && id < V) row[id] += 1;
  }
}

void adjust_logits(Tensor logits, Tensor params, Tensor mask_words) {
  const int64_t B = logits.size(0), V = logits.size(1), n = mask_words.numel();
  const uint32_t* words = reinterpret_cast<const uint32_t*>(mask_words.ptr<const int32_t>());
  for (int64_t b = 0; b < B; ++b) {
    ops::SamplingRow p;
    std::memcpy(static_cast<void*>(&p), params.ptr<const int32_t>() + b * ops::kSamplingRowWords, sizeof(p));
    float* row = logits.ptr<float>() + b * V;
    auto allowed = [&](int64_t v) {
      const int64_t w = p.mask_offset + (v >> 5);
      return p.mask_offset < 0 || (w < n && (words[w] >> (v & 31) & 1));
    };
    if (p.mask_offset >= 0)
      for (int64_t v = 0; v < V; ++v)
        if (!allowed(v)) row[v] = -INFINITY;
    for (int32_t k = 0; p.bias_offset >= 0 && k < p.bias_count; ++k) {
      const int64_t w = p.bias_offset + 2 * static_cast<int64_t>(k);
      if (w + 1 >= n) break;
      const int64_t id = static_cast<int32_t>(words[w]);
      if (id < 0 || id >= V || !allowed(id)) continue;
      row[id] += std::bit_cast<float>(words[w + 1]);
    }
  }
}

}  // namespace kiln::cpu
