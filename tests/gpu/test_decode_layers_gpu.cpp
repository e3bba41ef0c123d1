// The small-batch decode forward on CUDA (the fused layers of kernels/ops.h, programmatically
// launched, kernels/cuda/programmatic_launch.cuh) against the CPU twin, on random models that take
// every branch: head_dim 64 and 128, query groups of 1, 3, 4 and 8 heads, q/k/v and o biases, q/k
// norms, MLP biases, tied embeddings, widths that are not multiples of the fused kernel's 32-wide k
// chunk (those projections take the streaming kernel or cuBLASLt), contexts of 1 to 2500 tokens on pages in random order (one attention split and many), and a
// padded batch. The logits and the new keys and values against the CPU; bit-exact with every kernel
// launched after the previous one has finished, when repeated, and when replayed from a CUDA graph.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda_backend.h"
#include "kernels/ops.h"
#include "kernels/rng.h"
#include "model/config.h"
#include "model/transformer.h"
#include "test_util.h"

namespace kiln::test {
namespace {

struct Case {
  const char* name;
  int64_t hidden, heads, kv_heads, head_dim, intermediate, vocab, layers;
  bool attention_bias, o_bias, qk_norm, mlp_bias, tied;
};

ModelConfig config_of(const Case& c) {
  Result<ModelConfig> base = load_model_config(testdata_dir() + "/tiny-llama");
  KILN_ASSERT(base.ok());
  ModelConfig m = *base;
  m.hidden_size = c.hidden, m.num_attention_heads = c.heads, m.num_key_value_heads = c.kv_heads;
  m.head_dim = c.head_dim, m.intermediate_size = c.intermediate, m.vocab_size = c.vocab;
  m.num_hidden_layers = c.layers, m.max_position_embeddings = 4096;
  m.attention_bias = c.attention_bias, m.o_proj_bias = c.o_bias, m.qk_norm = c.qk_norm, m.mlp_bias = c.mlp_bias;
  m.tie_word_embeddings = c.tied;
  return m;
}

// One decode step: request b has kv_lens[b] tokens of context including this step's (0: a padding
// request with no query); token rows are the real requests' queries, then padding rows.
struct Step {
  std::vector<int32_t> kv_lens;
  int32_t token_rows = 0;
};

struct Inputs {
  TensorBuffer ids, positions, slots, q_indptr, logit_rows, page_indptr, page_indices, last_page;
  ForwardBatch batch;
  std::vector<int32_t> new_slots;  // the slot of each real query
};

constexpr int32_t kPageSize = 16, kPoolPages = 600;

Inputs make_inputs(Backend& be, const Step& s, uint64_t seed, int64_t vocab) {
  std::vector<std::vector<int32_t>> slot_of;
  PagedTables pages = scattered_pages(s.kv_lens, kPageSize, kPoolPages, seed, &slot_of);
  std::vector<int32_t> ids, positions, slots, q_indptr = {0};
  Inputs in;
  for (size_t b = 0; b < s.kv_lens.size(); ++b) {
    const int32_t n = s.kv_lens[b];
    if (n > 0) {
      ids.push_back(3 + static_cast<int32_t>(rng::uniform(seed + 1, b) * (vocab - 3)));
      positions.push_back(n - 1);
      slots.push_back(slot_of[b][n - 1]);
      in.new_slots.push_back(slot_of[b][n - 1]);
    }
    q_indptr.push_back(static_cast<int32_t>(ids.size()));
  }
  while (static_cast<int32_t>(ids.size()) < s.token_rows) ids.push_back(0), positions.push_back(0), slots.push_back(-1);
  std::vector<int32_t> rows(ids.size());
  for (size_t r = 0; r < rows.size(); ++r) rows[r] = static_cast<int32_t>(r);
  auto dev = [&](const std::vector<int32_t>& v) { return std::move(to_device(be, host_ints(v))).value(); };
  auto dev_t = [&](const TensorBuffer& t) { return std::move(to_device(be, t)).value(); };
  in.ids = dev(ids), in.positions = dev(positions), in.slots = dev(slots), in.q_indptr = dev(q_indptr);
  in.logit_rows = dev(rows);
  in.page_indptr = dev_t(pages.indptr), in.page_indices = dev_t(pages.indices), in.last_page = dev_t(pages.last);
  ForwardBatch& fb = in.batch;
  fb.ids = in.ids, fb.positions = in.positions, fb.slots = in.slots, fb.q_indptr = in.q_indptr;
  fb.logit_rows = in.logit_rows;
  fb.kv = PagedKV{in.page_indptr, in.page_indices, in.last_page, kPageSize};
  int32_t max_kv = 1;
  for (int32_t n : s.kv_lens) max_kv = std::max(max_kv, n);
  fb.bounds = {static_cast<int32_t>(s.kv_lens.size()), 1, max_kv};
  return in;
}

// A model, its cache filled with seeded random keys and values (the same on every device up to
// the storage rounding), and a workspace.
struct Rig {
  std::unique_ptr<Transformer> model;
  KVCache cache;
  ForwardWorkspace ws;
};

Rig make_rig(Backend& be, const ModelConfig& config, int64_t max_rows) {
  Rig r;
  Result<std::unique_ptr<Transformer>> m = Transformer::random(be, config, 11);
  KILN_ASSERT(m.ok());
  r.model = std::move(m).value();
  r.cache = std::move(r.model->make_kv_cache(kPoolPages * kPageSize)).value();
  for (size_t l = 0; l < r.cache.k.size(); ++l) {
    ops::fill_normal(be, r.cache.k[l], 1.0f, 100 + l);
    ops::fill_normal(be, r.cache.v[l], 1.0f, 200 + l);
  }
  r.ws = std::move(r.model->make_workspace(max_rows, max_rows)).value();
  return r;
}

// The rows of the keys (or values) of layer `layer` at `slots`, as floats.
std::vector<float> cache_rows(Backend& be, const Tensor& cache, const std::vector<int32_t>& slots) {
  const std::vector<float> all = to_f32(be, cache);
  const int64_t width = cache.numel() / cache.size(0);
  std::vector<float> out;
  for (int32_t s : slots) out.insert(out.end(), all.begin() + s * width, all.begin() + (s + 1) * width);
  return out;
}

std::vector<float> real_rows(const std::vector<float>& logits, int64_t rows, int64_t vocab) {
  return std::vector<float>(logits.begin(), logits.begin() + rows * vocab);
}

const std::vector<Step> kSmallSteps = {{{1, 17, 300, 64, 65, 1000, 2, 2500}, 8}, {{2500}, 1}, {{40, 0, 129, 0}, 4}};

void check_case(const Case& c, const std::vector<Step>& steps = kSmallSteps) {
  SCOPED_TRACE(c.name);
  KILN_REQUIRE_GPU(be);
  CudaBackend& cbe = static_cast<CudaBackend&>(*be);
  ASSERT_TRUE(cbe.programmatic_launch());  // the default
  const ModelConfig config = config_of(c);
  int32_t max_rows = 1;
  for (const Step& s : steps) max_rows = std::max({max_rows, s.token_rows, static_cast<int32_t>(s.kv_lens.size())});
  Rig gpu = make_rig(*be, config, max_rows);
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  Rig ref = make_rig(*cpu, config, max_rows);
  for (size_t si = 0; si < steps.size(); ++si) {
    SCOPED_TRACE(testing::Message() << "step " << si);
    const Step& s = steps[si];
    Inputs in = make_inputs(*be, s, 31 + si, c.vocab);
    Inputs in_cpu = make_inputs(*cpu, s, 31 + si, c.vocab);
    const int64_t real = static_cast<int64_t>(in.new_slots.size());
    ASSERT_TRUE(gpu.model->uses_fused_layers(in.batch.ids.numel()));

    const std::vector<float> want = real_rows(to_f32(*cpu, ref.model->forward(in_cpu.batch, ref.cache, ref.ws)), real, c.vocab);
    const std::vector<float> all = to_f32(*be, gpu.model->forward(in.batch, gpu.cache, gpu.ws));
    const std::vector<float> got = real_rows(all, real, c.vocab);
    // Whole-model bf16 logits: relative L2 error as the golden-model tests judge them (bf16 rounding
    // through the layers moves single logits by a few percent of the rms).
    EXPECT_LE(rel_error(got, want), 2e-2);
    // And every logit within a quarter of its own magnitude (floored at the rms): a few percent is
    // rounding, a wrong row or column is off by about 100%, which the L2 norm over many rows hides.
    EXPECT_LE(elem_error(got, want), 0.25);
    // The new keys and values of every layer, judged like the logits: the bf16 activations of the
    // deeper layers differ from the f32 twin's by single elements at the 2% level (per-element
    // bounds are for single ops), the relative L2 error over a layer's rows stays below 1%.
    for (int l = 0; l < c.layers; ++l) {
      const std::vector<float> k = cache_rows(*be, gpu.cache.k[l], in.new_slots),
                               k_ref = cache_rows(*cpu, ref.cache.k[l], in_cpu.new_slots);
      const std::vector<float> v = cache_rows(*be, gpu.cache.v[l], in.new_slots),
                               v_ref = cache_rows(*cpu, ref.cache.v[l], in_cpu.new_slots);
      EXPECT_LE(rel_error(k, k_ref), 2e-2) << "keys, layer " << l;
      EXPECT_LE(rel_error(v, v_ref), 2e-2) << "values, layer " << l;
      EXPECT_LE(elem_error(k, k_ref), 0.25) << "keys, layer " << l;  // as the logits
      EXPECT_LE(elem_error(v, v_ref), 0.25) << "values, layer " << l;
    }

    // Programmatic launch changes when the kernels start, never what they compute.
    cbe.set_programmatic_launch(false);
    const std::vector<float> serial = to_f32(*be, gpu.model->forward(in.batch, gpu.cache, gpu.ws));
    cbe.set_programmatic_launch(true);
    EXPECT_EQ(serial, all) << "each kernel launched after the previous one";
    expect_repeats_and_replays(
        *be, [&] { return gpu.model->forward(in.batch, gpu.cache, gpu.ws); }, gpu.ws.logits.view(), all);
  }
}

TEST(DecodeLayersGpu, LlamaHeadDim64GroupOf3UnevenWidths) {
  check_case({"llama d64 g3", 208, 6, 2, 64, 176, 1001, 3, false, false, false, false, false});
}
TEST(DecodeLayersGpu, Qwen2BiasesHeadDim128GroupOf4) {
  check_case({"qwen2 d128 g4", 256, 8, 2, 128, 352, 777, 2, true, false, false, false, false});
}
TEST(DecodeLayersGpu, Qwen3NormsTiedMlpBiasNoGroups) {
  check_case({"qwen3 d64 g1", 320, 4, 4, 64, 288, 512, 2, false, true, true, true, true});
}
// A wide MLP and vocabulary (several blocks per SM, the long-K down projection split over a
// cluster), head_dim 128 and a group of 8.
TEST(DecodeLayersGpu, HeadDim128GroupOf8WideMlp) {
  check_case({"d128 g8", 512, 8, 1, 128, 3072, 5000, 2, false, false, false, false, false});
}

// Steps of 9 to 128 rows run the projections on cuBLASLt, and the MLP's long-K down projection
// (here 4x the hidden size) split along K into f32 products that the next layer's input norm (the
// final norm after the last layer) adds into the residual (ops::linear_k_split_forward).
TEST(DecodeLayersGpu, BatchedStepsSplitTheDownProjection) {
  KILN_REQUIRE_GPU(be);
  ASSERT_EQ(ops::linear_k_split_parts(*be, 24, 256, 1024, DType::bf16), 4);
  ASSERT_EQ(ops::linear_k_split_parts(*be, 100, 256, 1024, DType::bf16), 4);
  std::vector<int32_t> lens24, lens90;
  for (int32_t i = 0; i < 24; ++i) lens24.push_back(1 + (i * 37) % 200);
  for (int32_t i = 0; i < 90; ++i) lens90.push_back(i % 7 == 3 ? 0 : 1 + (i * 53) % 80);  // and padding requests
  check_case({"batched d64 g4", 256, 8, 2, 64, 1024, 700, 3, false, false, false, false, false},
             {{lens24, 24}, {lens90, 100}});
}

}  // namespace
}  // namespace kiln::test
