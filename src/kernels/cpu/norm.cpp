// RMS normalisation over the last dimension (Hugging Face Llama semantics, f32 math):
//   rmsnorm:      y = x * (1 / sqrt(mean(x^2) + eps)) * w
//   add_rmsnorm:  residual += x (stored in residual's dtype); y = rmsnorm(residual) * w, where the
//                 norm reads the stored (rounded) residual. x may be [S, rows, H] partial sums,
//                 added up in f32 in order before the add.
// x, residual, y: [..., H] viewed as [rows, H]; w: [H]. y may alias x (each row is read whole
// before it is written). The sum of squares is accumulated in double, the rest is f32.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_ops.h"

namespace kiln::cpu {
namespace {

// row[0..H) <- row * inv_rms(row) * w, in f32.
void normalize_row(float* row, const float* w, int64_t H, float eps) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < H; ++i) sum_sq += static_cast<double>(row[i]) * row[i];
  const float mean_sq = static_cast<float>(sum_sq / static_cast<double>(H));
  const float inv_rms = 1.0f / std::sqrt(mean_sq + eps);
  for (int64_t i = 0; i < H; ++i) row[i] = (row[i] * inv_rms) * w[i];
}

}  // namespace

void rmsnorm_forward(Tensor y, Tensor x, Tensor w, float eps) {
  detail::check_float(y);
  detail::check_float(x);
  detail::check_float(w);
  KILN_ASSERT(x.ndim() >= 1 && y.shape == x.shape);
  const int64_t H = x.size(-1);
  KILN_ASSERT(w.ndim() == 1 && w.size(0) == H);
  if (H == 0) return;
  const int64_t rows = x.numel() / H;

  const std::vector<float> wf = detail::to_f32(w);
  std::vector<float> row(static_cast<size_t>(H));
  for (int64_t r = 0; r < rows; ++r) {
    detail::load_f32(x, r * H, H, row.data());
    normalize_row(row.data(), wf.data(), H, eps);
    detail::store_f32(y, r * H, H, row.data());
  }
}

void add_rmsnorm_forward(Tensor y, Tensor residual, Tensor x, Tensor w, float eps, Tensor residual_in) {
  if (residual_in.data == nullptr) residual_in = residual;
  detail::check_float(y);
  detail::check_float(residual);
  detail::check_float(x);
  detail::check_float(w);
  detail::check_float(residual_in);
  // x: like residual, or [S, ...residual's shape] of S partial sums.
  const bool partial_sums = x.ndim() == residual.ndim() + 1;
  const int64_t parts = partial_sums ? x.size(0) : 1;
  KILN_ASSERT(residual.ndim() >= 1 && y.shape == residual.shape && residual_in.shape == residual.shape);
  KILN_ASSERT(partial_sums ? x.numel() == parts * residual.numel() && x.size(-1) == residual.size(-1)
                           : x.shape == residual.shape);
  const int64_t H = residual.size(-1);
  KILN_ASSERT(w.ndim() == 1 && w.size(0) == H);
  if (H == 0) return;
  const int64_t rows = residual.numel() / H;

  const std::vector<float> wf = detail::to_f32(w);
  std::vector<float> res(static_cast<size_t>(H)), xr(static_cast<size_t>(H)), part(static_cast<size_t>(H));
  for (int64_t r = 0; r < rows; ++r) {
    detail::load_f32(residual_in, r * H, H, res.data());
    detail::load_f32(x, r * H, H, xr.data());
    for (int64_t s = 1; s < parts; ++s) {  // in order, in f32, as the CUDA twin
      detail::load_f32(x, (s * rows + r) * H, H, part.data());
      for (int64_t i = 0; i < H; ++i) xr[i] += part[i];
    }
    // The sum rounded to the residual's storage dtype: what is stored is what the norm reads.
    for (int64_t i = 0; i < H; ++i) res[i] = detail::round_to(residual.dtype, res[i] + xr[i]);
    detail::store_f32(residual, r * H, H, res.data());
    normalize_row(res.data(), wf.data(), H, eps);
    detail::store_f32(y, r * H, H, res.data());
  }
}

}  // namespace kiln::cpu
