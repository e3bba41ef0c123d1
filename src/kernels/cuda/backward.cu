// Backward passes of the model's row-wise and elementwise ops, CUDA twins of
// kernels/cpu/backward.cpp (math and shapes in kernels/train_ops.h and there; the training
// attention-input stage is qkv_train.cu).
// Activations f32, bf16 or f16 (each tensor its own dtype), f32 arithmetic, f32 weight gradients
// accumulated (+=).
//
// Weight gradients (rmsnorm dw, bias db, and qkv_train.cu's q/k norm weights) are sums over many
// rows. They are deterministic for a given GPU: each block sums a fixed, contiguous range of rows
// into an f32 partial row of a scratch [blocks, H] buffer (from the backend's caching allocator),
// and column_sum_kernel (detail::column_sum_add) then adds the partials of every column in a fixed
// order, in double, to the gradient. No atomics, so equal inputs give equal bits run after run.
//
//   rmsnorm_backward: dy, x, dx: [rows, H]; w: [H]; dw: [H] f32. A group of threads per row (a warp
//     when H <= 1024, the 256-thread block otherwise), rows strided over the groups of a block and
//     blocks over contiguous row ranges (about one wave of resident blocks). One read of dy and x
//     per row, held in registers (up to kCache vectors per thread; longer rows re-read the rest, an
//     L1/L2 hit): the row's sum(x^2) and sum(dy w x) in one two-value reduction, then
//     dx = r dy w - x r^3 sum(dy w x) / H, and dw partials dy x r kept in registers across the
//     rows of the block. Warp groups merge their partials through shared memory at the end. When a
//     row is one vector per thread (H = 2048 with the block, H <= 256 with a warp) two rows share
//     one reduction, so twice the loads are in flight per barrier.
//     dx may alias dy or x (each element is read and written by one thread, reads first).
//   swiglu_backward: elementwise, grid-stride over 8-element vectors (scalar when unaligned);
//     d_gate_up may alias gate_up.
//   embedding_backward: dtable[ids[t], :] += dy[t, :] by f32 atomicAdd (float4 atomics on sm_90,
//     16-byte aligned rows). NOT bitwise deterministic when ids repeat (the order of the adds
//     varies); every sum is still an f32 sum of the same terms. Ids outside [0, V) are skipped.
//   bias_backward: dy [M, N] column sums: blocks of (32 column vectors x 8 row lanes) over a
//     contiguous row range each, then column_sum_kernel.
#include <algorithm>

#include "kernels/cuda/cuda_train_ops.h"
#include "kernels/cuda/kernel_util.cuh"

namespace kiln::cuda {
namespace {

using detail::load_vec;
using detail::store_vec;

constexpr int kBlock = 256;

// An f32 scratch buffer of n elements from the backend's caching allocator (freed to the cache at
// the end of the op; later work on the stream may reuse it only after this op's kernels).
TensorBuffer scratch_f32(CudaBackend& be, int64_t n) { return empty_for_op(be, Shape{n}, DType::f32); }

// Resident blocks of `kernel` per SM at `threads` threads (at least 1).
template <typename Kernel>
int blocks_per_sm(Kernel kernel, int threads) {
  int n = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0));
  return std::max(n, 1);
}

// ---- Column sums of partials -----------------------------------------------------------------------

constexpr int kSumCols = 32, kSumLanes = 16;

// out[c] += sum over g < G of partial[g * stride + c], for c < ncols. The sum runs in double in a
// fixed order (lane y takes g = y, y + kSumLanes, ...; the lanes are then added in order).
// Block (kSumCols, kSumLanes); grid ceil(ncols / kSumCols).
__global__ void __launch_bounds__(kSumCols* kSumLanes)
    column_sum_kernel(float* out, const float* partial, int64_t G, int64_t ncols, int64_t stride) {
  __shared__ double lanes[kSumLanes][kSumCols];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kSumCols + threadIdx.x;
  double s = 0.0;
  if (c < ncols) {
#pragma unroll 4
    for (int64_t g = threadIdx.y; g < G; g += kSumLanes) s += static_cast<double>(partial[g * stride + c]);
  }
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < ncols) {
    double total = 0.0;
#pragma unroll
    for (int y = 0; y < kSumLanes; ++y) total += lanes[y][threadIdx.x];
    out[c] = static_cast<float>(static_cast<double>(out[c]) + total);
  }
}


