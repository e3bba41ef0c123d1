// qkv_rope_cache_write: CUDA against the CPU twin on random bf16 and f32 inputs; the decode path's
// projection with that stage fused in (norm_linear_qkv_rope_forward) and the decode attention with
// it fused in (attention_decode_rope_forward): bit for bit the separate CUDA ops, and close to the
// CPU twin.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/ops.h"
#include "test_util.h"

namespace kiln::test {

TEST(CudaFusedKernels, QkvRopeCacheWrite) {
  KILN_REQUIRE_GPU(gpu);
  auto cpu = make_cpu_backend();
  struct Case { int64_t T, Hq, Hkv, D; bool norms; DType dt; };
  // Without the (cos, sin) table every case runs the warp-per-head path, checked against the CPU;
  // with it, head dims that are multiples of 64 run the vector path, checked bit for bit against
  // the warp path (48: the warp path both times).
  for (const Case& c : {Case{1, 24, 4, 64, false, DType::bf16}, Case{37, 24, 4, 64, true, DType::bf16},
                        Case{300, 32, 8, 128, true, DType::bf16}, Case{5, 6, 2, 48, true, DType::f32},
                        Case{3, 4, 1, 256, false, DType::f32}, Case{9, 6, 2, 192, true, DType::bf16},
                        Case{11, 8, 2, 128, false, DType::f32}}) {
    SCOPED_TRACE(testing::Message() << "T=" << c.T << " Hq=" << c.Hq << " D=" << c.D);
    const int64_t W = (c.Hq + 2 * c.Hkv) * c.D, S = 2 * c.T + 9, half = c.D / 2;
    TensorBuffer qkv = random_host({c.T, W}, c.dt, 21), qn = random_host({c.D}, c.dt, 22), kn = random_host({c.D}, c.dt, 23);
    TensorBuffer inv = host_empty({half}, DType::f32);
    for (int64_t i = 0; i < half; ++i) inv.ptr<float>()[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / c.D));
    std::vector<int32_t> pos(c.T), slot(c.T);
    // Every fifth token from the second a padding row (negative slot: q written, nothing cached).
    for (int64_t t = 0; t < c.T; ++t)
      pos[t] = static_cast<int32_t>(29000 + t), slot[t] = t % 5 == 1 ? -1 : static_cast<int32_t>(S - 2 - 2 * t);
    TensorBuffer positions = host_ints(pos), slots = host_ints(slot);
    TensorBuffer kc = random_host({S, c.Hkv, c.D}, c.dt, 24), vc = random_host({S, c.Hkv, c.D}, c.dt, 25);
    TensorBuffer q = host_empty({c.T, c.Hq, c.D}, c.dt);
    ops::qkv_rope_cache_write(*cpu, q, kc, vc, qkv, positions, slots, inv, 1.0f, c.norms ? qn.view() : Tensor{},
                              c.norms ? kn.view() : Tensor{}, 1e-6f);
    auto dev = [&](Tensor t) { return std::move(to_device(*gpu, t)).value(); };
    TensorBuffer d_qkv = dev(qkv), d_qn = dev(qn), d_kn = dev(kn), d_inv = dev(inv), d_pos = dev(positions),
                 d_slots = dev(slots);
    TensorBuffer d_kc = dev(random_host({S, c.Hkv, c.D}, c.dt, 24)), d_vc = dev(random_host({S, c.Hkv, c.D}, c.dt, 25));
    TensorBuffer d_q = std::move(empty(*gpu, {c.T, c.Hq, c.D}, c.dt)).value();
    ops::fill_constant(*gpu, d_q, NAN);
    ops::qkv_rope_cache_write(*gpu, d_q, d_kc, d_vc, d_qkv, d_pos, d_slots, d_inv, 1.0f,
                              c.norms ? d_qn.view() : Tensor{}, c.norms ? d_kn.view() : Tensor{}, 1e-6f);
    const double tol = c.dt == DType::f32 ? 1e-6 : 1e-2;
    EXPECT_CLOSE(to_f32(*gpu, d_q), to_f32(*cpu, q), tol);
    EXPECT_CLOSE(to_f32(*gpu, d_kc), to_f32(*cpu, kc), tol);
    EXPECT_EQ(to_f32(*gpu, d_vc), to_f32(*cpu, vc));

    // With the step's (cos, sin) table (rope_cos_sin_table, as prefill steps run it; the vector
    // path where D is a multiple of 64): the same bits as the warp path without it.
    TensorBuffer d_table = std::move(empty(*gpu, {c.T, half, 2}, DType::f32)).value();
    ops::rope_cos_sin_table(*gpu, d_table, d_pos, d_inv, 1.0f);
    TensorBuffer d_kc2 = dev(random_host({S, c.Hkv, c.D}, c.dt, 24)), d_vc2 = dev(random_host({S, c.Hkv, c.D}, c.dt, 25));
    TensorBuffer d_q2 = std::move(empty(*gpu, {c.T, c.Hq, c.D}, c.dt)).value();
    ops::qkv_rope_cache_write(*gpu, d_q2, d_kc2, d_vc2, d_qkv, d_pos, d_slots, d_inv, 1.0f,
                              c.norms ? d_qn.view() : Tensor{}, c.norms ? d_kn.view() : Tensor{}, 1e-6f, d_table);
    EXPECT_EQ(to_f32(*gpu, d_q2), to_f32(*gpu, d_q));
    EXPECT_EQ(to_f32(*gpu, d_kc2), to_f32(*gpu, d_kc));
    EXPECT_EQ(to_f32(*gpu, d_vc2), to_f32(*gpu, d_vc));
  }
}

