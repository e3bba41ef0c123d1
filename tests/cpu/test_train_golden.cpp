// Training against the Hugging Face reference on the CPU in f32: the loss, every parameter's
// gradient, the parameters after one AdamW step and the loss after it (tiny-llama: GQA, llama3
// RoPE, untied head; tiny-qwen2: q/k/v biases, tied embeddings), and a packed row of three
// documents whose attention must not cross document boundaries (tiny-llama-packed).
#include <algorithm>
#include <gtest/gtest.h>

#include <map>

#include <cmath>

#include "backend/backend.h"
#include "golden.h"
#include "test_util.h"
#include "model/config.h"
#include "train/data.h"
#include "train/parameters.h"
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

// More architectures (tests/reference/make_train_fixtures.py): q/k norms with head_dim != hidden /
// heads and one KV head (tiny-qwen3), q/k/v/o and MLP biases with linear RoPE (tiny-llama-biased),
// Mistral with a sharded checkpoint; and for tiny-llama a padded batch of rows of 11, 16 and 5 tokens
// and a loss with label smoothing 0.1.
TEST(TrainGolden, TinyQwen3QkNorm) {
  auto be = make_cpu_backend();
  check_training_golden(*be, "tiny-qwen3", "tiny-qwen3/train_golden.safetensors", "train", kCpuF32);
}

TEST(TrainGolden, TinyLlamaBiased) {
  auto be = make_cpu_backend();
  check_training_golden(*be, "tiny-llama-biased", "tiny-llama-biased/train_golden.safetensors", "train", kCpuF32);
}

// YaRN (tests/reference/make_rope_fixtures.py): rows of 120 tokens, past the 64 pretraining positions.
TEST(TrainGolden, TinyQwen3Yarn) {
  auto be = make_cpu_backend();
  check_training_golden(*be, "tiny-qwen3-yarn", "tiny-qwen3-yarn/train_golden.safetensors", "train", kCpuF32);
}

TEST(TrainGolden, TinyMistral) {
  auto be = make_cpu_backend();
  check_training_golden(*be, "tiny-mistral", "tiny-mistral/train_golden.safetensors", "train", kCpuF32);
}

TEST(TrainGolden, TinyLlamaPaddedBatch) {
  auto be = make_cpu_backend();
  check_training_golden(*be, "tiny-llama", "tiny-llama/train_golden.safetensors", "ragged", kCpuF32);
}

