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

}  // namespace kiln::test