TEST(CudaFusedKernels, RopeCosSinTableMatchesTheCpuTwin) {
  // Positions up to 32K and two scalings: the double-precision cos/sin rounded to f32 on both sides.
  KILN_REQUIRE_GPU(gpu);
  auto cpu = make_cpu_backend();
  for (int64_t D : {64, 128, 18}) {
    const int64_t T = 333, half = D / 2;
    TensorBuffer inv = host_empty({half}, DType::f32);
    for (int64_t i = 0; i < half; ++i) inv.ptr<float>()[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / D));
    std::vector<int32_t> pos(T);
    for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t * 97 % 32768);
    TensorBuffer positions = host_ints(pos);
    for (float scaling : {1.0f, 0.8f}) {
      SCOPED_TRACE(testing::Message() << "D=" << D << " scaling=" << scaling);
      TensorBuffer table = host_empty({T, half, 2}, DType::f32);
      ops::rope_cos_sin_table(*cpu, table, positions, inv, scaling);
      TensorBuffer d_pos = std::move(to_device(*gpu, positions)).value(), d_inv = std::move(to_device(*gpu, inv)).value();
      TensorBuffer d_table = std::move(empty(*gpu, {T, half, 2}, DType::f32)).value();
      ops::rope_cos_sin_table(*gpu, d_table, d_pos, d_inv, scaling);
      EXPECT_CLOSE(to_f32(*gpu, d_table), to_f32(*cpu, table), 1e-6);
      // Against cos and sin in double of the f32 angle.
      const float* got = table.ptr<float>();
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<float>(pos[t]) * inv.ptr<float>()[i];
          ASSERT_NEAR(got[2 * (t * half + i)], std::cos(angle) * scaling, 1e-6);
          ASSERT_NEAR(got[2 * (t * half + i) + 1], std::sin(angle) * scaling, 1e-6);
        }
    }
  }
}

