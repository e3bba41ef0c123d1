// CPU twin of ops::muon_step: torch.optim.Muon's single-tensor step with the bf16 cast of its
// Newton-Schulz left out, every element operation and GEMM in f32 (the reference the CUDA twin and
// torch's f32 arithmetic are compared with, tests/cpu/test_muon.cpp).
//
// Per matrix:
//   g = grad * grad_scale
//   buf = lerp(buf, g, f32(1 - momentum)),  u = nesterov ? lerp(g, buf, f32(momentum)) : buf
//     lerp as ATen's vectorised CPU kernel: |w| < 0.5 ? fma(w, b - a, a) : fma(w - 1, b - a, b)
//   per matrix [A, B], X its u block (the transposed problem handled by transposed GEMM operands
//   instead of a copy: for A > B the stored X is [A, B] and torch's X^T is what iterates):
//     X = X / max(f32(||X||_F), eps)                 (sum of squares in double)
//     G = X X^T;  U = b G + c G G;  X = a X + U X     (A <= B; for A > B: G = X^T X, X = a X + X U^T)
//     p = p * f32(1 - lr wd) (decayed);  p = fma(f32(-lr'), X, p)
// Scratch (host vectors, per matrix): u, the next X and two [min, min] matrices. Elements of the
// range outside every matrix are not touched.
#include "kernels/cpu/muon.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_ops.h"

namespace kiln::cpu {
namespace {

float lerp(float a, float b, float w) {
  return std::fabs(w) < 0.5f ? std::fma(w, b - a, a) : std::fma(w - 1.0f, b - a, b);
}

Tensor host_matrix(float* data, int64_t rows, int64_t cols) {
  Tensor t;
  t.data = data;
  t.dtype = DType::f32;
  t.shape = Shape{rows, cols};
  return t;
}

void check_f32(const Tensor& t, int64_t n) {
  detail::check_float(t);
  KILN_ASSERT(t.dtype == DType::f32 && t.numel() == n);
}

// Newton-Schulz on the [rows, cols] matrix x (in place; `next` has rows * cols floats, gram and
// update min(rows, cols)^2 each).
void newton_schulz(float* x, int64_t rows, int64_t cols, const ops::detail::MuonScalars& c, std::vector<float>& next,
                   std::vector<float>& gram, std::vector<float>& update) {
  const int64_t n = rows * cols, k = std::min(rows, cols);
  const bool transposed = rows > cols;  // torch iterates on x^T
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  const float norm = std::max(static_cast<float>(std::sqrt(ss)), c.eps);
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] / norm;

  float* cur = x;
  float* nxt = next.data();
  const Tensor G = host_matrix(gram.data(), k, k), U = host_matrix(update.data(), k, k);
  for (int it = 0; it < c.ns_steps; ++it) {
    const Tensor X = host_matrix(cur, rows, cols), Y = host_matrix(nxt, rows, cols);
    if (transposed)
      gemm(G, X, /*trans_a=*/true, X, /*trans_b=*/false, 1.0f, 0.0f);  // X^T X  [k, k]
    else
      gemm(G, X, false, X, true, 1.0f, 0.0f);  // X X^T  [k, k]
    std::copy(gram.begin(), gram.begin() + k * k, update.begin());
    gemm(U, G, false, G, false, c.ns_c, c.ns_b);  // b G + c G G
    std::copy(cur, cur + n, nxt);
    if (transposed)
      gemm(Y, X, false, U, true, 1.0f, c.ns_a);  // a X + X U^T  (torch: (a X^T + U X^T)^T)
    else
      gemm(Y, U, false, X, false, 1.0f, c.ns_a);  // a X + U X
    std::swap(cur, nxt);
  }
  if (cur != x) std::copy(cur, cur + n, x);
}

}  // namespace

void muon_step(Tensor params, Tensor grads, Tensor momentum, Tensor params_lowp,
               const std::vector<ops::MuonMatrix>& matrices, const ops::MuonStep& s) {
  const int64_t M = params.numel();
  check_f32(params, M);
  check_f32(grads, M);
  check_f32(momentum, M);
  const bool lowp = params_lowp.data != nullptr;
  if (lowp) detail::check_float(params_lowp);
  const ops::detail::MuonScalars c = ops::detail::muon_scalars(s);

  float* p = params.ptr<float>();
  const float* gr = grads.ptr<const float>();
  float* buf = momentum.ptr<float>();
  std::vector<float> u, next, gram, update;
  for (const ops::MuonMatrix& m : matrices) {
    const int64_t n = m.rows * m.cols, k = std::min(m.rows, m.cols);
    u.resize(static_cast<size_t>(n));
    next.resize(static_cast<size_t>(n));
    gram.resize(static_cast<size_t>(k * k));
    update.resize(static_cast<size_t>(k * k));
    float* bm = buf + m.offset;
    const float* gm = gr + m.offset;
    for (int64_t i = 0; i < n; ++i) {
      const float g = gm[i] * c.grad_scale;
      const float b = lerp(bm[i], g, c.buf_weight);
      bm[i] = b;
      u[i] = c.nesterov ? lerp(g, b, c.nesterov_weight) : b;
    }
    float* x = u.data();
    newton_schulz(x, m.rows, m.cols, c, next, gram, update);
    const float neg_lr = ops::detail::muon_neg_adjusted_lr(s, m.rows, m.cols);
    float* pm = p + m.offset;
    for (int64_t i = 0; i < n; ++i) {
      float pi = pm[i];
      if (m.decay) pi = pi * c.decay;
      pm[i] = std::fma(neg_lr, x[i], pi);
    }
    if (lowp) detail::store_f32(params_lowp, m.offset, n, pm);
  }
}

}  // namespace kiln::cpu
