// CPU kernels (kernels/cpu/) against independent references: naive double-precision loops written
// here, hand-computed values, and known identities (softmax shift invariance, rope relative
// positions, conversion round trips). Calls go through kiln::ops with a CPU backend, so the dispatch
// of ops.cpp is exercised too. The sampler has its own tests (test_sampler.cpp); the KV-cache write
// and attention are in test_cpu_attention.cpp, gemm / linear / bias_add in test_cpu_gemm.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "cpu_kernel_test.h"
#include "kernels/ops.h"
#include "kernels/rng.h"
#include "kernels/step_io.h"
#include "test_util.h"

namespace kiln {
namespace {

// ---------------------------------------------------------------------------------------------
// embedding

TEST_F(CpuKernels, EmbeddingGathersRowsExactly) {
  const int64_t V = 1001, H = 37;
  const std::vector<int32_t> ids = {0, 1000, 5, 5, 999, 17, 500};
  const int64_t T = static_cast<int64_t>(ids.size());
  TensorBuffer id = test::host_ints(ids);
  for (DType table_dtype : {DType::f32, DType::bf16, DType::f16}) {
    TensorBuffer table = test::random_host(Shape{V, H}, table_dtype, 11);
    const std::vector<float> tv = read(table);
    for (DType out_dtype : {DType::f32, DType::bf16, DType::f16}) {
      TensorBuffer out = filled(Shape{T, H}, out_dtype, 123.0f);
      ops::embedding_forward(*be, out, table, id);
      const std::vector<float> ov = read(out);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h) {
          // The table value rounded to the output dtype, through core/dtype.h.
          float want = tv[ids[t] * H + h];
          if (out_dtype == DType::bf16) want = bf16_to_f32(f32_to_bf16(want));
          if (out_dtype == DType::f16) want = f16_to_f32(f32_to_f16(want));
          ASSERT_EQ(ov[t * H + h], want) << dtype_name(table_dtype) << "->" << dtype_name(out_dtype) << " t=" << t;
        }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// rmsnorm / add_rmsnorm

std::vector<double> rmsnorm_ref(const std::vector<float>& x, const std::vector<float>& w, int64_t H, double eps) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / H; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < H; ++i) ss += static_cast<double>(x[r * H + i]) * x[r * H + i];
    const double inv = 1.0 / std::sqrt(ss / H + eps);
    for (int64_t i = 0; i < H; ++i) y[r * H + i] = x[r * H + i] * inv * w[i];
  }
  return y;
}

TEST_F(CpuKernels, RmsnormHandComputed) {
  // x = [3, 4]: mean(x^2) = 12.5, rms = 3.5355339; y = x / rms * [1, 2] = [0.8485281, 2.2627417].
  TensorBuffer x = make(Shape{1, 2}, DType::f32, {3.0f, 4.0f});
  TensorBuffer w = make(Shape{2}, DType::f32, {1.0f, 2.0f});
  TensorBuffer y = filled(Shape{1, 2}, DType::f32, 0.0f);
  ops::rmsnorm_forward(*be, y, x, w, 0.0f);
  EXPECT_NEAR(y.ptr<float>()[0], 0.84852814, 1e-6);
  EXPECT_NEAR(y.ptr<float>()[1], 2.26274170, 1e-6);
}

TEST_F(CpuKernels, RmsnormF32MatchesDoubleReference) {
  const int64_t H = 37;
  TensorBuffer x = test::random_host(Shape{3, 4, H}, DType::f32, 1, 2.0f);
  TensorBuffer w = test::random_host(Shape{H}, DType::f32, 2);
  TensorBuffer y = filled(Shape{3, 4, H}, DType::f32, 0.0f);
  ops::rmsnorm_forward(*be, y, x, w, 1e-6f);
  const std::vector<double> ref = rmsnorm_ref(read(x), read(w), H, 1e-6);
  expect_close(read(y), ref, 1e-5, 1e-6 * max_abs(ref), "rmsnorm f32");

  // In place (y aliases x) gives the same result.
  ops::rmsnorm_forward(*be, x, x, w, 1e-6f);
  expect_close(read(x), ref, 1e-5, 1e-6 * max_abs(ref), "rmsnorm in place");
}

TEST_F(CpuKernels, RmsnormLowPrecisionInputsAndOutputs) {
  const int64_t H = 37;
  for (DType dt : {DType::bf16, DType::f16}) {
    TensorBuffer x = test::random_host(Shape{5, H}, dt, 3);
    TensorBuffer w = test::random_host(Shape{H}, dt, 4);
    const std::vector<double> ref = rmsnorm_ref(read(x), read(w), H, 1e-5);
    // f32 output: only the f32 math differs from the reference.
    TensorBuffer y32 = filled(Shape{5, H}, DType::f32, 0.0f);
    ops::rmsnorm_forward(*be, y32, x, w, 1e-5f);
    expect_close(read(y32), ref, 1e-5, 1e-6 * max_abs(ref), "rmsnorm low-precision in, f32 out");
    // Same-dtype output: one rounding of the result.
    TensorBuffer y = filled(Shape{5, H}, dt, 0.0f);
    ops::rmsnorm_forward(*be, y, x, w, 1e-5f);
    const double rtol = dt == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
    expect_close(read(y), ref, rtol, 1e-6, "rmsnorm low-precision out");
  }
}

TEST_F(CpuKernels, AddRmsnormF32) {
  const int64_t H = 37, R = 6;
  TensorBuffer res = test::random_host(Shape{R, H}, DType::f32, 5);
  TensorBuffer x = test::random_host(Shape{R, H}, DType::f32, 6);
  TensorBuffer w = test::random_host(Shape{H}, DType::f32, 7);
  TensorBuffer y = filled(Shape{R, H}, DType::f32, 0.0f);
  const std::vector<float> r0 = read(res), xv = read(x);
  ops::add_rmsnorm_forward(*be, y, res, x, w, 1e-6f);
  const std::vector<float> r1 = read(res);
  for (size_t i = 0; i < r0.size(); ++i) ASSERT_EQ(r1[i], r0[i] + xv[i]) << i;
  const std::vector<double> ref = rmsnorm_ref(r1, read(w), H, 1e-6);
  expect_close(read(y), ref, 1e-5, 1e-6 * max_abs(ref), "add_rmsnorm f32");
}

TEST_F(CpuKernels, AddRmsnormOutOfPlaceKeepsTheInput) {
  const int64_t H = 37, R = 6;
  TensorBuffer res = test::random_host(Shape{R, H}, DType::f32, 5);
  TensorBuffer x = test::random_host(Shape{R, H}, DType::f32, 6);
  TensorBuffer w = test::random_host(Shape{H}, DType::f32, 7);
  TensorBuffer y = filled(Shape{R, H}, DType::f32, 0.0f), out = filled(Shape{R, H}, DType::f32, 0.0f);
  const std::vector<float> r0 = read(res), xv = read(x);
  ops::add_rmsnorm_forward(*be, y, out, x, w, 1e-6f, res);
  EXPECT_EQ(read(res), r0);
  const std::vector<float> r1 = read(out);
  for (size_t i = 0; i < r0.size(); ++i) ASSERT_EQ(r1[i], r0[i] + xv[i]) << i;
  const std::vector<double> ref = rmsnorm_ref(r1, read(w), H, 1e-6);
  expect_close(read(y), ref, 1e-5, 1e-6 * max_abs(ref), "add_rmsnorm out of place");
}

TEST_F(CpuKernels, AddRmsnormNormReadsTheRoundedResidual) {
  const int64_t H = 37, R = 4;
  TensorBuffer res = test::random_host(Shape{R, H}, DType::bf16, 8);
  TensorBuffer x = test::random_host(Shape{R, H}, DType::f32, 9);
  TensorBuffer w = test::random_host(Shape{H}, DType::f32, 10);
  TensorBuffer y = filled(Shape{R, H}, DType::f32, 0.0f);
  const std::vector<float> r0 = read(res), xv = read(x);
  ops::add_rmsnorm_forward(*be, y, res, x, w, 1e-6f);
  const std::vector<float> r1 = read(res);
  for (size_t i = 0; i < r0.size(); ++i) ASSERT_EQ(r1[i], bf16_to_f32(f32_to_bf16(r0[i] + xv[i]))) << i;
  // Tight tolerance: normalising the unrounded sum would be off by ~1e-3.
  const std::vector<double> ref = rmsnorm_ref(r1, read(w), H, 1e-6);
  expect_close(read(y), ref, 1e-5, 1e-6 * max_abs(ref), "add_rmsnorm bf16 residual");
}

TEST_F(CpuKernels, AddRmsnormAddsPartialSumsInOrder) {
  // x as S = 3 partial products [S, R, H]: their f32 sum (in order) is added to the residual.
  const int64_t H = 37, R = 5, S = 3;
  TensorBuffer res = test::random_host(Shape{R, H}, DType::f32, 11);
  TensorBuffer parts = test::random_host(Shape{S, R, H}, DType::f32, 12);
  TensorBuffer w = test::random_host(Shape{H}, DType::f32, 13);
  TensorBuffer y = filled(Shape{R, H}, DType::f32, kNaN);
  const std::vector<float> r0 = read(res), pv = read(parts);
  ops::add_rmsnorm_forward(*be, y, res, parts, w, 1e-6f);
  const std::vector<float> r1 = read(res);
  for (int64_t i = 0; i < R * H; ++i) {
    const float sum = (pv[i] + pv[R * H + i]) + pv[2 * R * H + i];
    ASSERT_EQ(r1[i], r0[i] + sum) << i;
  }
  const std::vector<double> ref = rmsnorm_ref(r1, read(w), H, 1e-6);
  expect_close(read(y), ref, 1e-5, 1e-6 * max_abs(ref), "add_rmsnorm of partial sums");
}

// ---------------------------------------------------------------------------------------------
// rope

std::vector<float> llama_inv_freq(int64_t D, float theta) {
  std::vector<float> f(static_cast<size_t>(D / 2));
  for (int64_t i = 0; i < D / 2; ++i) f[i] = static_cast<float>(1.0 / std::pow(theta, 2.0 * i / D));
  return f;
}

// The rotation in double; the angle is the f32 product pos * inv_freq, as specified.
std::vector<double> rope_ref(const std::vector<float>& x, const std::vector<int32_t>& pos,
                             const std::vector<float>& inv_freq, int64_t heads, int64_t D, double scaling) {
  std::vector<double> y(x.size());
  const int64_t half = D / 2;
  for (size_t t = 0; t < pos.size(); ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<float>(pos[t]) * inv_freq[i];
        const double c = std::cos(angle) * scaling, s = std::sin(angle) * scaling;
        const int64_t o = (static_cast<int64_t>(t) * heads + h) * D;
        const double x0 = x[o + i], x1 = x[o + i + half];
        y[o + i] = x0 * c - x1 * s;
        y[o + i + half] = x1 * c + x0 * s;
      }
  return y;
}

TEST_F(CpuKernels, RopeMatchesDoubleReference) {
  const int64_t heads = 3, D = 64;
  const std::vector<int32_t> positions = {0, 1, 2, 7, 100, 4095, 31999};
  const int64_t T = static_cast<int64_t>(positions.size());
  const std::vector<float> inv_freq = llama_inv_freq(D, 10000.0f);
  TensorBuffer pos = test::host_ints(positions);
  TensorBuffer freq = make(Shape{D / 2}, DType::f32, inv_freq);
  for (float scaling : {1.0f, 0.75f}) {
    TensorBuffer x = test::random_host(Shape{T, heads, D}, DType::f32, 12);
    const std::vector<double> ref = rope_ref(read(x), positions, inv_freq, heads, D, scaling);
    ops::rope_forward(*be, x, pos, freq, scaling);
    expect_close(read(x), ref, 1e-5, 1e-5 * max_abs(ref), "rope f32");
  }
  // bf16 storage: the reference starts from the stored inputs; one rounding of the output.
  TensorBuffer xb = test::random_host(Shape{T, heads, D}, DType::bf16, 13);
  const std::vector<double> ref = rope_ref(read(xb), positions, inv_freq, heads, D, 1.0);
  ops::rope_forward(*be, xb, pos, freq, 1.0f);
  expect_close(read(xb), ref, 1.0 / 256, 1e-6 * max_abs(ref), "rope bf16");
}

TEST_F(CpuKernels, RopeOddHeadDimAndPositionZeroIsIdentity) {
  const int64_t heads = 5, D = 38;  // D/2 = 19 pairs
  TensorBuffer x = test::random_host(Shape{2, heads, D}, DType::f32, 14);
  const std::vector<float> before = read(x);
  TensorBuffer pos = test::host_ints({0, 0});
  TensorBuffer freq = make(Shape{D / 2}, DType::f32, llama_inv_freq(D, 500000.0f));
  ops::rope_forward(*be, x, pos, freq, 1.0f);
  EXPECT_EQ(read(x), before);
}

TEST_F(CpuKernels, RopeDotProductDependsOnlyOnRelativePosition) {
  const int64_t D = 128;
  const std::vector<float> inv_freq = llama_inv_freq(D, 10000.0f);
  TensorBuffer freq = make(Shape{D / 2}, DType::f32, inv_freq);
  TensorBuffer q0 = test::random_host(Shape{1, 1, D}, DType::f32, 15);
  TensorBuffer k0 = test::random_host(Shape{1, 1, D}, DType::f32, 16);
  auto rotated_dot = [&](int32_t m, int32_t n) {
    TensorBuffer q = make(Shape{1, 1, D}, DType::f32, read(q0));
    TensorBuffer k = make(Shape{1, 1, D}, DType::f32, read(k0));
    TensorBuffer pm = test::host_ints({m}), pn = test::host_ints({n});
    ops::rope_forward(*be, q, pm, freq, 1.0f);
    ops::rope_forward(*be, k, pn, freq, 1.0f);
    double dot = 0;
    for (int64_t i = 0; i < D; ++i) dot += static_cast<double>(q.ptr<float>()[i]) * k.ptr<float>()[i];
    return dot;
  };
  const double d0 = rotated_dot(5, 2);
  EXPECT_NEAR(rotated_dot(13, 10), d0, 1e-4 * std::fabs(d0) + 1e-4);
  EXPECT_NEAR(rotated_dot(103, 100), d0, 1e-4 * std::fabs(d0) + 1e-4);
  // Norm preserved with scaling 1.
  TensorBuffer q = make(Shape{1, 1, D}, DType::f32, read(q0));
  TensorBuffer p = test::host_ints({777});
  ops::rope_forward(*be, q, p, freq, 1.0f);
  double n0 = 0, n1 = 0;
  for (int64_t i = 0; i < D; ++i) {
    n0 += static_cast<double>(q0.ptr<float>()[i]) * q0.ptr<float>()[i];
    n1 += static_cast<double>(q.ptr<float>()[i]) * q.ptr<float>()[i];
  }
  EXPECT_NEAR(n1, n0, 1e-5 * n0);
}

// ---------------------------------------------------------------------------------------------
// swiglu / add_inplace

TEST_F(CpuKernels, SwigluMatchesDoubleReference) {
  const int64_t T = 5, I = 37;
  TensorBuffer gu = test::random_host(Shape{T, 2 * I}, DType::f32, 40, 3.0f);
  TensorBuffer out = filled(Shape{T, I}, DType::f32, 0.0f);
  ops::swiglu_forward(*be, out, gu);
  const std::vector<float> g = read(gu);
  std::vector<double> ref(static_cast<size_t>(T * I));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < I; ++i) {
      const double a = g[t * 2 * I + i], u = g[t * 2 * I + I + i];
      ref[t * I + i] = a / (1.0 + std::exp(-a)) * u;
    }
  expect_close(read(out), ref, 1e-5, 1e-7, "swiglu");
}