// ---- RMSNorm -------------------------------------------------------------------------------------

// Sums of K values over a group of kThreads threads (a warp, or the whole block when kThreads ==
// kBlock); every thread of the group gets the results. smem: 32 * K floats, reusable by the next call.
template <int kThreads, int K>
__device__ __forceinline__ void group_sum(float (&v)[K], float* smem) {
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = detail::warp_reduce(v[k], detail::SumOp{});
  if constexpr (kThreads > 32) {
    constexpr int kWarps = kThreads / 32;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // earlier readers of smem are done
    if (lane == 0) {
#pragma unroll
      for (int k = 0; k < K; ++k) smem[warp * K + k] = v[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = detail::warp_reduce(lane < kWarps ? smem[lane * K + k] : 0.0f, detail::SumOp{});
  }
}

// Block b handles rows [b * rows_per_block, min(rows, (b + 1) * rows_per_block)); within it group
// g (of kGroups = kBlock / kThreads) takes kRows rows at a time (rows g * kRows + j, then
// kGroups * kRows further on, ...), loading all of them before the one reduction of their sums so
// that more loads are in flight. A thread owns the N-element chunks at i = (c * kThreads + lane) * N
// of every row: c < kCache in registers, the rest (block groups only) re-read in the second pass
// with their dw partials kept in the block's partial row.
// partial: [gridDim.x, H] f32, each block writing its own row; null when dw is absent.
template <int kThreads, int N, int kCache, int kRows>
__global__ void __launch_bounds__(kBlock)
    rmsnorm_backward_kernel(void* dx, DType dx_dt, void* dx_copy, DType copy_dt, const void* dy, DType dy_dt,
                            const void* x, DType x_dt, const void* w, DType w_dt, float* partial, int64_t rows,
                            int64_t H, int64_t rows_per_block, float eps, bool accumulate) {
  constexpr int kGroups = kBlock / kThreads;
  static_assert(kThreads == 32 || kThreads == kBlock, "a warp or the whole block per row");
  __shared__ float smem[32 * 2 * kRows];
  __shared__ float merge[kGroups > 1 ? 1024 : 1];  // warp groups: H <= 1024, all in registers

  const int lane = threadIdx.x % kThreads, group = threadIdx.x / kThreads;
  const int64_t row_begin = std::min(rows, static_cast<int64_t>(blockIdx.x) * rows_per_block);
  const int64_t row_end = std::min(rows, row_begin + rows_per_block);
  const int64_t sweep = static_cast<int64_t>(kThreads) * N;  // elements per pass of the group
  const int64_t first_uncached = kCache * sweep + static_cast<int64_t>(lane) * N;
  float* block_partial = partial ? partial + static_cast<int64_t>(blockIdx.x) * H : nullptr;
  const float h_f = static_cast<float>(H);

  float wc[kCache][N], dwc[kCache][N];
#pragma unroll
  for (int c = 0; c < kCache; ++c) {
    const int64_t i = (static_cast<int64_t>(c) * kThreads + lane) * N;
    if (i < H) load_vec<N>(w, i, w_dt, wc[c]);
#pragma unroll
    for (int k = 0; k < N; ++k) dwc[c][k] = 0.0f;
  }
  // Chunks past the cache (block groups only): their partials start at zero in the partial row.
  if (block_partial) {
    for (int64_t i = first_uncached; i < H; i += sweep) {
#pragma unroll
      for (int k = 0; k < N; ++k) block_partial[i + k] = 0.0f;
    }
  }

  for (int64_t row0 = row_begin + static_cast<int64_t>(group) * kRows; row0 < row_end;
       row0 += static_cast<int64_t>(kGroups) * kRows) {
    float dyc[kRows][kCache][N], xc[kRows][kCache][N];
    float sums[2 * kRows];  // (sum x^2, sum dy w x) per row
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int64_t row = row0 + j, base = row * H;
      float ss = 0.0f, dot = 0.0f;
      if (row < row_end) {
#pragma unroll
        for (int c = 0; c < kCache; ++c) {
          const int64_t i = (static_cast<int64_t>(c) * kThreads + lane) * N;
          if (i < H) {
            load_vec<N>(dy, base + i, dy_dt, dyc[j][c]);
            load_vec<N>(x, base + i, x_dt, xc[j][c]);
#pragma unroll
            for (int k = 0; k < N; ++k) {
              ss += xc[j][c][k] * xc[j][c][k];
              dot += dyc[j][c][k] * wc[c][k] * xc[j][c][k];
            }
          }
        }
        for (int64_t i = first_uncached; i < H; i += sweep) {
          float dyv[N], xv[N], wv[N];
          load_vec<N>(dy, base + i, dy_dt, dyv);
          load_vec<N>(x, base + i, x_dt, xv);
          load_vec<N>(w, i, w_dt, wv);
#pragma unroll
          for (int k = 0; k < N; ++k) {
            ss += xv[k] * xv[k];
            dot += dyv[k] * wv[k] * xv[k];
          }
        }
      }
      sums[2 * j] = ss;
      sums[2 * j + 1] = dot;
    }
    group_sum<kThreads>(sums, smem);

#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int64_t row = row0 + j, base = row * H;
      if (row >= row_end) continue;
      const float r = 1.0f / sqrtf(sums[2 * j] / h_f + eps);
      const float coef = r * r * r * (sums[2 * j + 1] / h_f);
      // dx for chunk i (dy, x, w given) and the dw partial update.
      auto chunk = [&](int64_t i, const float (&dyv)[N], const float (&xv)[N], const float (&wv)[N], float (&dwv)[N]) {
        float out[N];
        if (accumulate) {
          load_vec<N>(dx, base + i, dx_dt, out);
        } else {
#pragma unroll
          for (int k = 0; k < N; ++k) out[k] = 0.0f;
        }
#pragma unroll
        for (int k = 0; k < N; ++k) {
          out[k] += r * dyv[k] * wv[k] - coef * xv[k];
          dwv[k] += dyv[k] * xv[k] * r;
        }
        store_vec<N>(dx, base + i, dx_dt, out);
        if (dx_copy) store_vec<N>(dx_copy, base + i, copy_dt, out);
      };
#pragma unroll
      for (int c = 0; c < kCache; ++c) {
        const int64_t i = (static_cast<int64_t>(c) * kThreads + lane) * N;
        if (i < H) chunk(i, dyc[j][c], xc[j][c], wc[c], dwc[c]);
      }
      for (int64_t i = first_uncached; i < H; i += sweep) {
        float dyv[N], xv[N], wv[N], dwv[N];
        load_vec<N>(dy, base + i, dy_dt, dyv);  // dx may alias dy or x: this thread has not written i yet
        load_vec<N>(x, base + i, x_dt, xv);
        load_vec<N>(w, i, w_dt, wv);
#pragma unroll
        for (int k = 0; k < N; ++k) dwv[k] = block_partial ? block_partial[i + k] : 0.0f;
        chunk(i, dyv, xv, wv, dwv);
        if (block_partial) {
#pragma unroll
          for (int k = 0; k < N; ++k) block_partial[i + k] = dwv[k];
        }
      }
    }
  }

  if (!block_partial) return;
  if constexpr (kGroups == 1) {
#pragma unroll
    for (int c = 0; c < kCache; ++c) {
      const int64_t i = (static_cast<int64_t>(c) * kThreads + lane) * N;
      if (i < H) {
#pragma unroll
        for (int k = 0; k < N; ++k) block_partial[i + k] = dwc[c][k];
      }
    }
  } else {
    // Warp groups own the same columns: add their partials in group order through shared memory.
    for (int g = 0; g < kGroups; ++g) {
      if (group == g) {
#pragma unroll
        for (int c = 0; c < kCache; ++c) {
          const int64_t i = (static_cast<int64_t>(c) * kThreads + lane) * N;
          if (i < H) {
#pragma unroll
            for (int k = 0; k < N; ++k) merge[i + k] = g == 0 ? dwc[c][k] : merge[i + k] + dwc[c][k];
          }
        }
      }
      __syncthreads();
    }
    for (int64_t i = threadIdx.x; i < H; i += kBlock) block_partial[i] = merge[i];
  }
}

