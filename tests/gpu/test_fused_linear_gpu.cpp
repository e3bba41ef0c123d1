// The fused small-batch linear layers: CUDA (bf16 weights, kiln's tensor-core kernel) against the CPU
// twin on the same inputs, over batch sizes on both sides of each n8 tile, odd output counts and
// several widths; plus determinism (two runs give the same bits).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"
#include "test_util.h"

namespace kiln::test {

TEST(CudaFusedKernels, FusedLinearLayersMatchCpu) {
  KILN_REQUIRE_GPU(gpu);
  auto cpu = make_cpu_backend();
  const float eps = 1e-5f;
  struct Case { int64_t M, N, K; bool bias; };
  for (const Case& c : {Case{1, 16, 32, false}, Case{3, 37, 96, true}, Case{8, 2048, 1536, false},
                        Case{9, 100, 6912, true}, Case{16, 1536, 1536, false}, Case{17, 24, 64, true},
                        Case{32, 200, 512, false}, Case{31, 13, 32, true}, Case{16, 40000, 256, true},
                        Case{5, 33800, 96, false}}) {
    SCOPED_TRACE(testing::Message() << "M=" << c.M << " N=" << c.N << " K=" << c.K << " bias=" << c.bias);
    ASSERT_TRUE(ops::fused_linear_valid(*gpu, c.M, c.K, DType::bf16));
    auto dev = [&](Tensor t) { return std::move(to_device(*gpu, t)).value(); };
    TensorBuffer x = random_host({c.M, c.K}, DType::f32, 11);  // the residual stream
    TensorBuffer xb = random_host({c.M, c.K}, DType::bf16, 12);  // an attention / activation input
    TensorBuffer g = random_host({c.K}, DType::bf16, 13);
    TensorBuffer w = random_host({c.N, c.K}, DType::bf16, 14, 0.05f), b = random_host({c.N}, DType::bf16, 15);
    TensorBuffer w2 = random_host({2 * c.N, c.K}, DType::bf16, 16, 0.05f), b2 = random_host({2 * c.N}, DType::bf16, 17);
    TensorBuffer r = random_host({c.M, c.N}, DType::f32, 18);
    const Tensor bias = c.bias ? b.view() : Tensor{}, bias2 = c.bias ? b2.view() : Tensor{};
    TensorBuffer dx = dev(x), dxb = dev(xb), dg = dev(g), dw = dev(w), db = dev(b), dw2 = dev(w2), db2 = dev(b2);
    const Tensor dbias = c.bias ? db.view() : Tensor{}, dbias2 = c.bias ? db2.view() : Tensor{};

    // norm_linear: bf16 output (q/k/v) and f32 output (logits)
    for (DType y_dt : {DType::bf16, DType::f32}) {
      TensorBuffer y = host_empty({c.M, c.N}, DType::f32);
      ops::norm_linear_forward(*cpu, y, x, g, eps, w, bias);
      TensorBuffer dy = std::move(empty(*gpu, {c.M, c.N}, y_dt)).value();
      ops::fill_constant(*gpu, dy, NAN);
      ops::norm_linear_forward(*gpu, dy, dx, dg, eps, dw, dbias);
      EXPECT_LE(rel_error(to_f32(*gpu, dy), to_f32(*cpu, y)), 1e-2);
      TensorBuffer dy2 = std::move(empty(*gpu, {c.M, c.N}, y_dt)).value();
      ops::norm_linear_forward(*gpu, dy2, dx, dg, eps, dw, dbias);
      EXPECT_EQ(to_f32(*gpu, dy2), to_f32(*gpu, dy));
    }
    // linear_residual
    {
      TensorBuffer rc = host_empty({c.M, c.N}, DType::f32);
      std::copy(r.ptr<float>(), r.ptr<float>() + c.M * c.N, rc.ptr<float>());
      ops::linear_residual_forward(*cpu, rc, xb, w, bias);
      TensorBuffer dr = dev(r);
      ops::linear_residual_forward(*gpu, dr, dxb, dw, dbias);
      EXPECT_LE(rel_error(to_f32(*gpu, dr), to_f32(*cpu, rc)), 1e-3);
    }
    // norm_linear_swiglu
    {
      TensorBuffer act = host_empty({c.M, c.N}, DType::f32);
      ops::norm_linear_swiglu_forward(*cpu, act, x, g, eps, w2, bias2);
      TensorBuffer dact = std::move(empty(*gpu, {c.M, c.N}, DType::bf16)).value();
      ops::fill_constant(*gpu, dact, NAN);
      ops::norm_linear_swiglu_forward(*gpu, dact, dx, dg, eps, dw2, dbias2);
      EXPECT_LE(rel_error(to_f32(*gpu, dact), to_f32(*cpu, act)), 2e-2);
    }
  }
}

}  // namespace kiln::test
