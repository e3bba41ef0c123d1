// CUDA twin of ops::muon_step: torch.optim.Muon's single-tensor step as torch runs it on a GPU,
// Newton-Schulz in bf16. Per matrix [A, B] (k = min(A, B)):
//   momentum_kernel    g = grad * grad_scale; buf = lerp(buf, g, 1 - momentum) (f32, as the CPU
//                      twin, bit for bit); u = nesterov ? lerp(g, buf, momentum) : buf, stored bf16
//                      (torch: grad.to(bfloat16))
//   sumsq_kernel       per-block partial sums of u^2 (double, a fixed grid: deterministic)
//   normalize_kernel   every block sums the partials in the same order, norm = bf16(sqrt(sum))
//                      (torch's bf16 norm()), clamped at bf16(eps); u = bf16(u / norm)
//   5 x (cuda::gemm)   G = X X^T, U = b G + c G G, X = a X + U X: bf16 operands and results, f32
//                      accumulation and f32 alpha / beta (torch's bf16 matmul / addmm); for A > B the
//                      stored X stays [A, B] and the transposes go to the GEMM operands
//                      (G = X^T X, X = a X + X U^T), so nothing is copied into a transposed layout
//   apply_kernel       p = p * f32(1 - lr wd) (decayed); p = fma(-lr', f32(X), p); lowp = round(p)
// Scratch (the backend's caching allocator, per call): u and the next X ([max A*B] bf16 each), G and
// U ([max k^2] bf16 each), the partial sums. Elements outside every matrix are not touched.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/muon.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxPartials = 1024;  // blocks of the sum of squares (and partial sums per matrix)

using ops::detail::MuonScalars;

__device__ __forceinline__ float lerp(float a, float b, float w) {
  const float d = __fsub_rn(b, a);
  return fabsf(w) < 0.5f ? __fmaf_rn(w, d, a) : __fmaf_rn(__fsub_rn(w, 1.0f), d, b);
}

// grads, buf: [n] f32; u: [n] bf16.
__global__ void momentum_kernel(const float* grads, float* buf, __nv_bfloat16* u, int64_t n, MuonScalars c) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = __fmul_rn(grads[i], c.grad_scale);
    const float b = lerp(buf[i], g, c.buf_weight);
    buf[i] = b;
    u[i] = __float2bfloat16_rn(c.nesterov ? lerp(g, b, c.nesterov_weight) : b);
  }
}

// partial[blockIdx.x] = sum over this block's grid-stride share of x^2.
__global__ void __launch_bounds__(kThreads) sumsq_kernel(const __nv_bfloat16* x, int64_t n, double* partial) {
  __shared__ double smem[32];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  double acc = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    const double v = __bfloat162float(x[i]);
    acc += v * v;
  }
  acc = detail::block_reduce<kThreads>(acc, detail::SumOp{}, 0.0, smem);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// x /= max(bf16(||x||), eps_bf16), the norm from partial[0..parts).
__global__ void __launch_bounds__(kThreads) normalize_kernel(__nv_bfloat16* x, int64_t n, const double* partial,
                                                             int parts, float eps_bf16) {
  __shared__ double smem[32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < parts; i += kThreads) acc += partial[i];
  acc = detail::block_reduce<kThreads>(acc, detail::SumOp{}, 0.0, smem);
  const float norm = fmaxf(__bfloat162float(__float2bfloat16_rn(static_cast<float>(sqrt(acc)))), eps_bf16);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride)
    x[i] = __float2bfloat16_rn(__fdiv_rn(__bfloat162float(x[i]), norm));
}

// p: [n] f32, x: [n] bf16, lowp: [n] bf16/f16 or nullptr.
__global__ void apply_kernel(float* p, const __nv_bfloat16* x, void* lowp, DType lowp_dt, int64_t n, bool decay,
                             float decay_factor, float neg_lr) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float pi = p[i];
    if (decay) pi = __fmul_rn(pi, decay_factor);
    pi = __fmaf_rn(neg_lr, __bfloat162float(x[i]), pi);
    p[i] = pi;
    if (lowp) detail::store1(lowp, i, lowp_dt, pi);
  }
}

Tensor bf16_matrix(void* data, int64_t rows, int64_t cols, Device device) {
  Tensor t;
  t.data = data;
  t.dtype = DType::bf16;
  t.device = device;
  t.shape = Shape{rows, cols};
  return t;
}