TEST_F(CpuKernels, SwigluHandValuesAndBf16) {
  // silu(0) = 0, silu(100) = 100, silu(-100) = -100 e^-100 ~ -0, silu(1) = 0.7310586.
  TensorBuffer gu = make(Shape{1, 8}, DType::bf16, {0, 100, -100, 1, 5, 2, 3, 2});
  TensorBuffer out = filled(Shape{1, 4}, DType::f32, 0.0f);
  ops::swiglu_forward(*be, out, gu);
  const std::vector<float> o = read(out);
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_NEAR(o[1], 200.0, 1e-4);
  EXPECT_NEAR(o[2], 0.0, 1e-30);
  EXPECT_NEAR(o[3], 2 * 0.7310585786, 1e-6);
}

TEST_F(CpuKernels, AddInplaceMixedDtypes) {
  const int64_t n = 5000;  // spans more than one chunk
  TensorBuffer a = test::random_host(Shape{n}, DType::bf16, 41);
  TensorBuffer b = test::random_host(Shape{n}, DType::f32, 42);
  const std::vector<float> a0 = read(a), bv = read(b);
  ops::add_inplace(*be, a, b);
  const std::vector<float> a1 = read(a);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a1[i], bf16_to_f32(f32_to_bf16(a0[i] + bv[i]))) << i;

  TensorBuffer c = test::random_host(Shape{3, 7}, DType::f32, 43);
  TensorBuffer d = test::random_host(Shape{3, 7}, DType::f32, 44);
  const std::vector<float> c0 = read(c), dv = read(d);
  ops::add_inplace(*be, c, d);
  const std::vector<float> c1 = read(c);
  for (size_t i = 0; i < c0.size(); ++i) ASSERT_EQ(c1[i], c0[i] + dv[i]);
}

