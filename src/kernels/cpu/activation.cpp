// Elementwise ops of the MLP and the residual stream, f32 math, results stored in the output dtype.
//   swiglu_forward:   out[t, i] = silu(g) * u, g = gate_up[t, i], u = gate_up[t, I + i],
//                     silu(g) = g / (1 + exp(-g)).  gate_up: [..., 2I], out: [..., I].
//   bias_add_forward: y[m, n] += bias[n].  y: [..., N] viewed as [M, N], bias: [N].
//   add_inplace:      a += b elementwise.  a, b: same shape (dtypes may differ, e.g. bf16 a, f32 b).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_ops.h"

namespace kiln::cpu {

void swiglu_forward(Tensor out, Tensor gate_up) {
  detail::check_float(out);
  detail::check_float(gate_up);
  KILN_ASSERT(gate_up.ndim() >= 1 && out.ndim() == gate_up.ndim());
  for (int d = 0; d + 1 < out.ndim(); ++d) KILN_ASSERT(out.size(d) == gate_up.size(d));
  const int64_t I = out.size(-1);
  KILN_ASSERT(gate_up.size(-1) == 2 * I);
  if (I == 0) return;
  const int64_t rows = out.numel() / I;

  std::vector<float> gu(static_cast<size_t>(2 * I)), o(static_cast<size_t>(I));
  for (int64_t r = 0; r < rows; ++r) {
    detail::load_f32(gate_up, r * 2 * I, 2 * I, gu.data());
    for (int64_t i = 0; i < I; ++i) {
      const float g = gu[i], u = gu[I + i];
      o[i] = g / (1.0f + std::exp(-g)) * u;
    }
    detail::store_f32(out, r * I, I, o.data());
  }
}

void bias_add_forward(Tensor y, Tensor bias) {
  detail::check_float(y);
  detail::check_float(bias);
  KILN_ASSERT(y.ndim() >= 1);
  const int64_t N = y.size(-1);
  KILN_ASSERT(bias.ndim() == 1 && bias.size(0) == N);
  if (N == 0) return;
  const int64_t M = y.numel() / N;

  const std::vector<float> b = detail::to_f32(bias);
  std::vector<float> row(static_cast<size_t>(N));
  for (int64_t m = 0; m < M; ++m) {
    detail::load_f32(y, m * N, N, row.data());
    for (int64_t n = 0; n < N; ++n) row[n] += b[n];
    detail::store_f32(y, m * N, N, row.data());
  }
}

void add_inplace(Tensor a, Tensor b) {
  detail::check_float(a);
  detail::check_float(b);
  KILN_ASSERT(a.shape == b.shape);
  constexpr int64_t kChunk = 4096;
  std::vector<float> av(kChunk), bv(kChunk);
  for (int64_t i0 = 0; i0 < a.numel(); i0 += kChunk) {
    const int64_t n = std::min(kChunk, a.numel() - i0);
    detail::load_f32(a, i0, n, av.data());
    detail::load_f32(b, i0, n, bv.data());
    for (int64_t i = 0; i < n; ++i) av[i] += bv[i];
    detail::store_f32(a, i0, n, av.data());
  }
}

}  // namespace kiln::cpu
