// qkv_rope_cache_write (CPU) against an independent reference: each head split out by hand, RMSNorm
// and rotary embedding written out in double precision here, then compared with the fused op.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/ops.h"
#include "test_util.h"

namespace kiln::test {
namespace {

struct Case {
  int64_t T, Hq, Hkv, D;
  bool norms;
};

void run_case(const Case& c) {
  auto be = make_cpu_backend();
  const int64_t W = (c.Hq + 2 * c.Hkv) * c.D, S = c.T + 5, half = c.D / 2;
  TensorBuffer qkv = random_host({c.T, W}, DType::f32, 11);
  TensorBuffer qn = random_host({c.D}, DType::f32, 12), kn = random_host({c.D}, DType::f32, 13);
  TensorBuffer inv = host_empty({half}, DType::f32);
  for (int64_t i = 0; i < half; ++i) inv.ptr<float>()[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / c.D));
  std::vector<int32_t> pos(c.T), slot(c.T);
  for (int64_t t = 0; t < c.T; ++t) pos[t] = static_cast<int32_t>(3 + 7 * t), slot[t] = static_cast<int32_t>(S - 1 - t);
  TensorBuffer positions = host_ints(pos), slots = host_ints(slot);
  TensorBuffer q = host_empty({c.T, c.Hq, c.D}, DType::f32);
  TensorBuffer kc = random_host({S, c.Hkv, c.D}, DType::f32, 14), vc = random_host({S, c.Hkv, c.D}, DType::f32, 15);
  ops::qkv_rope_cache_write(*be, q, kc, vc, qkv, positions, slots, inv, 0.9f, c.norms ? qn.view() : Tensor{},
                            c.norms ? kn.view() : Tensor{}, 1e-5f);
  auto expect_head = [&](const float* src, const float* w, int64_t t, const float* got) {
    std::vector<double> x(src, src + c.D);
    if (w) {
      double ss = 0;
      for (double v : x) ss += v * v;
      double inv_rms = 1.0 / std::sqrt(ss / c.D + 1e-5);
      for (int64_t i = 0; i < c.D; ++i) x[i] = x[i] * inv_rms * w[i];
    }
    for (int64_t i = 0; i < half; ++i) {
      double a = static_cast<double>(static_cast<float>(pos[t]) * inv.ptr<float>()[i]);
      double cs = std::cos(a) * 0.9, sn = std::sin(a) * 0.9;
      double r0 = x[i] * cs - x[i + half] * sn, r1 = x[i + half] * cs + x[i] * sn;
      ASSERT_NEAR(got[i], r0, 1e-4 * (1 + std::fabs(r0)));
      ASSERT_NEAR(got[i + half], r1, 1e-4 * (1 + std::fabs(r1)));
    }
  };
  for (int64_t t = 0; t < c.T; ++t) {
    const float* row = qkv.ptr<float>() + t * W;
    for (int64_t h = 0; h < c.Hq; ++h)
      expect_head(row + h * c.D, c.norms ? qn.ptr<float>() : nullptr, t, q.ptr<float>() + (t * c.Hq + h) * c.D);
    for (int64_t h = 0; h < c.Hkv; ++h) {
      expect_head(row + (c.Hq + h) * c.D, c.norms ? kn.ptr<float>() : nullptr, t,
                  kc.ptr<float>() + (slot[t] * c.Hkv + h) * c.D);
      const float* v_src = row + (c.Hq + c.Hkv + h) * c.D;
      const float* v_got = vc.ptr<float>() + (slot[t] * c.Hkv + h) * c.D;
      for (int64_t i = 0; i < c.D; ++i) ASSERT_EQ(v_got[i], v_src[i]);
    }
  }
}

}  // namespace

TEST(FusedKernels, QkvRopeCacheWriteMatchesReference) {
  run_case({5, 4, 2, 16, false});
  run_case({3, 6, 2, 64, true});
  run_case({1, 4, 1, 32, true});
}

}  // namespace kiln::test