// ---------------------------------------------------------------------------------------------
// softmax / log_softmax

std::vector<double> softmax_ref(const std::vector<float>& x, int64_t V, bool log) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / V; ++r) {
    double m = -INFINITY;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, static_cast<double>(x[r * V + j]));
    double s = 0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(x[r * V + j] - m);
    for (int64_t j = 0; j < V; ++j)
      y[r * V + j] = log ? (x[r * V + j] - m) - std::log(s) : std::exp(x[r * V + j] - m) / s;
  }
  return y;
}

TEST_F(CpuKernels, SoftmaxMatchesDoubleReference) {
  const int64_t V = 1001;
  for (DType dt : {DType::f32, DType::bf16}) {
    TensorBuffer x = test::random_host(Shape{3, V}, dt, 50, 3.0f);
    TensorBuffer y = filled(Shape{3, V}, DType::f32, 0.0f);
    ops::softmax_forward(*be, y, x);
    const std::vector<float> yv = read(y);
    expect_close(yv, softmax_ref(read(x), V, false), 1e-5, 1e-12, "softmax");
    for (int r = 0; r < 3; ++r) {
      double s = 0;
      for (int64_t j = 0; j < V; ++j) s += yv[r * V + j];
      EXPECT_NEAR(s, 1.0, 1e-5);
    }
  }
}

