// Whole-tensor elementwise ops on float tensors (f32/bf16/f16), in chunks of kChunk elements.
//   cast:          dst[i] = src[i] converted (same element count; bit copy when the dtypes agree).
//   fill_normal:   t[i] = std * sqrt(-2 ln u1) * cos(2 pi u2)   (Box-Muller, f32 math), with
//                  u1 = rng::uniform_open(seed, 2i), u2 = rng::uniform_open(seed, 2i + 1) in (0, 1];
//                  the CUDA twin uses the same formula, so a seed gives the same values on both
//                  devices up to f32 ulps of log/cos and the storage rounding.
//   fill_constant: t[i] = value (rounded to t's dtype).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/rng.h"

namespace kiln::cpu {
namespace {
constexpr int64_t kChunk = 4096;
constexpr float kTwoPi = 6.28318530717958647692f;
}  // namespace

void cast(Tensor dst, Tensor src) {
  detail::check_float(dst);
  detail::check_float(src);
  KILN_ASSERT(dst.numel() == src.numel());
  if (dst.dtype == src.dtype) {
    if (dst.nbytes()) std::memmove(dst.data, src.data, static_cast<size_t>(dst.nbytes()));
    return;
  }
  std::vector<float> buf(kChunk);
  for (int64_t i0 = 0; i0 < src.numel(); i0 += kChunk) {
    const int64_t n = std::min(kChunk, src.numel() - i0);
    detail::load_f32(src, i0, n, buf.data());
    detail::store_f32(dst, i0, n, buf.data());
  }
}

void fill_normal(Tensor t, float std, uint64_t seed) {
  detail::check_float(t);
  std::vector<float> buf(kChunk);
  for (int64_t i0 = 0; i0 < t.numel(); i0 += kChunk) {
    const int64_t n = std::min(kChunk, t.numel() - i0);
    for (int64_t k = 0; k < n; ++k) {
      const uint64_t i = static_cast<uint64_t>(i0 + k);
      const float u1 = rng::uniform_open(seed, 2 * i);
      const float u2 = rng::uniform_open(seed, 2 * i + 1);
      buf[k] = std * std::sqrt(-2.0f * std::log(u1)) * std::cos(kTwoPi * u2);
    }
    detail::store_f32(t, i0, n, buf.data());
  }
}

void fill_constant(Tensor t, float value) {
  detail::check_float(t);
  const std::vector<float> buf(kChunk, value);
  for (int64_t i0 = 0; i0 < t.numel(); i0 += kChunk)
    detail::store_f32(t, i0, std::min(kChunk, t.numel() - i0), buf.data());
}

}  // namespace kiln::cpu
