// The inference engine on the CPU (f32) with the fixture models: many requests with random lengths,
// arrival times and sampling parameters give the same tokens as each request run alone (log-probs
// within 1e-5 relative), with the prefix cache on and off and with a pool small enough to preempt;
// greedy continuations equal the transformers fixtures; cancellation, bad input, zero allocations
// in steady-state decode.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>
#include <utility>

#include "golden.h"
#include "infer/engine.h"
#include "kernels/rng.h"
#include "test_util.h"

namespace kiln::test {
namespace {

struct Outcome {
  std::vector<float> prompt_logprobs;
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> top;
  std::vector<uint64_t> versions;
  std::string finish_reason;
  Usage usage;
};

Outcome drain(RequestStream& s) {
  Outcome o;
  while (std::optional<EngineEvent> e = s.next()) {
    EXPECT_TRUE(e->prompt_logprobs.empty() || o.ids.empty()) << "prompt log-probabilities after a generated token";
    o.prompt_logprobs.insert(o.prompt_logprobs.end(), e->prompt_logprobs.begin(), e->prompt_logprobs.end());
    for (const GeneratedToken& t : e->tokens) {
      o.ids.push_back(t.id);
      o.logprobs.push_back(t.logprob);
      o.top.push_back(t.top);
      o.versions.push_back(t.policy_version);
    }
    if (e->finished) {
      o.finish_reason = e->finish_reason;
      o.usage = e->usage;
    }
  }
  return o;
}

class EngineTest : public ::testing::Test {
 protected:
  void load(const std::string& model, bool batch_invariant = false) {
    model_.reset();  // before the backend it lives on
    be_ = make_cpu_backend(batch_invariant);
    Result<std::unique_ptr<Transformer>> m = Transformer::load(*be_, testdata_dir() + "/" + model);
    ASSERT_TRUE(m.ok()) << m.status().message();
    model_ = std::shared_ptr<const Transformer>(std::move(m).value());
  }
  std::unique_ptr<Engine> engine(EngineOptions o) {
    Result<std::unique_ptr<Engine>> e = Engine::create(model_, nullptr, model_->config().eos_token_ids, o);
    EXPECT_TRUE(e.ok()) << e.status().message();
    return e.ok() ? std::move(e).value() : nullptr;
  }
  Outcome alone(const GenerationRequest& r) {
    EngineOptions o;
    o.max_running = 1;
    o.max_step_tokens = 64;
    o.kv_tokens = 512;
    std::unique_ptr<Engine> e = engine(o);
    Result<std::shared_ptr<RequestStream>> s = e->submit(r);
    EXPECT_TRUE(s.ok()) << s.status().message();
    return drain(**s);
  }

  // Random requests; some share prefixes so that the radix cache has work. stop_ids > 0: each has
  // that many stop token ids (spread over the vocabulary), so that many end early.
  std::vector<GenerationRequest> random_requests(int n, uint64_t seed, int32_t stop_ids = 0) {
    const int32_t vocab = static_cast<int32_t>(model_->config().vocab_size);
    std::vector<int32_t> shared(40);
    for (int32_t& t : shared) t = 3 + static_cast<int32_t>(rng::uniform(seed, 999 + (&t - shared.data())) * (vocab - 3));
    std::vector<GenerationRequest> out;
    for (int i = 0; i < n; ++i) {
      auto u = [&](uint64_t k) { return rng::uniform(seed + static_cast<uint64_t>(i) * 7919, k); };
      GenerationRequest r;
      const int32_t len = 1 + static_cast<int32_t>(u(0) * 45);
      if (u(1) < 0.4) r.prompt.assign(shared.begin(), shared.begin() + std::min<int32_t>(len, 40));
      while (static_cast<int32_t>(r.prompt.size()) < len)
        r.prompt.push_back(3 + static_cast<int32_t>(u(100 + r.prompt.size()) * (vocab - 3)));
      r.max_tokens = 1 + static_cast<int32_t>(u(2) * 24);
      const double kind = u(3);
      if (kind > 0.25) r.temperature = static_cast<float>(0.5 + u(4));
      if (kind > 0.5) r.top_k = static_cast<int32_t>(u(5) * 50);
      if (kind > 0.6) r.top_p = static_cast<float>(0.5 + 0.5 * u(6));
      if (kind > 0.7) r.min_p = static_cast<float>(0.1 * u(7));
      if (u(8) < 0.3) r.repetition_penalty = static_cast<float>(0.8 + 0.6 * u(9));
      if (u(10) < 0.3) r.frequency_penalty = static_cast<float>(u(11) - 0.5);
      if (u(12) < 0.3) r.presence_penalty = static_cast<float>(u(13) - 0.5);
      r.seed = static_cast<uint64_t>(u(14) * 1e9);
      r.logprobs = true;
      r.top_logprobs = u(15) < 0.3 ? 3 : 0;
      r.ignore_eos = u(16) < 0.5;
      for (int32_t k = 0; k < stop_ids; ++k) r.stop_token_ids.push_back(3 + k * (vocab - 3) / stop_ids);
      out.push_back(r);
    }
    return out;
  }

