// CPU backward passes (kernels/train_ops.h) against references:
//   * rmsnorm, swiglu, qkv_split_rope: central finite differences of their CPU forwards (f32) of a
//     random projection loss L = sum(y * R), accumulated in double, so dL/dy = R is the upstream
//     gradient the backward receives;
//   * embedding and bias (linear ops): the sums written out here in double;
//   * qkv_split_rope_forward: bit for bit against ops::qkv_rope_cache_write's q output and cache
//     (identity slots), reordered from [T, H, D] to [B, H, S, D];
//   * bf16 inputs: the same numbers as f32 inputs holding the bf16 values, rounded once at the end.
// Finite-difference tolerance: step h = 1e-2 on O(1) inputs. The truncation error is h^2/6 |f'''|
// (~2e-5 for these smooth O(1) functions) and the f32 rounding of the perturbed outputs, divided by
// 2h, is ~ sqrt(H) * 6e-8 * |y R| / 2e-2 (~1e-4 for H ~ 100); 1e-3 * (1 + |g|) leaves a margin over
// both (the worst case seen is 1.5e-4) while still catching any wrong term (those are O(1)).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"
#include "kernels/train_ops.h"
#include "test_util.h"

namespace kiln::test {
namespace {

constexpr float kStep = 1e-2f;
constexpr double kFdTol = 1e-3;

// sum(y * R) in double; y, R: f32 host tensors of one shape.
double dot(Tensor y, Tensor r) {
  KILN_ASSERT(y.dtype == DType::f32 && r.dtype == DType::f32 && y.numel() == r.numel());
  double s = 0.0;
  for (int64_t i = 0; i < y.numel(); ++i) s += static_cast<double>(y.ptr<float>()[i]) * r.ptr<float>()[i];
  return s;
}

// Central differences of loss() with respect to every element of the f32 tensor p.
std::vector<double> finite_differences(Tensor p, const std::function<double()>& loss) {
  KILN_ASSERT(p.dtype == DType::f32);
  std::vector<double> g(static_cast<size_t>(p.numel()));
  float* v = p.ptr<float>();
  for (int64_t i = 0; i < p.numel(); ++i) {
    const float keep = v[i];
    v[i] = keep + kStep;
    const double up = loss();
    v[i] = keep - kStep;
    const double down = loss();
    v[i] = keep;
    // The true step is the difference of the rounded perturbed values.
    const double h2 = static_cast<double>(keep + kStep) - static_cast<double>(keep - kStep);
    g[i] = (up - down) / h2;
  }
  return g;
}

// got[i] == base[i] + fd[i] within the finite-difference tolerance.
void expect_fd_match(const char* what, Tensor got, const std::vector<float>& base, const std::vector<double>& fd) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(fd.size())) << what;
  const std::vector<float> g = cpu::detail::to_f32(got);
  for (size_t i = 0; i < fd.size(); ++i) {
    const double analytic = static_cast<double>(g[i]) - (base.empty() ? 0.0 : base[i]);
    ASSERT_NEAR(analytic, fd[i], kFdTol * (1.0 + std::fabs(fd[i]))) << what << " element " << i;
  }
}

std::vector<float> values(Tensor t) { return cpu::detail::to_f32(t); }

TensorBuffer copy_of(Tensor t) {
  TensorBuffer c = host_empty(t.shape, t.dtype);
  std::memcpy(c.view().data, t.data, static_cast<size_t>(t.nbytes()));
  return c;
}

// bf16 copy of an f32 tensor, and the f32 tensor holding exactly the bf16 values.
TensorBuffer to_bf16(Tensor t) {
  TensorBuffer c = host_empty(t.shape, DType::bf16);
  for (int64_t i = 0; i < t.numel(); ++i) c.ptr<uint16_t>()[i] = f32_to_bf16(t.ptr<float>()[i]);
  return c;
}
TensorBuffer bf16_values_f32(Tensor t) {
  TensorBuffer c = host_empty(t.shape, DType::f32);
  for (int64_t i = 0; i < t.numel(); ++i) c.ptr<float>()[i] = bf16_to_f32(f32_to_bf16(t.ptr<float>()[i]));
  return c;
}

