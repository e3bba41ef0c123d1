// The fused small-batch linear layers: CUDA (bf16 weights, kiln's tensor-core kernel up to 32 rows,
// the TMA streaming kernel up to 128) against the CPU twin on the same inputs, over batch sizes on
// both sides of each tile, odd output counts (SwiGLU's wide blocks of 32 outputs among them), widths
// off the kernels' k steps, every K split of the TMA kernel; plus determinism (two runs give the
// same bits).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "backend/cuda_backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"
#include "sampler_util.h"
#include "test_util.h"

namespace kiln::test {

// Every fused small-batch projection against the CPU twin. One row runs the warp-per-row kernel (one
// pass of K to many; 20512 wide: the tensor-core kernel takes it; 70001 outputs: a vocabulary head,
// many rows a warp), more rows the tensor-core tiles.
TEST(CudaFusedKernels, FusedLinearLayersMatchCpu) {
  KILN_REQUIRE_GPU(gpu);
  auto cpu = make_cpu_backend();
  const float eps = 1e-5f;
  struct Case { int64_t M, N, K; bool bias; };
  for (const Case& c : {Case{1, 16, 32, false}, Case{3, 37, 96, true}, Case{8, 2048, 1536, false},
                        Case{9, 100, 6912, true}, Case{16, 1536, 1536, false}, Case{17, 24, 64, true},
                        Case{32, 200, 512, false}, Case{31, 13, 32, true}, Case{16, 40000, 256, true},
                        Case{5, 33800, 96, false}, Case{1, 6912, 1536, true}, Case{8, 4232, 64, true},
                        Case{1, 1537, 6912, true}, Case{1, 3, 20480, false}, Case{1, 5, 20512, true},
                        Case{2, 300, 1536, true}, Case{1, 70001, 256, true}}) {
    SCOPED_TRACE(testing::Message() << "M=" << c.M << " N=" << c.N << " K=" << c.K << " bias=" << c.bias);
    ASSERT_TRUE(ops::fused_linear_valid(*gpu, ops::FusedLinear::norm, c.M, c.K, DType::bf16));
    auto& cuda_be = static_cast<CudaBackend&>(*gpu);
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
      EXPECT_CLOSE(to_f32(*gpu, dy), to_f32(*cpu, y), 1e-2);
      TensorBuffer dy2 = std::move(empty(*gpu, {c.M, c.N}, y_dt)).value();
      ops::norm_linear_forward(*gpu, dy2, dx, dg, eps, dw, dbias);
      EXPECT_EQ(to_f32(*gpu, dy2), to_f32(*gpu, dy));
    }
    // linear_residual and linear_swiglu on this kernel (the ops may pick the TMA kernel)
    {
      TensorBuffer rc = host_empty({c.M, c.N}, DType::f32);
      std::copy(r.ptr<float>(), r.ptr<float>() + c.M * c.N, rc.ptr<float>());
      ops::linear_residual_forward(*cpu, rc, xb, w, bias);
      TensorBuffer dr = dev(r);
      cuda::fused_linear_kernel_forward(cuda_be, ops::FusedLinear::residual, dr, dxb, Tensor{}, 0.0f, dw, dbias);
      EXPECT_CLOSE(to_f32(*gpu, dr), to_f32(*cpu, rc), 1e-3);
      TensorBuffer act = host_empty({c.M, c.N}, DType::f32);
      ops::linear_swiglu_forward(*cpu, act, xb, w2, bias2);
      TensorBuffer dact = std::move(empty(*gpu, {c.M, c.N}, DType::bf16)).value();
      cuda::fused_linear_kernel_forward(cuda_be, ops::FusedLinear::swiglu, dact, dxb, Tensor{}, 0.0f, dw2, dbias2);
      EXPECT_CLOSE(to_f32(*gpu, dact), to_f32(*cpu, act), 2e-2);
    }
    // norm_linear_swiglu
    {
      TensorBuffer act = host_empty({c.M, c.N}, DType::f32);
      ops::norm_linear_swiglu_forward(*cpu, act, x, g, eps, w2, bias2);
      TensorBuffer dact = std::move(empty(*gpu, {c.M, c.N}, DType::bf16)).value();
      ops::fill_constant(*gpu, dact, NAN);
      ops::norm_linear_swiglu_forward(*gpu, dact, dx, dg, eps, dw2, dbias2);
      EXPECT_CLOSE(to_f32(*gpu, dact), to_f32(*cpu, act), 2e-2);
    }
  }
}