  // Runs every request through one engine, arriving in waves, and compares with each run alone.
  void check_equivalence(const EngineOptions& options, int n, uint64_t seed, int64_t* preemptions = nullptr,
                         int64_t* hits = nullptr, int32_t stop_ids = 0, EngineStats* stats = nullptr) {
    std::vector<GenerationRequest> reqs = random_requests(n, seed, stop_ids);
    std::vector<Outcome> reference;
    for (const GenerationRequest& r : reqs) reference.push_back(alone(r));
    std::unique_ptr<Engine> e = engine(options);
    ASSERT_TRUE(e);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < n; ++i) {
      Result<std::shared_ptr<RequestStream>> s = e->submit(reqs[i]);
      ASSERT_TRUE(s.ok()) << s.status().message();
      streams.push_back(*s);
      if (rng::uniform(seed, 5000 + i) < 0.3) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    for (int i = 0; i < n; ++i) {
      Outcome got = drain(*streams[i]);
      const Outcome& want = reference[i];
      ASSERT_EQ(got.ids, want.ids) << "request " << i;
      EXPECT_EQ(got.finish_reason, want.finish_reason) << "request " << i;
      ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
      for (size_t t = 0; t < got.logprobs.size(); ++t) {
        if (be_->batch_invariant())  // bitwise, whatever the batch, the cache and preemptions did
          EXPECT_EQ(got.logprobs[t], want.logprobs[t]) << "request " << i << " token " << t;
        else
          EXPECT_NEAR(got.logprobs[t], want.logprobs[t], 1e-5 * std::max(1.0f, std::fabs(want.logprobs[t])))
              << "request " << i << " token " << t;
      }
      for (size_t t = 0; t < got.top.size(); ++t) {
        ASSERT_EQ(got.top[t].size(), want.top[t].size());
        for (size_t k = 0; k < got.top[t].size(); ++k) EXPECT_EQ(got.top[t][k].first, want.top[t][k].first);
      }
      EXPECT_EQ(got.usage.prompt_tokens, static_cast<int32_t>(reqs[i].prompt.size()));
      EXPECT_EQ(got.usage.completion_tokens, static_cast<int32_t>(got.ids.size()));
      for (uint64_t v : got.versions) EXPECT_EQ(v, 0u);
    }
    EngineStats st = e->stats();
    // The engine publishes its stats after the step whose events it delivered last.
    for (int i = 0; i < 1000 && (st.running > 0 || st.waiting > 0); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      st = e->stats();
    }
    if (preemptions) *preemptions = st.preemptions;
    if (hits) *hits = st.prefix_hit_tokens;
    if (stats) *stats = st;
  }

  void TearDown() override { model_.reset(); }