TEST(TrainGolden, TinyLlamaLabelSmoothing) {
  auto be = make_cpu_backend();
  check_training_golden(*be, "tiny-llama", "tiny-llama/train_golden.safetensors", "smooth", kCpuF32);
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

// Gradient accumulation: two micro-batches of one row each, scaled by the labelled tokens of the
// whole step, give the gradients of the one two-row batch (the reference's).
TEST(TrainGolden, GradientAccumulationMatchesOneBatch) {
  auto be = make_cpu_backend();
  Result<std::unique_ptr<TrainModel>> loaded = TrainModel::load(*be, testdata_dir() + "/tiny-llama", {});
  ASSERT_TRUE(loaded.ok());
  TrainModel& m = **loaded;
  const std::vector<int32_t> ids = golden_ints("tiny-llama", "train.input_ids");
  const std::vector<int32_t> labels = golden_ints("tiny-llama", "train.labels");
  std::vector<TrainExample> rows(2);
  for (int r = 0; r < 2; ++r) {
    rows[r].input_ids.assign(ids.begin() + 16 * r, ids.begin() + 16 * (r + 1));
    rows[r].labels.assign(labels.begin() + 16 * r, labels.begin() + 16 * (r + 1));
  }
  const HostBatch first = make_host_batch({&rows[0]}), second = make_host_batch({&rows[1]});
  const float scale = 1.0f / static_cast<float>(first.labelled() + second.labelled());
  double loss_sum = 0;
  for (const HostBatch* hb : {&first, &second}) {
    Result<DeviceBatch> db = m.upload(*hb);
    ASSERT_TRUE(db.ok());
    Result<double> sum = m.forward_backward(*db, scale);
    ASSERT_TRUE(sum.ok());
    loss_sum += *sum;
  }
  EXPECT_LE(rel_error({static_cast<float>(loss_sum * scale)}, golden_floats("tiny-llama", "train.loss")), 1e-5);
  const ParameterSet& P = m.params();
  for (const HfTensor& t : P.layout().hf)
    EXPECT_LE(rel_error(to_f32(*be, P.hf_view(P.grads(), t)), golden_floats("tiny-llama", "grad." + t.name)), 1e-4)
        << t.name;
}

// The parameter layout: Hugging Face names are views of kiln's fused tensors, the default no-decay
// set is norms, biases and embeddings (decayed tensors first), and an expression that would split a
// fused tensor is refused.
TEST(TrainGolden, ParameterLayoutAndNoDecay) {
  auto be = make_cpu_backend();
  Result<ModelConfig> c = load_model_config(testdata_dir() + "/tiny-qwen2");
  ASSERT_TRUE(c.ok());
  Result<ParameterSet> p = ParameterSet::create(*be, *c, kDefaultNoDecay, false);
  ASSERT_TRUE(p.ok()) << p.status().message();
  int64_t real = 0;
  for (const auto& [name, shape] : p->layout().fused) {
    const Tensor t = p->master(name);
    const int64_t offset = (static_cast<float*>(t.data) - p->master().ptr<float>());
    const bool exempt = name.find("norm") != std::string::npos || name.find("bias") != std::string::npos ||
                        name == "embed_tokens";
    EXPECT_EQ(offset < p->decay_end(), !exempt) << name;
    EXPECT_EQ(offset % 128, 0) << name;
    real += shape.numel();
  }
  EXPECT_EQ(real, p->parameter_count());
  for (const std::string& n : p->no_decay_names())
    EXPECT_TRUE(n.find("norm") != std::string::npos || n.find(".bias") != std::string::npos ||
                n.find("embed_tokens") != std::string::npos)
        << n;
  Result<ParameterSet> all = ParameterSet::create(*be, *c, "", false);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->decay_end(), all->size());
  EXPECT_TRUE(all->no_decay_names().empty());
  Result<ParameterSet> split = ParameterSet::create(*be, *c, "k_proj", false);
  ASSERT_FALSE(split.ok());
  EXPECT_NE(split.status().message().find("k_proj"), std::string::npos) << split.status().message();
}

// The flat layout for data parallelism: padded into equal shards, and the gradient buckets (each
// layer's ranges and the rest) cover [0, N) exactly once, every layer's tensors inside its ranges.
TEST(TrainGolden, ShardsAndLayerRanges) {
  auto be = make_cpu_backend();
  Result<ModelConfig> c = load_model_config(testdata_dir() + "/tiny-qwen2");
  ASSERT_TRUE(c.ok());
  Result<ParameterSet> one = ParameterSet::create(*be, *c, kDefaultNoDecay, false);
  ASSERT_TRUE(one.ok());
  for (int32_t shards : {1, 2, 3, 7}) {
    Result<ParameterSet> p = ParameterSet::create(*be, *c, kDefaultNoDecay, false, shards);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->size() % (128 * shards), 0) << shards;
    EXPECT_GE(p->size(), one->size());
    EXPECT_LT(p->size(), one->size() + 128 * shards);  // padding only at the end
    EXPECT_EQ(p->shard_size() * shards, p->size());
    EXPECT_EQ(p->decay_end(), one->decay_end());
    std::vector<int> cover(static_cast<size_t>(p->size()), 0);
    auto mark = [&](const std::vector<std::pair<int64_t, int64_t>>& ranges) {
      for (const auto& [b, e] : ranges)
        for (int64_t i = b; i < e; ++i) ++cover[static_cast<size_t>(i)];
    };
    for (int64_t l = 0; l < c->num_hidden_layers; ++l) {
      mark(p->layer_ranges(l));
      for (const auto& [name, shape] : p->layout().fused) {
        if (name.rfind("layers." + std::to_string(l) + ".", 0) != 0) continue;
        const int64_t offset = static_cast<float*>(p->master(name).data) - p->master().ptr<float>();
        bool inside = false;
        for (const auto& [b, e] : p->layer_ranges(l)) inside = inside || (b <= offset && offset + shape.numel() <= e);
        EXPECT_TRUE(inside) << name;
      }
    }
    mark(p->non_layer_ranges());
    EXPECT_EQ(std::count(cover.begin(), cover.end(), 1), static_cast<int64_t>(cover.size())) << shards;
  }
}