TEST(CudaFusedKernels, NormLinearQkvRopeMatchesSeparateOps) {
  KILN_REQUIRE_GPU(gpu);
  auto cpu = make_cpu_backend();
  const float eps = 1e-5f;
  // M rows (1: the warp-per-row kernel; 2 to 32: 1, 2 and 4 batch tiles of the tensor-core kernel),
  // heads, head_dim, width K (4096: K split over a cluster of two blocks), bias.
  struct Case { int64_t M, Hq, Hkv, D, K; bool bias; };
  for (const Case& c : {Case{1, 24, 4, 64, 1536, false}, Case{8, 4, 2, 128, 64, true}, Case{5, 3, 1, 32, 96, true},
                        Case{3, 2, 2, 16, 32, false}, Case{13, 4, 2, 64, 256, true}, Case{32, 2, 1, 64, 64, false},
                        Case{2, 8, 2, 64, 4096, true}, Case{1, 16, 8, 128, 4096, true}, Case{1, 2, 1, 16, 32, true}}) {
    SCOPED_TRACE(testing::Message() << "M=" << c.M << " Hq=" << c.Hq << " Hkv=" << c.Hkv << " D=" << c.D << " K=" << c.K);
    const int64_t N = (c.Hq + 2 * c.Hkv) * c.D, S = 2 * c.M + 5, half = c.D / 2;
    ASSERT_TRUE(ops::norm_linear_qkv_rope_preferred(*cpu, c.M, N, c.K, c.D, DType::f32));
    TensorBuffer x = random_host({c.M, c.K}, DType::f32, 31), g = random_host({c.K}, DType::bf16, 32);
    TensorBuffer w = random_host({N, c.K}, DType::bf16, 33, 0.05f), b = random_host({N}, DType::bf16, 34);
    TensorBuffer inv = host_empty({half}, DType::f32);
    for (int64_t i = 0; i < half; ++i) inv.ptr<float>()[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / c.D));
    std::vector<int32_t> pos(c.M), slot(c.M);
    for (int64_t t = 0; t < c.M; ++t) pos[t] = static_cast<int32_t>(t * 977 % 30011), slot[t] = static_cast<int32_t>(S - 1 - 2 * t);
    if (c.M > 1) slot[1] = -1;  // a padding row: nothing written to the cache
    TensorBuffer positions = host_ints(pos), slots = host_ints(slot);
    const Tensor bias = c.bias ? b.view() : Tensor{};

    // The CPU twin.
    TensorBuffer q = host_empty({c.M, c.Hq, c.D}, DType::bf16), qkv = host_empty({c.M, N}, DType::f32);
    TensorBuffer kc = random_host({S, c.Hkv, c.D}, DType::bf16, 35), vc = random_host({S, c.Hkv, c.D}, DType::bf16, 36);
    ops::norm_linear_qkv_rope_forward(*cpu, q, kc, vc, qkv, x, g, eps, w, bias, positions, slots, inv, 1.0f);

    auto dev = [&](Tensor t) { return std::move(to_device(*gpu, t)).value(); };
    TensorBuffer dx = dev(x), dg = dev(g), dw = dev(w), db = dev(b), dinv = dev(inv), dpos = dev(positions),
                 dslots = dev(slots);
    const Tensor dbias = c.bias ? db.view() : Tensor{};
    // CUDA, fused and separate (norm_linear_forward, then qkv_rope_cache_write).
    TensorBuffer dq = std::move(empty(*gpu, {c.M, c.Hq, c.D}, DType::bf16)).value();
    TensorBuffer dq2 = std::move(empty(*gpu, {c.M, c.Hq, c.D}, DType::bf16)).value();
    TensorBuffer dqkv = std::move(empty(*gpu, {c.M, N}, DType::bf16)).value();
    ops::fill_constant(*gpu, dq, NAN);
    ops::fill_constant(*gpu, dq2, NAN);
    TensorBuffer dkc = dev(random_host({S, c.Hkv, c.D}, DType::bf16, 35)), dvc = dev(random_host({S, c.Hkv, c.D}, DType::bf16, 36));
    TensorBuffer dkc2 = dev(random_host({S, c.Hkv, c.D}, DType::bf16, 35)), dvc2 = dev(random_host({S, c.Hkv, c.D}, DType::bf16, 36));
    ops::norm_linear_qkv_rope_forward(*gpu, dq, dkc, dvc, dqkv, dx, dg, eps, dw, dbias, dpos, dslots, dinv, 1.0f);
    ops::norm_linear_forward(*gpu, dqkv, dx, dg, eps, dw, dbias);
    ops::qkv_rope_cache_write(*gpu, dq2, dkc2, dvc2, dqkv, dpos, dslots, dinv, 1.0f, Tensor{}, Tensor{}, eps);
    EXPECT_EQ(to_f32(*gpu, dq), to_f32(*gpu, dq2));
    EXPECT_EQ(to_f32(*gpu, dkc), to_f32(*gpu, dkc2));
    EXPECT_EQ(to_f32(*gpu, dvc), to_f32(*gpu, dvc2));
    EXPECT_CLOSE(to_f32(*gpu, dq), to_f32(*cpu, q), 1e-2);
    EXPECT_CLOSE(to_f32(*gpu, dkc), to_f32(*cpu, kc), 1e-2);
    EXPECT_CLOSE(to_f32(*gpu, dvc), to_f32(*cpu, vc), 1e-2);
  }
}