  std::unique_ptr<Backend> be_;
  std::shared_ptr<const Transformer> model_;
};

TEST_F(EngineTest, BatchedEqualsAloneWithPrefixCache) {
  for (const char* m : {"tiny-llama", "tiny-qwen3"}) {
    load(m);
    EngineOptions o;
    o.max_running = 8;
    o.max_step_tokens = 48;  // long prompts are chunked and mixed with decodes
    o.page_size = 4;
    o.kv_tokens = 2048;
    int64_t hits = 0;
    check_equivalence(o, 24, 11, nullptr, &hits);
    EXPECT_GT(hits, 0) << m << ": the shared prefixes should hit the radix cache";
  }
}

// A batch-invariant backend makes every request's tokens and log-probabilities bitwise those of
// the request run alone: with and without the prefix cache, chunked, and preempted.
TEST_F(EngineTest, BatchInvariantBackendIsBitwiseAlone) {
  for (const char* m : {"tiny-llama", "tiny-qwen3"}) {
    load(m, /*batch_invariant=*/true);
    for (bool cache : {true, false}) {
      EngineOptions o;
      o.max_running = 8;
      o.max_step_tokens = 48;
      o.page_size = 4;
      o.kv_tokens = cache ? 2048 : 96;  // the small pool preempts
      o.prefix_cache = cache;
      int64_t preemptions = 0;
      check_equivalence(o, 24, 29, &preemptions);
      if (!cache) {
        EXPECT_GT(preemptions, 0) << m;
      }
    }
  }
}

TEST_F(EngineTest, BatchedEqualsAloneWithoutPrefixCache) {
  load("tiny-llama");
  EngineOptions o;
  o.max_running = 6;
  o.max_step_tokens = 32;
  o.page_size = 16;
  o.kv_tokens = 2048;
  o.prefix_cache = false;
  int64_t hits = -1;
  check_equivalence(o, 16, 23, nullptr, &hits);
  EXPECT_EQ(hits, 0);
}

TEST_F(EngineTest, PreemptionDoesNotChangeOutputs) {
  load("tiny-qwen3");
  EngineOptions o;
  o.max_running = 8;
  o.max_step_tokens = 64;
  o.page_size = 2;
  o.kv_tokens = 80;  // a pool far smaller than 8 running requests need: preemption must happen
  int64_t preemptions = 0;
  check_equivalence(o, 16, 37, &preemptions);
  EXPECT_GT(preemptions, 0);
}

// A step of prefill chunks alone samples no request, yet its forward computes one logit row: that
// row must not be sampled with the parameters a previous step left behind, whose counts row (the
// penalties' token counts) may by then belong to another request. Here A ends, B takes A's counts
// row and its prompt is chunked: B's tokens and the log-probabilities of its penalised sampler are
// bitwise those of B alone, one chunk, on a fresh engine.
TEST_F(EngineTest, PrefillOnlyStepsLeaveTheCountsOfOthersAlone) {
  load("tiny-llama", /*batch_invariant=*/true);
  GenerationRequest a;
  a.prompt = {5, 6, 7};
  a.max_tokens = 4;
  a.frequency_penalty = 0.5f;
  a.ignore_eos = true;
  GenerationRequest b;
  for (int32_t t = 0; t < 20; ++t) b.prompt.push_back(10 + 7 * t);
  b.max_tokens = 8;
  b.temperature = 1.0f;
  b.frequency_penalty = 1.5f;
  b.presence_penalty = 1.0f;
  b.behaviour_logprobs = true;  // log-probabilities under the penalised distribution
  b.seed = 7;
  b.ignore_eos = true;
  const Outcome want = alone(b);
  EngineOptions o;
  o.max_running = 1;      // B runs after A and takes its counts row
  o.max_step_tokens = 8;  // B's prompt in chunks of 8, 8, 4: two steps sample nothing
  o.page_size = 4;
  o.kv_tokens = 512;
  o.prefix_cache = false;
  std::unique_ptr<Engine> e = engine(o);
  ASSERT_TRUE(e);
  Result<std::shared_ptr<RequestStream>> sa = e->submit(a);
  Result<std::shared_ptr<RequestStream>> sb = e->submit(b);
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_EQ(drain(**sa).ids.size(), 4u);
  const Outcome got = drain(**sb);
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_EQ(got.logprobs, want.logprobs);
}

// Lookahead (each decode step launched before the tokens of the step before it are known, its
// input tokens copied on the device; waiting requests admitted by it) changes no output: requests
// that stop tokens end in the middle of a chain, max_tokens, penalties, a pool small enough to
// preempt, a running limit that keeps requests waiting; against each request alone, with
// lookahead on and off. The engine counts the steps it launched ahead.
TEST_F(EngineTest, LookaheadChangesNoOutput) {
  load("tiny-llama");
  struct Case {
    int32_t max_running;
    int64_t kv_tokens;
  };
  for (bool lookahead : {true, false}) {
    for (const Case c : {Case{8, 2048}, Case{8, 96}, Case{2, 2048}}) {
      EngineOptions o;
      o.max_running = c.max_running;
      o.max_step_tokens = 48;
      o.page_size = 4;
      o.kv_tokens = c.kv_tokens;
      o.lookahead = lookahead;
      EngineStats st;
      int64_t preemptions = 0;
      check_equivalence(o, 24, 53, &preemptions, nullptr, /*stop_ids=*/16, &st);
      if (lookahead) {
        EXPECT_GT(st.lookahead_steps, 0) << "kv " << c.kv_tokens << " running " << c.max_running;
      } else {
        EXPECT_EQ(st.lookahead_steps, 0);
      }
      if (c.kv_tokens < 100) {
        EXPECT_GT(preemptions, 0);
      }
      EXPECT_EQ(st.running, 0);
      EXPECT_EQ(st.kv_pages_used, st.kv_pages_cached) << "pages of finished requests left in use";
    }
  }
}

TEST_F(EngineTest, GreedyContinuationEqualsTransformers) {
  for (const char* m : {"tiny-llama", "tiny-qwen3", "tiny-mistral", "tiny-qwen2"}) {
    load(m);
    GenerationRequest r;
    r.prompt = golden_ints(m, "seq_b.input_ids");
    const std::vector<int32_t> expected = golden_ints(m, "greedy.new_tokens");
    r.max_tokens = static_cast<int32_t>(expected.size());
    r.ignore_eos = true;
    EngineOptions o;
    o.kv_tokens = 1024;
    o.page_size = 8;
    std::unique_ptr<Engine> e = engine(o);
    Result<std::shared_ptr<RequestStream>> s = e->submit(r);
    ASSERT_TRUE(s.ok());
    Outcome got = drain(**s);
    EXPECT_EQ(got.ids, expected) << m;
    EXPECT_EQ(got.finish_reason, "length");
  }
}

// logit_bias: the first greedy token after the fixture prompt is the argmax of transformers' logits
// for it plus the biases (a ban of the reference's choice, a forced unlikely token, a mix), taken
// only where the reference's best and second best differ by more than f32 noise.
TEST_F(EngineTest, LogitBiasShiftsTheTransformersLogits) {
  int checked = 0;
  for (const char* m : {"tiny-llama", "tiny-qwen2"}) {
    load(m);
    const std::vector<int32_t> ids = golden_ints(m, "seq_a.input_ids");
    const std::vector<float> logits = golden_floats(m, "seq_a.logits");
    const int64_t vocab = static_cast<int64_t>(logits.size() / ids.size());
    const float* last = logits.data() + (ids.size() - 1) * vocab;
    const int32_t best = static_cast<int32_t>(std::max_element(last, last + vocab) - last);
    const int32_t worst = static_cast<int32_t>(std::min_element(last, last + vocab) - last);
    const std::vector<std::vector<std::pair<int32_t, float>>> cases = {
        {{best, -100.0f}}, {{worst, 100.0f}}, {{best, -100.0f}, {worst, 50.0f}, {(best + 1) % vocab, 0.25f}}};
    for (const auto& bias : cases) {
      std::vector<float> biased(last, last + vocab);
      for (const auto& [id, v] : bias) biased[id] += v;
      std::vector<float> sorted = biased;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      if (sorted[0] - sorted[1] < 1e-3f) continue;  // a near tie: f32 noise decides
      GenerationRequest r;
      r.prompt = ids;
      r.max_tokens = 1;
      r.ignore_eos = true;
      r.logit_bias = bias;
      const Outcome got = alone(r);
      ASSERT_EQ(got.ids.size(), 1u) << m;
      EXPECT_EQ(got.ids[0], std::max_element(biased.begin(), biased.end()) - biased.begin()) << m;
      ++checked;
    }
  }
  EXPECT_GE(checked, 5);
}

// log p(ids[t] | ids[<t]) from transformers' logits of the fixture sequence.
std::vector<double> reference_prompt_logprobs(const std::string& model, const std::vector<int32_t>& ids) {
  const std::vector<float> logits = golden_floats(model, "seq_a.logits");
  const int64_t vocab = static_cast<int64_t>(logits.size() / ids.size());
  std::vector<double> out;
  for (size_t t = 1; t < ids.size(); ++t) {
    const float* row = logits.data() + (t - 1) * vocab;
    double mx = row[0], sum = 0;
    for (int64_t v = 0; v < vocab; ++v) mx = std::max<double>(mx, row[v]);
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - mx);
    out.push_back(row[ids[t]] - mx - std::log(sum));
  }
  return out;
}

TEST_F(EngineTest, PromptLogprobsEqualTransformersUnderEveryBudgetCacheAndPreemption) {
  // The fixture sequence scored from several first tokens, concurrently with generating requests
  // that share its prefix, under row budgets that cut chunks, pages of 2 and a pool that preempts.
  for (const char* m : {"tiny-llama", "tiny-qwen2"}) {
    load(m);
    const std::vector<int32_t> ids = golden_ints(m, "seq_a.input_ids");
    const std::vector<double> ref = reference_prompt_logprobs(m, ids);
    const int32_t n = static_cast<int32_t>(ids.size());
    for (const auto& [rows, kv_tokens] : {std::pair{3, 4096}, std::pair{64, 4096}, std::pair{5, n + 8}}) {
      EngineOptions o;
      o.max_score_rows = rows;
      o.max_step_tokens = 16;
      o.max_running = 8;
      o.page_size = 2;
      o.kv_tokens = kv_tokens;
      std::unique_ptr<Engine> e = engine(o);
      ASSERT_TRUE(e);
      std::vector<std::pair<int32_t, std::shared_ptr<RequestStream>>> scored;
      std::vector<std::shared_ptr<RequestStream>> others;
      for (int32_t from : {1, n / 2, n - 1, 1, 5}) {
        GenerationRequest r;
        r.prompt = ids;
        r.prompt_logprobs_from = from;
        r.max_tokens = from == 5 ? 4 : 0;  // one also generates after its prompt
        r.ignore_eos = true;
        Result<std::shared_ptr<RequestStream>> s = e->submit(r);
        ASSERT_TRUE(s.ok()) << s.status().message();
        scored.emplace_back(from, *s);
        GenerationRequest g;  // a generating request sharing the prefix
        g.prompt.assign(ids.begin(), ids.begin() + from + 1);
        g.max_tokens = 6;
        g.ignore_eos = true;
        others.push_back(*e->submit(g));
      }
      for (auto& [from, s] : scored) {
        Outcome got = drain(*s);
        ASSERT_EQ(static_cast<int32_t>(got.prompt_logprobs.size()), n - from) << m << " from " << from;
        for (int32_t t = from; t < n; ++t)
          EXPECT_NEAR(got.prompt_logprobs[t - from], ref[t - 1], 1e-4 * std::max(1.0, std::fabs(ref[t - 1])))
              << m << " rows " << rows << " from " << from << " token " << t;
        EXPECT_EQ(got.finish_reason, "length");
        EXPECT_EQ(got.ids.size(), from == 5 ? 4u : 0u);
        EXPECT_EQ(got.usage.completion_tokens, from == 5 ? 4 : 0);
      }
      for (auto& s : others) EXPECT_EQ(drain(*s).ids.size(), 6u);
      if (kv_tokens < 4096) {
        EXPECT_GT(e->stats().preemptions, 0) << m;
      }
      if (rows == 64) {
        EXPECT_GT(e->stats().prefix_hit_tokens, 0) << m;
      }
    }
  }
}

TEST_F(EngineTest, PromptLogprobRequestsAreCheckedAtSubmit) {
  load("tiny-llama");
  EngineOptions o;
  o.kv_tokens = 1024;
  std::unique_ptr<Engine> off = engine(o);
  GenerationRequest r;
  r.prompt = {5, 6, 7};
  r.prompt_logprobs_from = 1;
  Result<std::shared_ptr<RequestStream>> s = off->submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("max_score_rows"), std::string::npos) << s.status().message();
  o.max_score_rows = 16;
  std::unique_ptr<Engine> on = engine(o);
  for (int32_t bad : {-1, 3, 100}) {
    r.prompt_logprobs_from = bad;
    s = on->submit(r);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.status().message().find("prompt_logprobs_from"), std::string::npos) << s.status().message();
  }
  r.prompt_logprobs_from = 2;
  r.max_tokens = 0;
  s = on->submit(r);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(drain(**s).prompt_logprobs.size(), 1u);
}