TEST_F(CpuKernels, SoftmaxHandValuesLargeOffsetsAndMaskedEntries) {
  // softmax([0, 1, 2]) = [0.09003057, 0.24472847, 0.66524096], shifted by 1000 (no overflow).
  TensorBuffer x = make(Shape{2, 3}, DType::f32, {1000, 1001, 1002, 0, -kInf, 0});
  TensorBuffer y = filled(Shape{2, 3}, DType::f32, 0.0f);
  ops::softmax_forward(*be, y, x);
  const std::vector<float> yv = read(y);
  EXPECT_NEAR(yv[0], 0.0900305732, 1e-7);
  EXPECT_NEAR(yv[1], 0.2447284711, 1e-7);
  EXPECT_NEAR(yv[2], 0.6652409558, 1e-7);
  EXPECT_EQ(yv[3], 0.5f);
  EXPECT_EQ(yv[4], 0.0f);
  EXPECT_EQ(yv[5], 0.5f);
  // In place.
  ops::softmax_forward(*be, x, x);
  EXPECT_EQ(read(x), yv);
}

TEST_F(CpuKernels, LogSoftmaxIdentities) {
  const int64_t V = 1001, R = 4;
  TensorBuffer x = test::random_host(Shape{R, V}, DType::f32, 51, 4.0f);
  TensorBuffer y = filled(Shape{R, V}, DType::f32, 0.0f);
  ops::log_softmax_forward(*be, y, x);
  const std::vector<float> xv = read(x), yv = read(y);
  expect_close(yv, softmax_ref(xv, V, true), 1e-5, 1e-5, "log_softmax");
  for (int64_t r = 0; r < R; ++r) {
    // logsumexp(y) = 0 and y - x is the same constant (-logsumexp(x)) across the row.
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, static_cast<double>(yv[r * V + j]));
    for (int64_t j = 0; j < V; ++j) s += std::exp(yv[r * V + j] - m);
    EXPECT_NEAR(m + std::log(s), 0.0, 1e-5);
    const double c0 = static_cast<double>(yv[r * V]) - xv[r * V];
    for (int64_t j = 1; j < V; ++j) ASSERT_NEAR(static_cast<double>(yv[r * V + j]) - xv[r * V + j], c0, 1e-5);
  }
  // Hand value: log_softmax([0, 0]) = [-ln 2, -ln 2]; masked entry stays -inf.
  TensorBuffer h = make(Shape{1, 3}, DType::f32, {0.0f, -kInf, 0.0f});
  TensorBuffer hy = filled(Shape{1, 3}, DType::f32, 0.0f);
  ops::log_softmax_forward(*be, hy, h);
  EXPECT_NEAR(hy.ptr<float>()[0], -0.6931471806, 1e-7);
  EXPECT_EQ(hy.ptr<float>()[1], -kInf);
  EXPECT_NEAR(hy.ptr<float>()[2], -0.6931471806, 1e-7);
}