// ZeRO-2's sharded gradients: the shard holds the accumulated gradients of its elements only; the
// backward's scratch gives layers of the same parity one buffer, the other tensors another, each
// tensor's gradient inside the spans of its layer, with the spans covering [0, N) once.
TEST(TrainGolden, ShardedGradientsAndTheirScratch) {
  auto be = make_cpu_backend();
  Result<ModelConfig> c = load_model_config(testdata_dir() + "/tiny-qwen2");
  ASSERT_TRUE(c.ok());
  ASSERT_GE(c->num_hidden_layers, 2);
  Result<ParameterSet> p = ParameterSet::create(*be, *c, kDefaultNoDecay, false, 3);
  ASSERT_TRUE(p.ok());
  const int64_t begin = p->shard_size(), end = 2 * p->shard_size();  // rank 1 of 3
  ASSERT_TRUE(p->shard_gradients(*be, begin, end).ok());
  EXPECT_TRUE(p->gradients_sharded());
  EXPECT_EQ(p->grad_rows(begin, end).numel(), end - begin);
  std::vector<int> cover(static_cast<size_t>(p->size()), 0);
  std::map<int64_t, const void*> first_scratch;  // layer parity -> its buffer's start
  for (int64_t layer = -1; layer < c->num_hidden_layers; ++layer) {
    const std::vector<ParameterSet::GradientSpan> spans = p->gradient_spans(layer);
    ASSERT_FALSE(spans.empty()) << layer;
    const char* base = static_cast<const char*>(spans.front().scratch.data);
    for (const ParameterSet::GradientSpan& s : spans) {
      EXPECT_EQ(s.scratch.numel(), s.end - s.begin);
      for (int64_t i = s.begin; i < s.end; ++i) ++cover[static_cast<size_t>(i)];
      base = std::min(base, static_cast<const char*>(s.scratch.data));
    }
    if (layer >= 0) {
      auto [it, fresh] = first_scratch.emplace(layer % 2, base);
      EXPECT_EQ(it->second, base) << "layer " << layer << " shares its parity's buffer";
    }
    for (const auto& [name, shape] : p->layout().fused) {
      const bool in_layer = name.rfind("layers.", 0) == 0;
      if (layer >= 0 ? name.rfind("layers." + std::to_string(layer) + ".", 0) != 0 : in_layer) continue;
      const Tensor g = p->grad(name);
      EXPECT_EQ(g.shape, shape) << name;
      bool inside = false;
      for (const ParameterSet::GradientSpan& s : spans) {
        const char* lo = static_cast<const char*>(s.scratch.data);
        const char* at = static_cast<const char*>(g.data);
        inside = inside || (lo <= at && at + g.nbytes() <= lo + s.scratch.nbytes());
      }
      EXPECT_TRUE(inside) << name;
    }
  }
  EXPECT_NE(first_scratch[0], first_scratch[1]);
  EXPECT_EQ(std::count(cover.begin(), cover.end(), 1), static_cast<int64_t>(cover.size()));
}

}  // namespace
}  // namespace kiln::test
