// Training against the Hugging Face reference on the GPU in bf16 mixed precision (bf16 compute
// copy of the weights, f32 master weights, gradients and moments): the loss, every parameter's
// gradient (relative error <= 3e-2) and the parameters after one AdamW step (<= 1e-3), for the same
// fixtures as the CPU test, including the packed row of three documents.
#include <gtest/gtest.h>

#include <string>

#include "golden.h"
#include "test_util.h"

namespace kiln::test {
namespace {

// The bf16 tolerances for gradients (3e-2) and updated parameters (1e-3); the loss is a mean
// over many tokens of bf16 logits, held to 1e-2.
constexpr TrainingTolerances kGpuBf16{1e-2, 3e-2, 1e-3};

TEST(TrainGoldenGpu, TinyLlama) {
  KILN_REQUIRE_GPU(be);
  check_training_golden(*be, "tiny-llama", "tiny-llama/golden.safetensors", "train", kGpuBf16);
}

TEST(TrainGoldenGpu, TinyQwen2) {
  KILN_REQUIRE_GPU(be);
  check_training_golden(*be, "tiny-qwen2", "tiny-qwen2/golden.safetensors", "train", kGpuBf16);
}

TEST(TrainGoldenGpu, TinyLlamaPackedDocuments) {
  KILN_REQUIRE_GPU(be);
  check_training_golden(*be, "tiny-llama", "tiny-llama-packed/packed.safetensors", "packed", kGpuBf16);
}

TEST(TrainGoldenGpu, MoreArchitectures) {
  KILN_REQUIRE_GPU(be);
  for (const char* model : {"tiny-qwen3", "tiny-llama-biased", "tiny-mistral", "tiny-qwen3-yarn"})
    check_training_golden(*be, model, std::string(model) + "/train_golden.safetensors", "train", kGpuBf16);
}

TEST(TrainGoldenGpu, PaddedBatchAndLabelSmoothing) {
  KILN_REQUIRE_GPU(be);
  check_training_golden(*be, "tiny-llama", "tiny-llama/train_golden.safetensors", "ragged", kGpuBf16);
  check_training_golden(*be, "tiny-llama", "tiny-llama/train_golden.safetensors", "smooth", kGpuBf16);
}

}  // namespace
}  // namespace kiln::test