// A decode step of B requests (contexts of 1 to 5000 keys, the new token last, on shuffled 16-row
// pages; one padding request without queries or pages, its token row writing nothing): the
// attention with its input stage (attention_decode_rope_forward) against qkv_rope_cache_write then
// attention_forward on CUDA, bit for bit in the output and the whole pool, also with bounds beyond
// the step's longest context (as a captured graph runs it); and against the CPU twin.
TEST(CudaFusedKernels, AttentionDecodeRopeMatchesSeparateOps) {
  KILN_REQUIRE_GPU(gpu);
  auto cpu = make_cpu_backend();
  const float eps = 1e-6f, scale = 0.125f;
  constexpr int kPage = 16;
  struct Case { int Hq, Hkv, D; bool norms; std::vector<int32_t> kv_lens; };
  for (const Case& c : {Case{24, 4, 64, false, {1, 700, 64, 65, 2500, 17}}, Case{24, 4, 64, true, {1023, 3, 1024}},
                        Case{32, 8, 128, true, {129, 1, 4000}}, Case{16, 1, 64, false, {300, 47}},
                        Case{8, 8, 128, false, {5000}}, Case{12, 4, 64, true, std::vector<int32_t>(40, 900)}}) {
    SCOPED_TRACE(testing::Message() << "Hq=" << c.Hq << " Hkv=" << c.Hkv << " D=" << c.D << " norms=" << c.norms
                                    << " B=" << c.kv_lens.size());
    const int B = static_cast<int>(c.kv_lens.size()), T = B + 1;  // + the padding request's token row
    const int64_t W = static_cast<int64_t>(c.Hq + 2 * c.Hkv) * c.D;
    // Pages: each request's ceil(kv_len / 16) pages, taken from a shuffled pool with spares.
    int n_pages = 3;
    for (int32_t n : c.kv_lens) n_pages += (n + kPage - 1) / kPage;
    std::vector<int32_t> order(n_pages);
    std::iota(order.begin(), order.end(), 0);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = n_pages - 1; i > 0; --i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      std::swap(order[i], order[static_cast<int>((x >> 33) % static_cast<uint64_t>(i + 1))]);
    }
    std::vector<int32_t> qi(B + 2), pi(B + 2), last(B + 1), indices, pos(T, 0), slot(T, -1);
    for (int b = 0; b < B; ++b) {
      const int32_t n = c.kv_lens[b], pages = (n + kPage - 1) / kPage;
      qi[b + 1] = b + 1;
      pi[b + 1] = pi[b] + pages;
      last[b] = n - (pages - 1) * kPage;
      for (int p = 0; p < pages; ++p) indices.push_back(order[pi[b] + p]);
      pos[b] = n - 1;
      slot[b] = indices[pi[b] + (n - 1) / kPage] * kPage + (n - 1) % kPage;
    }
    qi[B + 1] = B, pi[B + 1] = pi[B], last[B] = 0;  // the padding request
    const int32_t max_kv = *std::max_element(c.kv_lens.begin(), c.kv_lens.end());
    const int64_t S = static_cast<int64_t>(n_pages) * kPage;

    TensorBuffer qkv = random_host({T, W}, DType::bf16, 41), qn = random_host({c.D}, DType::bf16, 42),
                 kn = random_host({c.D}, DType::bf16, 43);
    TensorBuffer inv = host_empty({c.D / 2}, DType::f32);
    for (int i = 0; i < c.D / 2; ++i) inv.ptr<float>()[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / c.D));
    TensorBuffer k0 = random_host({S, c.Hkv, c.D}, DType::bf16, 44), v0 = random_host({S, c.Hkv, c.D}, DType::bf16, 45);
    TensorBuffer positions = host_ints(pos), slots = host_ints(slot), q_indptr = host_ints(qi),
                 page_indptr = host_ints(pi), page_indices = host_ints(indices), last_len = host_ints(last);
    const Tensor q_norm = c.norms ? qn.view() : Tensor{}, k_norm = c.norms ? kn.view() : Tensor{};
    const ops::AttentionBounds bounds{B + 1, 1, max_kv};

    // The CPU twin.
    TensorBuffer kc = random_host({S, c.Hkv, c.D}, DType::bf16, 44), vc = random_host({S, c.Hkv, c.D}, DType::bf16, 45);
    TensorBuffer q = host_empty({T, c.Hq, c.D}, DType::bf16), out = host_empty({T, c.Hq, c.D}, DType::bf16);
    ops::attention_decode_rope_forward(*cpu, out, q, kc, vc, qkv, positions, slots, inv, 1.0f, q_norm, k_norm, eps,
                                       q_indptr, PagedKV{page_indptr, page_indices, last_len, kPage}, bounds, scale);

    auto dev = [&](Tensor t) { return std::move(to_device(*gpu, t)).value(); };
    TensorBuffer d_qkv = dev(qkv), d_qn = dev(qn), d_kn = dev(kn), d_inv = dev(inv), d_pos = dev(positions),
                 d_slots = dev(slots), d_qi = dev(q_indptr), d_pi = dev(page_indptr), d_idx = dev(page_indices),
                 d_last = dev(last_len);
    const PagedKV d_pages{d_pi, d_idx, d_last, kPage};
    const Tensor dq_norm = c.norms ? d_qn.view() : Tensor{}, dk_norm = c.norms ? d_kn.view() : Tensor{};
    auto fresh = [&](Shape shape) {
      TensorBuffer t = std::move(empty(*gpu, shape, DType::bf16)).value();
      ops::fill_constant(*gpu, t, NAN);
      return t;
    };
    // Separate ops.
    TensorBuffer kc_a = dev(k0), vc_a = dev(v0), q_a = fresh({T, c.Hq, c.D}), out_a = fresh({T, c.Hq, c.D});
    ops::qkv_rope_cache_write(*gpu, q_a, kc_a, vc_a, d_qkv, d_pos, d_slots, d_inv, 1.0f, dq_norm, dk_norm, eps);
    ops::attention_forward(*gpu, out_a, q_a, kc_a, vc_a, d_qi, d_pages, bounds, scale);
    // Fused (the CUDA op runs its kernel wherever the shapes allow, preferred or not), with the
    // step's bounds and with a larger context bound.
    for (int32_t bound : {max_kv, max_kv + 3000}) {
      SCOPED_TRACE(testing::Message() << "max_kv_len " << bound);
      TensorBuffer kc_b = dev(k0), vc_b = dev(v0), q_b = fresh({T, c.Hq, c.D}), out_b = fresh({T, c.Hq, c.D});
      ops::attention_decode_rope_forward(*gpu, out_b, q_b, kc_b, vc_b, d_qkv, d_pos, d_slots, d_inv, 1.0f, dq_norm,
                                         dk_norm, eps, d_qi, d_pages, ops::AttentionBounds{B + 1, 1, bound}, scale);
      // The request rows (the padding request's row is left alone).
      const int64_t used = static_cast<int64_t>(B) * c.Hq * c.D;
      auto rows = [&](const std::vector<float>& all) { return std::vector<float>(all.begin(), all.begin() + used); };
      const std::vector<float> got = rows(to_f32(*gpu, out_b));
      EXPECT_EQ(got, rows(to_f32(*gpu, out_a)));
      EXPECT_EQ(to_f32(*gpu, kc_b), to_f32(*gpu, kc_a));
      EXPECT_EQ(to_f32(*gpu, vc_b), to_f32(*gpu, vc_a));
      EXPECT_CLOSE(got, rows(to_f32(*cpu, out)), 1e-2);
    }
    EXPECT_CLOSE(to_f32(*gpu, kc_a), to_f32(*cpu, kc), 1e-2);
  }
}

}  // namespace kiln::test
