// Activation recomputation (TrainModelOptions::recompute) on the CPU: forward_backward with it gives
// the same bits as without it, loss and every parameter gradient, because the backward recomputes
// each layer with the very function and inputs of the forward (train/train_model.h).
// Models: tiny-llama (GQA, untied head), tiny-qwen2 (q/k/v biases, tied embeddings), tiny-qwen3
// (q/k norms, one KV head), tiny-llama-biased (o and MLP biases too), and tiny-qwen3's shape with 5
// layers and random weights. Batches: plain rows, and packed documents with padded rows (segment
// mask); two micro-batches accumulate into the gradients.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kernels/rng.h"
#include "model/config.h"
#include "test_util.h"
#include "train/data.h"
#include "train/train_model.h"

namespace kiln::test {
namespace {

// Rows of seeded random ids. packed: row 0 holds three documents (positions restart at 0), row 1 is
// shorter than row 0 (padding), row 2 has two documents and is shorter still.
HostBatch make_batch(int64_t vocab, uint64_t seed, bool packed) {
  const std::vector<std::vector<int32_t>> docs =
      packed ? std::vector<std::vector<int32_t>>{{9, 7, 12}, {20}, {6, 5}} : std::vector<std::vector<int32_t>>{{24}, {24}};
  std::vector<TrainExample> rows(docs.size());
  uint64_t n = 0;
  for (size_t r = 0; r < docs.size(); ++r) {
    for (int32_t len : docs[r]) {
      for (int32_t t = 0; t < len; ++t) {
        rows[r].input_ids.push_back(static_cast<int32_t>(rng::splitmix64(seed * 7919 + n++) % static_cast<uint64_t>(vocab)));
        if (packed) rows[r].position_ids.push_back(t);
      }
    }
  }
  std::vector<const TrainExample*> ptrs;
  for (const TrainExample& e : rows) ptrs.push_back(&e);
  return make_host_batch(ptrs);
}

struct Outcome {
  std::vector<double> losses;
  std::vector<uint32_t> grad_bits;  // the flat f32 gradient buffer
};

// Two micro-batches through one model (gradients accumulated), as in a gradient-accumulation step.
Outcome train_step(TrainModel& m, const std::vector<HostBatch>& batches) {
  Outcome out;
  int64_t labelled = 0;
  for (const HostBatch& hb : batches) labelled += hb.labelled();
  for (const HostBatch& hb : batches) {
    Result<DeviceBatch> db = m.upload(hb);
    KILN_ASSERT(db.ok());
    Result<double> loss = m.forward_backward(*db, 1.0f / static_cast<float>(labelled));
    KILN_ASSERT(loss.ok());
    out.losses.push_back(*loss);
  }
  const Tensor g = m.params().grads();
  out.grad_bits.resize(static_cast<size_t>(g.numel()));
  std::memcpy(out.grad_bits.data(), g.data, static_cast<size_t>(g.nbytes()));
  return out;
}

// With and without recomputation on the same batches: bitwise equal losses and gradients.
void expect_same_bits(Backend& be, const std::function<std::unique_ptr<TrainModel>(const TrainModelOptions&)>& make,
                      bool packed) {
  TrainModelOptions plain_opt, recompute_opt;
  recompute_opt.recompute = true;
  std::unique_ptr<TrainModel> plain = make(plain_opt), recomputed = make(recompute_opt);
  const int64_t V = plain->config().vocab_size;
  const std::vector<HostBatch> batches = {make_batch(V, 11, packed), make_batch(V, 12, packed)};
  const Outcome a = train_step(*plain, batches), b = train_step(*recomputed, batches);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_GT(a.losses[i], 0.0);
    EXPECT_EQ(std::memcmp(&a.losses[i], &b.losses[i], sizeof(double)), 0)
        << "micro-batch " << i << ": loss " << a.losses[i] << " vs " << b.losses[i];
  }
  // Per Hugging Face tensor, for a message that names the first that differs.
  const ParameterSet& P = plain->params();
  for (const HfTensor& t : P.layout().hf) {
    const Tensor va = P.hf_view(plain->params().grads(), t), vb = P.hf_view(recomputed->params().grads(), t);
    ASSERT_EQ(va.nbytes(), vb.nbytes());
    EXPECT_EQ(std::memcmp(va.data, vb.data, static_cast<size_t>(va.nbytes())), 0) << "gradient of " << t.name;
    // Not trivially equal: every gradient is non-zero somewhere.
    const std::vector<float> f = to_f32(be, va);
    bool nonzero = false;
    for (float x : f) nonzero = nonzero || x != 0.0f;
    EXPECT_TRUE(nonzero) << t.name;
  }
  EXPECT_TRUE(a.grad_bits == b.grad_bits) << "flat gradient buffers differ";
}

std::function<std::unique_ptr<TrainModel>(const TrainModelOptions&)> fixture(Backend& be, const std::string& model) {
  return [&be, model](const TrainModelOptions& o) {
    Result<std::unique_ptr<TrainModel>> m = TrainModel::load(be, testdata_dir() + "/" + model, o);
    KILN_ASSERT(m.ok());
    return std::move(m).value();
  };
}

class Recompute : public ::testing::TestWithParam<std::string> {};

TEST_P(Recompute, PlainRowsBitwiseEqual) {
  auto be = make_cpu_backend();
  expect_same_bits(*be, fixture(*be, GetParam()), /*packed=*/false);
}

TEST_P(Recompute, PackedPaddedRowsBitwiseEqual) {
  auto be = make_cpu_backend();
  expect_same_bits(*be, fixture(*be, GetParam()), /*packed=*/true);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Recompute,
                         ::testing::Values("tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-llama-biased"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string s = p.param;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

// Five layers (every layer but the last is recomputed, the last reuses the forward's workspace).
TEST(RecomputeDeep, FiveLayersBitwiseEqual) {
  auto be = make_cpu_backend();
  Result<ModelConfig> c = load_model_config(testdata_dir() + "/tiny-qwen3");
  ASSERT_TRUE(c.ok());
  ModelConfig config = *c;
  config.num_hidden_layers = 5;
  auto make = [&](const TrainModelOptions& o) {
    TrainModelOptions opt = o;
    opt.random_seed = 77;
    Result<std::unique_ptr<TrainModel>> m = TrainModel::random(*be, config, opt);
    KILN_ASSERT(m.ok());
    return std::move(m).value();
  };
  expect_same_bits(*be, make, /*packed=*/true);
}

// Scoring runs the forward with one shared layer workspace: its log-probabilities are the token
// losses of the forward that keeps every layer (no label smoothing: loss = -log p, summed in
// double in row order by both).
TEST(RecomputeDeep, SharedWorkspaceForwardMatchesKeptForward) {
  auto be = make_cpu_backend();
  Result<std::unique_ptr<TrainModel>> m = TrainModel::load(*be, testdata_dir() + "/tiny-llama", {});
  ASSERT_TRUE(m.ok());
  const HostBatch hb = make_batch((*m)->config().vocab_size, 5, /*packed=*/true);
  Result<DeviceBatch> db = (*m)->upload(hb);
  ASSERT_TRUE(db.ok());
  Result<std::vector<float>> lp = (*m)->target_logprobs(*db);
  ASSERT_TRUE(lp.ok());
  ASSERT_EQ(static_cast<int64_t>(lp->size()), hb.labelled());
  Result<double> loss = (*m)->forward_backward(*db, 1.0f);
  ASSERT_TRUE(loss.ok());
  double sum = 0.0;
  for (float x : *lp) sum += static_cast<double>(-x);
  EXPECT_EQ(sum, *loss);
}

}  // namespace
}  // namespace kiln::test