class TrainBackward : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();
};

// ---- rmsnorm --------------------------------------------------------------------------------------

TEST_F(TrainBackward, RmsnormMatchesFiniteDifferences) {
  const float eps = 1e-5f;
  struct Case {
    int64_t rows, H;
  };
  for (Case c : {Case{1, 1}, Case{3, 7}, Case{5, 64}, Case{2, 129}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " H " << c.H);
    TensorBuffer x = random_host({c.rows, c.H}, DType::f32, 101);
    TensorBuffer w = random_host({c.H}, DType::f32, 102);
    TensorBuffer R = random_host({c.rows, c.H}, DType::f32, 103);
    TensorBuffer y = host_empty({c.rows, c.H}, DType::f32);
    auto loss = [&] {
      ops::rmsnorm_forward(*be, y, x, w, eps);
      return dot(y, R);
    };
    const std::vector<double> fd_x = finite_differences(x, loss);
    const std::vector<double> fd_w = finite_differences(w, loss);

    // dx overwritten; dw accumulated onto a non-zero start.
    TensorBuffer dx = random_host({c.rows, c.H}, DType::f32, 104);
    TensorBuffer dw = random_host({c.H}, DType::f32, 105);
    const std::vector<float> dw0 = values(dw);
    ops::rmsnorm_backward(*be, dx, dw, R, x, w, eps, /*accumulate_dx=*/false);
    expect_fd_match("dx", dx, {}, fd_x);
    expect_fd_match("dw", dw, dw0, fd_w);

    // dx accumulated onto its contents; dw accumulates a second time.
    TensorBuffer dx_acc = random_host({c.rows, c.H}, DType::f32, 106);
    const std::vector<float> dx0 = values(dx_acc);
    const std::vector<float> dw1 = values(dw);
    ops::rmsnorm_backward(*be, dx_acc, dw, R, x, w, eps, /*accumulate_dx=*/true);
    expect_fd_match("dx accumulated", dx_acc, dx0, fd_x);
    expect_fd_match("dw accumulated twice", dw, dw1, fd_w);
  }
}

// The optional compute-dtype copy of dx is the new dx rounded, and does not change dx.
TEST_F(TrainBackward, RmsnormWritesTheDxCopy) {
  const int64_t rows = 5, H = 64;
  TensorBuffer x = random_host({rows, H}, DType::f32, 111), w = random_host({H}, DType::f32, 112);
  TensorBuffer dy = random_host({rows, H}, DType::f32, 113), start = random_host({rows, H}, DType::f32, 114);
  TensorBuffer dx_plain = host_empty({rows, H}, DType::f32), dx = host_empty({rows, H}, DType::f32);
  TensorBuffer copy = host_empty({rows, H}, DType::bf16);
  std::memcpy(dx_plain.ptr<float>(), start.ptr<float>(), rows * H * sizeof(float));
  std::memcpy(dx.ptr<float>(), start.ptr<float>(), rows * H * sizeof(float));
  ops::rmsnorm_backward(*be, dx_plain, Tensor{}, dy, x, w, 1e-6f, /*accumulate_dx=*/true);
  ops::rmsnorm_backward(*be, dx, Tensor{}, dy, x, w, 1e-6f, /*accumulate_dx=*/true, copy);
  for (int64_t i = 0; i < rows * H; ++i) {
    ASSERT_EQ(dx.ptr<float>()[i], dx_plain.ptr<float>()[i]) << i;
    ASSERT_EQ(copy.ptr<uint16_t>()[i], f32_to_bf16(dx.ptr<float>()[i])) << i;
  }
}

