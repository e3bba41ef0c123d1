// The single decode-step kernel (ops::decode_step_kernel_forward, on with KILN_DECODE_STEP_KERNEL=1)
// against the CPU twin of the layered forward, on random models of the shapes it takes (head_dim 64
// and 128, query groups of 2 to 8 heads, widths that take 4-row and 6-row pages, vocabularies and
// widths that leave a partial last unit),
// one request at contexts of 1 to 2500 tokens on pages in random order (16-row pages) and on 128-row
// pages: the logits, the new keys and values of every layer, and the greedy token (the first index
// of the largest logit). Repeated and replayed from a CUDA graph it gives the same bits (its counters
// are left zero).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

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
};

ModelConfig config_of(const Case& c) {
  Result<ModelConfig> base = load_model_config(testdata_dir() + "/tiny-llama");
  KILN_ASSERT(base.ok());
  ModelConfig m = *base;
  m.hidden_size = c.hidden, m.num_attention_heads = c.heads, m.num_key_value_heads = c.kv_heads;
  m.head_dim = c.head_dim, m.intermediate_size = c.intermediate, m.vocab_size = c.vocab;
  m.num_hidden_layers = c.layers, m.max_position_embeddings = 4096;
  m.attention_bias = false, m.o_proj_bias = false, m.qk_norm = false, m.mlp_bias = false;
  m.tie_word_embeddings = false;
  return m;
}

constexpr int32_t kPoolPages = 400;

struct Rig {
  std::unique_ptr<Transformer> model;
  KVCache cache;
  ForwardWorkspace ws;
};

// The model (seed 11: the same weights on every backend and with the kernel on or off), its cache of
// seeded random keys and values, a one-row workspace.
Rig make_rig(Backend& be, const ModelConfig& config, int32_t page_size, bool kernel) {
  if (kernel) setenv("KILN_DECODE_STEP_KERNEL", "1", 1);
  Result<std::unique_ptr<Transformer>> m = Transformer::random(be, config, 11);
  unsetenv("KILN_DECODE_STEP_KERNEL");
  KILN_ASSERT(m.ok());
  Rig r;
  r.model = std::move(m).value();
  r.cache = std::move(r.model->make_kv_cache(kPoolPages * page_size)).value();
  for (size_t l = 0; l < r.cache.k.size(); ++l) {
    ops::fill_normal(be, r.cache.k[l], 1.0f, 100 + l);
    ops::fill_normal(be, r.cache.v[l], 1.0f, 200 + l);
  }
  r.ws = std::move(r.model->make_workspace(1, 1)).value();
  return r;
}

struct Inputs {
  TensorBuffer ids, positions, slots, q_indptr, logit_rows, page_indptr, page_indices, last_page, token;
  ForwardBatch batch;
  int32_t new_slot = 0;
};

// One request with kv_len tokens of context (this step's included) on scattered pages.
Inputs make_inputs(Backend& be, int32_t kv_len, int32_t page_size, uint64_t seed, int64_t vocab, bool greedy) {
  std::vector<std::vector<int32_t>> slot_of;
  PagedTables pages = scattered_pages({kv_len}, page_size, kPoolPages, seed, &slot_of);
  Inputs in;
  in.new_slot = slot_of[0][kv_len - 1];
  const int32_t id = 3 + static_cast<int32_t>(rng::uniform(seed + 1, 0) * (vocab - 3));
  auto dev = [&](const std::vector<int32_t>& v) { return std::move(to_device(be, host_ints(v))).value(); };
  auto dev_t = [&](const TensorBuffer& t) { return std::move(to_device(be, t)).value(); };
  in.ids = dev({id}), in.positions = dev({kv_len - 1}), in.slots = dev({in.new_slot}), in.q_indptr = dev({0, 1});
  in.logit_rows = dev({0}), in.token = dev({-1});
  in.page_indptr = dev_t(pages.indptr), in.page_indices = dev_t(pages.indices), in.last_page = dev_t(pages.last);
  ForwardBatch& fb = in.batch;
  fb.ids = in.ids, fb.positions = in.positions, fb.slots = in.slots, fb.q_indptr = in.q_indptr;
  fb.logit_rows = in.logit_rows;
  fb.logits_of_every_row = true;
  fb.kv = PagedKV{in.page_indptr, in.page_indices, in.last_page, page_size};
  fb.bounds = {1, 1, std::max(kv_len, 1024)};  // a graph's bound above the context, as the engine's
  if (greedy) fb.greedy_tokens = in.token;
  return in;
}

std::vector<float> cache_row(Backend& be, const Tensor& cache, int32_t slot) {
  return to_f32(be, cache.rows(slot, slot + 1));
}

