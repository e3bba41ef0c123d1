// The engine on CUDA (bf16): batched requests agree with each request run alone up to near-ties and
// within bf16 tolerance, and steady-state decode (graph replay) allocates no device memory.
#include <gtest/gtest.h>

#include <cmath>

#include "golden.h"
#include "infer/engine.h"
#include "model/model_text.h"
#include "kernels/rng.h"
#include "test_util.h"

namespace kiln::test {
namespace {

struct Generated {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> top;  // the two most likely tokens at each step
};

Generated drain(RequestStream& s) {
  Generated r;
  while (std::optional<EngineEvent> e = s.next())
    for (const GeneratedToken& t : e->tokens) {
      r.ids.push_back(t.id), r.logprobs.push_back(t.logprob);
      r.top.push_back(t.top);
    }
  return r;
}

GenerationRequest greedy_request(int i, int64_t vocab) {
  GenerationRequest r;
  const int32_t len = 3 + (i * 37) % 90;
  for (int32_t t = 0; t < len; ++t) r.prompt.push_back(3 + static_cast<int32_t>(rng::uniform(i, t) * (vocab - 3)));
  r.max_tokens = 8 + i % 17;
  r.ignore_eos = true;
  r.logprobs = true;
  r.top_logprobs = 2;
  return r;
}

// Greedy tokens of each request run in a batch equal those of the request run alone up to the
// first near-tie of the alone run: where they differ, the batched token is the alone run's second
// choice and the two choices' log-probabilities are within bf16 tolerance (the batch shape changes
// bf16 rounding, so a near-tie may flip; anything else is a bug). Log-probs of the shared tokens,
// and of the first differing one, agree within bf16 tolerance.
TEST(EngineGpu, BatchedAgreesWithAloneWithinBf16Tolerance) {
  KILN_REQUIRE_GPU(be);
  const double tol = 3e-2;
  auto rel = [](double a, double b) { return std::fabs(a - b) / std::max(1.0, std::fabs(b)); };
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
    EXPECT_EQ((*batched)->options().page_size, 128);  // the automatic page size on CUDA
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
      SCOPED_TRACE(testing::Message() << name << " request " << i);
      Generated a = drain(**(*alone)->submit(greedy_request(i, vocab)));
      const Generated& b = together[i];
      ASSERT_EQ(a.ids.size(), b.ids.size());
      size_t agree = 0;
      while (agree < a.ids.size() && a.ids[agree] == b.ids[agree]) ++agree;
      identical += agree == a.ids.size();
      for (size_t t = 0; t < std::min(agree + 1, a.ids.size()); ++t) worst = std::max(worst, rel(b.logprobs[t], a.logprobs[t]));
      if (agree < a.ids.size()) {
        const auto& top = a.top[agree];
        ASSERT_EQ(top.size(), 2u);
        EXPECT_EQ(top[0].first, a.ids[agree]);
        EXPECT_EQ(top[1].first, b.ids[agree]) << "the batched token is not the alone run's second choice";
        EXPECT_LE(rel(top[1].second, top[0].second), tol) << "a flip away from a near-tie at token " << agree;
      }
    }
    EXPECT_LE(worst, tol) << name;
    EXPECT_GE(identical, n / 2) << name;  // near-ties are the exception
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
  const EngineStats st = (*e)->stats();
  EXPECT_GT(st.graph_replays, 50);
  // Four requests fill the bucket of four rows: those replays are the full-bucket ones.
  EXPECT_GT(st.full_bucket_replays, 50);
  EXPECT_LE(st.full_bucket_replays, st.graph_replays);
  EXPECT_GT(st.full_bucket_seconds, 0.0);
  EXPECT_LE(st.full_bucket_seconds, st.graph_device_seconds);
  for (auto& x : s) drain(*x);
}

// Structured outputs on CUDA: the token masks travel with the step's inputs and are applied by the
// masked graphs; greedy and sampled outputs of testdata/tiny-tools (bf16) are JSON objects of the
// schema, and decode steps replayed graphs while they ran.
TEST(EngineGpu, StructuredOutputsFollowTheSchema) {
  KILN_REQUIRE_GPU(be);
  Result<std::unique_ptr<Transformer>> m = Transformer::load(*be, testdata_dir() + "/tiny-tools");
  ASSERT_TRUE(m.ok()) << m.status().message();
  std::shared_ptr<const Transformer> model(std::move(m).value());
  Result<ModelText> text = ModelText::load(testdata_dir() + "/tiny-tools");
  ASSERT_TRUE(text.ok()) << text.status().message();
  EngineOptions o;
  o.kv_tokens = 16384;
  o.max_running = 8;
  Result<std::unique_ptr<Engine>> e = Engine::create(model, &text->tokenizer(), text->stop_ids(), o);
  ASSERT_TRUE(e.ok()) << e.status().message();
  Result<std::shared_ptr<const structured::JsonSchema>> schema = structured::JsonSchema::compile(nlohmann::json::parse(
      R"({"type": "object", "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "blue"]}}, "required": ["ok", "color"]})"));
  ASSERT_TRUE(schema.ok());
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    GenerationRequest r;
    r.prompt = *text->tokenizer().encode("Answer in JSON:", true);
    r.max_tokens = 300;
    r.temperature = seed == 0 ? 0.0f : 1.0f;
    r.seed = seed;
    r.json_schema = *schema;
    Result<std::shared_ptr<RequestStream>> s = (*e)->submit(r);
    ASSERT_TRUE(s.ok()) << s.status().message();
    streams.push_back(*s);
  }
  for (auto& s : streams) {
    std::string out, finish;
    while (std::optional<EngineEvent> ev = s->next()) {
      out += ev->text;
      if (ev->finished) finish = ev->finish_reason;
    }
    ASSERT_EQ(finish, "stop") << out;
    const nlohmann::json v = nlohmann::json::parse(out, nullptr, false);
    ASSERT_TRUE(v.is_object()) << out;
    EXPECT_EQ(v.size(), 2u) << out;
    EXPECT_TRUE(v["ok"].is_boolean()) << out;
    EXPECT_TRUE(v["color"] == "red" || v["color"] == "blue") << out;
  }
  EXPECT_GT((*e)->stats().graph_replays, 0);
}

}  // namespace
}  // namespace kiln::test
