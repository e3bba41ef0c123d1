// Backward passes of the model's row-wise and elementwise ops, and the training attention-input
// stage (qkv_split_rope_forward / _backward), CPU twins: the f32 reference the CUDA kernels are
// tested against. Inputs may be f32, bf16 or f16 (read through load_f32); per-row sums and the
// weight-gradient accumulators are double, elementwise math f32 unless noted.
//
//   rmsnorm:   y = x * r * w, r = 1 / sqrt(mean(x^2) + eps), per row of H.
//              dx = r * (dy * w) - x * r^3 * sum_j(dy_j w_j x_j) / H       (computed in double)
//              dw += sum over rows of dy * x * r
//   swiglu:    out = silu(g) * u, silu(g) = g s, s = 1 / (1 + exp(-g)).
//              dg = dout * u * s * (1 + g (1 - s));  du = dout * silu(g)
//   embedding: dtable[ids[t], :] += dy[t, :]
//   bias:      db[n] += sum over m of dy[m, n]
//   qkv_split_rope_forward: for each token t = b * S + s and head, the arithmetic of
//              cpu::qkv_rope_cache_write step for step: the head row rounded to the output dtype,
//              the optional RMSNorm (double sum of squares, f32 scale, rounded to the output dtype),
//              rotary embedding (rope.cpp's cos/sin and f32 products), stored to q [B, Hq, S, D] or
//              k [B, Hkv, S, D]; value heads copied to v [B, Hkv, S, D].
//   qkv_split_rope_backward: rotary is a rotation by the angle, so its backward rotates dy back:
//              dz0 = dy0 c + dy1 s,  dz1 = dy1 c - dy0 s  (c, s the scaled cos/sin of the forward);
//              then the RMSNorm backward above over D (dq_norm/dk_norm accumulate dz * x * r over all
//              tokens and heads). The forward's roundings are treated as identities.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_train_ops.h"