void check_case(const Case& c) {
  SCOPED_TRACE(c.name);
  KILN_REQUIRE_GPU(be);
  const ModelConfig config = config_of(c);
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  for (int32_t page_size : {16, 128}) {
    Rig gpu = make_rig(*be, config, page_size, true);
    Rig ref = make_rig(*cpu, config, page_size, false);
    int si = 0;
    for (int32_t kv_len : {1, 17, 300, 2500}) {
      SCOPED_TRACE(testing::Message() << "page size " << page_size << ", context " << kv_len);
      const uint64_t seed = 31 + static_cast<uint64_t>(si++);
      Inputs in = make_inputs(*be, kv_len, page_size, seed, c.vocab, true);
      Inputs in_cpu = make_inputs(*cpu, kv_len, page_size, seed, c.vocab, false);
      ASSERT_TRUE(gpu.model->uses_decode_step_kernel(in.batch)) << "the kernel takes this model and step";
      const std::vector<float> want = to_f32(*cpu, ref.model->forward(in_cpu.batch, ref.cache, ref.ws));
      const std::vector<float> got = to_f32(*be, gpu.model->forward(in.batch, gpu.cache, gpu.ws));
      // As the layered decode path is judged against the CPU twin (test_decode_layers_gpu.cpp).
      EXPECT_LE(rel_error(got, want), 2e-2);
      EXPECT_LE(elem_error(got, want), 0.25);
      for (int l = 0; l < c.layers; ++l) {
        const std::vector<float> k = cache_row(*be, gpu.cache.k[l], in.new_slot);
        const std::vector<float> k_ref = cache_row(*cpu, ref.cache.k[l], in_cpu.new_slot);
        const std::vector<float> v = cache_row(*be, gpu.cache.v[l], in.new_slot);
        const std::vector<float> v_ref = cache_row(*cpu, ref.cache.v[l], in_cpu.new_slot);
        EXPECT_LE(rel_error(k, k_ref), 2e-2) << "keys, layer " << l;
        EXPECT_LE(rel_error(v, v_ref), 2e-2) << "values, layer " << l;
      }
      // The greedy token: the first index of the largest of the kernel's own logits.
      const int32_t want_token =
          static_cast<int32_t>(std::max_element(got.begin(), got.end()) - got.begin());
      const TensorBuffer token = to_host(*be, in.token);
      EXPECT_EQ(token.ptr<int32_t>()[0], want_token);

      // Deterministic, and the counters it leaves let it run again, eagerly and replayed.
      expect_repeats_and_replays(
          *be, [&] { return gpu.model->forward(in.batch, gpu.cache, gpu.ws); }, gpu.ws.logits.view(), got);
    }
  }
}

TEST(DecodeStepKernelGpu, HeadDim64GroupOf3OddVocabulary) {
  check_case({"d64 g3", 768, 12, 4, 64, 1536, 1001, 3});
}
TEST(DecodeStepKernelGpu, HeadDim128GroupOf6) {
  check_case({"d128 g6", 1536, 12, 2, 128, 2304, 5000, 2});
}
TEST(DecodeStepKernelGpu, HeadDim64GroupOf8) {
  check_case({"d64 g8", 1536, 24, 3, 64, 3072, 777, 2});
}
// Widths that are multiples of 512 but not 768 (llama-1b's 2048): pages of 6 rows x 512 columns,
// units of three rotation pairs or three gate/up outputs, the last unit of o, gate/up, down and the
// head partial.
TEST(DecodeStepKernelGpu, SixRowPagesHeadDim64GroupOf4) {
  check_case({"d64 g4 512-wide", 1024, 16, 4, 64, 2560, 1001, 2});
}
TEST(DecodeStepKernelGpu, SixRowPagesHeadDim128GroupOf2) {
  check_case({"d128 g2 512-wide", 2048, 16, 8, 128, 5632, 3001, 2});
}
// Models it does not take run the layered forward.
TEST(DecodeStepKernelGpu, OtherModelsKeepTheLayeredForward) {
  KILN_REQUIRE_GPU(be);
  EXPECT_FALSE(ops::decode_step_kernel_supported(*be, 1000, 12, 4, 64, 1536, 2, DType::bf16)) << "hidden size";
  EXPECT_FALSE(ops::decode_step_kernel_supported(*be, 768, 12, 4, 96, 1536, 2, DType::bf16)) << "head_dim";
  EXPECT_FALSE(ops::decode_step_kernel_supported(*be, 768, 48, 4, 64, 1536, 2, DType::bf16)) << "group of 12";
  EXPECT_TRUE(ops::decode_step_kernel_supported(*be, 768, 12, 4, 64, 1536, 2, DType::bf16));
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  EXPECT_FALSE(ops::decode_step_kernel_supported(*cpu, 768, 12, 4, 64, 1536, 2, DType::f32)) << "CPU";
}

}  // namespace
}  // namespace kiln::test
