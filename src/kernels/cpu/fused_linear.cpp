// CPU twins of the fused small-batch linear layers (ops.h: norm_linear_forward,
// norm_linear_swiglu_forward, linear_swiglu_forward, linear_residual_forward), composed in f32 from
// the same formulas:
// the normed rows x * norm_w scaled by 1 / rms after the product, as the CUDA kernels do.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/sampling_math.h"

namespace kiln::cpu {
namespace {

Tensor host_f32(std::vector<float>& v, int64_t rows, int64_t cols) {
  Tensor t;
  t.data = v.data();
  t.dtype = DType::f32;
  t.device = Device::cpu();
  t.shape = Shape{rows, cols};
  return t;
}

// out[M, N] (f32) = rmsnorm(x) @ w^T + bias, with the norm's scale applied after the product.
std::vector<float> norm_linear_f32(Tensor x, Tensor norm_w, float eps, Tensor w, Tensor bias) {
  detail::check_float(x);
  detail::check_float(norm_w);
  const int64_t K = x.size(-1), M = x.numel() / K, N = w.size(0);
  KILN_ASSERT(norm_w.numel() == K && w.ndim() == 2 && w.size(1) == K);
  std::vector<float> xs = detail::to_f32(x), g = detail::to_f32(norm_w), scale(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) {
    float* row = xs.data() + m * K;
    float ss = 0.0f;
    for (int64_t k = 0; k < K; ++k) ss += row[k] * row[k];
    scale[m] = 1.0f / std::sqrt(ss / static_cast<float>(K) + eps);
    for (int64_t k = 0; k < K; ++k) row[k] *= g[k];
  }
  std::vector<float> out(static_cast<size_t>(M * N));
  linear_forward(host_f32(out, M, N), host_f32(xs, M, K), w, Tensor{});
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) out[m * N + n] *= scale[m];
  if (bias.data) {
    const std::vector<float> b = detail::to_f32(bias);
    KILN_ASSERT(static_cast<int64_t>(b.size()) == N);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) out[m * N + n] += b[n];
  }
  return out;
}

// out[M, I] = silu(g) * u of the rows [g | u] of gu [M, 2I].
void swiglu_rows(Tensor out, const std::vector<float>& gu, int64_t M, int64_t I) {
  std::vector<float> act(static_cast<size_t>(M * I));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < I; ++i) {
      const float g = gu[m * 2 * I + i], u = gu[m * 2 * I + I + i];
      act[m * I + i] = g / (1.0f + std::exp(-g)) * u;
    }
  detail::store_f32(out, 0, out.numel(), act.data());
}

}  // namespace

void norm_linear_forward(Tensor y, Tensor x, Tensor norm_w, float eps, Tensor w, Tensor bias) {
  detail::check_float(y);
  const std::vector<float> out = norm_linear_f32(x, norm_w, eps, w, bias);
  KILN_ASSERT(static_cast<int64_t>(out.size()) == y.numel());
  detail::store_f32(y, 0, y.numel(), out.data());
}

void norm_linear_argmax_forward(Tensor logits, Tensor tokens, Tensor x, Tensor norm_w, float eps, Tensor w) {
  KILN_ASSERT(tokens.dtype == DType::i32 && logits.ndim() == 2 && tokens.numel() == logits.size(0));
  norm_linear_forward(logits, x, norm_w, eps, w, Tensor{});
  const std::vector<float> v = detail::to_f32(logits);  // as stored
  const int64_t M = logits.size(0), N = logits.size(1);
  for (int64_t m = 0; m < M; ++m) {
    int64_t best = 0;
    float best_v = -INFINITY;
    for (int64_t i = 0; i < N; ++i) {
      const float vi = sampling::clean(v[m * N + i]);
      if (i == 0 || vi > best_v) best = i, best_v = vi;
    }
    tokens.ptr<int32_t>()[m] = static_cast<int32_t>(best);
  }
}

void norm_linear_swiglu_forward(Tensor out, Tensor x, Tensor norm_w, float eps, Tensor w, Tensor bias) {
  detail::check_float(out);
  const int64_t K = x.size(-1), M = x.numel() / K, I = w.size(0) / 2;
  KILN_ASSERT(w.size(0) % 2 == 0 && out.numel() == M * I);
  swiglu_rows(out, norm_linear_f32(x, norm_w, eps, w, bias), M, I);
}

void linear_swiglu_forward(Tensor out, Tensor x, Tensor w, Tensor bias) {
  detail::check_float(out);
  const int64_t K = x.size(-1), M = x.numel() / K, I = w.size(0) / 2;
  KILN_ASSERT(w.size(0) % 2 == 0 && out.numel() == M * I);
  std::vector<float> gu(static_cast<size_t>(M * 2 * I));
  linear_forward(host_f32(gu, M, 2 * I), x.view(Shape{M, K}), w, bias);
  swiglu_rows(out, gu, M, I);
}

void linear_residual_forward(Tensor residual, Tensor x, Tensor w, Tensor bias) {
  detail::check_float(residual);
  KILN_ASSERT(residual.dtype == DType::f32);
  const int64_t K = x.size(-1), M = x.numel() / K, N = w.size(0);
  KILN_ASSERT(residual.numel() == M * N);
  std::vector<float> out(static_cast<size_t>(M * N));
  linear_forward(host_f32(out, M, N), x.view(Shape{M, K}), w, bias);
  float* r = residual.ptr<float>();
  for (int64_t i = 0; i < M * N; ++i) r[i] += out[i];
}

}  // namespace kiln::cpu