namespace kiln::cpu {
namespace {

// Backward of y = x * r * w for one row of H values, in double. Writes dx (when not null), adds to
// dw_acc (when not null).
void rmsnorm_row_backward(const float* dy, const float* x, const float* w, int64_t H, float eps, double* dx,
                          double* dw_acc) {
  double sum_sq = 0.0, dot = 0.0;
  for (int64_t i = 0; i < H; ++i) {
    sum_sq += static_cast<double>(x[i]) * x[i];
    dot += static_cast<double>(dy[i]) * w[i] * x[i];
  }
  const double r = 1.0 / std::sqrt(sum_sq / static_cast<double>(H) + static_cast<double>(eps));
  const double c = r * r * r * dot / static_cast<double>(H);
  for (int64_t i = 0; i < H; ++i) {
    if (dx) dx[i] = r * static_cast<double>(dy[i]) * w[i] - c * x[i];
    if (dw_acc) dw_acc[i] += static_cast<double>(dy[i]) * x[i] * r;
  }
}

// Adds the double accumulator to an f32 weight gradient: dw[i] += acc[i].
void add_to_f32(Tensor dw, const std::vector<double>& acc) {
  KILN_ASSERT(dw.dtype == DType::f32 && dw.numel() == static_cast<int64_t>(acc.size()));
  float* p = dw.ptr<float>();
  for (size_t i = 0; i < acc.size(); ++i) p[i] = static_cast<float>(static_cast<double>(p[i]) + acc[i]);
}

// The rotary (cos, sin) * scaling of one position for pairs i < half, as rope.cpp computes them.
void rope_table(int32_t pos, const std::vector<float>& freq, float scaling, float* cos_t, float* sin_t) {
  for (size_t i = 0; i < freq.size(); ++i) {
    const float angle = static_cast<float>(pos) * freq[i];
    cos_t[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * scaling;
    sin_t[i] = static_cast<float>(std::sin(static_cast<double>(angle))) * scaling;
  }
}

// Shapes of the training attention-input stage, read and checked once.
struct QkvDims {
  int64_t B, S, Hq, Hkv, D, half, width;
};

QkvDims qkv_dims(Tensor q, Tensor k, Tensor v, Tensor qkv, Tensor positions, Tensor inv_freq, Tensor q_norm,
                 Tensor k_norm) {
  KILN_ASSERT(q.ndim() == 4 && k.ndim() == 4 && v.shape == k.shape);
  QkvDims d{q.size(0), q.size(2), q.size(1), k.size(1), q.size(3), q.size(3) / 2, 0};
  d.width = (d.Hq + 2 * d.Hkv) * d.D;
  KILN_ASSERT(k.size(0) == d.B && k.size(2) == d.S && k.size(3) == d.D && d.D % 2 == 0);
  KILN_ASSERT(qkv.ndim() == 2 && qkv.size(0) == d.B * d.S && qkv.size(1) == d.width);
  KILN_ASSERT(positions.ndim() == 1 && positions.size(0) == d.B * d.S);
  KILN_ASSERT(inv_freq.ndim() == 1 && inv_freq.size(0) == d.half);
  KILN_ASSERT(!q_norm.data || (q_norm.ndim() == 1 && q_norm.size(0) == d.D));
  KILN_ASSERT(!k_norm.data || (k_norm.ndim() == 1 && k_norm.size(0) == d.D));
  return d;
}

}  // namespace

// dy, x: [rows, H]; w: [H]; dx: [rows, H] (overwritten or accumulated); dw: [H] f32 (accumulated).
void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, float eps, bool accumulate_dx,
                      Tensor dx_copy) {
  detail::check_float(dx);
  const bool has_copy = dx_copy.data != nullptr;
  if (has_copy) {
    detail::check_float(dx_copy);
    KILN_ASSERT(dx_copy.shape == dx.shape);
  }
  detail::check_float(dy);
  detail::check_float(x);
  detail::check_float(w);
  KILN_ASSERT(x.ndim() >= 1 && dy.shape == x.shape && dx.shape == x.shape);
  const int64_t H = x.size(-1);
  KILN_ASSERT(w.ndim() == 1 && w.size(0) == H);
  const bool has_dw = dw.data != nullptr;
  if (has_dw) KILN_ASSERT(dw.device.is_cpu() && dw.dtype == DType::f32 && dw.numel() == H);
  if (H == 0 || x.numel() == 0) return;
  const int64_t rows = x.numel() / H;

  const std::vector<float> wf = detail::to_f32(w);
  std::vector<float> dyr(static_cast<size_t>(H)), xr(static_cast<size_t>(H)), out(static_cast<size_t>(H));
  std::vector<double> dxr(static_cast<size_t>(H)), dw_acc(static_cast<size_t>(H), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    detail::load_f32(dy, r * H, H, dyr.data());
    detail::load_f32(x, r * H, H, xr.data());
    rmsnorm_row_backward(dyr.data(), xr.data(), wf.data(), H, eps, dxr.data(), has_dw ? dw_acc.data() : nullptr);
    if (accumulate_dx) detail::load_f32(dx, r * H, H, out.data());
    for (int64_t i = 0; i < H; ++i) {
      out[i] = accumulate_dx ? static_cast<float>(out[i] + dxr[i]) : static_cast<float>(dxr[i]);
    }
    detail::store_f32(dx, r * H, H, out.data());
    if (has_copy) detail::store_f32(dx_copy, r * H, H, out.data());
  }
  if (has_dw) add_to_f32(dw, dw_acc);
}

// dout: [T, I]; gate_up: [T, 2I]; d_gate_up: [T, 2I] (overwritten; may alias gate_up).
void swiglu_backward(Tensor d_gate_up, Tensor dout, Tensor gate_up) {
  detail::check_float(d_gate_up);
  detail::check_float(dout);
  detail::check_float(gate_up);
  KILN_ASSERT(gate_up.ndim() >= 1 && d_gate_up.shape == gate_up.shape && dout.ndim() == gate_up.ndim());
  for (int d = 0; d + 1 < dout.ndim(); ++d) KILN_ASSERT(dout.size(d) == gate_up.size(d));
  const int64_t I = dout.size(-1);
  KILN_ASSERT(gate_up.size(-1) == 2 * I);
  if (I == 0 || dout.numel() == 0) return;
  const int64_t rows = dout.numel() / I;

  std::vector<float> gu(static_cast<size_t>(2 * I)), d(static_cast<size_t>(I)), out(static_cast<size_t>(2 * I));
  for (int64_t r = 0; r < rows; ++r) {
    detail::load_f32(gate_up, r * 2 * I, 2 * I, gu.data());
    detail::load_f32(dout, r * I, I, d.data());
    for (int64_t i = 0; i < I; ++i) {
      const float g = gu[i], u = gu[I + i];
      const float s = 1.0f / (1.0f + std::exp(-g));
      out[i] = d[i] * u * (s * (1.0f + g * (1.0f - s)));
      out[I + i] = d[i] * (g / (1.0f + std::exp(-g)));
    }
    detail::store_f32(d_gate_up, r * 2 * I, 2 * I, out.data());
  }
}

// dtable: [V, H] f32 (accumulated); dy: [T, H]; ids: [T] i32.
void embedding_backward(Tensor dtable, Tensor dy, Tensor ids) {
  detail::check_float(dy);
  detail::check_i32(ids);
  KILN_ASSERT(dtable.device.is_cpu() && dtable.dtype == DType::f32);
  KILN_ASSERT(dtable.ndim() == 2 && dy.ndim() == 2 && ids.ndim() == 1);
  const int64_t V = dtable.size(0), H = dtable.size(1), T = ids.size(0);
  KILN_ASSERT(dy.size(0) == T && dy.size(1) == H);

  const int32_t* id = ids.ptr<const int32_t>();
  float* table = dtable.ptr<float>();
  std::vector<float> row(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t v = id[t];
    KILN_ASSERT(v >= 0 && v < V);
    detail::load_f32(dy, t * H, H, row.data());
    for (int64_t i = 0; i < H; ++i) table[v * H + i] += row[i];
  }
}

// db: [N] f32 (accumulated); dy: [M, N] (any leading shape).
void bias_backward(Tensor db, Tensor dy) {
  detail::check_float(dy);
  KILN_ASSERT(db.device.is_cpu() && db.dtype == DType::f32 && db.ndim() == 1);
  KILN_ASSERT(dy.ndim() >= 1);
  const int64_t N = dy.size(-1);
  KILN_ASSERT(db.size(0) == N);
  if (N == 0 || dy.numel() == 0) return;
  const int64_t M = dy.numel() / N;

  std::vector<float> row(static_cast<size_t>(N));
  std::vector<double> acc(static_cast<size_t>(N), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    detail::load_f32(dy, m * N, N, row.data());
    for (int64_t n = 0; n < N; ++n) acc[n] += row[n];
  }
  add_to_f32(db, acc);
}

// qkv: [B*S, (Hq + 2 Hkv) D]; q: [B, Hq, S, D]; k, v: [B, Hkv, S, D]; positions: [B*S];
// inv_freq: [D/2]; q_norm, k_norm: [D] or absent.
void qkv_split_rope_forward(Tensor q, Tensor k, Tensor v, Tensor qkv, Tensor positions, Tensor inv_freq,
                            float attention_scaling, Tensor q_norm, Tensor k_norm, float eps) {
  detail::check_float(q);
  detail::check_float(k);
  detail::check_float(v);
  detail::check_float(qkv);
  detail::check_i32(positions);
  detail::check_float(inv_freq);
  const QkvDims d = qkv_dims(q, k, v, qkv, positions, inv_freq, q_norm, k_norm);
  if (d.B * d.S == 0) return;

  const std::vector<float> freq = detail::to_f32(inv_freq);
  const std::vector<float> qw = q_norm.data ? detail::to_f32(q_norm) : std::vector<float>();
  const std::vector<float> kw = k_norm.data ? detail::to_f32(k_norm) : std::vector<float>();
  const int32_t* pos = positions.ptr<const int32_t>();
  std::vector<float> cos_t(static_cast<size_t>(d.half)), sin_t(static_cast<size_t>(d.half));
  std::vector<float> row(static_cast<size_t>(d.D)), out(static_cast<size_t>(d.D));
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t s = 0; s < d.S; ++s) {
      const int64_t t = b * d.S + s;
      rope_table(pos[t], freq, attention_scaling, cos_t.data(), sin_t.data());
      for (int64_t h = 0; h < d.Hq + 2 * d.Hkv; ++h) {
        detail::load_f32(qkv, t * d.width + h * d.D, d.D, row.data());
        if (h >= d.Hq + d.Hkv) {  // value head: a copy
          const int64_t hv = h - d.Hq - d.Hkv;
          detail::store_f32(v, ((b * d.Hkv + hv) * d.S + s) * d.D, d.D, row.data());
          continue;
        }
        const bool is_q = h < d.Hq;
        const Tensor dst = is_q ? q : k;
        const int64_t heads = is_q ? d.Hq : d.Hkv, hh = is_q ? h : h - d.Hq;
        const std::vector<float>& w = is_q ? qw : kw;
        // The split stores the head in the output dtype; the norm reads that and stores rounded.
        for (int64_t i = 0; i < d.D; ++i) row[i] = detail::round_to(dst.dtype, row[i]);
        if (!w.empty()) {
          double sum_sq = 0.0;
          for (int64_t i = 0; i < d.D; ++i) sum_sq += static_cast<double>(row[i]) * row[i];
          const float mean_sq = static_cast<float>(sum_sq / static_cast<double>(d.D));
          const float inv_rms = 1.0f / std::sqrt(mean_sq + eps);
          for (int64_t i = 0; i < d.D; ++i) row[i] = detail::round_to(dst.dtype, (row[i] * inv_rms) * w[i]);
        }
        for (int64_t i = 0; i < d.half; ++i) {
          const float x0 = row[i], x1 = row[i + d.half];
          out[i] = x0 * cos_t[i] - x1 * sin_t[i];
          out[i + d.half] = x1 * cos_t[i] + x0 * sin_t[i];
        }
        detail::store_f32(dst, ((b * heads + hh) * d.S + s) * d.D, d.D, out.data());
      }
    }
  }
}

