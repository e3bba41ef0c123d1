// CPU gemm, linear (with and without bias, K split into parts) and bias_add against double-precision
// references written here, through kiln::ops with a CPU backend (the rest of the CPU kernels:
// test_cpu_kernels.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_kernel_test.h"
#include "kernels/ops.h"
#include "kernels/rng.h"
#include "test_util.h"

namespace kiln {
namespace {

// ---------------------------------------------------------------------------------------------
// gemm / linear / bias_add

// C = alpha op(A) op(B) + beta C in double, plus the matching magnitude sum for error bounds.
void gemm_ref(const std::vector<float>& a, bool ta, const std::vector<float>& b, bool tb, const std::vector<float>& c,
              int64_t M, int64_t N, int64_t K, double alpha, double beta, std::vector<double>* out,
              std::vector<double>* mag) {
  out->assign(static_cast<size_t>(M * N), 0.0);
  mag->assign(static_cast<size_t>(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, sa = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double av = ta ? a[k * M + m] : a[m * K + k];
        const double bv = tb ? b[n * K + k] : b[k * N + n];
        s += av * bv;
        sa += std::fabs(av * bv);
      }
      const double cv = beta == 0.0 ? 0.0 : beta * c[m * N + n];
      (*out)[m * N + n] = alpha * s + cv;
      (*mag)[m * N + n] = std::fabs(alpha) * sa + std::fabs(cv);
    }
}

void expect_within_mag(const std::vector<float>& got, const std::vector<double>& ref, const std::vector<double>& mag,
                       double rtol, const char* what) {
  ASSERT_EQ(got.size(), ref.size());
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - ref[i]) <= rtol * (mag[i] + 1e-30)))
      if (++failures <= 5) ADD_FAILURE() << what << " index " << i << ": got " << got[i] << ", reference " << ref[i];
  EXPECT_EQ(failures, 0) << what;
}

TEST_F(CpuKernels, GemmAllTransposeCombinations) {
  struct Size { int64_t M, N, K; };
  for (Size sz : {Size{5, 7, 9}, Size{33, 17, 65}, Size{1, 1, 1}}) {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        const int64_t M = sz.M, N = sz.N, K = sz.K;
        TensorBuffer a = test::random_host(ta ? Shape{K, M} : Shape{M, K}, DType::f32, 20);
        TensorBuffer b = test::random_host(tb ? Shape{N, K} : Shape{K, N}, DType::f32, 21);
        TensorBuffer c = test::random_host(Shape{M, N}, DType::f32, 22);
        std::vector<double> ref, mag;
        gemm_ref(read(a), ta, read(b), tb, read(c), M, N, K, 0.5, 0.25, &ref, &mag);
        ops::gemm(*be, c, a, ta, b, tb, 0.5f, 0.25f);
        expect_within_mag(read(c), ref, mag, 1e-5, ta ? (tb ? "gemm TT" : "gemm TN") : (tb ? "gemm NT" : "gemm NN"));
      }
  }
}

TEST_F(CpuKernels, GemmBetaZeroIgnoresC) {
  const int64_t M = 4, N = 3, K = 5;
  TensorBuffer a = test::random_host(Shape{M, K}, DType::f32, 23);
  TensorBuffer b = test::random_host(Shape{K, N}, DType::f32, 24);
  TensorBuffer c = filled(Shape{M, N}, DType::f32, kNaN);
  std::vector<double> ref, mag;
  gemm_ref(read(a), false, read(b), false, read(c), M, N, K, 2.0, 0.0, &ref, &mag);
  ops::gemm(*be, c, a, false, b, false, 2.0f, 0.0f);
  expect_within_mag(read(c), ref, mag, 1e-5, "gemm beta=0");
}

TEST_F(CpuKernels, GemmLowPrecisionOperands) {
  const int64_t M = 6, N = 11, K = 37;
  TensorBuffer a = test::random_host(Shape{K, M}, DType::bf16, 25);
  TensorBuffer b = test::random_host(Shape{N, K}, DType::f16, 26);
  // f32 C: exact inputs, so f32 accuracy.
  TensorBuffer c = test::random_host(Shape{M, N}, DType::f32, 27);
  std::vector<double> ref, mag;
  gemm_ref(read(a), true, read(b), true, read(c), M, N, K, 1.0, 1.0, &ref, &mag);
  ops::gemm(*be, c, a, true, b, true, 1.0f, 1.0f);
  expect_within_mag(read(c), ref, mag, 1e-5, "gemm bf16 x f16 -> f32");
  // bf16 C: one rounding of the result.
  TensorBuffer cb = test::random_host(Shape{M, N}, DType::bf16, 28);
  gemm_ref(read(a), true, read(b), true, read(cb), M, N, K, -1.0, 0.5, &ref, &mag);
  ops::gemm(*be, cb, a, true, b, true, -1.0f, 0.5f);
  expect_close(read(cb), ref, 1.0 / 256, 1e-5 * max_abs(mag), "gemm bf16 C");
}

TEST_F(CpuKernels, GemmEmptyInnerDimensionScalesC) {
  TensorBuffer a = host_empty(Shape{3, 0}, DType::f32);
  TensorBuffer b = host_empty(Shape{0, 2}, DType::f32);
  TensorBuffer c = make(Shape{3, 2}, DType::f32, {1, 2, 3, 4, 5, 6});
  ops::gemm(*be, c, a, false, b, false, 1.0f, 0.5f);
  EXPECT_EQ(read(c), (std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f, 2.5f, 3.0f}));
}

