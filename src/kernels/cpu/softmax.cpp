// Row-wise softmax and log-softmax over the last dimension, numerically stable:
//   m = max_j x[j],  s = sum_j exp(x[j] - m)  (exp in f32, sum accumulated in double)
//   softmax:     y[j] = exp(x[j] - m) / s
//   log_softmax: y[j] = (x[j] - m) - log(s)
// x: [..., V] (f32/bf16/f16) viewed as [rows, V]; y: same shape, f32 (another float dtype is
// converted on store). y may alias x. A row of all -inf gives NaN, as in torch.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_ops.h"

namespace kiln::cpu {
namespace {

template <bool kLog>
void softmax_rows(Tensor y, Tensor x) {
  detail::check_float(y);
  detail::check_float(x);
  KILN_ASSERT(x.ndim() >= 1 && y.shape == x.shape);
  const int64_t V = x.size(-1);
  if (V == 0) return;
  const int64_t rows = x.numel() / V;

  std::vector<float> row(static_cast<size_t>(V));
  for (int64_t r = 0; r < rows; ++r) {
    detail::load_f32(x, r * V, V, row.data());
    float m = row[0];
    for (int64_t j = 1; j < V; ++j) m = std::fmax(m, row[j]);
    double s = 0.0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(row[j] - m);
    if constexpr (kLog) {
      const float log_s = static_cast<float>(std::log(s));
      for (int64_t j = 0; j < V; ++j) row[j] = (row[j] - m) - log_s;
    } else {
      const float inv_s = static_cast<float>(1.0 / s);
      for (int64_t j = 0; j < V; ++j) row[j] = std::exp(row[j] - m) * inv_s;
    }
    detail::store_f32(y, r * V, V, row.data());
  }
}

}  // namespace

void softmax_forward(Tensor y, Tensor x) { softmax_rows<false>(y, x); }
void log_softmax_forward(Tensor y, Tensor x) { softmax_rows<true>(y, x); }

}  // namespace kiln::cpu
