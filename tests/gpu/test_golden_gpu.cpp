// The CUDA (bf16) model against Hugging Face transformers (f32): logits within 2e-2 relative
// error and identical greedy tokens, also through the captured-graph decode path.
#include <gtest/gtest.h>

#include <cstring>

#include "golden.h"
#include "test_util.h"

namespace kiln::test {

TEST(GoldenGpu, TinyLlama) {
  KILN_REQUIRE_GPU(be);
  check_golden_model(*be, "tiny-llama", 2e-2);
}

TEST(GoldenGpu, TinyQwen2) {
  KILN_REQUIRE_GPU(be);
  check_golden_model(*be, "tiny-qwen2", 2e-2);
}

// The fixtures of tests/reference/make_model_fixtures.py. tiny-qwen3's very first greedy step is a
// near-tie in the reference (logits 0.0006 apart at a scale of 1.7), which bf16 cannot resolve, so
// tokens are compared up to the first such tie; logits are compared at every step before it and in
// full forwards over the reference continuation.
TEST(GoldenGpu, MoreArchitectures) {
  KILN_REQUIRE_GPU(be);
  for (const char* model : {"tiny-qwen3", "tiny-mistral", "tiny-llama-biased", "tiny-qwen2-bf16"}) {
    SCOPED_TRACE(model);
    check_golden_model(*be, model, 2e-2, GreedyCheck::until_near_tie);
  }
}

}  // namespace kiln::test

#include "infer/generator.h"
#include "model/transformer.h"

namespace kiln::test {

// Replaying captured decode steps must give bit-identical logits to running them eagerly.
TEST(GeneratorGpu, GraphReplayIsBitExact) {
  KILN_REQUIRE_GPU(be);
  Result<std::unique_ptr<Transformer>> m = Transformer::load(*be, testdata_dir() + "/tiny-llama");
  ASSERT_TRUE(m.ok()) << m.status().message();
  std::vector<int32_t> prompt = golden_ints("tiny-llama", "seq_a.input_ids");
  auto run = [&](bool graphs) {
    std::vector<float> all;
    Result<std::unique_ptr<Generator>> g = Generator::create(**m, 600);
    KILN_ASSERT(g.ok());
    GenerateOptions o;
    o.max_new_tokens = 300;  // crosses the 256-token context bucket
    o.use_graphs = graphs;
    o.sampling.temperature = 0.8f;
    ops::set_sampling_seed(o.sampling, 5);
    Result<GenerateResult> r = (*g)->generate(prompt, o, nullptr, [&](const float* l, int64_t n) {
      all.insert(all.end(), l, l + n);
    });
    KILN_ASSERT(r.ok());
    return std::make_pair(r->tokens, all);
  };
  auto eager = run(false);
  auto graphs = run(true);
  EXPECT_EQ(eager.first, graphs.first);
  ASSERT_EQ(eager.second.size(), graphs.second.size());
  EXPECT_EQ(0, std::memcmp(eager.second.data(), graphs.second.data(), eager.second.size() * sizeof(float)));
}

}  // namespace kiln::test