// The greedy head (ops::norm_linear_argmax_forward) at one row: the logits bit for bit those of
// norm_linear_forward, the token the first index of the largest of them (checked on the host, and
// equal to the sampler's greedy token), ties to the lower index (two equal rows planted on top), a NaN
// logit as -inf; three calls in a row give the same token and leave the scratch zero; the CPU twin
// picks the same planted token.
TEST(CudaFusedKernels, GreedyHeadPicksTheFirstLargestLogit) {
  KILN_REQUIRE_GPU(gpu);
  auto cpu = make_cpu_backend();
  const float eps = 1e-5f;
  for (const auto& [N, K] : std::vector<std::pair<int64_t, int64_t>>{{100000, 1536}, {70001, 256}, {37, 96}}) {
    for (bool planted : {false, true}) {
      SCOPED_TRACE(testing::Message() << "N=" << N << " K=" << K << " planted=" << planted);
      ASSERT_TRUE(ops::norm_linear_argmax_preferred(*gpu, 1, N, K, DType::bf16));
      TensorBuffer x = random_host({1, K}, DType::f32, 21), g = random_host({K}, DType::bf16, 22);
      TensorBuffer w = random_host({N, K}, DType::bf16, 23, 0.05f);
      const int64_t first = N / 3, second = N - 2;  // the planted tie
      if (planted) {
        uint16_t* wp = w.ptr<uint16_t>();
        const float* xp = x.ptr<float>();
        for (int64_t k = 0; k < K; ++k) {
          const uint16_t v = f32_to_bf16(xp[k] * bf16_to_f32(g.ptr<uint16_t>()[k]) > 0 ? 0.5f : -0.5f);
          wp[first * K + k] = wp[second * K + k] = v;
          wp[1 * K + k] = f32_to_bf16(k == 0 ? NAN : 0.0f);  // logit 1: NaN
        }
      }
      auto dev = [&](Tensor t) { return std::move(to_device(*gpu, t)).value(); };
      auto bits = [](const std::vector<float>& v) {
        std::vector<uint32_t> b(v.size());
        for (size_t i = 0; i < v.size(); ++i) b[i] = f32_bits(v[i]);
        return b;
      };
      TensorBuffer dx = dev(x), dg = dev(g), dw = dev(w);
      TensorBuffer want = std::move(empty(*gpu, {1, N}, DType::f32)).value();
      ops::norm_linear_forward(*gpu, want, dx, dg, eps, dw);
      TensorBuffer logits = std::move(empty(*gpu, {1, N}, DType::f32)).value();
      TensorBuffer tokens = std::move(empty(*gpu, {1}, DType::i32)).value();
      TensorBuffer scratch = std::move(empty(*gpu, {ops::kArgmaxScratchWords}, DType::i32)).value();
      gpu->zero(scratch);
      const std::vector<float> host_logits = to_f32(*gpu, want);
      int32_t host_token = 0;
      for (int64_t n = 0; n < N; ++n) {
        const float v = std::isnan(host_logits[n]) ? -INFINITY : host_logits[n];
        const float b = std::isnan(host_logits[host_token]) ? -INFINITY : host_logits[host_token];
        if (v > b) host_token = static_cast<int32_t>(n);
      }
      if (planted) {
        ASSERT_EQ(host_token, first);
      }
      for (int call = 0; call < 3; ++call) {
        ops::fill_constant(*gpu, logits, NAN);
        ops::norm_linear_argmax_forward(*gpu, logits, tokens, dx, dg, eps, dw, scratch);
        EXPECT_EQ(bits(to_f32(*gpu, logits)), bits(host_logits));  // bit for bit, the NaN logit too
        EXPECT_EQ(sampler_read<int32_t>(*gpu, tokens), std::vector<int32_t>{host_token});
        EXPECT_EQ(sampler_read<int32_t>(*gpu, scratch), std::vector<int32_t>(ops::kArgmaxScratchWords, 0));
      }
      // The sampler's greedy token of the same logits.
      SamplerCall call;
      call.B = 1, call.V = N, call.logits = host_logits, call.rows = {ops::SamplingRow{}}, call.logprob_outputs = false;
      EXPECT_EQ(run_sampler(*gpu, call, /*full=*/false).tokens, std::vector<int32_t>{host_token});
      if (planted) {
        TensorBuffer cl = host_empty({1, N}, DType::f32), ct = host_empty({1}, DType::i32);
        ops::norm_linear_argmax_forward(*cpu, cl, ct, x, g, eps, w, Tensor{});
        EXPECT_EQ(ct.ptr<int32_t>()[0], first);
      }
    }
  }
}

