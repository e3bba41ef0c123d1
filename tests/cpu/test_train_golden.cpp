// Training against the Hugging Face reference on the CPU in f32: the loss, every parameter's
// gradient, the parameters after one AdamW step and the loss after it (tiny-llama: GQA, llama3
// RoPE, untied head; tiny-qwen2: q/k/v biases, tied embeddings), and a packed row of three
// documents whose attention must not cross document boundaries (tiny-llama-packed).
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "golden.h"
#include "test_util.h"
#include "train/data.h"
#include "train/train_model.h"

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

// Per-token log-probabilities through the training path (the fused head, no gradient) against the
// log-softmax of the reference logits of seq_a.
TEST(TrainGolden, TargetLogprobsMatchReferenceLogits) {
  auto be = make_cpu_backend();
  Result<std::unique_ptr<TrainModel>> m = TrainModel::load(*be, testdata_dir() + "/tiny-llama", {});
  ASSERT_TRUE(m.ok()) << m.status().message();
  const std::vector<int32_t> ids = golden_ints("tiny-llama", "seq_a.input_ids");
  const std::vector<float> logits = golden_floats("tiny-llama", "seq_a.logits");
  const int64_t n = static_cast<int64_t>(ids.size()), V = (*m)->config().vocab_size;
  TrainExample ex;
  ex.input_ids = ids;
  const HostBatch hb = make_host_batch({&ex});
  Result<DeviceBatch> db = (*m)->upload(hb);
  ASSERT_TRUE(db.ok());
  Result<std::vector<float>> lp = (*m)->target_logprobs(*db);
  ASSERT_TRUE(lp.ok()) << lp.status().message();
  ASSERT_EQ(static_cast<int64_t>(lp->size()), n - 1);
  std::vector<float> ref;
  for (int64_t t = 0; t + 1 < n; ++t) {
    const float* row = logits.data() + t * V;
    double mx = row[0], sum = 0;
    for (int64_t v = 1; v < V; ++v) mx = std::max<double>(mx, row[v]);
    for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
    ref.push_back(static_cast<float>(row[ids[t + 1]] - mx - std::log(sum)));
  }
  EXPECT_LE(rel_error(*lp, ref), 1e-5);
}

}  // namespace
}  // namespace kiln::test