// ---- SwiGLU --------------------------------------------------------------------------------------

// Chunks of N never straddle rows (N divides I).
template <int N>
__global__ void __launch_bounds__(kBlock)
    swiglu_backward_kernel(void* d_gate_up, DType dgu_dt, const void* dout, DType d_dt, const void* gate_up,
                           DType gu_dt, int64_t rows, int64_t I) {
  const int64_t chunks = rows * I / N;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * kBlock) {
    const int64_t e = c * N, r = e / I, i = e - r * I;
    const int64_t g_at = r * 2 * I + i, u_at = g_at + I;
    float g[N], u[N], d[N], dg[N], du[N];
    detail::load_vec<N>(gate_up, g_at, gu_dt, g);
    detail::load_vec<N>(gate_up, u_at, gu_dt, u);
    detail::load_vec<N>(dout, e, d_dt, d);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float e_neg = expf(-g[k]);
      const float s = 1.0f / (1.0f + e_neg);
      dg[k] = d[k] * u[k] * (s * (1.0f + g[k] * (1.0f - s)));
      du[k] = d[k] * (g[k] / (1.0f + e_neg));
    }
    detail::store_vec<N>(d_gate_up, g_at, dgu_dt, dg);
    detail::store_vec<N>(d_gate_up, u_at, dgu_dt, du);
  }
}