// ---------------------------------------------------------------------------------------------
// cast / fill

TEST_F(CpuKernels, CastHandValues) {
  TensorBuffer src = make(Shape{6}, DType::f32, {1.0f, -2.5f, 1.0f / 3.0f, 65504.0f, 70000.0f, 5.9604645e-8f});
  TensorBuffer b = host_empty(Shape{6}, DType::bf16);
  TensorBuffer h = host_empty(Shape{2, 3}, DType::f16);  // same element count, other shape
  ops::cast(*be, b, src);
  ops::cast(*be, h, src);
  const uint16_t* bb = b.ptr<uint16_t>();
  const uint16_t* hh = h.ptr<uint16_t>();
  EXPECT_EQ(bb[0], 0x3F80);
  EXPECT_EQ(bb[1], 0xC020);
  EXPECT_EQ(bb[2], 0x3EAB);  // 0x3EAAAAAB rounds up
  EXPECT_EQ(hh[0], 0x3C00);
  EXPECT_EQ(hh[1], 0xC100);
  EXPECT_EQ(hh[2], 0x3555);
  EXPECT_EQ(hh[3], 0x7BFF);  // largest finite f16
  EXPECT_EQ(hh[4], 0x7C00);  // overflow -> inf
  EXPECT_EQ(hh[5], 0x0001);  // 2^-24, smallest subnormal
}

