// CPU training attention (kernels/cpu/attention_train.cpp, through kiln::ops) against references
// written here in double precision:
//  - the forward against a naive materialised softmax (the full S x S probability matrix per head),
//    for out and lse;
//  - the backward against the analytic gradient of that naive forward for every element, and against
//    central finite differences of the scalar loss L = sum(out * R) (R random; dout = R) at sampled
//    elements of q, k and v, which checks the analytic formula itself.
// Cases: causal; causal + segment ids (3 documents, padding -1 at the end); non-causal; non-causal
// with segment ids; GQA (Hq=4, Hkv=2) and MHA; odd S (13, 37); D = 16 and 64; f32 and bf16 storage.
// Padded queries must give out = 0, lse = -inf and zero gradients; padded keys zero dk, dv.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/rng.h"
#include "kernels/train_ops.h"
#include "test_util.h"

namespace kiln {
namespace {

struct Case {
  int64_t B, Hq, Hkv, S, D;
  bool causal;
  bool segments;
  DType dtype;
};

std::string name(const Case& c) {
  return "B" + std::to_string(c.B) + " Hq" + std::to_string(c.Hq) + " Hkv" + std::to_string(c.Hkv) + " S" +
         std::to_string(c.S) + " D" + std::to_string(c.D) + (c.causal ? " causal" : " full") +
         (c.segments ? " segments" : "") + " " + dtype_name(c.dtype);
}

// Segment ids of row b: three documents then padding; the boundaries move with b.
std::vector<int32_t> make_segments(int64_t B, int64_t S) {
  std::vector<int32_t> seg(static_cast<size_t>(B * S));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t e0 = S * 3 / 10 + b, e1 = S * 6 / 10 - b, e2 = S * 17 / 20;  // doc ends; pad from e2
    for (int64_t s = 0; s < S; ++s)
      seg[b * S + s] = s < e0 ? 0 : s < e1 ? 1 : s < e2 ? 2 : -1;
  }
  return seg;
}

// The naive double-precision attention of one problem, with everything materialised.
struct Naive {
  Case c;
  float scale;
  std::vector<double> q, k, v;  // [B,Hq,S,D], [B,Hkv,S,D] x2
  std::vector<int32_t> seg;     // [B,S] or empty