TEST_F(EngineTest, CancelFreesTheRequestAndOthersGoOn) {
  load("tiny-llama");
  EngineOptions o;
  o.kv_tokens = 1024;
  o.prefix_cache = false;
  std::unique_ptr<Engine> e = engine(o);
  GenerationRequest longer;
  longer.prompt = {5, 6, 7};
  longer.max_tokens = 200;
  longer.ignore_eos = true;
  GenerationRequest shorter = longer;
  shorter.max_tokens = 5;
  std::shared_ptr<RequestStream> a = *e->submit(longer), b = *e->submit(shorter);
  ASSERT_TRUE(a->next().has_value());  // running
  e->cancel(a->id());
  Outcome rest = drain(*a);
  EXPECT_EQ(rest.finish_reason, "abort");
  Outcome other = drain(*b);
  EXPECT_EQ(other.ids.size(), 5u);
  EXPECT_EQ(other.finish_reason, "length");
  for (int i = 0; i < 100 && e->stats().kv_pages_used > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(e->stats().kv_pages_used, 0);
  e->cancel(12345);  // unknown ids are ignored
}

TEST_F(EngineTest, BadRequestsAreRefusedAndTheEngineKeepsServing) {
  load("tiny-llama");
  EngineOptions o;
  o.kv_tokens = 128;
  std::unique_ptr<Engine> e = engine(o);
  auto refused = [&](GenerationRequest r, const std::string& words) {
    Result<std::shared_ptr<RequestStream>> s = e->submit(r);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find(words), std::string::npos) << s.status().message();
  };
  GenerationRequest ok;
  ok.prompt = {1, 2, 3};
  ok.max_tokens = 4;
  GenerationRequest r = ok;
  r.prompt.clear();
  refused(r, "empty");
  r = ok, r.prompt = {1, 384};
  refused(r, "vocabulary");
  r = ok, r.max_tokens = 126;
  refused(r, "KV pool");
  r = ok, r.max_tokens = -1;
  refused(r, "max_tokens");
  r = ok, r.temperature = -1;
  refused(r, "temperature");
  r = ok, r.top_p = 0;
  refused(r, "top_p");
  r = ok, r.min_p = 2;
  refused(r, "min_p");
  r = ok, r.repetition_penalty = 0;
  refused(r, "repetition_penalty");
  r = ok, r.top_logprobs = 21;
  refused(r, "top_logprobs");
  r = ok, r.stop = {"x"};
  refused(r, "tokenizer");
  r = ok, r.stop_token_ids = {-1};
  refused(r, "stop token");
  Result<std::shared_ptr<RequestStream>> s = e->submit(ok);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(drain(**s).usage.completion_tokens, 4);
  GenerationRequest zero = ok;
  zero.max_tokens = 0;
  Outcome z = drain(**e->submit(zero));
  EXPECT_TRUE(z.ids.empty());
  EXPECT_EQ(z.finish_reason, "length");
}