// ---- Embedding -----------------------------------------------------------------------------------

// dst[0..N) += v[0..N) by f32 atomics: two float4 atomics for N == 8 on sm_90 (dst 16-byte aligned).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr bool kVectorAtomics = true;
#else
constexpr bool kVectorAtomics = false;
#endif
template <int N>
__device__ __forceinline__ void add_row_chunk(float* dst, const float (&v)[N]) {
  if constexpr (N == 8 && kVectorAtomics) {
    atomicAdd(reinterpret_cast<float4*>(dst), make_float4(v[0], v[1], v[2], v[3]));
    atomicAdd(reinterpret_cast<float4*>(dst + 4), make_float4(v[4], v[5], v[6], v[7]));
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) atomicAdd(dst + k, v[k]);
  }
}

// One block per token row (threads over the row in chunks of N). N == 8: dy 16-byte loads and two
// float4 atomics (dtable rows 16-byte aligned).
template <int N>
__global__ void __launch_bounds__(kBlock)
    embedding_backward_kernel(float* dtable, const void* dy, DType dy_dt, const int32_t* ids, int64_t V, int64_t H) {
  const int64_t t = blockIdx.x;
  const int64_t id = ids[t];
  if (id < 0 || id >= V) return;
  float* dst = dtable + id * H;
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * N; i < H; i += static_cast<int64_t>(blockDim.x) * N) {
    float v[N];
    detail::load_vec<N>(dy, t * H + i, dy_dt, v);
    add_row_chunk<N>(dst + i, v);
  }
}

// ---- Bias ----------------------------------------------------------------------------------------

constexpr int kBiasCols = 32, kBiasLanes = 8;