TEST_F(TrainBackward, RmsnormBf16InputsMatchF32OfSameValues) {
  const int64_t rows = 4, H = 24;
  TensorBuffer x = random_host({rows, H}, DType::f32, 111), dy = random_host({rows, H}, DType::f32, 112);
  TensorBuffer w = random_host({H}, DType::f32, 113);
  TensorBuffer xb = to_bf16(x), dyb = to_bf16(dy), xf = bf16_values_f32(x), dyf = bf16_values_f32(dy);
  TensorBuffer dx_b = host_empty({rows, H}, DType::bf16), dx_f = host_empty({rows, H}, DType::f32);
  TensorBuffer dw_b = host_empty({H}, DType::f32), dw_f = host_empty({H}, DType::f32);
  be->zero(dw_b);
  be->zero(dw_f);
  ops::rmsnorm_backward(*be, dx_b, dw_b, dyb, xb, w, 1e-6f, false);
  ops::rmsnorm_backward(*be, dx_f, dw_f, dyf, xf, w, 1e-6f, false);
  for (int64_t i = 0; i < rows * H; ++i)
    ASSERT_EQ(dx_b.ptr<uint16_t>()[i], f32_to_bf16(dx_f.ptr<float>()[i])) << i;
  for (int64_t i = 0; i < H; ++i) ASSERT_EQ(dw_b.ptr<float>()[i], dw_f.ptr<float>()[i]) << i;
}

// ---- swiglu ---------------------------------------------------------------------------------------

TEST_F(TrainBackward, SwigluMatchesFiniteDifferences) {
  struct Case {
    int64_t T, I;
  };
  for (Case c : {Case{1, 1}, Case{3, 5}, Case{4, 33}}) {
    SCOPED_TRACE(::testing::Message() << "T " << c.T << " I " << c.I);
    TensorBuffer gu = random_host({c.T, 2 * c.I}, DType::f32, 201, 2.0f);
    TensorBuffer R = random_host({c.T, c.I}, DType::f32, 202);
    TensorBuffer out = host_empty({c.T, c.I}, DType::f32);
    auto loss = [&] {
      ops::swiglu_forward(*be, out, gu);
      return dot(out, R);
    };
    const std::vector<double> fd = finite_differences(gu, loss);
    TensorBuffer dgu = random_host({c.T, 2 * c.I}, DType::f32, 203);  // overwritten
    ops::swiglu_backward(*be, dgu, R, gu);
    expect_fd_match("d_gate_up", dgu, {}, fd);

    // In place: d_gate_up aliasing gate_up gives the same result.
    TensorBuffer inplace = copy_of(gu);
    ops::swiglu_backward(*be, inplace, R, inplace);
    for (int64_t i = 0; i < inplace.numel(); ++i) ASSERT_EQ(inplace.ptr<float>()[i], dgu.ptr<float>()[i]) << i;
  }
}

TEST_F(TrainBackward, SwigluBf16InputsMatchF32OfSameValues) {
  const int64_t T = 3, I = 40;
  TensorBuffer gu = random_host({T, 2 * I}, DType::f32, 211, 2.0f), d = random_host({T, I}, DType::f32, 212);
  TensorBuffer gub = to_bf16(gu), db = to_bf16(d), guf = bf16_values_f32(gu), df = bf16_values_f32(d);
  TensorBuffer out_b = host_empty({T, 2 * I}, DType::bf16), out_f = host_empty({T, 2 * I}, DType::f32);
  ops::swiglu_backward(*be, out_b, db, gub);
  ops::swiglu_backward(*be, out_f, df, guf);
  for (int64_t i = 0; i < T * 2 * I; ++i)
    ASSERT_EQ(out_b.ptr<uint16_t>()[i], f32_to_bf16(out_f.ptr<float>()[i])) << i;
}

// ---- embedding, bias ------------------------------------------------------------------------------