  bool visible(int64_t b, int64_t i, int64_t j) const {
    if (c.causal && j > i) return false;
    if (!seg.empty()) return seg[b * c.S + i] >= 0 && seg[b * c.S + j] == seg[b * c.S + i];
    return true;
  }
  double score(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const int64_t kvh = h / (c.Hq / c.Hkv);
    const double* qi = q.data() + ((b * c.Hq + h) * c.S + i) * c.D;
    const double* kj = k.data() + ((b * c.Hkv + kvh) * c.S + j) * c.D;
    double s = 0;
    for (int64_t d = 0; d < c.D; ++d) s += qi[d] * kj[d];
    return scale * s;
  }
  // P[i][j] of head (b, h): the softmax over visible keys (rows with none are all zero).
  std::vector<double> probs(int64_t b, int64_t h, std::vector<double>* lse_row) const {
    const int64_t S = c.S;
    std::vector<double> P(static_cast<size_t>(S * S), 0.0);
    for (int64_t i = 0; i < S; ++i) {
      double m = -INFINITY;
      for (int64_t j = 0; j < S; ++j)
        if (visible(b, i, j)) m = std::max(m, score(b, h, i, j));
      double l = 0;
      for (int64_t j = 0; j < S; ++j)
        if (visible(b, i, j)) l += (P[i * S + j] = std::exp(score(b, h, i, j) - m));
      for (int64_t j = 0; j < S; ++j)
        if (l > 0) P[i * S + j] /= l;
      if (lse_row) (*lse_row)[i] = l > 0 ? m + std::log(l) : -INFINITY;
    }
    return P;
  }
  // out [B,S,Hq,D], lse [B,Hq,S].
  void forward(std::vector<double>& out, std::vector<double>& lse) const {
    const int64_t S = c.S, D = c.D;
    out.assign(static_cast<size_t>(c.B * S * c.Hq * D), 0.0);
    lse.assign(static_cast<size_t>(c.B * c.Hq * S), 0.0);
    std::vector<double> lse_row(static_cast<size_t>(S));
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.Hq; ++h) {
        const std::vector<double> P = probs(b, h, &lse_row);
        const int64_t kvh = h / (c.Hq / c.Hkv);
        for (int64_t i = 0; i < S; ++i) {
          lse[(b * c.Hq + h) * S + i] = lse_row[i];
          for (int64_t j = 0; j < S; ++j) {
            const double p = P[i * S + j];
            if (p == 0) continue;
            const double* vj = v.data() + ((b * c.Hkv + kvh) * S + j) * D;
            double* o = out.data() + ((b * S + i) * c.Hq + h) * D;
            for (int64_t d = 0; d < D; ++d) o[d] += p * vj[d];
          }
        }
      }
  }
  double loss(const std::vector<double>& R) const {
    std::vector<double> out, lse;
    forward(out, lse);
    double L = 0;
    for (size_t e = 0; e < out.size(); ++e) L += out[e] * R[e];
    return L;
  }
  // Analytic gradients of sum(out * dout): dP = dout V^T, dS = P (dP - rowsum(P dP)), dq = scale dS K,
  // dk = scale dS^T Q, dv = P^T dout.
  void backward(const std::vector<double>& dout, std::vector<double>& dq, std::vector<double>& dk,
                std::vector<double>& dv) const {
    const int64_t S = c.S, D = c.D;
    dq.assign(q.size(), 0.0);
    dk.assign(k.size(), 0.0);
    dv.assign(v.size(), 0.0);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.Hq; ++h) {
        const std::vector<double> P = probs(b, h, nullptr);
        const int64_t kvh = h / (c.Hq / c.Hkv);
        for (int64_t i = 0; i < S; ++i) {
          const double* doi = dout.data() + ((b * S + i) * c.Hq + h) * D;
          const double* qi = q.data() + ((b * c.Hq + h) * S + i) * D;
          std::vector<double> dp(static_cast<size_t>(S), 0.0);
          double delta = 0;
          for (int64_t j = 0; j < S; ++j) {
            const double* vj = v.data() + ((b * c.Hkv + kvh) * S + j) * D;
            for (int64_t d = 0; d < D; ++d) dp[j] += doi[d] * vj[d];
            delta += P[i * S + j] * dp[j];
          }
          for (int64_t j = 0; j < S; ++j) {
            const double p = P[i * S + j];
            if (p == 0) continue;
            const double ds = scale * p * (dp[j] - delta);
            const int64_t kv_off = ((b * c.Hkv + kvh) * S + j) * D;
            for (int64_t d = 0; d < D; ++d) {
              dq[((b * c.Hq + h) * S + i) * D + d] += ds * k[kv_off + d];
              dk[kv_off + d] += ds * qi[d];
              dv[kv_off + d] += p * doi[d];
            }
          }
        }
      }
  }
};

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }
std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

