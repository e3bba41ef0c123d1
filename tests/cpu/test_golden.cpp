// The CPU (f32) model against Hugging Face transformers: logits within 1e-5 relative error,
// identical greedy tokens, and incremental decode logits equal to the full forward's.
#include <gtest/gtest.h>

#include "golden.h"

namespace kiln::test {

TEST(GoldenCpu, TinyLlama) {
  auto be = make_cpu_backend();
  check_golden_model(*be, "tiny-llama", 1e-5);
}

TEST(GoldenCpu, TinyQwen2) {
  auto be = make_cpu_backend();
  check_golden_model(*be, "tiny-qwen2", 1e-5);
}

// Made by tests/reference/make_model_fixtures.py (transformers 5.17): more architectures and
// checkpoint forms.
TEST(GoldenCpu, TinyQwen3QkNormExplicitHeadDim) {
  auto be = make_cpu_backend();
  check_golden_model(*be, "tiny-qwen3", 1e-5);
}

TEST(GoldenCpu, TinyMistralSharded) {
  auto be = make_cpu_backend();
  check_golden_model(*be, "tiny-mistral", 1e-5);
}

TEST(GoldenCpu, TinyLlamaBiasesLinearRope) {
  auto be = make_cpu_backend();
  check_golden_model(*be, "tiny-llama-biased", 1e-5);
}

TEST(GoldenCpu, TinyQwen2StoredInBf16) {
  auto be = make_cpu_backend();
  check_golden_model(*be, "tiny-qwen2-bf16", 1e-5);
}

}  // namespace kiln::test