TEST_F(TrainBackward, EmbeddingAccumulatesRepeatedIds) {
  const int64_t V = 7, H = 5;
  const std::vector<int32_t> id = {3, 0, 3, 6, 3, 1, 0, 5, 3, 6, 2, 0};
  const int64_t T = static_cast<int64_t>(id.size());
  TensorBuffer ids = host_ints(id);
  for (DType dt : {DType::f32, DType::bf16}) {
    TensorBuffer dy = random_host({T, H}, dt, 301);
    TensorBuffer table = random_host({V, H}, DType::f32, 302);
    const std::vector<float> t0 = values(table), dyv = values(dy);
    ops::embedding_backward(*be, table, dy, ids);
    for (int64_t v = 0; v < V; ++v) {
      for (int64_t j = 0; j < H; ++j) {
        double want = t0[v * H + j];
        for (int64_t t = 0; t < T; ++t)
          if (id[t] == v) want += dyv[t * H + j];
        ASSERT_NEAR(table.ptr<float>()[v * H + j], want, 1e-6 * (1.0 + std::fabs(want))) << v << "," << j;
      }
    }
    // Row 4 is never looked up: untouched.
    for (int64_t j = 0; j < H; ++j) ASSERT_EQ(table.ptr<float>()[4 * H + j], t0[4 * H + j]);
  }
}

TEST_F(TrainBackward, BiasSumsRows) {
  struct Case {
    int64_t M, N;
  };
  for (Case c : {Case{1, 1}, Case{7, 3}, Case{33, 65}}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      TensorBuffer dy = random_host({c.M, c.N}, dt, 401);
      TensorBuffer db = random_host({c.N}, DType::f32, 402);
      const std::vector<float> db0 = values(db), dyv = values(dy);
      ops::bias_backward(*be, db, dy);
      for (int64_t n = 0; n < c.N; ++n) {
        double want = db0[n];
        for (int64_t m = 0; m < c.M; ++m) want += dyv[m * c.N + n];
        ASSERT_NEAR(db.ptr<float>()[n], want, 1e-6 * (1.0 + std::fabs(want))) << n;
      }
    }
  }
}

// ---- qkv_split_rope -------------------------------------------------------------------------------

struct QkvCase {
  int64_t B, S, Hq, Hkv, D;
  bool norms;
};

// Everything one case needs on the host.
struct QkvSetup {
  QkvCase c;
  int64_t T, W;
  TensorBuffer qkv, positions, inv_freq, q_norm, k_norm;
  Tensor qn() const { return c.norms ? q_norm.view() : Tensor{}; }
  Tensor kn() const { return c.norms ? k_norm.view() : Tensor{}; }
};

QkvSetup make_qkv(const QkvCase& c, DType dt) {
  QkvSetup s{c, c.B * c.S, (c.Hq + 2 * c.Hkv) * c.D, {}, {}, {}, {}, {}};
  s.qkv = random_host({s.T, s.W}, dt, 501);
  s.q_norm = random_host({c.D}, DType::f32, 502);
  s.k_norm = random_host({c.D}, DType::f32, 503);
  s.inv_freq = host_empty({c.D / 2}, DType::f32);
  for (int64_t i = 0; i < c.D / 2; ++i)
    s.inv_freq.ptr<float>()[i] = static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / c.D));
  std::vector<int32_t> pos(static_cast<size_t>(s.T));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0; t < c.S; ++t) pos[b * c.S + t] = static_cast<int32_t>(5 + 3 * t + 11 * b);  // not 0..S-1
  s.positions = host_ints(pos);
  return s;
}

constexpr float kAttnScaling = 0.9f, kNormEps = 1e-6f;

