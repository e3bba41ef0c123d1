// Matrix products through OpenBLAS (cblas_sgemm, row-major, f32).
//   linear_forward: y[M, N] = x[M, K] @ w[N, K]^T (+ bias[N] if bias.data != nullptr).
//     x: [..., K] viewed as [M, K]; y: [..., N] with the same leading dims; w: [N, K];
//     bias: [N] of any float dtype. Inputs that are not f32 are converted to f32 scratch first (w in
//     blocks of rows, so a bf16 vocabulary projection never needs a full f32 copy); y is written
//     through an f32 scratch when it is not f32.
//   gemm: C = alpha * op(A) @ op(B) + beta * C, op(X) = X^T when trans_X.
//     A: [M, K] (or [K, M] when trans_a), B: [K, N] (or [N, K] when trans_b), C: [M, N].
//     BLAS convention: with beta == 0, C is not read (NaN/garbage in C does not propagate).
//   linear_forward_row_invariant: linear_forward where every y[m][n] is one fixed function of row m
//     of x and row n of w, whatever M and the other rows are (OpenBLAS picks kernels by shape, so
//     its rows change in the last bits with the batch): 8 partial sums over k = j (mod 8) in
//     increasing k, combined as ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)), then + bias.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_ops.h"

namespace kiln::cpu {
namespace {

// Rows of w converted per sgemm call when w is not f32 (bounds the scratch to kBlockRows * K floats).
constexpr int64_t kBlockRows = 1024;

// A float pointer to t's contents as f32: the tensor itself when it is f32, else `scratch`.
const float* as_f32(const Tensor& t, std::vector<float>& scratch) {
  if (t.dtype == DType::f32) return t.ptr<const float>();
  scratch = detail::to_f32(t);
  return scratch.data();
}

// Checks linear_forward's operands (see the header comment); returns M, the rows of x.
int64_t check_linear(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias) {
  detail::check_float(y);
  detail::check_float(x);
  detail::check_float(w);
  KILN_ASSERT(x.ndim() >= 1 && w.ndim() == 2 && y.ndim() == x.ndim());
  const int64_t K = x.size(-1), N = w.size(0);
  KILN_ASSERT(w.size(1) == K && y.size(-1) == N);
  for (int d = 0; d + 1 < x.ndim(); ++d) KILN_ASSERT(y.size(d) == x.size(d));
  int64_t M = 1;
  for (int d = 0; d + 1 < x.ndim(); ++d) M *= x.size(d);
  KILN_ASSERT(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX);
  if (bias.data) {
    detail::check_float(bias);
    KILN_ASSERT(bias.numel() == N);
  }
  return M;
}

// The row-invariant dot product (see the header comment).
float dot_row_invariant(const float* a, const float* b, int64_t K) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[k + j] * b[k + j];
  for (int j = 0; k + j < K; ++j) s[j] += a[k + j] * b[k + j];
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

}  // namespace

void linear_forward_row_invariant(Tensor y, Tensor x, Tensor w, Tensor bias) {
  const int64_t M = check_linear(y, x, w, bias), K = x.size(-1), N = w.size(0);
  if (M == 0 || N == 0) return;
  std::vector<float> x_scratch, y_scratch, w_block, b;
  const float* xf = as_f32(x, x_scratch);
  float* yf = y.ptr<float>();
  if (y.dtype != DType::f32) {
    y_scratch.resize(static_cast<size_t>(M * N));
    yf = y_scratch.data();
  }
  if (bias.data) b = detail::to_f32(bias);
  // Blocks of 64 weight rows stay in cache while every row of x passes over them.
  constexpr int64_t kRows = 64;
  for (int64_t n0 = 0; n0 < N; n0 += kRows) {
    const int64_t nb = std::min(kRows, N - n0);
    const float* wf;
    if (w.dtype == DType::f32) {
      wf = w.ptr<const float>() + n0 * K;
    } else {
      w_block.resize(static_cast<size_t>(nb * K));
      detail::load_f32(w, n0 * K, nb * K, w_block.data());
      wf = w_block.data();
    }
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < nb; ++n) {
        const float d = K == 0 ? 0.0f : dot_row_invariant(xf + m * K, wf + n * K, K);
        yf[m * N + n0 + n] = bias.data ? d + b[n0 + n] : d;
      }
  }
  if (y.dtype != DType::f32) detail::store_f32(y, 0, M * N, yf);
}

