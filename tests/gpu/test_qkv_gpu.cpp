// qkv_rope_cache_write: CUDA against the CPU twin on random bf16 and f32 inputs.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/ops.h"
#include "test_util.h"

namespace kiln::test {

TEST(CudaFusedKernels, QkvRopeCacheWrite) {
  KILN_REQUIRE_GPU(gpu);
  auto cpu = make_cpu_backend();
  struct Case { int64_t T, Hq, Hkv, D; bool norms; DType dt; };
  for (const Case& c : {Case{1, 24, 4, 64, false, DType::bf16}, Case{37, 24, 4, 64, true, DType::bf16},
                        Case{300, 32, 8, 128, true, DType::bf16}, Case{5, 6, 2, 48, true, DType::f32},
                        Case{3, 4, 1, 256, false, DType::f32}}) {
    SCOPED_TRACE(testing::Message() << "T=" << c.T << " Hq=" << c.Hq << " D=" << c.D);
    const int64_t W = (c.Hq + 2 * c.Hkv) * c.D, S = 2 * c.T + 9, half = c.D / 2;
    TensorBuffer qkv = random_host({c.T, W}, c.dt, 21), qn = random_host({c.D}, c.dt, 22), kn = random_host({c.D}, c.dt, 23);
    TensorBuffer inv = host_empty({half}, DType::f32);
    for (int64_t i = 0; i < half; ++i) inv.ptr<float>()[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / c.D));
    std::vector<int32_t> pos(c.T), slot(c.T);
    for (int64_t t = 0; t < c.T; ++t) pos[t] = static_cast<int32_t>(29000 + t), slot[t] = static_cast<int32_t>(S - 2 - 2 * t);
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
  }
}

}  // namespace kiln::test
