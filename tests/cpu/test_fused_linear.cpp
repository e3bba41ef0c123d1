// The fused small-batch linear layers (CPU) against a double-precision reference written out here:
// RMSNorm, the product, bias, SwiGLU and the residual add, each by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/ops.h"
#include "test_util.h"

namespace kiln::test {
namespace {

struct Shape3 {
  int64_t M, N, K;
};

// ref[m][n] = sum_k normed(x)[m][k] w[n][k] + bias[n], normed(x) = x / rms(x) * g (or x).
std::vector<double> reference(const float* x, const float* g, const float* w, const float* bias, const Shape3& s,
                              float eps) {
  std::vector<double> out(s.M * s.N);
  for (int64_t m = 0; m < s.M; ++m) {
    std::vector<double> row(x + m * s.K, x + (m + 1) * s.K);
    if (g) {
      double ss = 0;
      for (double v : row) ss += v * v;
      const double r = 1.0 / std::sqrt(ss / s.K + eps);
      for (int64_t k = 0; k < s.K; ++k) row[k] = row[k] * r * g[k];
    }
    for (int64_t n = 0; n < s.N; ++n) {
      double acc = bias ? bias[n] : 0.0;
      for (int64_t k = 0; k < s.K; ++k) acc += row[k] * w[n * s.K + k];
      out[m * s.N + n] = acc;
    }
  }
  return out;
}

void expect_close(const float* got, const std::vector<double>& want) {
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << i;
}

TEST(FusedLinear, MatchHandWrittenReference) {
  auto be = make_cpu_backend();
  const float eps = 1e-5f;
  for (const Shape3& s : {Shape3{1, 16, 32}, Shape3{5, 37, 96}, Shape3{32, 64, 64}, Shape3{100, 40, 48}}) {
    for (bool with_bias : {false, true}) {
      SCOPED_TRACE(testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K << " bias=" << with_bias);
      TensorBuffer x = random_host({s.M, s.K}, DType::f32, 1), g = random_host({s.K}, DType::f32, 2);
      TensorBuffer w = random_host({s.N, s.K}, DType::f32, 3, 0.2f), b = random_host({s.N}, DType::f32, 4);
      const float* bias = with_bias ? b.ptr<float>() : nullptr;
      const Tensor bias_t = with_bias ? b.view() : Tensor{};

      TensorBuffer y = host_empty({s.M, s.N}, DType::f32);
      ops::norm_linear_forward(*be, y, x, g, eps, w, bias_t);
      expect_close(y.ptr<float>(), reference(x.ptr<float>(), g.ptr<float>(), w.ptr<float>(), bias, s, eps));

      // residual += x @ w^T + bias
      TensorBuffer r = random_host({s.M, s.N}, DType::f32, 5);
      std::vector<float> r0(r.ptr<float>(), r.ptr<float>() + s.M * s.N);
      ops::linear_residual_forward(*be, r, x, w, bias_t);
      std::vector<double> want = reference(x.ptr<float>(), nullptr, w.ptr<float>(), bias, s, eps);
      for (size_t i = 0; i < want.size(); ++i) want[i] += r0[i];
      expect_close(r.ptr<float>(), want);

      // SwiGLU over [gate | up] = normed(x) @ w2^T + bias2, w2: [2N, K]
      const Shape3 s2{s.M, 2 * s.N, s.K};
      TensorBuffer w2 = random_host({2 * s.N, s.K}, DType::f32, 6, 0.2f), b2 = random_host({2 * s.N}, DType::f32, 7);
      TensorBuffer act = host_empty({s.M, s.N}, DType::f32);
      ops::norm_linear_swiglu_forward(*be, act, x, g, eps, w2, with_bias ? b2.view() : Tensor{});
      const std::vector<double> gu =
          reference(x.ptr<float>(), g.ptr<float>(), w2.ptr<float>(), with_bias ? b2.ptr<float>() : nullptr, s2, eps);
      std::vector<double> want_act(s.M * s.N);
      for (int64_t m = 0; m < s.M; ++m)
        for (int64_t n = 0; n < s.N; ++n) {
          const double gate = gu[m * 2 * s.N + n], up = gu[m * 2 * s.N + s.N + n];
          want_act[m * s.N + n] = gate / (1.0 + std::exp(-gate)) * up;
        }
      expect_close(act.ptr<float>(), want_act);

      // The same SwiGLU without the norm: [gate | up] = x @ w2^T + bias2
      ops::linear_swiglu_forward(*be, act, x, w2, with_bias ? b2.view() : Tensor{});
      const std::vector<double> gu_plain =
          reference(x.ptr<float>(), nullptr, w2.ptr<float>(), with_bias ? b2.ptr<float>() : nullptr, s2, eps);
      for (int64_t m = 0; m < s.M; ++m)
        for (int64_t n = 0; n < s.N; ++n) {
          const double gate = gu_plain[m * 2 * s.N + n], up = gu_plain[m * 2 * s.N + s.N + n];
          want_act[m * s.N + n] = gate / (1.0 + std::exp(-gate)) * up;
        }
      expect_close(act.ptr<float>(), want_act);
    }
  }
}

// The greedy head: the logits as norm_linear writes them, and each row's token the first index of its
// largest logit (planted: two equal rows on top of the others, the first of them wins; a NaN logit
// counts as -inf).
TEST(FusedLinear, GreedyHeadPicksTheFirstLargestLogit) {
  auto be = make_cpu_backend();
  const float eps = 1e-5f;
  const Shape3 s{3, 50, 32};
  TensorBuffer x = random_host({s.M, s.K}, DType::f32, 1), g = random_host({s.K}, DType::f32, 2);
  TensorBuffer w = random_host({s.N, s.K}, DType::f32, 3, 0.2f);
  float* wp = w.ptr<float>();
  for (int64_t k = 0; k < s.K; ++k) {
    wp[7 * s.K + k] = wp[31 * s.K + k] = 3.0f * x.ptr<float>()[k] * g.ptr<float>()[k];  // row 0's winners
    wp[0 * s.K + k] = k == 0 ? NAN : 0.0f;
  }
  TensorBuffer logits = host_empty({s.M, s.N}, DType::f32), tokens = host_empty({s.M}, DType::i32);
  ops::norm_linear_argmax_forward(*be, logits, tokens, x, g, eps, w, Tensor{});
  const std::vector<double> want = reference(x.ptr<float>(), g.ptr<float>(), wp, nullptr, s, eps);
  for (int64_t m = 0; m < s.M; ++m) {
    int64_t best = 1;  // logit 0 is NaN
    for (int64_t n = 2; n < s.N; ++n)
      if (want[m * s.N + n] > want[m * s.N + best] + 1e-6) best = n;
    EXPECT_EQ(tokens.ptr<int32_t>()[m], best) << "row " << m;
    for (int64_t n = 1; n < s.N; ++n)
      EXPECT_NEAR(logits.ptr<float>()[m * s.N + n], want[m * s.N + n], 1e-4 * (1 + std::fabs(want[m * s.N + n])));
  }
  EXPECT_EQ(tokens.ptr<int32_t>()[0], 7);
}

}  // namespace
}  // namespace kiln::test