// y = x w^T + bias in double.
void linear_ref(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>* bias, int64_t M,
                int64_t N, int64_t K, std::vector<double>* out, std::vector<double>* mag) {
  out->assign(static_cast<size_t>(M * N), 0.0);
  mag->assign(static_cast<size_t>(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = bias ? (*bias)[n] : 0.0, sa = std::fabs(s);
      for (int64_t k = 0; k < K; ++k) {
        s += static_cast<double>(x[m * K + k]) * w[n * K + k];
        sa += std::fabs(static_cast<double>(x[m * K + k]) * w[n * K + k]);
      }
      (*out)[m * N + n] = s;
      (*mag)[m * N + n] = sa;
    }
}

TEST_F(CpuKernels, LinearF32WithAndWithoutBias) {
  const int64_t K = 37, N = 11;
  TensorBuffer x = test::random_host(Shape{2, 3, K}, DType::f32, 30);  // leading dims [2, 3]: M = 6
  TensorBuffer w = test::random_host(Shape{N, K}, DType::f32, 31);
  TensorBuffer bias = test::random_host(Shape{N}, DType::f32, 32);
  const std::vector<float> bv = read(bias);
  std::vector<double> ref, mag;

  TensorBuffer y = filled(Shape{2, 3, N}, DType::f32, kNaN);
  ops::linear_forward(*be, y, x, w);
  linear_ref(read(x), read(w), nullptr, 6, N, K, &ref, &mag);
  expect_within_mag(read(y), ref, mag, 1e-5, "linear no bias");

  ops::linear_forward(*be, y, x, w, bias);
  linear_ref(read(x), read(w), &bv, 6, N, K, &ref, &mag);
  expect_within_mag(read(y), ref, mag, 1e-5, "linear with bias");
}

TEST_F(CpuKernels, LinearKSplitPartsAreTheProductsOfTheKSlices) {
  const int64_t M = 5, K = 36, N = 11;
  for (int64_t S : {1, 3, 4}) {
    TensorBuffer x = test::random_host(Shape{M, K}, DType::bf16, 40 + S);
    TensorBuffer w = test::random_host(Shape{N, K}, DType::bf16, 50 + S);
    TensorBuffer parts = filled(Shape{S, M, N}, DType::f32, kNaN);
    ops::linear_k_split_forward(*be, parts, x, w);
    const std::vector<float> xv = read(x), wv = read(w), got = read(parts);
    const int64_t part = K / S;
    for (int64_t s = 0; s < S; ++s) {
      // The slice's product in double, from the slices copied out.
      std::vector<float> xs(M * part), ws(N * part);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < part; ++k) xs[m * part + k] = xv[m * K + s * part + k];
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < part; ++k) ws[n * part + k] = wv[n * K + s * part + k];
      std::vector<double> ref, mag;
      linear_ref(xs, ws, nullptr, M, N, part, &ref, &mag);
      const std::vector<float> slice(got.begin() + s * M * N, got.begin() + (s + 1) * M * N);
      const std::string what = "k split part " + std::to_string(s) + " of " + std::to_string(S);
      expect_within_mag(slice, ref, mag, 1e-5, what.c_str());
    }
  }
  EXPECT_EQ(ops::linear_k_split_parts(*be, 32, 1536, 6912, DType::f32), 0) << "the CPU never splits";
}

TEST_F(CpuKernels, LinearLowPrecision) {
  const int64_t M = 3, K = 37, N = 11;
  TensorBuffer x = test::random_host(Shape{M, K}, DType::bf16, 33);
  TensorBuffer w = test::random_host(Shape{N, K}, DType::bf16, 34);
  TensorBuffer bias = test::random_host(Shape{N}, DType::bf16, 35);
  const std::vector<float> bv = read(bias);
  std::vector<double> ref, mag;
  linear_ref(read(x), read(w), &bv, M, N, K, &ref, &mag);

  TensorBuffer y32 = filled(Shape{M, N}, DType::f32, 0.0f);  // f32 logits from bf16 operands
  ops::linear_forward(*be, y32, x, w, bias);
  expect_within_mag(read(y32), ref, mag, 1e-5, "linear bf16 -> f32");

  TensorBuffer yb = filled(Shape{M, N}, DType::bf16, 0.0f);
  ops::linear_forward(*be, yb, x, w, bias);
  expect_close(read(yb), ref, 1.0 / 256, 1e-5 * max_abs(mag), "linear bf16 -> bf16");
}

TEST_F(CpuKernels, LinearManyOutputsBf16Weights) {
  // N spans several blocks of converted weight rows (and a ragged last block).
  const int64_t M = 2, K = 8, N = 2053;
  TensorBuffer x = test::random_host(Shape{M, K}, DType::f32, 36);
  TensorBuffer w = test::random_host(Shape{N, K}, DType::bf16, 37);
  TensorBuffer y = filled(Shape{M, N}, DType::f32, kNaN);
  ops::linear_forward(*be, y, x, w);
  std::vector<double> ref, mag;
  linear_ref(read(x), read(w), nullptr, M, N, K, &ref, &mag);
  expect_within_mag(read(y), ref, mag, 1e-5, "linear N=2053");
}

TEST_F(CpuKernels, BiasAdd) {
  const int64_t M = 7, N = 37;
  TensorBuffer y = test::random_host(Shape{M, N}, DType::f32, 38);
  TensorBuffer bias = test::random_host(Shape{N}, DType::bf16, 39);
  const std::vector<float> y0 = read(y), bv = read(bias);
  ops::bias_add_forward(*be, y, bias);
  const std::vector<float> y1 = read(y);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) ASSERT_EQ(y1[m * N + n], y0[m * N + n] + bv[n]);
}

}  // namespace
}  // namespace kiln
