// Elementwise ops of the MLP and the residual stream, f32 math, results stored in the output dtype.
//   swiglu_forward:   out[t, i] = silu(g) * u, g = gate_up[t, i], u = gate_up[t, I + i],
//                     silu(g) = g / (1 + exp(-g)) (precise expf).  gate_up: [..., 2I], out: [..., I].
//   bias_add_forward: y[m, n] += bias[n].  y: [..., N] viewed as [M, N], bias: [N].
//   add_inplace:      a += b elementwise.  a, b: same shape (dtypes may differ, e.g. bf16 a, f32 b).
// Grid-stride loops over chunks of N elements: N = 8 (16-byte vector accesses) when the row length
// is a multiple of 8 and the bases are 16-byte aligned, else N = 1.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_util.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

// Chunks never straddle rows: N divides I.
template <int N>
__global__ void __launch_bounds__(kThreads)
    swiglu_kernel(void* out, DType out_dt, const void* gate_up, DType gu_dt, int64_t rows, int64_t I) {
  const int64_t chunks = rows * I / N;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t e = c * N, r = e / I, i = e - r * I;
    float g[N], u[N], o[N];
    detail::load_vec<N>(gate_up, r * 2 * I + i, gu_dt, g);
    detail::load_vec<N>(gate_up, r * 2 * I + I + i, gu_dt, u);
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = g[k] / (1.0f + expf(-g[k])) * u[k];
    detail::store_vec<N>(out, e, out_dt, o);
  }
}

template <int N>
__global__ void __launch_bounds__(kThreads)
    bias_add_kernel(void* y, DType y_dt, const void* bias, DType b_dt, int64_t total, int64_t n_cols) {
  const int64_t chunks = total / N;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t e = c * N, n = e % n_cols;
    float v[N], b[N];
    detail::load_vec<N>(y, e, y_dt, v);
    detail::load_vec<N>(bias, n, b_dt, b);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] += b[k];
    detail::store_vec<N>(y, e, y_dt, v);
  }
}

// Flat: full chunks of N, then the tail element by element (only when N == 8).
template <int N>
__global__ void __launch_bounds__(kThreads)
    add_kernel(void* a, DType a_dt, const void* b, DType b_dt, int64_t n) {
  const int64_t chunks = n / N;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (int64_t c = tid; c < chunks; c += static_cast<int64_t>(gridDim.x) * kThreads) {
    float av[N], bv[N];
    detail::load_vec<N>(a, c * N, a_dt, av);
    detail::load_vec<N>(b, c * N, b_dt, bv);
#pragma unroll
    for (int k = 0; k < N; ++k) av[k] += bv[k];
    detail::store_vec<N>(a, c * N, a_dt, av);
  }
  if (N > 1 && tid < n - chunks * N) {
    const int64_t i = chunks * N + tid;
    detail::store1(a, i, a_dt, detail::load1(a, i, a_dt) + detail::load1(b, i, b_dt));
  }
}

}  // namespace

void swiglu_forward(CudaBackend& be, Tensor out, Tensor gate_up) {
  detail::check_float(be, out);
  detail::check_float(be, gate_up);
  KILN_ASSERT(gate_up.ndim() >= 1 && out.ndim() == gate_up.ndim());
  for (int d = 0; d + 1 < out.ndim(); ++d) KILN_ASSERT(out.size(d) == gate_up.size(d));
  const int64_t I = out.size(-1);
  KILN_ASSERT(gate_up.size(-1) == 2 * I);
  if (I == 0 || out.numel() == 0) return;
  const int64_t rows = out.numel() / I;
  const bool vec = I % 8 == 0 && detail::aligned16(out.data) && detail::aligned16(gate_up.data);
  const int N = vec ? 8 : 1;
  const unsigned grid = detail::grid_for(be, rows * I / N, kThreads);
  cudaStream_t stream = detail::stream_of(be);
  if (vec)
    swiglu_kernel<8><<<grid, kThreads, 0, stream>>>(out.data, out.dtype, gate_up.data, gate_up.dtype, rows, I);
  else
    swiglu_kernel<1><<<grid, kThreads, 0, stream>>>(out.data, out.dtype, gate_up.data, gate_up.dtype, rows, I);
  KILN_CUDA_CHECK_LAUNCH();
}

void bias_add_forward(CudaBackend& be, Tensor y, Tensor bias) {
  detail::check_float(be, y);
  detail::check_float(be, bias);
  KILN_ASSERT(y.ndim() >= 1);
  const int64_t N = y.size(-1);
  KILN_ASSERT(bias.ndim() == 1 && bias.size(0) == N);
  if (N == 0 || y.numel() == 0) return;
  const bool vec = N % 8 == 0 && detail::aligned16(y.data) && detail::aligned16(bias.data);
  const unsigned grid = detail::grid_for(be, y.numel() / (vec ? 8 : 1), kThreads);
  cudaStream_t stream = detail::stream_of(be);
  if (vec)
    bias_add_kernel<8><<<grid, kThreads, 0, stream>>>(y.data, y.dtype, bias.data, bias.dtype, y.numel(), N);
  else
    bias_add_kernel<1><<<grid, kThreads, 0, stream>>>(y.data, y.dtype, bias.data, bias.dtype, y.numel(), N);
  KILN_CUDA_CHECK_LAUNCH();
}

void add_inplace(CudaBackend& be, Tensor a, Tensor b) {
  detail::check_float(be, a);
  detail::check_float(be, b);
  KILN_ASSERT(a.shape == b.shape);
  const int64_t n = a.numel();
  if (n == 0) return;
  const bool vec = detail::aligned16(a.data) && detail::aligned16(b.data) && n >= 8;
  // The tail (< 8 elements) is handled by the first threads of the grid, so the grid has at least 8.
  const unsigned grid = detail::grid_for(be, std::max<int64_t>(n / (vec ? 8 : 1), 8), kThreads);
  cudaStream_t stream = detail::stream_of(be);
  if (vec)
    add_kernel<8><<<grid, kThreads, 0, stream>>>(a.data, a.dtype, b.data, b.dtype, n);
  else
    add_kernel<1><<<grid, kThreads, 0, stream>>>(a.data, a.dtype, b.data, b.dtype, n);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
