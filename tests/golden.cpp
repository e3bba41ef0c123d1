#include "golden.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "infer/generator.h"
#include "model/safetensors.h"
#include "model/transformer.h"
#include "test_util.h"

namespace kiln::test {
namespace {

TensorInfo golden_tensor(const SafetensorsFile& f, const std::string& name) {
  Result<TensorInfo> t = f.find(name);
  KILN_ASSERT(t.ok());
  return *t;
}

SafetensorsFile open_golden(const std::string& model) {
  Result<SafetensorsFile> f = SafetensorsFile::open(testdata_dir() + "/" + model + "/golden.safetensors");
  if (!f.ok()) {
    std::fprintf(stderr, "%s\n", f.status().message().c_str());
    std::abort();
  }
  return std::move(f).value();
}

// Logits [n, vocab] of one full forward over `ids` (row t predicts token t + 1).
std::vector<float> full_forward_logits(const Transformer& m, const std::vector<int32_t>& ids) {
  Backend& be = m.backend();
  const int32_t n = static_cast<int32_t>(ids.size());
  Result<KVCache> cache = m.make_kv_cache(n);
  Result<ForwardWorkspace> ws = m.make_workspace(n, n);
  KILN_ASSERT(cache.ok() && ws.ok());
  std::vector<int32_t> positions(n), rows(n);
  for (int32_t i = 0; i < n; ++i) positions[i] = rows[i] = i;
  auto dev = [&](const std::vector<int32_t>& v) {
    Result<TensorBuffer> t = to_device(be, host_ints(v));
    KILN_ASSERT(t.ok());
    return std::move(t).value();
  };
  TensorBuffer d_ids = dev(ids), d_pos = dev(positions), d_rows = dev(rows), d_q = dev({0, n}), d_kv = dev({0, n});
  ForwardBatch b;
  b.ids = d_ids;
  b.positions = d_pos;
  b.slots = d_pos;
  b.q_indptr = d_q;
  b.kv_indptr = d_kv;
  b.logit_rows = d_rows;
  b.bounds = {1, n, n};
  Tensor logits = m.forward(b, *cache, *ws);
  return to_f32(be, logits);
}

std::vector<float> row_slice(const std::vector<float>& m, int64_t row, int64_t width) {
  return std::vector<float>(m.begin() + row * width, m.begin() + (row + 1) * width);
}

}  // namespace

std::vector<float> golden_floats(const std::string& model, const std::string& name) {
  SafetensorsFile f = open_golden(model);
  TensorInfo t = golden_tensor(f, name);
  KILN_ASSERT(t.dtype == DType::f32);
  std::vector<float> v(static_cast<size_t>(t.shape.numel()));
  std::memcpy(v.data(), t.data, v.size() * sizeof(float));
  return v;
}

std::vector<int32_t> golden_ints(const std::string& model, const std::string& name) {
  SafetensorsFile f = open_golden(model);
  TensorInfo t = golden_tensor(f, name);
  std::vector<int32_t> v(static_cast<size_t>(t.shape.numel()));
  if (t.dtype == DType::i32) {
    std::memcpy(v.data(), t.data, v.size() * sizeof(int32_t));
  } else {
    KILN_ASSERT(t.dtype == DType::i64);
    for (size_t i = 0; i < v.size(); ++i) {
      int64_t x;
      std::memcpy(&x, static_cast<const char*>(t.data) + 8 * i, 8);
      v[i] = static_cast<int32_t>(x);
    }
  }
  return v;
}

void check_golden_model(Backend& be, const std::string& model, double tol, GreedyCheck greedy) {
  Result<std::unique_ptr<Transformer>> m = Transformer::load(be, testdata_dir() + "/" + model);
  ASSERT_TRUE(m.ok()) << m.status().message();
  const int64_t vocab = (*m)->config().vocab_size;

  // 1) one forward over each sequence: every position's logits
  for (const char* seq : {"seq_a", "seq_b"}) {
    std::vector<int32_t> ids = golden_ints(model, std::string(seq) + ".input_ids");
    std::vector<float> ref = golden_floats(model, std::string(seq) + ".logits");
    std::vector<float> got = full_forward_logits(**m, ids);
    double err = rel_error(got, ref);
    EXPECT_LE(err, tol) << model << " " << seq << " logits";
  }

  // 2) one full forward over seq_b + the reference's greedy tokens
  std::vector<int32_t> prompt = golden_ints(model, "seq_b.input_ids");
  std::vector<int32_t> expected = golden_ints(model, "greedy.new_tokens");
  std::vector<float> full = golden_floats(model, "greedy.full_logits");
  std::vector<int32_t> extended = prompt;
  extended.insert(extended.end(), expected.begin(), expected.end());
  EXPECT_LE(rel_error(full_forward_logits(**m, extended), full), tol) << model << " full forward of seq_b + greedy";

  // 3) greedy generation from seq_b; every incremental step's logits against the full forward's
  //    (for as long as the generated prefix equals the reference's)
  int64_t compare_steps = static_cast<int64_t>(expected.size());
  if (greedy == GreedyCheck::until_near_tie) {
    for (int64_t j = 0; j < compare_steps; ++j) {
      std::vector<float> row = row_slice(full, static_cast<int64_t>(prompt.size()) - 1 + j, vocab);
      std::vector<float> sorted = row;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      float scale = 0;
      for (float x : row) scale = std::max(scale, std::fabs(x));
      if (sorted[0] - sorted[1] < 0.01f * scale) compare_steps = j + 1;  // step j's logits still compare
    }
  }
  Result<std::unique_ptr<Generator>> gen =
      Generator::create(**m, static_cast<int32_t>(prompt.size() + expected.size()));
  ASSERT_TRUE(gen.ok()) << gen.status().message();
  GenerateOptions opts;
  opts.max_new_tokens = static_cast<int32_t>(expected.size());
  int64_t step = 0;
  double worst = 0;
  Result<GenerateResult> r = (*gen)->generate(prompt, opts, nullptr, [&](const float* logits, int64_t n) {
    ASSERT_EQ(n, vocab);
    int64_t row = static_cast<int64_t>(prompt.size()) - 1 + step;
    if (step++ < compare_steps)
      worst = std::max(worst, rel_error(std::vector<float>(logits, logits + n), row_slice(full, row, vocab)));
  });
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(step, static_cast<int64_t>(expected.size()));
  const int64_t token_steps = greedy == GreedyCheck::exact ? static_cast<int64_t>(expected.size()) : compare_steps - 1;
  EXPECT_EQ(std::vector<int32_t>(r->tokens.begin(), r->tokens.begin() + token_steps),
            std::vector<int32_t>(expected.begin(), expected.begin() + token_steps))
      << model << " greedy tokens (first " << token_steps << ")";
  EXPECT_LE(worst, tol) << model << " incremental decode logits vs full forward";
}

}  // namespace kiln::test