// d_qkv: [B*S, (Hq + 2 Hkv) D] (overwritten); dq: [B, Hq, S, D]; dk, dv: [B, Hkv, S, D];
// dq_norm, dk_norm: [D] f32 (accumulated) or absent with the norms.
void qkv_split_rope_backward(Tensor d_qkv, Tensor dq_norm, Tensor dk_norm, Tensor dq, Tensor dk, Tensor dv, Tensor qkv,
                             Tensor positions, Tensor inv_freq, float attention_scaling, Tensor q_norm, Tensor k_norm,
                             float eps) {
  detail::check_float(d_qkv);
  detail::check_float(dq);
  detail::check_float(dk);
  detail::check_float(dv);
  detail::check_float(qkv);
  detail::check_i32(positions);
  detail::check_float(inv_freq);
  const QkvDims d = qkv_dims(dq, dk, dv, qkv, positions, inv_freq, q_norm, k_norm);
  KILN_ASSERT(d_qkv.shape == qkv.shape);
  KILN_ASSERT(!q_norm.data || (dq_norm.data && dq_norm.dtype == DType::f32 && dq_norm.numel() == d.D));
  KILN_ASSERT(!k_norm.data || (dk_norm.data && dk_norm.dtype == DType::f32 && dk_norm.numel() == d.D));
  if (d.B * d.S == 0) return;

  const std::vector<float> freq = detail::to_f32(inv_freq);
  const std::vector<float> qw = q_norm.data ? detail::to_f32(q_norm) : std::vector<float>();
  const std::vector<float> kw = k_norm.data ? detail::to_f32(k_norm) : std::vector<float>();
  std::vector<double> dqw_acc(static_cast<size_t>(d.D), 0.0), dkw_acc(static_cast<size_t>(d.D), 0.0);
  const int32_t* pos = positions.ptr<const int32_t>();
  std::vector<float> cos_t(static_cast<size_t>(d.half)), sin_t(static_cast<size_t>(d.half));
  std::vector<float> dy(static_cast<size_t>(d.D)), dz(static_cast<size_t>(d.D)), x(static_cast<size_t>(d.D));
  std::vector<double> dx(static_cast<size_t>(d.D));
  std::vector<float> out(static_cast<size_t>(d.D));
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t s = 0; s < d.S; ++s) {
      const int64_t t = b * d.S + s;
      rope_table(pos[t], freq, attention_scaling, cos_t.data(), sin_t.data());
      for (int64_t h = 0; h < d.Hq + 2 * d.Hkv; ++h) {
        const int64_t dst = t * d.width + h * d.D;
        if (h >= d.Hq + d.Hkv) {  // value head: the gradient passes through
          const int64_t hv = h - d.Hq - d.Hkv;
          detail::load_f32(dv, ((b * d.Hkv + hv) * d.S + s) * d.D, d.D, dy.data());
          detail::store_f32(d_qkv, dst, d.D, dy.data());
          continue;
        }
        const bool is_q = h < d.Hq;
        const Tensor g = is_q ? dq : dk;
        const int64_t heads = is_q ? d.Hq : d.Hkv, hh = is_q ? h : h - d.Hq;
        const std::vector<float>& w = is_q ? qw : kw;
        detail::load_f32(g, ((b * heads + hh) * d.S + s) * d.D, d.D, dy.data());
        for (int64_t i = 0; i < d.half; ++i) {  // rotate back by the angle
          const float g0 = dy[i], g1 = dy[i + d.half];
          dz[i] = g0 * cos_t[i] + g1 * sin_t[i];
          dz[i + d.half] = g1 * cos_t[i] - g0 * sin_t[i];
        }
        if (w.empty()) {
          detail::store_f32(d_qkv, dst, d.D, dz.data());
          continue;
        }
        detail::load_f32(qkv, dst, d.D, x.data());
        for (int64_t i = 0; i < d.D; ++i) x[i] = detail::round_to(g.dtype, x[i]);  // what the forward normed
        rmsnorm_row_backward(dz.data(), x.data(), w.data(), d.D, eps, dx.data(),
                             is_q ? dqw_acc.data() : dkw_acc.data());
        for (int64_t i = 0; i < d.D; ++i) out[i] = static_cast<float>(dx[i]);
        detail::store_f32(d_qkv, dst, d.D, out.data());
      }
    }
  }
  if (q_norm.data) add_to_f32(dq_norm, dqw_acc);
  if (k_norm.data) add_to_f32(dk_norm, dkw_acc);
}

}  // namespace kiln::cpu
