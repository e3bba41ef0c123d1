// The model tensor table shared by inference and training: one random initialisation (the same
// config and seed give the same model in Transformer and TrainModel) and a Transformer that runs on
// borrowed views of a trainer's weights, giving the logits of the checkpoint it was loaded from.
#include <gtest/gtest.h>

#include "golden.h"
#include "model/tensor_table.h"
#include "model/transformer.h"
#include "test_util.h"
#include "train/train_model.h"

namespace kiln::test {
namespace {

TEST(TensorTable, OneRandomModelForInferenceAndTraining) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  for (const char* m : {"tiny-llama", "tiny-qwen3", "tiny-llama-biased"}) {
    Result<ModelConfig> c = load_model_config(testdata_dir() + "/" + m);
    ASSERT_TRUE(c.ok());
    Result<std::unique_ptr<Transformer>> inf = Transformer::random(*be, *c, 77);
    TrainModelOptions o;
    o.random_seed = 77;
    Result<std::unique_ptr<TrainModel>> train = TrainModel::random(*be, *c, o);
    ASSERT_TRUE(inf.ok() && train.ok());
    const ModelTensorLayout layout = model_tensor_layout(*c);
    const ModelWeights tw = (*train)->params().master_weights();
    for (const auto& [name, shape] : layout.fused) {
      EXPECT_EQ(to_f32(*be, (*inf)->weights().get(name)), to_f32(*be, tw.get(name))) << m << " " << name;
    }
    Result<std::unique_ptr<Transformer>> other_seed = Transformer::random(*be, *c, 78);
    EXPECT_NE(to_f32(*be, (*other_seed)->weights().get("embed_tokens")),
              to_f32(*be, (*inf)->weights().get("embed_tokens")));
  }
}

TEST(TensorTable, TransformerRunsOnATrainersWeights) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  for (const char* m : {"tiny-llama", "tiny-qwen2"}) {
    Result<std::unique_ptr<TrainModel>> train = TrainModel::load(*be, testdata_dir() + "/" + m, {});
    ASSERT_TRUE(train.ok()) << train.status().message();
    Result<std::unique_ptr<Transformer>> borrowed =
        Transformer::borrow(*be, (*train)->config(), (*train)->params().compute_weights());
    ASSERT_TRUE(borrowed.ok()) << borrowed.status().message();
    // The views are the trainer's memory, not copies.
    EXPECT_EQ((*borrowed)->weights().get("layers.0.qkv_proj").data,
              (*train)->params().weight("layers.0.qkv_proj").data);
    // And the model computes what transformers computed for the checkpoint.
    const std::vector<int32_t> ids = golden_ints(m, "seq_a.input_ids");
    const std::vector<float> want = golden_floats(m, "seq_a.logits");
    EXPECT_LE(rel_error(full_forward_logits(**borrowed, ids), want), 1e-4) << m;
  }
}

TEST(TensorTable, BorrowChecksTheTable) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  Result<ModelConfig> c = load_model_config(testdata_dir() + "/tiny-llama");
  ASSERT_TRUE(c.ok());
  Result<std::unique_ptr<Transformer>> m = Transformer::random(*be, *c, 1);
  ModelWeights w = (*m)->weights();
  w.set("final_norm", (*m)->weights().get("layers.0.qkv_proj"));  // wrong shape
  Result<std::unique_ptr<Transformer>> bad = Transformer::borrow(*be, *c, w);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("final_norm"), std::string::npos);
}

}  // namespace
}  // namespace kiln::test