TEST_F(TrainBackward, QkvSplitRopeForwardMatchesCacheWrite) {
  for (DType dt : {DType::f32, DType::bf16}) {
    for (QkvCase c : {QkvCase{2, 3, 4, 2, 16, true}, QkvCase{1, 5, 3, 1, 10, false}, QkvCase{3, 2, 2, 2, 8, true}}) {
      SCOPED_TRACE(::testing::Message() << "B " << c.B << " S " << c.S << " Hq " << c.Hq << " Hkv " << c.Hkv << " D "
                                        << c.D << " norms " << c.norms << " " << dtype_name(dt));
      QkvSetup s = make_qkv(c, dt);
      TensorBuffer q = host_empty({c.B, c.Hq, c.S, c.D}, dt), k = host_empty({c.B, c.Hkv, c.S, c.D}, dt),
                   v = host_empty({c.B, c.Hkv, c.S, c.D}, dt);
      ops::qkv_split_rope_forward(*be, q, k, v, s.qkv, s.positions, s.inv_freq, kAttnScaling, s.qn(), s.kn(),
                                  kNormEps);

      std::vector<int32_t> slot(static_cast<size_t>(s.T));
      for (int64_t t = 0; t < s.T; ++t) slot[t] = static_cast<int32_t>(t);
      TensorBuffer slots = host_ints(slot);
      TensorBuffer q_ref = host_empty({s.T, c.Hq, c.D}, dt), kc = host_empty({s.T, c.Hkv, c.D}, dt),
                   vc = host_empty({s.T, c.Hkv, c.D}, dt);
      ops::qkv_rope_cache_write(*be, q_ref, kc, vc, s.qkv, s.positions, slots, s.inv_freq, kAttnScaling, s.qn(),
                                s.kn(), kNormEps);
      const std::vector<float> qg = values(q), kg = values(k), vg = values(v);
      const std::vector<float> qr = values(q_ref), kr = values(kc), vr = values(vc);
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t t = 0; t < c.S; ++t)
          for (int64_t i = 0; i < c.D; ++i) {
            const int64_t row = b * c.S + t;
            for (int64_t h = 0; h < c.Hq; ++h)
              ASSERT_EQ(qg[((b * c.Hq + h) * c.S + t) * c.D + i], qr[(row * c.Hq + h) * c.D + i]);
            for (int64_t h = 0; h < c.Hkv; ++h) {
              ASSERT_EQ(kg[((b * c.Hkv + h) * c.S + t) * c.D + i], kr[(row * c.Hkv + h) * c.D + i]);
              ASSERT_EQ(vg[((b * c.Hkv + h) * c.S + t) * c.D + i], vr[(row * c.Hkv + h) * c.D + i]);
            }
          }
    }
  }
}

TEST_F(TrainBackward, QkvSplitRopeMatchesFiniteDifferences) {
  for (QkvCase c : {QkvCase{2, 3, 4, 2, 16, true}, QkvCase{2, 3, 4, 2, 16, false}, QkvCase{1, 5, 3, 1, 10, true},
                    QkvCase{3, 2, 2, 2, 8, false}}) {
    SCOPED_TRACE(::testing::Message() << "B " << c.B << " S " << c.S << " Hq " << c.Hq << " Hkv " << c.Hkv << " D "
                                      << c.D << " norms " << c.norms);
    QkvSetup s = make_qkv(c, DType::f32);
    TensorBuffer q = host_empty({c.B, c.Hq, c.S, c.D}, DType::f32), k = host_empty({c.B, c.Hkv, c.S, c.D}, DType::f32),
                 v = host_empty({c.B, c.Hkv, c.S, c.D}, DType::f32);
    TensorBuffer Rq = random_host(q.shape(), DType::f32, 511), Rk = random_host(k.shape(), DType::f32, 512),
                 Rv = random_host(v.shape(), DType::f32, 513);
    auto loss = [&] {
      ops::qkv_split_rope_forward(*be, q, k, v, s.qkv, s.positions, s.inv_freq, kAttnScaling, s.qn(), s.kn(),
                                  kNormEps);
      return dot(q, Rq) + dot(k, Rk) + dot(v, Rv);
    };
    const std::vector<double> fd_qkv = finite_differences(s.qkv, loss);
    const std::vector<double> fd_qn = c.norms ? finite_differences(s.q_norm, loss) : std::vector<double>();
    const std::vector<double> fd_kn = c.norms ? finite_differences(s.k_norm, loss) : std::vector<double>();

    TensorBuffer d_qkv = random_host({s.T, s.W}, DType::f32, 514);  // overwritten
    TensorBuffer dqn = random_host({c.D}, DType::f32, 515), dkn = random_host({c.D}, DType::f32, 516);
    const std::vector<float> dqn0 = values(dqn), dkn0 = values(dkn);
    ops::qkv_split_rope_backward(*be, d_qkv, c.norms ? dqn.view() : Tensor{}, c.norms ? dkn.view() : Tensor{}, Rq, Rk,
                                 Rv, s.qkv, s.positions, s.inv_freq, kAttnScaling, s.qn(), s.kn(), kNormEps);
    expect_fd_match("d_qkv", d_qkv, {}, fd_qkv);
    if (c.norms) {
      expect_fd_match("dq_norm", dqn, dqn0, fd_qn);
      expect_fd_match("dk_norm", dkn, dkn0, fd_kn);
    } else {
      for (int64_t i = 0; i < c.D; ++i) ASSERT_EQ(dqn.ptr<float>()[i], dqn0[i]);  // absent: untouched
    }
  }
}

