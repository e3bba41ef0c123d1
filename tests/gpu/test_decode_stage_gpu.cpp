// qkv_rope_attention_decode: the decode attention kernel with the input stage fused in, against
// the two ops it replaces on the same GPU (bit for bit: output and both caches) and against the CPU
// twin, for the batch sizes that take each decode launch (many splits and the combine pass, a few
// splits, two merged in a cluster, one), both head dims, the Qwen3 norms, f16, small pages, a
// padding request and padding token rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/ops.h"
#include "test_util.h"

namespace kiln::test {
namespace {

int64_t count_nonfinite(const std::vector<float>& x) {
  return std::count_if(x.begin(), x.end(), [](float v) { return !std::isfinite(v); });
}

struct StageCase {
  int B, Hq, Hkv, D;
  bool norms;
  DType dt;
  int page_size;
};

void check_stage(Backend& gpu, const StageCase& c) {
  auto cpu = make_cpu_backend();
  std::mt19937 rng(1000 + c.B * 7 + c.D);
  const int pad_request = c.B > 2 ? 1 : -1;  // request 1 has no query and no context
  std::vector<int32_t> kv_len(c.B);
  for (int b = 0; b < c.B; ++b) kv_len[b] = b == pad_request ? 0 : 1 + static_cast<int32_t>(rng() % 1500);
  if (c.B > 3) kv_len[3] = 1;  // a context of the new key alone
  const int32_t ps = c.page_size;
  std::vector<int32_t> n_pages(c.B);
  int32_t total_pages = 0;
  for (int b = 0; b < c.B; ++b) total_pages += n_pages[b] = (kv_len[b] + ps - 1) / ps;
  const int32_t pool_pages = total_pages + 7;
  std::vector<int32_t> order(pool_pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);

  // Tokens: one per request with a query, then two padding rows (slot -1) of no request.
  std::vector<int32_t> q_indptr = {0}, page_indptr = {0}, page_indices, last, positions, slots;
  int32_t next_page = 0, max_kv = 0;
  for (int b = 0; b < c.B; ++b) {
    for (int p = 0; p < n_pages[b]; ++p) page_indices.push_back(order[next_page++]);
    page_indptr.push_back(static_cast<int32_t>(page_indices.size()));
    last.push_back(kv_len[b] == 0 ? 0 : kv_len[b] - (n_pages[b] - 1) * ps);
    const bool query = kv_len[b] > 0;
    q_indptr.push_back(q_indptr.back() + (query ? 1 : 0));
    if (query) {
      const int32_t key = kv_len[b] - 1;
      positions.push_back(key);
      slots.push_back(page_indices[page_indptr[b] + key / ps] * ps + key % ps);
    }
    max_kv = std::max(max_kv, kv_len[b]);
  }
  for (int p = 0; p < 2; ++p) positions.push_back(0), slots.push_back(-1);
  const int64_t T = static_cast<int64_t>(positions.size()), S = static_cast<int64_t>(pool_pages) * ps;
  const int64_t W = (c.Hq + 2 * c.Hkv) * c.D, half = c.D / 2;

  TensorBuffer qkv = random_host({T, W}, c.dt, 31), qn = random_host({c.D}, c.dt, 32), kn = random_host({c.D}, c.dt, 33);
  TensorBuffer kc = random_host({S, c.Hkv, c.D}, c.dt, 34), vc = random_host({S, c.Hkv, c.D}, c.dt, 35);
  TensorBuffer inv = host_empty({half}, DType::f32);
  for (int64_t i = 0; i < half; ++i) inv.ptr<float>()[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / c.D));
  TensorBuffer h_qi = host_ints(q_indptr), h_pi = host_ints(page_indptr), h_idx = host_ints(page_indices),
               h_last = host_ints(last), h_pos = host_ints(positions), h_slots = host_ints(slots);
  const ops::AttentionBounds bounds{c.B, 1, max_kv};
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D)), scaling = 0.9f, eps = 1e-6f;
  const Tensor no_norm;

  // CPU twin (the two ops).
  TensorBuffer out = host_empty({T, c.Hq, c.D}, c.dt), q = host_empty({T, c.Hq, c.D}, c.dt);
  ops::fill_constant(*cpu, out, 0.0f);
  ops::qkv_rope_attention_decode(*cpu, out, q, kc, vc, qkv, h_pos, h_slots, inv, scaling, c.norms ? qn.view() : no_norm,
                                 c.norms ? kn.view() : no_norm, eps, h_qi, PagedKV{h_pi, h_idx, h_last, ps}, bounds,
                                 scale);

  auto dev = [&](Tensor t) { return std::move(to_device(gpu, t)).value(); };
  TensorBuffer d_qkv = dev(qkv), d_qn = dev(qn), d_kn = dev(kn), d_inv = dev(inv), d_qi = dev(h_qi), d_pi = dev(h_pi),
               d_idx = dev(h_idx), d_last = dev(h_last), d_pos = dev(h_pos), d_slots = dev(h_slots);
  const PagedKV pages{d_pi, d_idx, d_last, ps};
  const Tensor d_q_norm = c.norms ? d_qn.view() : no_norm, d_k_norm = c.norms ? d_kn.view() : no_norm;
  // The two ops on the GPU.
  TensorBuffer kc1 = dev(random_host({S, c.Hkv, c.D}, c.dt, 34)), vc1 = dev(random_host({S, c.Hkv, c.D}, c.dt, 35));
  TensorBuffer out1 = std::move(empty(gpu, {T, c.Hq, c.D}, c.dt)).value();
  TensorBuffer q1 = std::move(empty(gpu, {T, c.Hq, c.D}, c.dt)).value();
  ops::fill_constant(gpu, out1, 0.0f);
  ops::qkv_rope_cache_write(gpu, q1, kc1, vc1, d_qkv, d_pos, d_slots, d_inv, scaling, d_q_norm, d_k_norm, eps);
  ops::attention_forward(gpu, out1, q1, kc1, vc1, d_qi, pages, bounds, scale);
  // Fused.
  TensorBuffer kc2 = dev(random_host({S, c.Hkv, c.D}, c.dt, 34)), vc2 = dev(random_host({S, c.Hkv, c.D}, c.dt, 35));
  TensorBuffer out2 = std::move(empty(gpu, {T, c.Hq, c.D}, c.dt)).value();
  TensorBuffer q2 = std::move(empty(gpu, {T, c.Hq, c.D}, c.dt)).value();
  ops::fill_constant(gpu, out2, 0.0f);
  ops::qkv_rope_attention_decode(gpu, out2, q2, kc2, vc2, d_qkv, d_pos, d_slots, d_inv, scaling, d_q_norm, d_k_norm, eps,
                                 d_qi, pages, bounds, scale);

  const std::vector<float> got = to_f32(gpu, out2);
  EXPECT_EQ(count_nonfinite(got), 0);
  EXPECT_EQ(got, to_f32(gpu, out1)) << "fused differs from the two ops";
  EXPECT_EQ(to_f32(gpu, kc2), to_f32(gpu, kc1)) << "key cache";
  EXPECT_EQ(to_f32(gpu, vc2), to_f32(gpu, vc1)) << "value cache";
  EXPECT_CLOSE(got, to_f32(*cpu, out), 1e-2);
  EXPECT_CLOSE(to_f32(gpu, kc2), to_f32(*cpu, kc), 1e-2);
  EXPECT_EQ(to_f32(gpu, vc2), to_f32(*cpu, vc));
}