void check_f32(const CudaBackend& be, const Tensor& t, int64_t n) {
  detail::check_float(be, t);
  KILN_ASSERT(t.dtype == DType::f32 && t.numel() == n);
}

}  // namespace

void muon_step(CudaBackend& be, Tensor params, Tensor grads, Tensor momentum, Tensor params_lowp,
               const std::vector<ops::MuonMatrix>& matrices, const ops::MuonStep& s) {
  const int64_t M = params.numel();
  check_f32(be, params, M);
  check_f32(be, grads, M);
  check_f32(be, momentum, M);
  void* lowp = nullptr;
  if (params_lowp.data != nullptr) {
    detail::check_float(be, params_lowp);
    lowp = params_lowp.data;
  }
  if (matrices.empty()) return;
  const MuonScalars c = ops::detail::muon_scalars(s);
  const float eps_bf16 = __bfloat162float(__float2bfloat16_rn(c.eps));
  int64_t max_n = 0, max_k2 = 0;
  for (const ops::MuonMatrix& m : matrices) {
    max_n = std::max(max_n, m.rows * m.cols);
    max_k2 = std::max(max_k2, std::min(m.rows, m.cols) * std::min(m.rows, m.cols));
  }
  TensorBuffer u = kiln::empty_for_op(be, Shape{max_n}, DType::bf16);
  TensorBuffer next = kiln::empty_for_op(be, Shape{max_n}, DType::bf16);
  TensorBuffer gram = kiln::empty_for_op(be, Shape{max_k2}, DType::bf16);
  TensorBuffer update = kiln::empty_for_op(be, Shape{max_k2}, DType::bf16);
  TensorBuffer partial = kiln::empty_for_op(be, Shape{kMaxPartials}, DType::i64);  // doubles
  cudaStream_t stream = detail::stream_of(be);
  const Device dev = be.device();

  for (const ops::MuonMatrix& m : matrices) {
    const int64_t n = m.rows * m.cols, k = std::min(m.rows, m.cols);
    const bool transposed = m.rows > m.cols;  // torch iterates on X^T
    const unsigned grid = detail::grid_for(be, n, kThreads);
    momentum_kernel<<<grid, kThreads, 0, stream>>>(grads.ptr<const float>() + m.offset,
                                                   momentum.ptr<float>() + m.offset,
                                                   u.ptr<__nv_bfloat16>(), n, c);
    KILN_CUDA_CHECK_LAUNCH();
    const int parts = static_cast<int>(std::min<unsigned>(grid, kMaxPartials));
    sumsq_kernel<<<parts, kThreads, 0, stream>>>(u.ptr<const __nv_bfloat16>(), n, partial.ptr<double>());
    KILN_CUDA_CHECK_LAUNCH();
    normalize_kernel<<<grid, kThreads, 0, stream>>>(u.ptr<__nv_bfloat16>(), n, partial.ptr<const double>(), parts,
                                                    eps_bf16);
    KILN_CUDA_CHECK_LAUNCH();

    Tensor X = bf16_matrix(u.view().data, m.rows, m.cols, dev);
    Tensor Y = bf16_matrix(next.view().data, m.rows, m.cols, dev);
    const Tensor G = bf16_matrix(gram.view().data, k, k, dev), U = bf16_matrix(update.view().data, k, k, dev);
    for (int it = 0; it < c.ns_steps; ++it) {
      if (transposed)
        gemm(be, G, X, /*trans_a=*/true, X, /*trans_b=*/false, 1.0f, 0.0f);  // X^T X
      else
        gemm(be, G, X, false, X, true, 1.0f, 0.0f);  // X X^T
      be.copy(U, G);
      gemm(be, U, G, false, G, false, c.ns_c, c.ns_b);  // b G + c G G
      be.copy(Y, X);
      if (transposed)
        gemm(be, Y, X, false, U, true, 1.0f, c.ns_a);  // a X + X U^T
      else
        gemm(be, Y, U, false, X, false, 1.0f, c.ns_a);  // a X + U X
      std::swap(X, Y);
    }

    const float neg_lr = ops::detail::muon_neg_adjusted_lr(s, m.rows, m.cols);
    void* lowp_m = lowp ? static_cast<char*>(lowp) + m.offset * dtype_size(params_lowp.dtype) : nullptr;
    apply_kernel<<<grid, kThreads, 0, stream>>>(params.ptr<float>() + m.offset, X.ptr<const __nv_bfloat16>(), lowp_m,
                                                params_lowp.dtype, n, m.decay, c.decay, neg_lr);
    KILN_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace kiln::cuda
