// Row-wise softmax and log-softmax over the last dimension, numerically stable:
//   m = max_j x[j],  s = sum_j exp(x[j] - m)  (expf in f32, the sum accumulated in double)
//   softmax:     y[j] = exp(x[j] - m) * (float)(1 / s)
//   log_softmax: y[j] = (x[j] - m) - (float)log(s)
// x: [..., V] (f32/bf16/f16) viewed as [rows, V]; y: same shape, f32 (another float dtype is
// converted on store). y may alias x. A row of all -inf gives NaN, as in torch.
//
// One block of 1024 threads per row (vocabularies up to 256K and beyond). Pass 1 is an online
// max/sum: each thread keeps (m, s) and rescales s when its maximum grows, then the block merges the
// pairs; pass 2 writes. 16-byte loads when V % 8 == 0 and the bases are aligned.
#include <cmath>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_util.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 1024;

// Merges the running (m, s) with one more value v: s is relative to m.
__device__ __forceinline__ void online_add(float& m, double& s, float v) {
  if (v > m) {
    s = (m == -INFINITY ? 0.0 : s * static_cast<double>(expf(m - v))) + 1.0;
    m = v;
  } else if (m != -INFINITY || v != v) {
    s += static_cast<double>(expf(v - m));  // a NaN v makes s NaN (the whole row NaN), as on the CPU
  }
}

__device__ __forceinline__ void online_merge(float& m, double& s, float m2, double s2) {
  const float mm = fmaxf(m, m2);
  double r = 0.0;
  if (m != -INFINITY || s != s) r += s * static_cast<double>(expf(m - mm));
  if (m2 != -INFINITY || s2 != s2) r += s2 * static_cast<double>(expf(m2 - mm));
  m = mm;
  s = r;
}

template <int N, bool kLog>
__global__ void __launch_bounds__(kThreads) softmax_kernel(void* y, DType y_dt, const void* x, DType x_dt, int64_t V) {
  __shared__ float sm_m[32];
  __shared__ double sm_s[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * V;

  float m = -INFINITY;
  double s = 0.0;
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * N; i < V; i += static_cast<int64_t>(kThreads) * N) {
    float v[N];
    detail::load_vec<N>(x, base + i, x_dt, v);
#pragma unroll
    for (int k = 0; k < N; ++k) online_add(m, s, v[k]);
  }
  // Block merge: warps by shuffles, then the warp leaders through shared memory.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const double s2 = __shfl_xor_sync(0xffffffffu, s, o);
    online_merge(m, s, m2, s2);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sm_m[warp] = m;
    sm_s[warp] = s;
  }
  __syncthreads();
  m = lane < kThreads / 32 ? sm_m[lane] : -INFINITY;
  s = lane < kThreads / 32 ? sm_s[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const double s2 = __shfl_xor_sync(0xffffffffu, s, o);
    online_merge(m, s, m2, s2);
  }
  // A row of -inf: m = -inf, s = 0 -> NaN below, as on the CPU.
  const float inv_s = static_cast<float>(1.0 / s);
  const float log_s = static_cast<float>(log(s));
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * N; i < V; i += static_cast<int64_t>(kThreads) * N) {
    float v[N];
    detail::load_vec<N>(x, base + i, x_dt, v);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float d = v[k] - m;
      v[k] = kLog ? d - log_s : __fmul_rn(expf(d), inv_s);
    }
    detail::store_vec<N>(y, base + i, y_dt, v);
  }
}

template <bool kLog>
void launch_softmax(CudaBackend& be, Tensor y, Tensor x) {
  detail::check_float(be, y);
  detail::check_float(be, x);
  KILN_ASSERT(x.ndim() >= 1 && y.shape == x.shape);
  const int64_t V = x.size(-1);
  if (V == 0 || x.numel() == 0) return;
  const int64_t rows = x.numel() / V;
  KILN_ASSERT(rows < (int64_t(1) << 31));
  const bool vec = V % 8 == 0 && detail::aligned16(x.data) && detail::aligned16(y.data);
  cudaStream_t stream = detail::stream_of(be);
  if (vec)
    softmax_kernel<8, kLog><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(y.data, y.dtype, x.data, x.dtype, V);
  else
    softmax_kernel<1, kLog><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(y.data, y.dtype, x.data, x.dtype, V);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void softmax_forward(CudaBackend& be, Tensor y, Tensor x) { launch_softmax<false>(be, y, x); }
void log_softmax_forward(CudaBackend& be, Tensor y, Tensor x) { launch_softmax<true>(be, y, x); }

}  // namespace kiln::cuda
