// Rotary position embedding in place, Hugging Face "rotate half" convention.
// x: [T, heads, D] (f32/bf16/f16), positions: [T] i32, inv_freq: [D/2] f32 (already scaled for the
// rope type). For token t, head h and pair i < D/2:
//   angle = (float)positions[t] * inv_freq[i]            (an f32 product, as torch computes it)
//   c = (float)cos((double)angle) * attention_scaling    (double-precision cos/sin, rounded to f32:
//   s = (float)sin((double)angle) * attention_scaling     exact for the large angles of 32K contexts)
//   (x[i], x[i + D/2]) <- (x[i] * c - x[i + D/2] * s,  x[i + D/2] * c + x[i] * s)
// Same arithmetic as the CPU twin (products rounded separately, no FMA contraction).
//
// One block per token: its threads first fill a table of the D/2 (c, s) pairs in shared memory,
// then rotate every pair of every head of the token (consecutive threads touch consecutive i, so the
// accesses coalesce).
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/programmatic_launch.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads)
    rope_kernel(void* x, DType dt, const int32_t* positions, const float* inv_freq, int64_t heads, int64_t half,
                float scaling) {
  extern __shared__ float2 cs[];  // [half]: (c, s)
  const int64_t t = blockIdx.x;
  const float pos = static_cast<float>(positions[t]);
  for (int64_t i = threadIdx.x; i < half; i += kThreads) {
    cs[i] = detail::rope_cos_sin(pos, inv_freq[i], scaling);
  }
  __syncthreads();
  const int64_t D = 2 * half;
  const int64_t pairs = heads * half;
  for (int64_t p = threadIdx.x; p < pairs; p += kThreads) {
    const int64_t h = p / half, i = p - h * half;
    const int64_t i0 = (t * heads + h) * D + i, i1 = i0 + half;
    const float x0 = detail::load1(x, i0, dt), x1 = detail::load1(x, i1, dt);
    const float2 r = cs[i];
    const float2 rot = detail::rope_rotate(x0, x1, r);
    detail::store1(x, i0, dt, rot.x);
    detail::store1(x, i1, dt, rot.y);
  }
}

// table[t * half + i] = (c, s) of token t's pair i (rope_cos_sin_table). Launched programmatically:
// waits for whatever wrote the positions.
__global__ void __launch_bounds__(kThreads)
    rope_table_kernel(float2* table, const int32_t* positions, const float* inv_freq, int64_t T, int64_t half,
                      float scaling) {
  hopper::launch_dependents();
  hopper::grid_dependency_wait();
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < T * half;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t t = e / half, i = e - t * half;
    table[e] = detail::rope_cos_sin(static_cast<float>(positions[t]), inv_freq[i], scaling);
  }
}

}  // namespace

void rope_cos_sin_table(CudaBackend& be, Tensor table, Tensor positions, Tensor inv_freq, float attention_scaling) {
  detail::check_i32(be, positions);
  KILN_ASSERT(table.device == be.device() && inv_freq.device == be.device() && inv_freq.dtype == DType::f32);
  KILN_ASSERT(table.dtype == DType::f32 && table.ndim() == 3 && table.size(2) == 2);
  const int64_t T = table.size(0), half = table.size(1);
  KILN_ASSERT(positions.numel() == T && inv_freq.numel() == half);
  if (T == 0 || half == 0) return;
  detail::launch_programmatic(be, rope_table_kernel, detail::grid_for(be, T * half, kThreads), dim3(kThreads), 0, 1,
                              static_cast<float2*>(table.data), positions.ptr<const int32_t>(),
                              inv_freq.ptr<const float>(), T, half, attention_scaling);
}

void rope_forward(CudaBackend& be, Tensor x, Tensor positions, Tensor inv_freq, float attention_scaling) {
  detail::check_float(be, x);
  detail::check_i32(be, positions);
  KILN_ASSERT(inv_freq.dtype == DType::f32 && (inv_freq.numel() == 0 || inv_freq.device == be.device()));
  KILN_ASSERT(x.ndim() == 3);
  const int64_t T = x.size(0), heads = x.size(1), D = x.size(2);
  KILN_ASSERT(D % 2 == 0);
  const int64_t half = D / 2;
  KILN_ASSERT(positions.ndim() == 1 && positions.size(0) == T);
  KILN_ASSERT(inv_freq.ndim() == 1 && inv_freq.size(0) == half);
  KILN_ASSERT(half * static_cast<int64_t>(sizeof(float2)) <= 48 * 1024);
  KILN_ASSERT(T < (int64_t(1) << 31));
  if (T == 0 || heads == 0 || half == 0) return;
  rope_kernel<<<static_cast<unsigned>(T), kThreads, half * sizeof(float2), detail::stream_of(be)>>>(
      x.data, x.dtype, positions.ptr<const int32_t>(), inv_freq.ptr<const float>(), heads, half, attention_scaling);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