void run_case(const Case& c, uint64_t seed) {
  SCOPED_TRACE(name(c));
  auto be = make_cpu_backend();
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  TensorBuffer q = test::random_host(Shape{c.B, c.Hq, c.S, c.D}, c.dtype, seed + 1);
  TensorBuffer k = test::random_host(Shape{c.B, c.Hkv, c.S, c.D}, c.dtype, seed + 2);
  TensorBuffer v = test::random_host(Shape{c.B, c.Hkv, c.S, c.D}, c.dtype, seed + 3);
  TensorBuffer dout = test::random_host(Shape{c.B, c.S, c.Hq, c.D}, c.dtype, seed + 4);
  TensorBuffer seg;
  Naive ref{c, scale, to_double(test::to_f32(*be, q)), to_double(test::to_f32(*be, k)),
            to_double(test::to_f32(*be, v)), {}};
  if (c.segments) {
    ref.seg = make_segments(c.B, c.S);
    seg = test::host_ints(ref.seg);
  }
  Tensor seg_view = c.segments ? seg.view().view(Shape{c.B, c.S}) : Tensor{};

  TensorBuffer out = host_empty(Shape{c.B, c.S, c.Hq, c.D}, c.dtype);
  TensorBuffer lse = host_empty(Shape{c.B, c.Hq, c.S}, DType::f32);
  ops::attention_train_forward(*be, out, lse, q, k, v, seg_view, c.causal, scale);

  // Forward: out and lse against the materialised softmax.
  std::vector<double> out_ref, lse_ref;
  ref.forward(out_ref, lse_ref);
  const double out_tol = c.dtype == DType::f32 ? 1e-6 : 5e-3;  // bf16: the output's storage rounding
  EXPECT_LT(test::rel_error(test::to_f32(*be, out), to_float(out_ref)), out_tol) << "out";
  std::vector<float> lse_got = test::to_f32(*be, lse), lse_fin, lse_ref_fin;
  int64_t masked_rows = 0;
  for (size_t e = 0; e < lse_ref.size(); ++e) {
    if (std::isinf(lse_ref[e])) {
      ++masked_rows;
      EXPECT_TRUE(std::isinf(lse_got[e]) && lse_got[e] < 0) << "lse of a masked row " << e << ": " << lse_got[e];
    } else {
      lse_fin.push_back(lse_got[e]);
      lse_ref_fin.push_back(static_cast<float>(lse_ref[e]));
    }
  }
  EXPECT_LT(test::rel_error(lse_fin, lse_ref_fin), 1e-6) << "lse";
  EXPECT_EQ(masked_rows > 0, c.segments) << "the segment cases pad; the others see at least the diagonal";

  // Backward against the analytic double gradient.
  TensorBuffer dq = host_empty(q.shape(), c.dtype);
  TensorBuffer dk = host_empty(k.shape(), c.dtype);
  TensorBuffer dv = host_empty(v.shape(), c.dtype);
  ops::attention_train_backward(*be, dq, dk, dv, dout, q, k, v, out, lse, seg_view, c.causal, scale);
  const std::vector<double> R = to_double(test::to_f32(*be, dout));
  std::vector<double> dq_ref, dk_ref, dv_ref;
  ref.backward(R, dq_ref, dk_ref, dv_ref);
  const std::vector<float> dq_got = test::to_f32(*be, dq), dk_got = test::to_f32(*be, dk),
                           dv_got = test::to_f32(*be, dv);
  const double grad_tol = c.dtype == DType::f32 ? 1e-5 : 5e-3;
  EXPECT_LT(test::rel_error(dq_got, to_float(dq_ref)), grad_tol) << "dq";
  EXPECT_LT(test::rel_error(dk_got, to_float(dk_ref)), grad_tol) << "dk";
  EXPECT_LT(test::rel_error(dv_got, to_float(dv_ref)), grad_tol) << "dv";

  // Padding: queries see nothing (out 0, no dq), keys are seen by nobody (no dk, dv).
  if (c.segments) {
    const std::vector<float> out_got = test::to_f32(*be, out);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t s = 0; s < c.S; ++s) {
        if (ref.seg[b * c.S + s] >= 0) continue;
        for (int64_t d = 0; d < c.D; ++d) {
          for (int64_t h = 0; h < c.Hq; ++h) {
            ASSERT_EQ(out_got[((b * c.S + s) * c.Hq + h) * c.D + d], 0.0f) << "padded out b" << b << " s" << s;
            ASSERT_EQ(dq_got[((b * c.Hq + h) * c.S + s) * c.D + d], 0.0f) << "padded dq b" << b << " s" << s;
          }
          for (int64_t h = 0; h < c.Hkv; ++h) {
            ASSERT_EQ(dk_got[((b * c.Hkv + h) * c.S + s) * c.D + d], 0.0f) << "padded dk b" << b << " s" << s;
            ASSERT_EQ(dv_got[((b * c.Hkv + h) * c.S + s) * c.D + d], 0.0f) << "padded dv b" << b << " s" << s;
          }
        }
      }
  }

  // Central finite differences of L = sum(out * R) in double at sampled elements (f32 cases; the
  // bf16 cases differ from the analytic gradient only by the storage rounding checked above).
  if (c.dtype != DType::f32) return;
  const double eps = 1e-4;
  auto check_fd = [&](std::vector<double>& x, const std::vector<float>& got, const char* what) {
    std::vector<float> fd, an;
    const int64_t n = static_cast<int64_t>(x.size());
    const int64_t samples = std::min<int64_t>(n, 48);
    for (int64_t t = 0; t < samples; ++t) {
      const int64_t e = samples == n ? t : static_cast<int64_t>(rng::uniform(seed + 99, static_cast<uint64_t>(t)) * n);
      const double x0 = x[e];
      x[e] = x0 + eps;
      const double lp = ref.loss(R);
      x[e] = x0 - eps;
      const double lm = ref.loss(R);
      x[e] = x0;
      fd.push_back(static_cast<float>((lp - lm) / (2 * eps)));
      an.push_back(got[e]);
    }
    EXPECT_LT(test::rel_error(an, fd), 1e-5) << what << " against finite differences";
  };
  check_fd(ref.q, dq_got, "dq");
  check_fd(ref.k, dk_got, "dk");
  check_fd(ref.v, dv_got, "dv");
}

