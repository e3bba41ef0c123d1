// Rotary position embedding in place, Hugging Face "rotate half" convention.
// x: [T, heads, D] (f32/bf16/f16), positions: [T] i32, inv_freq: [D/2] (f32, already scaled for the
// rope type). For token t, head h and pair i < D/2:
//   angle = (float)positions[t] * inv_freq[i]            (an f32 product, as torch computes it)
//   c = (float)cos((double)angle) * attention_scaling    (cos/sin correctly rounded to f32, then
//   s = (float)sin((double)angle) * attention_scaling     the f32 multiply by the scaling)
//   (x[i], x[i + D/2]) <- (x[i] * c - x[i + D/2] * s,  x[i + D/2] * c + x[i] * s)
// All arithmetic after the angle is f32; the result is stored in x's dtype.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_ops.h"

namespace kiln::cpu {
namespace {

// The (c, s) of one pair: the angle and scaling of the header comment.
void pair_cos_sin(int32_t pos, float freq, float attention_scaling, float& c, float& s) {
  const float angle = static_cast<float>(pos) * freq;
  c = static_cast<float>(std::cos(static_cast<double>(angle))) * attention_scaling;
  s = static_cast<float>(std::sin(static_cast<double>(angle))) * attention_scaling;
}

}  // namespace

void rope_cos_sin_table(Tensor table, Tensor positions, Tensor inv_freq, float attention_scaling) {
  detail::check_i32(positions);
  detail::check_float(inv_freq);
  KILN_ASSERT(table.dtype == DType::f32 && table.ndim() == 3 && table.size(2) == 2);
  const int64_t T = table.size(0), half = table.size(1);
  KILN_ASSERT(positions.numel() == T && inv_freq.numel() == half);
  const std::vector<float> freq = detail::to_f32(inv_freq);
  const int32_t* pos = positions.ptr<const int32_t>();
  float* out = table.ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i)  // rope_forward's pairs
      pair_cos_sin(pos[t], freq[i], attention_scaling, out[2 * (t * half + i)], out[2 * (t * half + i) + 1]);
}

void rope_forward(Tensor x, Tensor positions, Tensor inv_freq, float attention_scaling) {
  detail::check_float(x);
  detail::check_i32(positions);
  detail::check_float(inv_freq);
  KILN_ASSERT(x.ndim() == 3);
  const int64_t T = x.size(0), heads = x.size(1), D = x.size(2);
  KILN_ASSERT(D % 2 == 0);
  const int64_t half = D / 2;
  KILN_ASSERT(positions.ndim() == 1 && positions.size(0) == T);
  KILN_ASSERT(inv_freq.ndim() == 1 && inv_freq.size(0) == half);

  const std::vector<float> freq = detail::to_f32(inv_freq);
  const int32_t* pos = positions.ptr<const int32_t>();
  std::vector<float> cos_t(static_cast<size_t>(half)), sin_t(static_cast<size_t>(half));
  std::vector<float> row(static_cast<size_t>(D));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) pair_cos_sin(pos[t], freq[i], attention_scaling, cos_t[i], sin_t[i]);
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t offset = (t * heads + h) * D;
      detail::load_f32(x, offset, D, row.data());
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = row[i], x1 = row[i + half];
        row[i] = x0 * cos_t[i] - x1 * sin_t[i];
        row[i + half] = x1 * cos_t[i] + x0 * sin_t[i];
      }
      detail::store_f32(x, offset, D, row.data());
    }
  }
}

}  // namespace kiln::cpu
