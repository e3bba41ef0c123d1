// The CUDA twin of ops::sample (kernels/cuda/sampling.cu) against the CPU twin on random inputs:
// every parameter, odd sizes (V = 1, 7, 1000, 151936; B = 1, 3, 64, 256), greedy and sampled rows
// mixed in one batch, several decode steps with the counts table carried, special rows (NaN, +-inf,
// ties, extreme temperatures), the greedy-only path, graph capture and replay, reset_token_counts.
//
// Exactness: both twins compute the same single-rounded f32 operations (kernels/sampling_math.h:
// _rn intrinsics on the device, -ffp-contract=off on the host; the exponential is a polynomial of
// such operations, not libm) and exact integer masses, and every choice is defined by an order,
// not by a visiting order. So tokens, top-N ids and counts tables must be equal, with no tolerance.
// Log-probabilities sum their terms in double in different orders and take log from different
// libraries: they must agree to 1e-5. Behaviour log-probabilities (logprobs == kLogprobsSampled)
// come from the same integers (kept weight and mass) through one double log each: to 1e-6.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "kernels/ops.h"
#include "kernels/rng.h"
#include "sampler_util.h"
#include "test_util.h"

namespace kiln::test {
namespace {

constexpr float kInf = INFINITY;
constexpr int K = ops::kMaxTopLogprobs;

// A batch of B rows of V logits with parameters drawn per row (seeded): greedy (with and without
// penalties), temperature alone, top-k (1, small, >= V), top-p (tiny to 0.99), min-p, penalties,
// log-probabilities (raw and behaviour), and special rows (ties, NaN, +inf, all -inf, extreme scales and temperatures).
SamplerCall random_call(int64_t B, int64_t V, uint64_t seed) {
  SamplerCall c;
  c.B = B, c.V = V, c.count_rows = B;
  c.counts.assign(B * V, 0);
  auto u = [&](int64_t b, int k) { return rng::uniform(seed, static_cast<uint64_t>(b) * 64 + k); };
  for (int64_t b = 0; b < B; ++b) {
    const float scale = static_cast<float>(0.3 + 8 * u(b, 0));
    TensorBuffer t = random_host(Shape{V}, DType::f32, seed * 100003 + b, scale);
    std::vector<float> l(t.ptr<float>(), t.ptr<float>() + V);
    const int special = static_cast<int>(u(b, 1) * 40);
    if (special == 0) for (float& x : l) x = std::round(x);  // many ties
    if (special == 1) for (int64_t i = 0; i < V; i += 3) l[i] = NAN;
    if (special == 2) l[V / 2] = kInf;
    if (special == 3) for (float& x : l) x = -kInf;
    if (special == 4) for (float& x : l) x *= 1000.0f;
    if (special == 5) l.assign(V, 0.25f);
    c.logits.insert(c.logits.end(), l.begin(), l.end());

    ops::SamplingRow r;
    const int kind = static_cast<int>(u(b, 2) * 8);
    r.temperature = kind == 0 ? 0.0f : static_cast<float>(0.1 + 2 * u(b, 3));
    if (special == 6) r.temperature = 1e-3f;
    if (special == 7) r.temperature = 1e3f;
    if (special == 8) r.temperature = 1e-45f;  // finite logits overflow: the greedy token
    if (kind == 2 || kind == 6) r.top_k = 1 + static_cast<int32_t>(u(b, 4) * std::min<int64_t>(V + 3, 300));
    if (kind == 3 || kind == 6) r.top_p = static_cast<float>(u(b, 5) < 0.1 ? 1e-6 : 0.05 + 0.94 * u(b, 6));
    if (kind == 4 || (kind == 6 && u(b, 7) < 0.5)) r.min_p = static_cast<float>(0.4 * u(b, 8));
    if (kind == 5 || kind == 6 || kind == 7 || u(b, 9) < 0.2) {
      r.counts_row = static_cast<int32_t>(b);
      r.repetition_penalty = static_cast<float>(0.7 + 0.9 * u(b, 10));
      r.frequency_penalty = static_cast<float>(u(b, 11) - 0.3);
      r.presence_penalty = static_cast<float>(u(b, 12) - 0.3);
      for (int64_t i = 0; i < V; ++i) {
        const double h = rng::uniform(seed + 1, static_cast<uint64_t>(b * V + i));
        const int32_t out = h > 0.9 ? static_cast<int32_t>(1 + 60 * (h - 0.9)) : 0;
        c.counts[b * V + i] = (h < 0.05 ? ops::kPromptBit : 0) + out;
      }
    }
    const double lp = u(b, 13);
    r.logprobs = lp < 0.15 ? ops::kLogprobsRaw : lp < 0.3 ? ops::kLogprobsSampled : ops::kLogprobsOff;
    r.top_logprobs = u(b, 14) < 0.3 ? static_cast<int32_t>(u(b, 15) * (K + 1)) : 0;
    ops::set_sampling_seed(r, rng::splitmix64(seed * 7919 + b));
    r.position = static_cast<int32_t>(u(b, 16) * 1e6);
    c.rows.push_back(r);
  }
  return c;
}

bool logprob_close(float g, float h) { return g == h || std::fabs(g - h) <= 1e-5f + 1e-6f * std::fabs(h); }

void expect_same(const SamplerCall& c, const SamplerOutputs& gpu, const SamplerOutputs& cpu, const std::string& what) {
  int bad = 0;
  for (int64_t b = 0; b < c.B; ++b) {
    if (gpu.tokens[b] == cpu.tokens[b]) continue;
    if (++bad <= 5) {
      const ops::SamplingRow& p = c.rows[b];
      ADD_FAILURE() << what << " row " << b << ": cuda " << gpu.tokens[b] << ", cpu " << cpu.tokens[b] << " (T "
                    << p.temperature << " k " << p.top_k << " p " << p.top_p << " min_p " << p.min_p << " counts_row "
                    << p.counts_row << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": token mismatches of " << c.B;
  EXPECT_TRUE(gpu.counts == cpu.counts) << what << ": counts tables differ";
  EXPECT_TRUE(gpu.top_ids == cpu.top_ids) << what << ": top ids differ";
  int far = 0, far_sampled = 0;
  for (size_t i = 0; i < cpu.logprobs.size(); ++i) {
    if (c.rows[i].logprobs == ops::kLogprobsSampled) {
      const float g = gpu.logprobs[i], h = cpu.logprobs[i];
      far_sampled += !(g == h || std::fabs(g - h) <= 1e-6f);
    } else {
      far += !logprob_close(gpu.logprobs[i], cpu.logprobs[i]);
    }
  }
  for (size_t i = 0; i < cpu.top_logprobs.size(); ++i) far += !logprob_close(gpu.top_logprobs[i], cpu.top_logprobs[i]);
  EXPECT_EQ(far, 0) << what << ": log-probabilities beyond 1e-5";
  EXPECT_EQ(far_sampled, 0) << what << ": behaviour log-probabilities beyond 1e-6";
}

TEST(CudaSampler, MatchesCpuOnRandomBatches) {
  KILN_REQUIRE_GPU(be);
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  uint64_t seed = 1;
  for (int64_t V : {1, 7, 1000, 151936}) {
    for (int64_t B : {1, 3, 64, 256}) {
      SamplerCall c = random_call(B, V, seed++);
      // Decode steps: the counts tables carry over (each side's own), positions advance.
      for (int step = 0; step < 3; ++step) {
        const std::string what = "V=" + std::to_string(V) + " B=" + std::to_string(B) + " step " + std::to_string(step);
        const SamplerOutputs g = run_sampler(*be, c), h = run_sampler(*cpu, c);
        expect_same(c, g, h, what);
        if (::testing::Test::HasFailure()) return;
        c.counts = h.counts;
        for (ops::SamplingRow& r : c.rows) r.position += 1;
      }
    }
  }
}

// Unaligned row lengths (no 16-byte loads) and one row of a long list (a flat distribution with
// every token kept: the draw descends through the segment levels of a 151936-entry list).
TEST(CudaSampler, MatchesCpuOnOddShapes) {
  KILN_REQUIRE_GPU(be);
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  uint64_t seed = 100;
  for (int64_t V : {2, 33, 1003, 32001, 151937}) {
    SamplerCall c = random_call(17, V, seed++);
    expect_same(c, run_sampler(*be, c), run_sampler(*cpu, c), "V=" + std::to_string(V));
  }
  SamplerCall flat = random_call(8, 151936, seed++);
  for (int64_t b = 0; b < flat.B; ++b) {
    flat.rows[b] = ops::SamplingRow{};
    flat.rows[b].temperature = 50.0f;
    flat.rows[b].top_p = b % 2 ? 0.999f : 1.0f;
    flat.rows[b].position = static_cast<int32_t>(b);
    flat.rows[b].logprobs = b % 4 < 2 ? ops::kLogprobsSampled : ops::kLogprobsRaw;
  }
  expect_same(flat, run_sampler(*be, flat), run_sampler(*cpu, flat), "flat");
}

// Every row asks for the behaviour log-probability (half of them with top-N too): both paths of
// the draw (with and without a cut), greedy and special rows (0), over several decode steps.
TEST(CudaSampler, SampledLogprobsMatchCpu) {
  KILN_REQUIRE_GPU(be);
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  uint64_t seed = 500;
  for (int64_t V : {1, 7, 1000, 32001, 151936}) {
    SamplerCall c = random_call(64, V, seed++);
    for (int64_t b = 0; b < c.B; ++b) {
      c.rows[b].logprobs = ops::kLogprobsSampled;
      c.rows[b].top_logprobs = b % 2 ? static_cast<int32_t>(1 + b % K) : 0;
    }
    for (int step = 0; step < 2; ++step) {
      const std::string what = "V=" + std::to_string(V) + " step " + std::to_string(step);
      const SamplerOutputs g = run_sampler(*be, c), h = run_sampler(*cpu, c);
      expect_same(c, g, h, what);
      for (int64_t b = 0; b < c.B; ++b)
        if (!(c.rows[b].temperature > 0.0f)) {
          EXPECT_EQ(g.logprobs[b], 0.0f) << what << " greedy row " << b;
        }
      if (::testing::Test::HasFailure()) return;
      c.counts = h.counts;
      for (ops::SamplingRow& r : c.rows) r.position += 1;
    }
  }
}

TEST(CudaSampler, GreedyOnlyPathMatchesCpu) {
  KILN_REQUIRE_GPU(be);
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  uint64_t seed = 200;
  for (int64_t V : {1, 7, 1000, 1003, 151936}) {
    for (int64_t B : {1, 3, 64}) {
      SamplerCall c = random_call(B, V, seed++);
      for (int64_t b = 0; b < B; ++b) {
        const int32_t counts_row = c.rows[b].counts_row;
        c.rows[b] = ops::SamplingRow{};
        c.rows[b].counts_row = counts_row;  // counted, not penalised
      }
      c.logprob_outputs = false;
      expect_same(c, run_sampler(*be, c, false), run_sampler(*cpu, c, false),
                  "V=" + std::to_string(V) + " B=" + std::to_string(B));
    }
  }
}

TEST(CudaSampler, RowsDoNotDependOnTheBatch) {
  KILN_REQUIRE_GPU(be);
  const SamplerCall c = random_call(256, 32000, 300);
  const SamplerOutputs all = run_sampler(*be, c);
  EXPECT_EQ(run_sampler(*be, c).tokens, all.tokens);  // and not on the run
  for (int64_t b = 0; b < c.B; b += 37) {
    SamplerCall one;
    one.B = 1, one.V = c.V;
    one.logits.assign(c.logits.begin() + b * c.V, c.logits.begin() + (b + 1) * c.V);
    one.rows = {c.rows[b]};
    if (one.rows[0].counts_row >= 0) {
      one.count_rows = 1;
      one.counts.assign(c.counts.begin() + b * c.V, c.counts.begin() + (b + 1) * c.V);
      one.rows[0].counts_row = 0;
    }
    EXPECT_EQ(run_sampler(*be, one).tokens[0], all.tokens[b]) << "row " << b;
  }
}

// A captured call replays to the eager result without allocating, and reads new parameters written
// into the recorded params buffer on replay.
TEST(CudaSampler, GraphReplayEqualsEager) {
  KILN_REQUIRE_GPU(be);
  CudaBackend& cb = static_cast<CudaBackend&>(*be);
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  SamplerCall c = random_call(64, 32000, 400);
  SamplerBuffers buf = sampler_buffers(*be, c);
  const TensorBuffer counts0 = to_host(*be, buf.counts);
  ops::sample(*be, buf.batch(true));
  const SamplerOutputs eager = buf.read(*be);
  be->copy(buf.counts, counts0);

  const int64_t in_use = cb.allocator().bytes_in_use(), cached = cb.allocator().bytes_cached();
  Result<std::unique_ptr<CapturedWork>> graph = be->capture([&] { ops::sample(*be, buf.batch(true)); });
  ASSERT_TRUE(graph.ok()) << graph.status().message();
  EXPECT_EQ(cb.allocator().bytes_in_use(), in_use);
  EXPECT_EQ(cb.allocator().bytes_cached(), cached);
  be->zero(buf.tokens);
  (*graph)->replay();
  ASSERT_TRUE(be->synchronize().ok());
  const SamplerOutputs replay = buf.read(*be);
  EXPECT_EQ(replay.tokens, eager.tokens);
  EXPECT_TRUE(replay.counts == eager.counts);
  EXPECT_TRUE(replay.top_ids == eager.top_ids);
  EXPECT_EQ(0, std::memcmp(replay.logprobs.data(), eager.logprobs.data(), eager.logprobs.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(replay.top_logprobs.data(), eager.top_logprobs.data(),
                           eager.top_logprobs.size() * sizeof(float)));

  // New parameters in the same buffer: later positions, some rows switched between greedy and sampled.
  for (int64_t b = 0; b < c.B; ++b) {
    c.rows[b].position += 1000;
    if (b % 5 == 0) c.rows[b].temperature = c.rows[b].temperature > 0 ? 0.0f : 0.8f;
    if (b % 7 == 0) c.rows[b].top_k = 5;
  }
  be->copy(buf.params, sampler_params_host(c.rows));
  be->copy(buf.counts, counts0);
  (*graph)->replay();
  ASSERT_TRUE(be->synchronize().ok());
  const SamplerOutputs changed = buf.read(*be);
  SamplerOutputs want = run_sampler(*cpu, c);
  // Rows that do not ask keep whatever the earlier runs left (sentinels, or the first run's values
  // for rows that asked then): compare tokens and counts, and the log-probs of rows that ask.
  EXPECT_EQ(changed.tokens, want.tokens);
  EXPECT_TRUE(changed.counts == want.counts);
  for (int64_t b = 0; b < c.B; ++b) {
    if (c.rows[b].logprobs || c.rows[b].top_logprobs > 0) {
      EXPECT_TRUE(logprob_close(changed.logprobs[b], want.logprobs[b])) << "row " << b;
    }
  }
}

TEST(CudaSampler, ResetTokenCountsMatchesCpu) {
  KILN_REQUIRE_GPU(be);
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  const int64_t V = 1000;
  TensorBuffer prompt = random_ints(Shape{300}, -5, V + 5, 1), output = random_ints(Shape{2000}, 0, 40, 2);
  TensorBuffer row_cpu = host_empty(Shape{V}, DType::i32);
  ops::reset_token_counts(*cpu, row_cpu, prompt, output);
  Result<TensorBuffer> d_row = to_device(*be, random_ints(Shape{V}, 0, 9, 3));
  Result<TensorBuffer> d_prompt = to_device(*be, prompt), d_output = to_device(*be, output);
  ASSERT_TRUE(d_row.ok() && d_prompt.ok() && d_output.ok());
  ops::reset_token_counts(*be, *d_row, *d_prompt, *d_output);
  EXPECT_EQ(sampler_read<int32_t>(*be, *d_row),
            std::vector<int32_t>(row_cpu.ptr<int32_t>(), row_cpu.ptr<int32_t>() + V));
  ops::reset_token_counts(*be, *d_row, Tensor{}, Tensor{});
  EXPECT_EQ(sampler_read<int32_t>(*be, *d_row), std::vector<int32_t>(V, 0));
}

// ops::adjust_logits (constrained decoding and logit biases): CUDA equals the CPU twin bit for bit;
// row 1 has biases only (one id outside the vocabulary, skipped), row 2 a mask and biases (those of
// masked tokens skipped), row 3 nothing; over vocabularies of odd sizes.
TEST(CudaSampler, AdjustLogitsMatchesCpu) {
  KILN_REQUIRE_GPU(be);
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  for (int64_t V : {1, 33, 1000, 151936}) {
    const int64_t B = 5, W = (V + 31) / 32;
    TensorBuffer logits = random_host(Shape{B, V}, DType::f32, 11 + V, 3.0f);
    // Masks of rows 0, 2 and 4 at offsets 3, 3 + W and 3 + 2W - 1 (the last one runs past the
    // masks), then the biases of rows 1 and 2.
    std::vector<std::pair<int32_t, float>> bias1, bias2;
    for (int64_t id : {int64_t(0), V - 1, V / 2, V + 5})
      if (std::none_of(bias1.begin(), bias1.end(), [&](const auto& b) { return b.first == id; }))
        bias1.emplace_back(static_cast<int32_t>(id), 0.75f * static_cast<float>(bias1.size() + 1) - 2.0f);
    for (int64_t id = 0; id < std::min<int64_t>(V, 40); id += 3) bias2.emplace_back(static_cast<int32_t>(id), 1.5f);
    const int64_t b1 = 3 + 2 * W, b2 = b1 + 2 * static_cast<int64_t>(bias1.size());
    TensorBuffer words = host_empty(Shape{b2 + 2 * static_cast<int64_t>(bias2.size())}, DType::i32);
    for (int64_t i = 0; i < b1; ++i)
      words.ptr<int32_t>()[i] = static_cast<int32_t>(rng::splitmix64(static_cast<uint64_t>(V * 1000 + i)));
    auto put = [&](int64_t at, const std::vector<std::pair<int32_t, float>>& bias) {
      for (const auto& [id, v] : bias) {
        words.ptr<int32_t>()[at++] = id;
        std::memcpy(words.ptr<int32_t>() + at++, &v, 4);
      }
    };
    put(b1, bias1);
    put(b2, bias2);
    std::vector<ops::SamplingRow> rows(B);
    rows[0].mask_offset = 3;
    rows[2].mask_offset = static_cast<int32_t>(3 + W);
    rows[4].mask_offset = static_cast<int32_t>(3 + 2 * W - (W > 1 ? 1 : 0));
    rows[1].bias_offset = static_cast<int32_t>(b1), rows[1].bias_count = static_cast<int32_t>(bias1.size());
    rows[2].bias_offset = static_cast<int32_t>(b2), rows[2].bias_count = static_cast<int32_t>(bias2.size());
    TensorBuffer params = host_empty(Shape{B, ops::kSamplingRowWords}, DType::i32);
    std::memcpy(params.ptr<int32_t>(), rows.data(), rows.size() * sizeof(ops::SamplingRow));
    TensorBuffer want = host_copy(logits);
    ops::adjust_logits(*cpu, want, params, words);
    TensorBuffer d_logits = upload(*be, logits), d_params = upload(*be, params), d_words = upload(*be, words);
    ops::adjust_logits(*be, d_logits, d_params, d_words);
    const std::vector<float> got = sampler_read<float>(*be, d_logits);
    ASSERT_EQ(got.size(), static_cast<size_t>(B * V));
    int64_t masked = 0;
    for (int64_t i = 0; i < B * V; ++i) {
      EXPECT_EQ(std::memcmp(&got[i], want.ptr<float>() + i, 4), 0) << "V " << V << " element " << i;
      masked += std::isinf(got[i]) && got[i] < 0;
      if (i / V == 3) EXPECT_EQ(got[i], logits.ptr<float>()[i]);  // nothing asked
    }
    for (const auto& [id, v] : bias1)  // row 1: biases alone, as added here
      if (id < V) EXPECT_EQ(got[V + id], logits.ptr<float>()[V + id] + v) << "V " << V << " token " << id;
    if (V >= 1000) EXPECT_GT(masked, V);  // about half of three rows
  }
}

}  // namespace
}  // namespace kiln::test