TEST_F(EngineTest, ContextLimitIsTheModels) {
  load("tiny-llama");  // max_position_embeddings 256
  EngineOptions o;
  o.kv_tokens = 4096;
  std::unique_ptr<Engine> e = engine(o);
  EXPECT_EQ(e->max_sequence_tokens(), 256);
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.max_tokens = 254;
  Result<std::shared_ptr<RequestStream>> s = e->submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("context"), std::string::npos) << s.status().message();
}

// The automatic step budgets on the CPU: 8192 tokens (never below max_running), the mixed budget
// within them; the automatic page size 16; explicit values as given.
TEST_F(EngineTest, StepBudgetsAndPageSizeResolveForTheCpu) {
  load("tiny-llama");
  // The (max_step_tokens, mixed_step_tokens) an engine made with `o` runs with.
  auto budgets = [&](const EngineOptions& o) {
    std::unique_ptr<Engine> e = engine(o);
    return std::make_pair(e->options().max_step_tokens, e->options().mixed_step_tokens);
  };
  EngineOptions o;
  o.kv_tokens = 4096;
  EXPECT_EQ(budgets(o), std::make_pair(8192, 8192));
  o.max_running = 10000;
  EXPECT_EQ(budgets(o), std::make_pair(10000, 10000));  // both raised to max_running
  o.max_running = 4;
  o.max_step_tokens = 100;
  o.mixed_step_tokens = 50;
  EXPECT_EQ(budgets(o), std::make_pair(100, 50));
  o.mixed_step_tokens = 500;
  EXPECT_EQ(budgets(o), std::make_pair(100, 100));  // lowered to max_step_tokens
  // The page size: 16 on the CPU unless given; what the engine runs with is what it reports.
  EXPECT_EQ(engine(o)->options().page_size, 16);
  EXPECT_EQ(engine(o)->stats().kv_page_size, 16);
  o.page_size = 5;
  EXPECT_EQ(engine(o)->options().page_size, 5);
  EXPECT_EQ(engine(o)->stats().kv_page_size, 5);
}

