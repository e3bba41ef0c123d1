// The engine on CUDA (bf16): batched requests agree with each request run alone within bf16
// tolerance, and steady-state decode (graph replay) allocates no device memory.
#include <gtest/gtest.h>

#include <cmath>

#include "golden.h"
#include "infer/engine.h"
#include "kernels/rng.h"
#include "test_util.h"

namespace kiln::test {
namespace {

struct Generated {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
};

Generated drain(RequestStream& s) {
  Generated r;
  while (std::optional<EngineEvent> e = s.next())
    for (const GeneratedToken& t : e->tokens) r.ids.push_back(t.id), r.logprobs.push_back(t.logprob);
  return r;
}

GenerationRequest greedy_request(int i, int64_t vocab) {
  GenerationRequest r;
  const int32_t len = 3 + (i * 37) % 90;
  for (int32_t t = 0; t < len; ++t) r.prompt.push_back(3 + static_cast<int32_t>(rng::uniform(i, t) * (vocab - 3)));
  r.max_tokens = 8 + i % 17;
  r.ignore_eos = true;
  r.logprobs = true;
  return r;
}

TEST(EngineGpu, BatchedAgreesWithAloneWithinBf16Tolerance) {
  KILN_REQUIRE_GPU(be);
  for (const char* name : {"tiny-llama", "tiny-qwen3"}) {
    Result<std::unique_ptr<Transformer>> m = Transformer::load(*be, testdata_dir() + "/" + name);
    ASSERT_TRUE(m.ok()) << m.status().message();
    std::shared_ptr<const Transformer> model(std::move(m).value());
    const int64_t vocab = model->config().vocab_size;
    EngineOptions o;
    o.kv_tokens = 8192;
    o.max_running = 16;
    o.max_step_tokens = 128;
    Result<std::unique_ptr<Engine>> batched = Engine::create(model, nullptr, {}, o);
    ASSERT_TRUE(batched.ok()) << batched.status().message();
    const int n = 24;
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < n; ++i) streams.push_back(*(*batched)->submit(greedy_request(i, vocab)));
    std::vector<Generated> together;
    for (auto& s : streams) together.push_back(drain(*s));
    EngineOptions one = o;
    one.max_running = 1;
    Result<std::unique_ptr<Engine>> alone = Engine::create(model, nullptr, {}, one);
    ASSERT_TRUE(alone.ok());
    int identical = 0;
    double worst = 0;
    for (int i = 0; i < n; ++i) {
      Generated a = drain(**(*alone)->submit(greedy_request(i, vocab)));
      ASSERT_EQ(a.ids.size(), together[i].ids.size());
      size_t agree = 0;
      while (agree < a.ids.size() && a.ids[agree] == together[i].ids[agree]) ++agree;
      identical += agree == a.ids.size();
      // Log-probs of the shared prefix of tokens (and of the first differing one) agree within bf16.
      for (size_t t = 0; t < std::min(agree + 1, a.ids.size()); ++t)
        worst = std::max(worst, std::fabs(static_cast<double>(a.logprobs[t] - together[i].logprobs[t])) /
                                    std::max(1.0, std::fabs(static_cast<double>(a.logprobs[t]))));
    }
    EXPECT_LE(worst, 3e-2) << name;
    // bf16 rounding depends on the batch shape, so a near-tie may flip; almost all must agree.
    EXPECT_GE(identical, n - 2) << name;
  }
}

TEST(EngineGpu, SteadyStateDecodeAllocatesNothing) {
  KILN_REQUIRE_GPU(be);
  Result<std::unique_ptr<Transformer>> m = Transformer::load(*be, testdata_dir() + "/tiny-llama");
  ASSERT_TRUE(m.ok());
  std::shared_ptr<const Transformer> model(std::move(m).value());
  EngineOptions o;
  o.kv_tokens = 4096;
  o.max_running = 8;
  o.max_step_tokens = 256;
  Result<std::unique_ptr<Engine>> e = Engine::create(model, nullptr, {}, o);
  ASSERT_TRUE(e.ok());
  GenerationRequest r = greedy_request(1, model->config().vocab_size);
  r.max_tokens = 150;
  r.temperature = 0.7f;
  r.top_k = 20;
  r.repetition_penalty = 1.1f;
  r.top_logprobs = 3;
  std::vector<std::shared_ptr<RequestStream>> s;
  for (int i = 0; i < 4; ++i) {
    r.seed = static_cast<uint64_t>(i);
    s.push_back(*(*e)->submit(r));
  }
  for (int k = 0; k < 20; ++k)
    for (auto& x : s) ASSERT_TRUE(x->next().has_value());  // prefill, graph capture, warm decode
  const int64_t before = be->allocation_count();
  for (int k = 0; k < 100; ++k)
    for (auto& x : s) ASSERT_TRUE(x->next().has_value());
  EXPECT_EQ(be->allocation_count(), before);
  EXPECT_GT((*e)->stats().graph_replays, 50);
  for (auto& x : s) drain(*x);
}

}  // namespace
}  // namespace kiln::test