// The TMA streaming kernel, each epilogue against the CPU twin: batch rows on both sides of every
// BM tile (16, 32, 64, 128), output counts off the 64-row tile (SwiGLU: 32 outputs), K off the
// 64-wide k step, every K split; bits equal across runs.
TEST(CudaFusedKernels, StreamingLinearMatchesCpu) {
  KILN_REQUIRE_GPU(gpu);
  auto& cuda_be = static_cast<CudaBackend&>(*gpu);
  if (!cuda::linear_tma_valid(cuda_be, 1, 64, DType::bf16)) GTEST_SKIP() << "needs a Hopper GPU (sm_90)";
  auto cpu = make_cpu_backend();
  struct Case { int64_t M, N, K; bool bias; int splits; };
  for (const Case& c : {Case{1, 64, 64, false, 0}, Case{5, 37, 200, true, 0}, Case{16, 2048, 1536, false, 0},
                        Case{17, 1536, 1536, true, 8}, Case{32, 100, 6912, false, 0}, Case{33, 13, 8, true, 1},
                        Case{64, 300, 520, false, 2}, Case{65, 1536, 6912, true, 0}, Case{100, 13824, 256, false, 0},
                        Case{128, 77, 1544, true, 4}, Case{127, 4000, 64, false, 8}, Case{128, 2048, 1536, false, 3},
                        Case{120, 13824, 256, true, 1}, Case{128, 2048, 1536, false, 2}, Case{31, 640, 1600, true, 0},
                        Case{49, 1536, 6912, false, 0}}) {
    SCOPED_TRACE(testing::Message() << "M=" << c.M << " N=" << c.N << " K=" << c.K << " bias=" << c.bias
                                    << " splits=" << c.splits);
    ASSERT_TRUE(cuda::linear_tma_valid(cuda_be, c.M, c.K, DType::bf16));
    auto dev = [&](Tensor t) { return std::move(to_device(*gpu, t)).value(); };
    TensorBuffer x = random_host({c.M, c.K}, DType::bf16, 21);
    TensorBuffer w = random_host({c.N, c.K}, DType::bf16, 22, 0.05f), b = random_host({c.N}, DType::bf16, 23);
    TensorBuffer w2 = random_host({2 * c.N, c.K}, DType::bf16, 24, 0.05f), b2 = random_host({2 * c.N}, DType::f32, 25);
    TensorBuffer r = random_host({c.M, c.N}, DType::f32, 26);
    const Tensor bias = c.bias ? b.view() : Tensor{}, bias2 = c.bias ? b2.view() : Tensor{};
    TensorBuffer dx = dev(x), dw = dev(w), db = dev(b), dw2 = dev(w2), db2 = dev(b2);
    const Tensor dbias = c.bias ? db.view() : Tensor{}, dbias2 = c.bias ? db2.view() : Tensor{};
    // The CPU twin's outputs: stored, added into the residual, SwiGLU of [gate; up].
    TensorBuffer y = host_empty({c.M, c.N}, DType::f32), rc = host_empty({c.M, c.N}, DType::f32);
    TensorBuffer act = host_empty({c.M, c.N}, DType::f32);
    ops::linear_forward(*cpu, y, x, w, bias);
    std::copy(r.ptr<float>(), r.ptr<float>() + c.M * c.N, rc.ptr<float>());
    ops::linear_residual_forward(*cpu, rc, x, w, bias);
    ops::linear_swiglu_forward(*cpu, act, x, w2, bias2);
    using cuda::TmaEpilogue;
    {
      for (DType y_dt : {DType::bf16, DType::f32}) {
        TensorBuffer dy = std::move(empty(*gpu, {c.M, c.N}, y_dt)).value();
        ops::fill_constant(*gpu, dy, NAN);
        cuda::linear_tma_forward(cuda_be, TmaEpilogue::store, dy, dx, dw, dbias, c.splits);
        EXPECT_CLOSE(to_f32(*gpu, dy), to_f32(*cpu, y), y_dt == DType::f32 ? 1e-4 : 1e-2);
        TensorBuffer dy2 = std::move(empty(*gpu, {c.M, c.N}, y_dt)).value();
        cuda::linear_tma_forward(cuda_be, TmaEpilogue::store, dy2, dx, dw, dbias, c.splits);
        EXPECT_EQ(to_f32(*gpu, dy2), to_f32(*gpu, dy));
      }
      TensorBuffer dr = dev(r);
      cuda::linear_tma_forward(cuda_be, TmaEpilogue::add_residual, dr, dx, dw, dbias, c.splits);
      EXPECT_CLOSE(to_f32(*gpu, dr), to_f32(*cpu, rc), 1e-4);
      TensorBuffer dact = std::move(empty(*gpu, {c.M, c.N}, DType::f32)).value();
      ops::fill_constant(*gpu, dact, NAN);
      cuda::linear_tma_forward(cuda_be, TmaEpilogue::swiglu, dact, dx, dw2, dbias2, c.splits);
      EXPECT_CLOSE(to_f32(*gpu, dact), to_f32(*cpu, act), 1e-4);
    }
  }
}

}  // namespace kiln::test
