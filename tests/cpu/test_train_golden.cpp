// Training against the Hugging Face reference on the CPU in f32: the loss, every parameter's
// gradient, the parameters after one AdamW step and the loss after it (tiny-llama: GQA, llama3
// RoPE, untied head; tiny-qwen2: q/k/v biases, tied embeddings), and a packed row of three
// documents whose attention must not cross document boundaries (tiny-llama-packed).
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "golden.h"

namespace kiln::test {
namespace {

// The fixture README's fp32 tolerances: 1e-5 for the loss (like logits), 1e-4 for gradients and
// updated parameters.
constexpr TrainingTolerances kCpuF32{1e-5, 1e-4, 1e-4};

TEST(TrainGolden, TinyLlamaLossGradsAdamW) {
  auto be = make_cpu_backend();
  check_training_golden(*be, "tiny-llama", "tiny-llama/golden.safetensors", "train", kCpuF32);
}

TEST(TrainGolden, TinyQwen2LossGradsAdamW) {
  auto be = make_cpu_backend();
  check_training_golden(*be, "tiny-qwen2", "tiny-qwen2/golden.safetensors", "train", kCpuF32);
}

TEST(TrainGolden, TinyLlamaPackedDocuments) {
  auto be = make_cpu_backend();
  check_training_golden(*be, "tiny-llama", "tiny-llama-packed/packed.safetensors", "packed", kCpuF32);
}

}  // namespace
}  // namespace kiln::test
