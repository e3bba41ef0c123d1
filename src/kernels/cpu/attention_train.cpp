// Dense masked training attention, CPU twin (the f32 reference of kernels/cuda/attention_train.cu).
//
// Shapes: q [B, Hq, S, D]; k, v [B, Hkv, S, D]; out, dout [B, S, Hq, D]; lse [B, Hq, S] f32;
// segment_ids [B, S] i32 or absent (data == nullptr); dq [B, Hq, S, D]; dk, dv [B, Hkv, S, D].
// Query head h reads kv head h / (Hq / Hkv). Query i sees key j iff (!causal || j <= i) and, with
// segment ids, seg[j] == seg[i] >= 0.
//
// Forward, per (b, h, i) over the visible keys j:
//   s_j = scale * q_i . k_j,  m = max_j s_j,  l = sum_j exp(s_j - m),
//   out_i = sum_j exp(s_j - m) v_j / l,  lse_i = m + log(l)
// (no visible key: out_i = 0, lse_i = -inf).
// Backward, with p_j = exp(s_j - lse_i) recomputed from the stored lse and dP_j = dout_i . v_j:
//   delta_i = sum_j p_j dP_j      (= dout_i . out_i, computed here from P so that it does not
//                                   depend on out's storage rounding),
//   dS_j = p_j (dP_j - delta_i),
//   dq_i = scale sum_j dS_j k_j,  dk_j += scale dS_j q_i,  dv_j += p_j dout_i.
// Dot products and the gradient sums accumulate in double. Work items are (b, kv head): each one
// converts its keys and values to f32 once, serves the Hq/Hkv query heads of its group and owns its
// dk/dv rows, so items write disjoint memory and run on up to 16 std::threads when large enough.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_train_ops.h"

