// Whole-tensor elementwise ops on float tensors (f32/bf16/f16), grid-stride loops.
//   cast:          dst[i] = src[i] converted (same element count; a device copy when the dtypes agree).
//   fill_normal:   t[i] = std * sqrtf(-2 logf(u1)) * cosf(2 pi u2)   (Box-Muller, f32 math, precise
//                  logf/cosf), u1 = rng::uniform_open(seed, 2i), u2 = rng::uniform_open(seed, 2i + 1)
//                  in (0, 1]: the CPU twin's formula, so a seed gives the same values on both devices
//                  up to f32 ulps of log/cos and the storage rounding.
//   fill_constant: t[i] = value (rounded to t's dtype).
// cast and fill_constant use 8-element vectors (16-byte accesses) when the bases are aligned, with
// the last n % 8 elements done one by one.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/rng.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kTwoPi = 6.2831853f;

template <int N>
__global__ void __launch_bounds__(kThreads) cast_kernel(void* dst, DType d_dt, const void* src, DType s_dt, int64_t n) {
  const int64_t chunks = n / N;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (int64_t c = tid; c < chunks; c += static_cast<int64_t>(gridDim.x) * kThreads) {
    float v[N];
    detail::load_vec<N>(src, c * N, s_dt, v);
    detail::store_vec<N>(dst, c * N, d_dt, v);
  }
  if (N > 1 && tid < n - chunks * N) {
    const int64_t i = chunks * N + tid;
    detail::store1(dst, i, d_dt, detail::load1(src, i, s_dt));
  }
}

template <int N>
__global__ void __launch_bounds__(kThreads) fill_constant_kernel(void* t, DType dt, int64_t n, float value) {
  const int64_t chunks = n / N;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  float v[N];
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = value;
  for (int64_t c = tid; c < chunks; c += static_cast<int64_t>(gridDim.x) * kThreads) detail::store_vec<N>(t, c * N, dt, v);
  if (N > 1 && tid < n - chunks * N) detail::store1(t, chunks * N + tid, dt, value);
}

__global__ void __launch_bounds__(kThreads) fill_normal_kernel(void* t, DType dt, int64_t n, float std, uint64_t seed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const uint64_t k = static_cast<uint64_t>(i);
    const float u1 = rng::uniform_open(seed, 2 * k);
    const float u2 = rng::uniform_open(seed, 2 * k + 1);
    const float v = __fmul_rn(__fmul_rn(std, sqrtf(__fmul_rn(-2.0f, logf(u1)))), cosf(__fmul_rn(kTwoPi, u2)));
    detail::store1(t, i, dt, v);
  }
}

}  // namespace

void cast(CudaBackend& be, Tensor dst, Tensor src) {
  detail::check_float(be, dst);
  detail::check_float(be, src);
  KILN_ASSERT(dst.numel() == src.numel());
  const int64_t n = src.numel();
  if (n == 0) return;
  cudaStream_t stream = detail::stream_of(be);
  if (dst.dtype == src.dtype) {
    if (dst.data != src.data)
      CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(dst.nbytes()), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const bool vec = detail::aligned16(dst.data) && detail::aligned16(src.data) && n >= 8;
  const unsigned grid = detail::grid_for(be, std::max<int64_t>(n / (vec ? 8 : 1), 8), kThreads);
  if (vec)
    cast_kernel<8><<<grid, kThreads, 0, stream>>>(dst.data, dst.dtype, src.data, src.dtype, n);
  else
    cast_kernel<1><<<grid, kThreads, 0, stream>>>(dst.data, dst.dtype, src.data, src.dtype, n);
  KILN_CUDA_CHECK_LAUNCH();
}

void fill_normal(CudaBackend& be, Tensor t, float std, uint64_t seed) {
  detail::check_float(be, t);
  const int64_t n = t.numel();
  if (n == 0) return;
  fill_normal_kernel<<<detail::grid_for(be, n, kThreads), kThreads, 0, detail::stream_of(be)>>>(t.data, t.dtype, n, std,
                                                                                               seed);
  KILN_CUDA_CHECK_LAUNCH();
}

void fill_constant(CudaBackend& be, Tensor t, float value) {
  detail::check_float(be, t);
  const int64_t n = t.numel();
  if (n == 0) return;
  const bool vec = detail::aligned16(t.data) && n >= 8;
  const unsigned grid = detail::grid_for(be, std::max<int64_t>(n / (vec ? 8 : 1), 8), kThreads);
  cudaStream_t stream = detail::stream_of(be);
  if (vec)
    fill_constant_kernel<8><<<grid, kThreads, 0, stream>>>(t.data, t.dtype, n, value);
  else
    fill_constant_kernel<1><<<grid, kThreads, 0, stream>>>(t.data, t.dtype, n, value);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