TEST(AttentionTrainCpu, CausalMha) { run_case({2, 2, 2, 13, 16, true, false, DType::f32}, 10); }
TEST(AttentionTrainCpu, CausalGqaD64) { run_case({2, 4, 2, 37, 64, true, false, DType::f32}, 20); }
TEST(AttentionTrainCpu, CausalSegmentsGqa) { run_case({2, 4, 2, 37, 16, true, true, DType::f32}, 30); }
TEST(AttentionTrainCpu, CausalSegmentsMhaD64) { run_case({1, 2, 2, 37, 64, true, true, DType::f32}, 40); }
TEST(AttentionTrainCpu, NonCausalGqa) { run_case({2, 4, 2, 13, 16, false, false, DType::f32}, 50); }
TEST(AttentionTrainCpu, NonCausalMhaD64) { run_case({1, 2, 2, 37, 64, false, false, DType::f32}, 60); }
TEST(AttentionTrainCpu, NonCausalSegmentsGqa) { run_case({2, 4, 2, 37, 16, false, true, DType::f32}, 70); }
TEST(AttentionTrainCpu, Bf16CausalSegmentsGqa) { run_case({2, 4, 2, 37, 64, true, true, DType::bf16}, 80); }

// A query whose row of scores is large: lse must not overflow (the max is subtracted), and a scale
// of 1 with big inputs still gives a normalised output.
TEST(AttentionTrainCpu, LargeScoresAreStable) {
  auto be = make_cpu_backend();
  const Case c{1, 1, 1, 5, 16, true, false, DType::f32};
  TensorBuffer q = test::random_host(Shape{1, 1, 5, 16}, DType::f32, 7, 30.0f);
  TensorBuffer k = test::random_host(Shape{1, 1, 5, 16}, DType::f32, 8, 30.0f);
  TensorBuffer v = test::random_host(Shape{1, 1, 5, 16}, DType::f32, 9);
  Naive ref{c, 1.0f, to_double(test::to_f32(*be, q)), to_double(test::to_f32(*be, k)), to_double(test::to_f32(*be, v)),
            {}};
  TensorBuffer out = host_empty(Shape{1, 5, 1, 16}, DType::f32);
  TensorBuffer lse = host_empty(Shape{1, 1, 5}, DType::f32);
  ops::attention_train_forward(*be, out, lse, q, k, v, Tensor{}, true, 1.0f);
  std::vector<double> out_ref, lse_ref;
  ref.forward(out_ref, lse_ref);
  EXPECT_LT(test::rel_error(test::to_f32(*be, out), to_float(out_ref)), 1e-5);
  EXPECT_LT(test::rel_error(test::to_f32(*be, lse), to_float(lse_ref)), 1e-6);
}

}  // namespace
}  // namespace kiln