namespace kiln::cpu {
namespace {

struct Geometry {
  int64_t B = 0, Hq = 0, Hkv = 0, S = 0, D = 0, group = 1;
};

// Checks the shapes shared by forward and backward and returns the geometry.
Geometry check_geometry(Tensor q, Tensor k, Tensor v, Tensor segment_ids) {
  detail::check_float(q);
  detail::check_float(k);
  detail::check_float(v);
  KILN_ASSERT(q.ndim() == 4 && k.ndim() == 4 && v.shape == k.shape);
  Geometry g;
  g.B = q.size(0);
  g.Hq = q.size(1);
  g.S = q.size(2);
  g.D = q.size(3);
  g.Hkv = k.size(1);
  KILN_ASSERT(k.size(0) == g.B && k.size(2) == g.S && k.size(3) == g.D);
  KILN_ASSERT(g.Hkv > 0 && g.Hq % g.Hkv == 0);
  g.group = g.Hq / g.Hkv;
  if (segment_ids.data != nullptr) {
    detail::check_i32(segment_ids);
    KILN_ASSERT(segment_ids.ndim() == 2 && segment_ids.size(0) == g.B && segment_ids.size(1) == g.S);
  }
  return g;
}

// The per-(b, kv head) state: keys and values as f32 [S, D] and the row's segment ids.
struct KvRows {
  std::vector<float> k, v;
  std::vector<int32_t> seg;  // empty when there are no segment ids
};

KvRows load_kv(Tensor k, Tensor v, Tensor segment_ids, const Geometry& g, int64_t b, int64_t kvh) {
  KvRows r;
  r.k.resize(static_cast<size_t>(g.S * g.D));
  r.v.resize(static_cast<size_t>(g.S * g.D));
  const int64_t base = (b * g.Hkv + kvh) * g.S * g.D;
  detail::load_f32(k, base, g.S * g.D, r.k.data());
  detail::load_f32(v, base, g.S * g.D, r.v.data());
  if (segment_ids.data != nullptr) {
    const int32_t* s = segment_ids.ptr<const int32_t>() + b * g.S;
    r.seg.assign(s, s + g.S);
  }
  return r;
}

// Does query i see key j?
inline bool visible(const KvRows& r, bool causal, int64_t i, int64_t j) {
  if (causal && j > i) return false;
  if (!r.seg.empty()) return r.seg[i] >= 0 && r.seg[j] == r.seg[i];
  return true;
}

inline double dot(const float* a, const float* b, int64_t n) {
  double acc = 0.0;
  for (int64_t d = 0; d < n; ++d) acc += static_cast<double>(a[d]) * static_cast<double>(b[d]);
  return acc;
}

double attention_flops(const Geometry& g) {
  return 4.0 * static_cast<double>(g.B * g.Hq) * static_cast<double>(g.S) * static_cast<double>(g.S) *
         static_cast<double>(g.D);
}

}  // namespace

void attention_train_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, Tensor segment_ids, bool causal,
                             float scale) {
  const Geometry g = check_geometry(q, k, v, segment_ids);
  detail::check_float(out);
  KILN_ASSERT(out.ndim() == 4 && out.size(0) == g.B && out.size(1) == g.S && out.size(2) == g.Hq &&
              out.size(3) == g.D);
  KILN_ASSERT(lse.device.is_cpu() && lse.dtype == DType::f32 && lse.ndim() == 3 && lse.size(0) == g.B &&
              lse.size(1) == g.Hq && lse.size(2) == g.S);
  const int64_t S = g.S, D = g.D;

  detail::parallel_items(g.B * g.Hkv, attention_flops(g), [&](int64_t item) {
    const int64_t b = item / g.Hkv, kvh = item % g.Hkv;
    const KvRows r = load_kv(k, v, segment_ids, g, b, kvh);
    std::vector<float> qrow(static_cast<size_t>(D)), orow(static_cast<size_t>(D));
    std::vector<double> s(static_cast<size_t>(S)), acc(static_cast<size_t>(D));
    for (int64_t h = kvh * g.group; h < (kvh + 1) * g.group; ++h) {
      for (int64_t i = 0; i < S; ++i) {
        detail::load_f32(q, ((b * g.Hq + h) * S + i) * D, D, qrow.data());
        double m = -INFINITY;
        for (int64_t j = 0; j < S; ++j) {
          if (!visible(r, causal, i, j)) continue;
          s[j] = scale * dot(qrow.data(), r.k.data() + j * D, D);
          m = std::max(m, s[j]);
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        double l = 0.0;
        if (m != -INFINITY) {
          for (int64_t j = 0; j < S; ++j) {
            if (!visible(r, causal, i, j)) continue;
            const double w = std::exp(s[j] - m);
            l += w;
            const float* vj = r.v.data() + j * D;
            for (int64_t d = 0; d < D; ++d) acc[d] += w * vj[d];
          }
        }
        for (int64_t d = 0; d < D; ++d) orow[d] = l > 0.0 ? static_cast<float>(acc[d] / l) : 0.0f;
        detail::store_f32(out, ((b * S + i) * g.Hq + h) * D, D, orow.data());
        lse.ptr<float>()[(b * g.Hq + h) * S + i] = l > 0.0 ? static_cast<float>(m + std::log(l)) : -INFINITY;
      }
    }
  });
}

void attention_train_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                              Tensor lse, Tensor segment_ids, bool causal, float scale) {
  const Geometry g = check_geometry(q, k, v, segment_ids);
  detail::check_float(dq);
  detail::check_float(dk);
  detail::check_float(dv);
  detail::check_float(dout);
  detail::check_float(out);
  KILN_ASSERT(dq.shape == q.shape && dk.shape == k.shape && dv.shape == k.shape);
  KILN_ASSERT(dout.ndim() == 4 && dout.size(0) == g.B && dout.size(1) == g.S && dout.size(2) == g.Hq &&
              dout.size(3) == g.D && out.shape == dout.shape);
  KILN_ASSERT(lse.device.is_cpu() && lse.dtype == DType::f32 && lse.ndim() == 3 && lse.size(0) == g.B &&
              lse.size(1) == g.Hq && lse.size(2) == g.S);
  const int64_t S = g.S, D = g.D;

  detail::parallel_items(g.B * g.Hkv, 2.5 * attention_flops(g), [&](int64_t item) {
    const int64_t b = item / g.Hkv, kvh = item % g.Hkv;
    const KvRows r = load_kv(k, v, segment_ids, g, b, kvh);
    std::vector<double> dk_acc(static_cast<size_t>(S * D), 0.0), dv_acc(static_cast<size_t>(S * D), 0.0);
    std::vector<float> qrow(static_cast<size_t>(D)), dorow(static_cast<size_t>(D)), dqrow(static_cast<size_t>(D));
    std::vector<double> p(static_cast<size_t>(S)), dp(static_cast<size_t>(S)), dq_acc(static_cast<size_t>(D));
    for (int64_t h = kvh * g.group; h < (kvh + 1) * g.group; ++h) {
      for (int64_t i = 0; i < S; ++i) {
        const int64_t q_offset = ((b * g.Hq + h) * S + i) * D;
        const float row_lse = lse.ptr<const float>()[(b * g.Hq + h) * S + i];
        std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
        if (row_lse != -INFINITY) {  // a query that sees nothing has no gradient
          detail::load_f32(q, q_offset, D, qrow.data());
          detail::load_f32(dout, ((b * S + i) * g.Hq + h) * D, D, dorow.data());
          double delta = 0.0;
          for (int64_t j = 0; j < S; ++j) {
            if (!visible(r, causal, i, j)) continue;
            p[j] = std::exp(scale * dot(qrow.data(), r.k.data() + j * D, D) - static_cast<double>(row_lse));
            dp[j] = dot(dorow.data(), r.v.data() + j * D, D);
            delta += p[j] * dp[j];
          }
          for (int64_t j = 0; j < S; ++j) {
            if (!visible(r, causal, i, j)) continue;
            const double ds = scale * p[j] * (dp[j] - delta);
            const float* kj = r.k.data() + j * D;
            double* dkj = dk_acc.data() + j * D;
            double* dvj = dv_acc.data() + j * D;
            for (int64_t d = 0; d < D; ++d) {
              dq_acc[d] += ds * kj[d];
              dkj[d] += ds * qrow[d];
              dvj[d] += p[j] * dorow[d];
            }
          }
        }
        for (int64_t d = 0; d < D; ++d) dqrow[d] = static_cast<float>(dq_acc[d]);
        detail::store_f32(dq, q_offset, D, dqrow.data());
      }
    }
    std::vector<float> tmp(static_cast<size_t>(S * D));
    const int64_t kv_offset = (b * g.Hkv + kvh) * S * D;
    for (int64_t e = 0; e < S * D; ++e) tmp[e] = static_cast<float>(dk_acc[e]);
    detail::store_f32(dk, kv_offset, S * D, tmp.data());
    for (int64_t e = 0; e < S * D; ++e) tmp[e] = static_cast<float>(dv_acc[e]);
    detail::store_f32(dv, kv_offset, S * D, tmp.data());
  });
}

}  // namespace kiln::cpu
