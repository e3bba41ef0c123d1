// RMS normalisation over the last dimension (Hugging Face Llama semantics, f32 math):
//   rmsnorm:      y = x * (1 / sqrt(mean(x^2) + eps)) * w
//   add_rmsnorm:  residual = residual_in + x (stored in residual's dtype; residual_in is residual
//                 itself unless given); y = rmsnorm(residual) * w, where the norm reads the stored
//                 (rounded) residual. One kernel serves both (residual may be null), so the residual
//                 add and the norm share one pass over memory. With a residual, x may be
//                 [S, rows, H] partial sums (linear_k_split_forward), added up in f32 in order
//                 first: a split-K reduction in the same pass.
// x, residual, y: [..., H] viewed as [rows, H] (f32/bf16/f16, each its own dtype); w: [H] (any float
// dtype). y may alias x.
//
// Launch shape: a group of kThreads threads per row, 256 threads per block: a warp per row when
// H <= 1024 (q/k norms over [T, heads, head_dim]), a whole block per row otherwise (the hidden-size
// norms of the decode path, e.g. H = 1536 with one row). Each thread keeps up to 32 of its values in
// registers between the sum of squares and the write; longer rows re-read the rest (an L1/L2 hit).
// Rows whose length is a multiple of 8 with 16-byte-aligned bases use 16-byte vector accesses.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/programmatic_launch.cuh"

namespace kiln::cuda {
namespace {

using detail::load_vec;
using detail::round_to;
using detail::store_vec;

constexpr int kBlock = 256;

template <int kThreads, int N>
__global__ void __launch_bounds__(kBlock)
    rmsnorm_kernel(void* y, DType y_dt, const void* x, DType x_dt, int x_parts, int64_t x_part_stride, void* residual,
                   const void* residual_in, DType r_dt, const void* w, DType w_dt, int64_t rows, int64_t H, float eps) {
  constexpr int kRowsPerBlock = kBlock / kThreads;
  constexpr int kCache = 32 / N;  // chunks of N values held in registers per thread
  __shared__ float smem[32];
  hopper::launch_dependents();  // a programmatically launched consumer may start its weight stream
  hopper::grid_dependency_wait();  // launched programmatically itself (programmatic_launch.cuh)

  const int lane = threadIdx.x % kThreads;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreads;
  // Only warp-per-row blocks can hold rows past the end; their reductions are warp-local, so the
  // early exit cannot strand a __syncthreads.
  if (row >= rows) return;
  const int64_t base = row * H;
  const void* src = residual ? static_cast<const void*>(residual) : x;  // what the second pass re-reads
  const DType src_dt = residual ? r_dt : x_dt;

  // Loads chunk [i, i + N) of the (updated) row into v and returns its sum of squares.
  auto load_chunk = [&](int64_t i, float (&v)[N]) {
    load_vec<N>(x, base + i, x_dt, v);
    for (int part = 1; part < x_parts; ++part) {  // partial sums, added in order (f32)
      float p[N];
      load_vec<N>(x, part * x_part_stride + base + i, x_dt, p);
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] += p[k];
    }
    if (residual) {
      float r[N];
      load_vec<N>(residual_in, base + i, r_dt, r);
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] = round_to(r_dt, r[k] + v[k]);
      store_vec<N>(residual, base + i, r_dt, v);
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < N; ++k) s += v[k] * v[k];
    return s;
  };

  float cache[kCache][N];
  float sum_sq = 0.0f;
#pragma unroll
  for (int c = 0; c < kCache; ++c) {
    const int64_t i = (static_cast<int64_t>(c) * kThreads + lane) * N;
    if (i < H) sum_sq += load_chunk(i, cache[c]);
  }
  for (int64_t i = (static_cast<int64_t>(kCache) * kThreads + lane) * N; i < H; i += static_cast<int64_t>(kThreads) * N) {
    float v[N];
    sum_sq += load_chunk(i, v);
  }
  sum_sq = detail::block_reduce<kThreads>(sum_sq, detail::SumOp{}, 0.0f, smem);
  const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(H) + eps);

  auto store_chunk = [&](int64_t i, const float (&v)[N]) {
    float wv[N], out[N];
    load_vec<N>(w, i, w_dt, wv);
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = __fmul_rn(__fmul_rn(v[k], inv_rms), wv[k]);
    store_vec<N>(y, base + i, y_dt, out);
  };
