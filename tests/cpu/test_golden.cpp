// The CPU (f32) model against Hugging Face transformers: logits within 1e-5 relative error,
// identical greedy tokens through the engine, its decode log-probabilities equal to the reference's.
#include <gtest/gtest.h>

#include "golden.h"

namespace kiln::test {

class GoldenCpu : public testing::TestWithParam<const char*> {};

TEST_P(GoldenCpu, MatchesTransformers) {
  auto be = make_cpu_backend();
  check_golden_model(*be, GetParam(), 1e-5);
  check_teacher_forced_decode(*be, GetParam(), 1e-5, /*use_graphs=*/false);
}

// tiny-llama and tiny-qwen2 come from ../shared/fixtures; the others from
// tests/reference/make_model_fixtures.py (Qwen3 q/k norms with an explicit head_dim, a sharded
// Mistral checkpoint, Llama with q/k/v/o and MLP biases and linear RoPE, a bf16-stored Qwen2);
// tiny-qwen3-yarn from tests/reference/make_rope_fixtures.py (YaRN, seq_a past the pretraining context).
INSTANTIATE_TEST_SUITE_P(Models, GoldenCpu,
                         testing::Values("tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral", "tiny-llama-biased",
                                         "tiny-qwen2-bf16", "tiny-qwen3-yarn"),
                         [](const testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

}  // namespace kiln::test

#include "kernels/ops.h"
#include "model/transformer.h"
#include "test_util.h"

namespace kiln::test {

// One step of host inputs on the CPU, the keys of request b in one-slot pages kv_indptr[b] ..
// kv_indptr[b + 1]: the logits of `rows`, with the final layer trimmed where last_rows_indptr is
// given and the head on the final rows in place where every_row.
namespace {

struct HostStep {
  std::vector<int32_t> ids, positions, slots, q_indptr, rows, kv_indptr, last_rows_indptr;
  ops::AttentionBounds bounds;
  bool every_row = false;
};
std::vector<float> run_step(Backend& be, const Transformer& m, KVCache& cache, const HostStep& s) {
  const int64_t T = static_cast<int64_t>(s.ids.size());
  Result<ForwardWorkspace> ws = m.make_workspace(T, static_cast<int64_t>(s.rows.size()));
  KILN_ASSERT(ws.ok());
  TensorBuffer ids = host_ints(s.ids), pos = host_ints(s.positions), slots = host_ints(s.slots),
               q_indptr = host_ints(s.q_indptr), rows = host_ints(s.rows), last = host_ints(s.last_rows_indptr);
  test::PagedTables pages = test::contiguous_pages(s.kv_indptr);
  ForwardBatch b;
  b.ids = ids;
  b.positions = pos;
  b.slots = slots;
  b.q_indptr = q_indptr;
  b.kv = pages.view();
  b.logit_rows = rows;
  b.bounds = s.bounds;
  if (!s.last_rows_indptr.empty()) b.last_rows_indptr = last;
  b.logits_of_every_row = s.every_row;
  return to_f32(be, m.forward(b, cache, *ws));
}

}  // namespace

// Trimming the final layer to the logit rows (ForwardBatch::last_rows_indptr) must not change the
// logits of those rows: two requests packed in one step, each with its last row wanted.
TEST(Transformer, FinalLayerTrimKeepsLastRowLogits) {
  auto be = make_cpu_backend();
  for (const char* model : {"tiny-llama", "tiny-qwen3"}) {
    Result<std::unique_ptr<Transformer>> m = Transformer::load(*be, testdata_dir() + "/" + model);
    ASSERT_TRUE(m.ok()) << m.status().message();
    HostStep step;  // request 0: 5 tokens, request 1: 3
    step.ids = {5, 9, 13, 17, 21, 3, 7, 11};
    step.positions = {0, 1, 2, 3, 4, 0, 1, 2};
    step.slots = {0, 1, 2, 3, 4, 5, 6, 7};
    step.q_indptr = step.kv_indptr = {0, 5, 8};
    step.rows = {4, 7};
    step.bounds = {2, 5, 5};
    auto run = [&](bool trim) {
      Result<KVCache> cache = (*m)->make_kv_cache(8);
      step.last_rows_indptr = trim ? std::vector<int32_t>{0, 1, 2} : std::vector<int32_t>{};
      return run_step(*be, **m, *cache, step);
    };
    std::vector<float> full = run(false), trimmed = run(true);
    EXPECT_LE(rel_error(trimmed, full), 1e-6) << model;
  }
}

// A decode step whose logit rows are every row in order (ForwardBatch::logits_of_every_row: the head
// reads the final rows in place) gives the logits of the gathered rows, bit for bit: three requests
// of one query each after contexts of 4, 2 and 3 tokens.
TEST(Transformer, LogitsOfEveryRowEqualGatheredRows) {
  auto be = make_cpu_backend();
  for (const char* model : {"tiny-llama", "tiny-qwen3"}) {
    Result<std::unique_ptr<Transformer>> m = Transformer::load(*be, testdata_dir() + "/" + model);
    ASSERT_TRUE(m.ok()) << m.status().message();
    HostStep step;
    step.ids = {5, 9, 13};
    step.positions = {4, 2, 3};
    step.slots = {4, 7, 11};
    step.q_indptr = {0, 1, 2, 3};
    step.kv_indptr = {0, 5, 8, 12};
    step.rows = {0, 1, 2};
    step.bounds = {3, 1, 5};
    auto run = [&](bool in_place) {
      Result<KVCache> cache = (*m)->make_kv_cache(16);
      for (size_t l = 0; l < cache->k.size(); ++l) {  // the cached contexts: seeded, the same in both runs
        ops::fill_normal(*be, cache->k[l], 0.5f, 2 * l + 1);
        ops::fill_normal(*be, cache->v[l], 0.5f, 2 * l + 2);
      }
      step.every_row = in_place;
      return run_step(*be, **m, *cache, step);
    };
    const std::vector<float> gathered = run(false), in_place = run(true);
    ASSERT_EQ(gathered.size(), 3u * (*m)->config().vocab_size);
    EXPECT_EQ(in_place, gathered) << model;
  }
}

}  // namespace kiln::test