void linear_forward(Tensor y, Tensor x, Tensor w, Tensor bias) {
  const int64_t M = check_linear(y, x, w, bias), K = x.size(-1), N = w.size(0);
  const bool has_bias = bias.data != nullptr;
  if (M == 0 || N == 0) return;

  std::vector<float> x_scratch, y_scratch, w_block;
  const float* xf = as_f32(x, x_scratch);
  float* yf = y.ptr<float>();
  if (y.dtype != DType::f32) {
    y_scratch.resize(static_cast<size_t>(M * N));
    yf = y_scratch.data();
  }

  if (K == 0) {
    std::fill(yf, yf + M * N, 0.0f);
  } else if (w.dtype == DType::f32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), 1.0f, xf, static_cast<int>(K), w.ptr<const float>(), static_cast<int>(K), 0.0f,
                yf, static_cast<int>(N));
  } else {
    for (int64_t n0 = 0; n0 < N; n0 += kBlockRows) {
      const int64_t nb = std::min(kBlockRows, N - n0);
      w_block.resize(static_cast<size_t>(nb * K));
      detail::load_f32(w, n0 * K, nb * K, w_block.data());
      // y[:, n0 : n0 + nb] = x @ w_block^T, written in place with leading dimension N.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(nb),
                  static_cast<int>(K), 1.0f, xf, static_cast<int>(K), w_block.data(), static_cast<int>(K), 0.0f,
                  yf + n0, static_cast<int>(N));
    }
  }

  if (has_bias) {
    const std::vector<float> b = detail::to_f32(bias);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) yf[m * N + n] += b[n];
  }
  if (y.dtype != DType::f32) detail::store_f32(y, 0, M * N, yf);
}

void linear_k_split_forward(Tensor partials, Tensor x, Tensor w) {
  detail::check_float(partials);
  detail::check_float(x);
  detail::check_float(w);
  KILN_ASSERT(x.ndim() == 2 && w.ndim() == 2 && partials.ndim() == 3 && partials.dtype == DType::f32);
  const int64_t S = partials.size(0), M = x.size(0), K = x.size(1), N = w.size(0);
  KILN_ASSERT(S >= 1 && K % S == 0 && w.size(1) == K && partials.size(1) == M && partials.size(2) == N);
  KILN_ASSERT(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX);
  const int64_t part = K / S;
  const std::vector<float> xf = detail::to_f32(x), wf = detail::to_f32(w);
  float* out = partials.ptr<float>();
  for (int64_t s = 0; s < S; ++s) {
    float* ps = out + s * M * N;
    if (part == 0) {
      std::fill(ps, ps + M * N, 0.0f);
      continue;
    }
    // ps[M, N] = x[:, s part : (s + 1) part] @ w[:, same]^T, both read in place with leading dimension K.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(part), 1.0f, xf.data() + s * part, static_cast<int>(K), wf.data() + s * part,
                static_cast<int>(K), 0.0f, ps, static_cast<int>(N));
  }
}

void gemm(Tensor c, Tensor a, bool trans_a, Tensor b, bool trans_b, float alpha, float beta) {
  detail::check_float(c);
  detail::check_float(a);
  detail::check_float(b);
  KILN_ASSERT(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2);
  const int64_t M = c.size(0), N = c.size(1);
  const int64_t K = trans_a ? a.size(0) : a.size(1);
  KILN_ASSERT((trans_a ? a.size(1) : a.size(0)) == M);
  KILN_ASSERT((trans_b ? b.size(1) : b.size(0)) == K);
  KILN_ASSERT((trans_b ? b.size(0) : b.size(1)) == N);
  KILN_ASSERT(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX);
  if (M == 0 || N == 0) return;

  std::vector<float> a_scratch, b_scratch, c_scratch;
  float* cf = c.ptr<float>();
  if (c.dtype != DType::f32) {
    c_scratch.resize(static_cast<size_t>(M * N));
    if (beta != 0.0f) detail::load_f32(c, 0, M * N, c_scratch.data());
    cf = c_scratch.data();
  }
  // BLAS convention: beta == 0 means C is overwritten, never read.
  if (beta == 0.0f) std::fill(cf, cf + M * N, 0.0f);

  if (K == 0) {
    if (beta != 0.0f && beta != 1.0f)
      for (int64_t i = 0; i < M * N; ++i) cf[i] *= beta;
  } else {
    const float* af = as_f32(a, a_scratch);
    const float* bf = as_f32(b, b_scratch);
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, af,
                static_cast<int>(a.size(1)), bf, static_cast<int>(b.size(1)), beta, cf, static_cast<int>(N));
  }
  if (c.dtype != DType::f32) detail::store_f32(c, 0, M * N, cf);
}

}  // namespace kiln::cpu