TEST_F(CpuKernels, CastRoundTripsAllSixteenBitPatterns) {
  for (DType dt : {DType::bf16, DType::f16}) {
    TensorBuffer bits = host_empty(Shape{65536}, dt);
    for (int i = 0; i < 65536; ++i) bits.ptr<uint16_t>()[i] = static_cast<uint16_t>(i);
    TensorBuffer f = host_empty(Shape{65536}, DType::f32);
    TensorBuffer back = host_empty(Shape{65536}, dt);
    ops::cast(*be, f, bits);
    ops::cast(*be, back, f);
    for (int i = 0; i < 65536; ++i) {
      const float v = f.ptr<float>()[i];
      if (std::isnan(v)) {
        const uint16_t r = back.ptr<uint16_t>()[i];
        EXPECT_TRUE(dt == DType::bf16 ? std::isnan(bf16_to_f32(r)) : std::isnan(f16_to_f32(r))) << i;
      } else {
        ASSERT_EQ(back.ptr<uint16_t>()[i], static_cast<uint16_t>(i)) << dtype_name(dt) << " pattern " << i;
      }
    }
  }
}

TEST_F(CpuKernels, CastRandomValuesRoundToNearest) {
  const int64_t n = 10007;
  TensorBuffer src = test::random_host(Shape{n}, DType::f32, 52, 100.0f);
  TensorBuffer b = host_empty(Shape{n}, DType::bf16);
  TensorBuffer h = host_empty(Shape{n}, DType::f16);
  TensorBuffer bh = host_empty(Shape{n}, DType::f16);
  ops::cast(*be, b, src);
  ops::cast(*be, h, src);
  ops::cast(*be, bh, b);
  for (int64_t i = 0; i < n; ++i) {
    const float v = src.ptr<float>()[i];
    // Nearest representable: the error is at most half a unit in the last place.
    const float vb = bf16_to_f32(b.ptr<uint16_t>()[i]);
    ASSERT_LE(std::fabs(vb - v), std::ldexp(std::fabs(v), -8) * 1.0001) << i;
    ASSERT_EQ(b.ptr<uint16_t>()[i], f32_to_bf16(v));
    ASSERT_EQ(h.ptr<uint16_t>()[i], f32_to_f16(v));
    ASSERT_EQ(bh.ptr<uint16_t>()[i], f32_to_f16(vb));
  }
  // Same dtype: a bit copy.
  TensorBuffer copy = host_empty(Shape{n}, DType::f32);
  ops::cast(*be, copy, src);
  EXPECT_EQ(read(copy), read(src));
}