TEST(DecodeStageGpu, FusedEqualsTheTwoOps) {
  KILN_REQUIRE_GPU(gpu);
  for (const StageCase& c : {StageCase{1, 24, 4, 64, false, DType::bf16, 16}, StageCase{5, 24, 4, 64, true, DType::bf16, 3},
                             StageCase{33, 24, 4, 64, false, DType::bf16, 16}, StageCase{64, 24, 4, 64, true, DType::bf16, 16},
                             StageCase{128, 24, 4, 64, false, DType::bf16, 16}, StageCase{3, 32, 8, 128, true, DType::bf16, 16},
                             StageCase{64, 32, 4, 128, false, DType::bf16, 64}, StageCase{9, 16, 16, 64, true, DType::f16, 16},
                             StageCase{40, 32, 8, 64, true, DType::bf16, 16}}) {
    SCOPED_TRACE(testing::Message() << "B=" << c.B << " Hq=" << c.Hq << " Hkv=" << c.Hkv << " D=" << c.D
                                    << " norms=" << c.norms << " page=" << c.page_size);
    check_stage(*gpu, c);
  }
}

// A call off the fused kernel's path (f32) runs the two ops: same results as calling them.
TEST(DecodeStageGpu, OffPathRunsTheTwoOps) {
  KILN_REQUIRE_GPU(gpu);
  check_stage(*gpu, StageCase{7, 8, 2, 48, true, DType::f32, 16});
}

}  // namespace
}  // namespace kiln::test