// Block (kBiasCols, kBiasLanes) sums rows [blockIdx.y * rows_per_split, ...) of the columns
// [(blockIdx.x * kBiasCols + threadIdx.x) * N, + N): lane y takes rows begin + y, + kBiasLanes, ...;
// the lanes are added in order and the block writes partial[blockIdx.y, columns].
template <int N>
__global__ void __launch_bounds__(kBiasCols* kBiasLanes)
    bias_partial_kernel(float* partial, const void* dy, DType dy_dt, int64_t M, int64_t ncols, int64_t rows_per_split) {
  __shared__ float lanes[kBiasLanes][kBiasCols * N];
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * kBiasCols + threadIdx.x) * N;
  const int64_t begin = std::min(M, static_cast<int64_t>(blockIdx.y) * rows_per_split);
  const int64_t end = std::min(M, begin + rows_per_split);
  float acc[N];
#pragma unroll
  for (int k = 0; k < N; ++k) acc[k] = 0.0f;
  if (col < ncols) {
    for (int64_t m = begin + threadIdx.y; m < end; m += kBiasLanes) {
      float v[N];
      detail::load_vec<N>(dy, m * ncols + col, dy_dt, v);
#pragma unroll
      for (int k = 0; k < N; ++k) acc[k] += v[k];
    }
  }
#pragma unroll
  for (int k = 0; k < N; ++k) lanes[threadIdx.y][threadIdx.x * N + k] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && col < ncols) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float s = 0.0f;
#pragma unroll
      for (int y = 0; y < kBiasLanes; ++y) s += lanes[y][threadIdx.x * N + k];
      partial[static_cast<int64_t>(blockIdx.y) * ncols + col + k] = s;
    }
  }
}

}  // namespace