TEST_F(CpuKernels, FillNormalFormulaStatisticsAndDeterminism) {
  const int64_t n = 200001;
  const float std_dev = 0.02f;
  TensorBuffer t = host_empty(Shape{n}, DType::f32);
  ops::fill_normal(*be, t, std_dev, 42);
  const std::vector<float> v = read(t);
  // The documented formula at a few indices, in double.
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{4095}, int64_t{4096}, int64_t{123457}}) {
    const double u1 = rng::uniform_open(42, 2 * static_cast<uint64_t>(i));
    const double u2 = rng::uniform_open(42, 2 * static_cast<uint64_t>(i) + 1);
    const double want = std_dev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
    EXPECT_NEAR(v[i], want, 1e-5 * std_dev) << i;
  }
  double mean = 0, var = 0;
  int64_t within = 0;
  for (float x : v) mean += x;
  mean /= n;
  for (float x : v) {
    var += (x - mean) * (x - mean);
    within += std::fabs(x) < std_dev;
  }
  var /= n;
  EXPECT_NEAR(mean, 0.0, 4 * std_dev / std::sqrt(static_cast<double>(n)));
  EXPECT_NEAR(std::sqrt(var), std_dev, 0.01 * std_dev);
  EXPECT_NEAR(static_cast<double>(within) / n, 0.682689, 0.005);

  TensorBuffer again = host_empty(Shape{n}, DType::f32);
  ops::fill_normal(*be, again, std_dev, 42);
  EXPECT_EQ(read(again), v);
  TensorBuffer other = host_empty(Shape{n}, DType::f32);
  ops::fill_normal(*be, other, std_dev, 43);
  int64_t same = 0;
  for (int64_t i = 0; i < n; ++i) same += other.ptr<float>()[i] == v[i];
  EXPECT_LT(same, 10);
  // bf16 storage: the f32 values rounded.
  TensorBuffer b = host_empty(Shape{n}, DType::bf16);
  ops::fill_normal(*be, b, std_dev, 42);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b.ptr<uint16_t>()[i], f32_to_bf16(v[i])) << i;
}

TEST_F(CpuKernels, FillConstant) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    TensorBuffer t = host_empty(Shape{4097}, dt);
    ops::fill_constant(*be, t, 0.1f);
    float want = 0.1f;
    if (dt == DType::bf16) want = bf16_to_f32(f32_to_bf16(0.1f));
    if (dt == DType::f16) want = f16_to_f32(f32_to_f16(0.1f));
    for (float x : read(t)) ASSERT_EQ(x, want) << dtype_name(dt);
  }
}

// ---------------------------------------------------------------------------------------------
// step inputs and outputs (kernels/step_io.h)

TEST_F(CpuKernels, StageStepInputsCopiesTheCountedWordsAndResolvesContinuedIds) {
  // Word 0: 11 words to copy; ids at [4, 8): -1 - r takes prev[r] (r = 2, 0, and 7 past prev: 0);
  // -5 at word 9 is outside the ids and stays; words from 11 on are not copied.
  const std::vector<int32_t> src = {11, 10, 20, 30, 5, -3, -1, -8, 40, -5, 50, 60, 70, 80, 90, 100};
  TensorBuffer host = test::host_ints(src);
  TensorBuffer prev = test::host_ints({700, 701, 702, 703});
  TensorBuffer dst = test::host_ints(std::vector<int32_t>(src.size(), 9999));
  ops::stage_step_inputs(*be, dst, host, 16, 4, 4, prev);
  const std::vector<int32_t> want = {11, 10, 20, 30, 5, 702, 700, 0, 40, -5, 50, 9999, 9999, 9999, 9999, 9999};
  EXPECT_EQ(std::vector<int32_t>(dst.ptr<int32_t>(), dst.ptr<int32_t>() + dst.numel()), want);

  TensorBuffer out = test::host_ints({0, 0, 0});
  TensorBuffer words = test::host_ints({-4, 7, 123456789});
  ops::publish_step_outputs(*be, out, words);
  EXPECT_EQ(std::vector<int32_t>(out.ptr<int32_t>(), out.ptr<int32_t>() + 3), (std::vector<int32_t>{-4, 7, 123456789}));
}

}  // namespace
}  // namespace kiln