#pragma unroll
  for (int c = 0; c < kCache; ++c) {
    const int64_t i = (static_cast<int64_t>(c) * kThreads + lane) * N;
    if (i < H) store_chunk(i, cache[c]);
  }
  for (int64_t i = (static_cast<int64_t>(kCache) * kThreads + lane) * N; i < H; i += static_cast<int64_t>(kThreads) * N) {
    float v[N];
    load_vec<N>(src, base + i, src_dt, v);  // this thread's own earlier write when src is the residual
    store_chunk(i, v);
  }
}

void launch_rmsnorm(CudaBackend& be, Tensor y, Tensor x, Tensor residual, Tensor residual_in, Tensor w, float eps) {
  detail::check_float(be, y);
  detail::check_float(be, x);
  detail::check_float(be, w);
  const bool has_residual = residual.data != nullptr;
  // x: like y, or (with a residual) [S, ...y's shape] of S partial sums.
  const bool partial_sums = has_residual && x.ndim() == y.ndim() + 1;
  const int x_parts = partial_sums ? static_cast<int>(x.size(0)) : 1;
  KILN_ASSERT(y.ndim() >= 1 && (partial_sums ? x.numel() == x_parts * y.numel() && x.size(-1) == y.size(-1)
                                             : x.shape == y.shape));
  const int64_t H = y.size(-1);
  KILN_ASSERT(w.ndim() == 1 && w.size(0) == H);
  if (has_residual) {
    detail::check_float(be, residual);
    KILN_ASSERT(residual.shape == y.shape);
    if (residual_in.data == nullptr) residual_in = residual;
    detail::check_float(be, residual_in);
    KILN_ASSERT(residual_in.shape == y.shape && residual_in.dtype == residual.dtype);
  }
  if (H == 0 || y.numel() == 0) return;
  const int64_t rows = y.numel() / H;
  const int64_t x_part_stride = y.numel();
  KILN_ASSERT(rows < (int64_t(1) << 31));

  const bool vec = H % 8 == 0 && detail::aligned16(y.data) && detail::aligned16(x.data) && detail::aligned16(w.data) &&
                   (!has_residual || (detail::aligned16(residual.data) && detail::aligned16(residual_in.data)));
  const bool warp_per_row = H <= 1024;
  const unsigned grid = static_cast<unsigned>(warp_per_row ? detail::ceil_div(rows, kBlock / 32) : rows);
  const DType r_dt = has_residual ? residual.dtype : x.dtype;
#define KILN_LAUNCH_RMSNORM(THREADS, N)                                                                       \
  detail::launch_programmatic(be, rmsnorm_kernel<THREADS, N>, dim3(grid), dim3(kBlock), 0, 1, y.data, y.dtype,     \
                              x.data, x.dtype, x_parts, x_part_stride, residual.data, residual_in.data, r_dt, w.data, \
                              w.dtype, rows, H, eps)
  if (warp_per_row) {
    if (vec) KILN_LAUNCH_RMSNORM(32, 8);
    else KILN_LAUNCH_RMSNORM(32, 1);
  } else {
    if (vec) KILN_LAUNCH_RMSNORM(kBlock, 8);
    else KILN_LAUNCH_RMSNORM(kBlock, 1);
  }
#undef KILN_LAUNCH_RMSNORM
}

}  // namespace

void rmsnorm_forward(CudaBackend& be, Tensor y, Tensor x, Tensor w, float eps) {
  launch_rmsnorm(be, y, x, Tensor{}, Tensor{}, w, eps);
}

void add_rmsnorm_forward(CudaBackend& be, Tensor y, Tensor residual, Tensor x, Tensor w, float eps, Tensor residual_in) {
  KILN_ASSERT(residual.data != nullptr || residual.numel() == 0);
  if (residual.numel() == 0) {
    KILN_ASSERT(x.numel() == 0 && y.numel() == 0);
    return;
  }
  launch_rmsnorm(be, y, x, residual, residual_in, w, eps);
}

}  // namespace kiln::cuda