// YaRN over 64 pretraining positions x 4: the engine runs 256 (max_position_embeddings is 64), and
// a prompt past 64 decodes the tokens the reference's full forward picks.
TEST_F(EngineTest, YarnContextIsTheExtendedOne) {
  load("tiny-qwen3-yarn");
  EngineOptions o;
  o.kv_tokens = 1024;
  std::unique_ptr<Engine> e = engine(o);
  EXPECT_EQ(e->max_sequence_tokens(), 256);
  GenerationRequest r;
  r.prompt = golden_ints("tiny-qwen3-yarn", "seq_a.input_ids");  // 150 tokens
  r.prompt.pop_back();
  r.max_tokens = 1;
  r.ignore_eos = true;
  Outcome out = drain(**e->submit(r));
  const std::vector<float> logits = golden_floats("tiny-qwen3-yarn", "seq_a.logits");
  const int64_t vocab = 384, row = static_cast<int64_t>(r.prompt.size()) - 1;
  const auto first = logits.begin() + row * vocab;
  ASSERT_EQ(out.ids.size(), 1u);
  EXPECT_EQ(out.ids[0], std::max_element(first, first + vocab) - first);
  r.max_tokens = 256 - static_cast<int32_t>(r.prompt.size()) + 1;
  Result<std::shared_ptr<RequestStream>> refused = e->submit(r);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("model's context of 256 tokens"), std::string::npos)
      << refused.status().message();
}

TEST_F(EngineTest, SteadyStateDecodeAllocatesNothing) {
  load("tiny-llama");
  EngineOptions o;
  o.kv_tokens = 1024;
  o.max_running = 4;
  o.max_step_tokens = 64;
  std::unique_ptr<Engine> e = engine(o);
  GenerationRequest r;
  r.prompt = {4, 5, 6, 7};
  r.max_tokens = 120;
  r.ignore_eos = true;
  r.temperature = 0.8f;
  r.top_p = 0.9f;
  r.frequency_penalty = 0.3f;
  r.logprobs = true;
  r.top_logprobs = 2;
  std::shared_ptr<RequestStream> s = *e->submit(r);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(s->next().has_value());  // prefill and warm decode steps
  const int64_t before = be_->allocation_count();
  for (int i = 0; i < 80; ++i) ASSERT_TRUE(s->next().has_value());
  EXPECT_EQ(be_->allocation_count(), before) << "decode steps allocated device memory";
  drain(*s);
}

}  // namespace
}  // namespace kiln::test