namespace detail {

void column_sum_add(CudaBackend& be, float* out, const float* partial, int64_t G, int64_t ncols, int64_t stride) {
  if (ncols == 0) return;
  const dim3 block(kSumCols, kSumLanes);
  column_sum_kernel<<<static_cast<unsigned>(detail::ceil_div(ncols, kSumCols)), block, 0, detail::stream_of(be)>>>(
      out, partial, G, ncols, stride);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace detail

void rmsnorm_backward(CudaBackend& be, Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, float eps, bool accumulate_dx,
                      Tensor dx_copy) {
  detail::check_float(be, dx);
  const bool has_copy = dx_copy.data != nullptr;
  if (has_copy) {
    detail::check_float(be, dx_copy);
    KILN_ASSERT(dx_copy.shape == dx.shape);
  }
  detail::check_float(be, dy);
  detail::check_float(be, x);
  detail::check_float(be, w);
  KILN_ASSERT(x.ndim() >= 1 && dy.shape == x.shape && dx.shape == x.shape);
  const int64_t H = x.size(-1);
  KILN_ASSERT(w.ndim() == 1 && w.size(0) == H);
  const bool has_dw = dw.data != nullptr;
  if (has_dw) KILN_ASSERT(dw.dtype == DType::f32 && dw.numel() == H && dw.device == be.device());
  if (H == 0 || x.numel() == 0) return;
  const int64_t rows = x.numel() / H;

  const bool vec = H % 8 == 0 && detail::aligned16(dx.data) && detail::aligned16(dy.data) &&
                   detail::aligned16(x.data) && detail::aligned16(w.data) && (!has_copy || detail::aligned16(dx_copy.data));
  const bool warp_per_row = H <= 1024;
  // The register cache: vectors of 8 -> 1, 2 or 4 per thread as H needs (all of H up to 1024 with a
  // warp, 8192 with the block); scalars -> 32 per lane (warp, all of H) or 8 per thread (block).
  const int64_t per_sweep = (warp_per_row ? 32 : kBlock) * (vec ? 8 : 1);
  const int64_t sweeps = detail::ceil_div(H, per_sweep);
  const int cache = vec ? (sweeps <= 1 ? 1 : sweeps <= 2 ? 2 : 4) : (warp_per_row ? 32 : 8);

  void (*kernel)(void*, DType, void*, DType, const void*, DType, const void*, DType, const void*, DType, float*, int64_t,
                 int64_t, int64_t, float, bool) = nullptr;
  // Two rows per reduction where a row is one vector per thread (the common H = 2048 block case):
  // twice the loads in flight for the same register budget as the larger caches.
  if (warp_per_row) {
    if (!vec) kernel = rmsnorm_backward_kernel<32, 1, 32, 1>;
    else if (cache == 1) kernel = rmsnorm_backward_kernel<32, 8, 1, 2>;
    else if (cache == 2) kernel = rmsnorm_backward_kernel<32, 8, 2, 1>;
    else kernel = rmsnorm_backward_kernel<32, 8, 4, 1>;
  } else {
    if (!vec) kernel = rmsnorm_backward_kernel<kBlock, 1, 8, 1>;
    else if (cache == 1) kernel = rmsnorm_backward_kernel<kBlock, 8, 1, 2>;
    else if (cache == 2) kernel = rmsnorm_backward_kernel<kBlock, 8, 2, 1>;
    else kernel = rmsnorm_backward_kernel<kBlock, 8, 4, 1>;
  }
  // About one wave of resident blocks, each over a contiguous range of rows.
  const int64_t groups_per_block = warp_per_row ? kBlock / 32 : 1;
  const int64_t wave = static_cast<int64_t>(std::max(1, be.multiprocessor_count())) * blocks_per_sm(kernel, kBlock);
  const int64_t blocks_wanted = std::max<int64_t>(1, std::min(wave, detail::ceil_div(rows, groups_per_block)));
  const int64_t rows_per_block = detail::ceil_div(rows, blocks_wanted);
  const int64_t blocks = detail::ceil_div(rows, rows_per_block);

  TensorBuffer partial;
  if (has_dw) partial = scratch_f32(be, blocks * H);
  float* partial_ptr = has_dw ? partial.ptr<float>() : nullptr;
  kernel<<<static_cast<unsigned>(blocks), kBlock, 0, detail::stream_of(be)>>>(
      dx.data, dx.dtype, dx_copy.data, has_copy ? dx_copy.dtype : dx.dtype, dy.data, dy.dtype, x.data, x.dtype, w.data,
      w.dtype, partial_ptr, rows, H, rows_per_block, eps, accumulate_dx);
  KILN_CUDA_CHECK_LAUNCH();
  if (has_dw) detail::column_sum_add(be, dw.ptr<float>(), partial_ptr, blocks, H, H);
}

void swiglu_backward(CudaBackend& be, Tensor d_gate_up, Tensor dout, Tensor gate_up) {
  detail::check_float(be, d_gate_up);
  detail::check_float(be, dout);
  detail::check_float(be, gate_up);
  KILN_ASSERT(gate_up.ndim() >= 1 && d_gate_up.shape == gate_up.shape && dout.ndim() == gate_up.ndim());
  for (int d = 0; d + 1 < dout.ndim(); ++d) KILN_ASSERT(dout.size(d) == gate_up.size(d));
  const int64_t I = dout.size(-1);
  KILN_ASSERT(gate_up.size(-1) == 2 * I);
  if (I == 0 || dout.numel() == 0) return;
  const int64_t rows = dout.numel() / I;
  const bool vec = I % 8 == 0 && detail::aligned16(d_gate_up.data) && detail::aligned16(dout.data) &&
                   detail::aligned16(gate_up.data);
  cudaStream_t stream = detail::stream_of(be);
  if (vec) {
    const unsigned grid = detail::grid_for(be, rows * I / 8, kBlock);
    swiglu_backward_kernel<8><<<grid, kBlock, 0, stream>>>(d_gate_up.data, d_gate_up.dtype, dout.data, dout.dtype,
                                                           gate_up.data, gate_up.dtype, rows, I);
  } else {
    const unsigned grid = detail::grid_for(be, rows * I, kBlock);
    swiglu_backward_kernel<1><<<grid, kBlock, 0, stream>>>(d_gate_up.data, d_gate_up.dtype, dout.data, dout.dtype,
                                                           gate_up.data, gate_up.dtype, rows, I);
  }
  KILN_CUDA_CHECK_LAUNCH();
}

void embedding_backward(CudaBackend& be, Tensor dtable, Tensor dy, Tensor ids) {
  detail::check_float(be, dy);
  detail::check_i32(be, ids);
  KILN_ASSERT(dtable.dtype == DType::f32 && (dtable.numel() == 0 || dtable.device == be.device()));
  KILN_ASSERT(dtable.ndim() == 2 && dy.ndim() == 2 && ids.ndim() == 1);
  const int64_t V = dtable.size(0), H = dtable.size(1), T = ids.size(0);
  KILN_ASSERT(dy.size(0) == T && dy.size(1) == H);
  KILN_ASSERT(T < (int64_t(1) << 31));
  if (T == 0 || H == 0) return;
  const bool vec = H % 8 == 0 && detail::aligned16(dtable.data) && detail::aligned16(dy.data);
  const int threads = static_cast<int>(std::min<int64_t>(kBlock, std::max<int64_t>(32, detail::ceil_div(H, vec ? 8 : 1))));
  cudaStream_t stream = detail::stream_of(be);
  if (vec)
    embedding_backward_kernel<8><<<static_cast<unsigned>(T), threads, 0, stream>>>(
        dtable.ptr<float>(), dy.data, dy.dtype, ids.ptr<const int32_t>(), V, H);
  else
    embedding_backward_kernel<1><<<static_cast<unsigned>(T), threads, 0, stream>>>(
        dtable.ptr<float>(), dy.data, dy.dtype, ids.ptr<const int32_t>(), V, H);
  KILN_CUDA_CHECK_LAUNCH();
}

void bias_backward(CudaBackend& be, Tensor db, Tensor dy) {
  detail::check_float(be, dy);
  KILN_ASSERT(db.dtype == DType::f32 && db.ndim() == 1);
  KILN_ASSERT(dy.ndim() >= 1);
  const int64_t N = dy.size(-1);
  KILN_ASSERT(db.size(0) == N);
  if (N == 0 || dy.numel() == 0) return;
  KILN_ASSERT(db.data != nullptr && db.device == be.device());
  const int64_t M = dy.numel() / N;
  const bool vec = N % 8 == 0 && detail::aligned16(dy.data);
  const int64_t nv = vec ? 8 : 1;
  const int64_t col_blocks = detail::ceil_div(N, kBiasCols * nv);
  KILN_ASSERT(col_blocks < (int64_t(1) << 31));
  // Row splits: about 8 blocks per SM in all, each split at least kBiasLanes rows, at most 65535.
  const int64_t target = static_cast<int64_t>(std::max(1, be.multiprocessor_count())) * 8;
  const int64_t splits_wanted =
      std::clamp<int64_t>(target / col_blocks, 1, std::min<int64_t>(65535, detail::ceil_div(M, kBiasLanes)));
  const int64_t rows_per_split = detail::ceil_div(M, splits_wanted);
  const int64_t splits = detail::ceil_div(M, rows_per_split);

  TensorBuffer partial = scratch_f32(be, splits * N);
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(splits)), block(kBiasCols, kBiasLanes);
  cudaStream_t stream = detail::stream_of(be);
  if (vec)
    bias_partial_kernel<8><<<grid, block, 0, stream>>>(partial.ptr<float>(), dy.data, dy.dtype, M, N, rows_per_split);
  else
    bias_partial_kernel<1><<<grid, block, 0, stream>>>(partial.ptr<float>(), dy.data, dy.dtype, M, N, rows_per_split);
  KILN_CUDA_CHECK_LAUNCH();
  detail::column_sum_add(be, db.ptr<float>(), partial.ptr<float>(), splits, N, N);
}

}  // namespace kiln::cuda