TEST_F(TrainBackward, QkvSplitRopeBackwardBf16MatchesF32OfSameValues) {
  const QkvCase c{2, 3, 4, 2, 16, true};
  QkvSetup s = make_qkv(c, DType::f32);
  TensorBuffer Rq = random_host({c.B, c.Hq, c.S, c.D}, DType::f32, 521), Rk = random_host({c.B, c.Hkv, c.S, c.D}, DType::f32, 522),
               Rv = random_host({c.B, c.Hkv, c.S, c.D}, DType::f32, 523);
  TensorBuffer qkv_b = to_bf16(s.qkv), qkv_f = bf16_values_f32(s.qkv);
  TensorBuffer Rq_b = to_bf16(Rq), Rk_b = to_bf16(Rk), Rv_b = to_bf16(Rv);
  TensorBuffer Rq_f = bf16_values_f32(Rq), Rk_f = bf16_values_f32(Rk), Rv_f = bf16_values_f32(Rv);
  TensorBuffer out_b = host_empty({s.T, s.W}, DType::bf16), out_f = host_empty({s.T, s.W}, DType::f32);
  TensorBuffer dqn_b = host_empty({c.D}, DType::f32), dkn_b = host_empty({c.D}, DType::f32);
  TensorBuffer dqn_f = host_empty({c.D}, DType::f32), dkn_f = host_empty({c.D}, DType::f32);
  for (Tensor t : {dqn_b.view(), dkn_b.view(), dqn_f.view(), dkn_f.view()}) be->zero(t);
  ops::qkv_split_rope_backward(*be, out_b, dqn_b, dkn_b, Rq_b, Rk_b, Rv_b, qkv_b, s.positions, s.inv_freq,
                               kAttnScaling, s.qn(), s.kn(), kNormEps);
  ops::qkv_split_rope_backward(*be, out_f, dqn_f, dkn_f, Rq_f, Rk_f, Rv_f, qkv_f, s.positions, s.inv_freq,
                               kAttnScaling, s.qn(), s.kn(), kNormEps);
  for (int64_t i = 0; i < s.T * s.W; ++i) ASSERT_EQ(out_b.ptr<uint16_t>()[i], f32_to_bf16(out_f.ptr<float>()[i])) << i;
  for (int64_t i = 0; i < c.D; ++i) {
    ASSERT_EQ(dqn_b.ptr<float>()[i], dqn_f.ptr<float>()[i]);
    ASSERT_EQ(dkn_b.ptr<float>()[i], dkn_f.ptr<float>()[i]);
  }
}

}  // namespace
}  // namespace kiln::test
