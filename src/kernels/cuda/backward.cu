// Backward passes of the model's row-wise and elementwise ops, and the training attention-input
// stage, CUDA twins of kernels/cpu/backward.cpp (math and shapes in kernels/train_ops.h and there).
// Activations f32, bf16 or f16 (each tensor its own dtype), f32 arithmetic, f32 weight gradients
// accumulated (+=).
//
// Weight gradients (rmsnorm dw, bias db, q/k norm weights) are sums over many rows. They are
// deterministic for a given GPU: each block sums a fixed, contiguous range of rows into an f32
// partial row of a scratch [blocks, H] buffer (from the backend's caching allocator), and
// column_sum_kernel then adds the partials of every column in a fixed order, in double, to the
// gradient. No atomics, so equal inputs give equal bits run after run.
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
//   qkv_split_rope_forward: one block (4 warps) per token, the arithmetic of qkv_rope_cache_write
//     (kernels/cuda/qkv.cu) with q [B, Hq, S, D], k, v [B, Hkv, S, D] outputs; the head row is first
//     rounded to the output dtype, as the CPU twin's split does.
//   qkv_split_rope_backward: blocks loop over tokens (about 8 blocks per SM); per head a warp rotates
//     dy back by the angle, then (norms present) recomputes r from the qkv head and applies the
//     RMSNorm backward over D; lanes keep dq_norm/dk_norm partials in registers across tokens.
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

void launch_column_sum(CudaBackend& be, float* out, const float* partial, int64_t G, int64_t ncols, int64_t stride) {
  if (ncols == 0) return;
  const dim3 block(kSumCols, kSumLanes);
  column_sum_kernel<<<static_cast<unsigned>(detail::ceil_div(ncols, kSumCols)), block, 0, detail::stream_of(be)>>>(
      out, partial, G, ncols, stride);
  KILN_CUDA_CHECK_LAUNCH();
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

// ---- QKV split + norm + rope -----------------------------------------------------------------------

constexpr int kQkvThreads = 128;
constexpr int kQkvWarps = kQkvThreads / 32;
constexpr int kMaxHeadDim = 256;
constexpr int kPerLane = kMaxHeadDim / 32;

struct QkvArgs {
  int B, S, Hq, Hkv, D;
};

// Forward: block t = b * S + s. Lane holds head elements lane + 32 j.
__global__ void __launch_bounds__(kQkvThreads)
    qkv_split_rope_forward_kernel(void* q, DType q_dt, void* k, DType k_dt, void* v, DType v_dt, const void* qkv,
                                  DType in_dt, const int32_t* positions, const float* inv_freq, float scaling,
                                  const void* q_norm, DType qn_dt, const void* k_norm, DType kn_dt, QkvArgs a,
                                  float eps) {
  __shared__ float2 cs[kMaxHeadDim / 2];
  __shared__ float rows[kQkvWarps][kMaxHeadDim];
  const int64_t t = blockIdx.x;
  const int b = static_cast<int>(t / a.S), s = static_cast<int>(t - static_cast<int64_t>(b) * a.S);
  const int D = a.D, half = D / 2, heads = a.Hq + 2 * a.Hkv;
  const float pos = static_cast<float>(positions[t]);
  for (int i = threadIdx.x; i < half; i += kQkvThreads) cs[i] = detail::rope_cos_sin(pos, inv_freq[i], scaling);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t in_row = t * heads * static_cast<int64_t>(D);
  float* row = rows[warp];
  for (int h = warp; h < heads; h += kQkvWarps) {
    const bool is_q = h < a.Hq, is_k = !is_q && h < a.Hq + a.Hkv;
    float xv[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int i = lane + 32 * j;
      xv[j] = i < D ? detail::load1(qkv, in_row + static_cast<int64_t>(h) * D + i, in_dt) : 0.0f;
    }
    if (!is_q && !is_k) {  // value head: a copy
      const int64_t dst = ((static_cast<int64_t>(b) * a.Hkv + (h - a.Hq - a.Hkv)) * a.S + s) * D;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j)
        if (lane + 32 * j < D) detail::store1(v, dst + lane + 32 * j, v_dt, xv[j]);
      continue;
    }
    const DType out_dt = is_q ? q_dt : k_dt;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) xv[j] = detail::round_to(out_dt, xv[j]);  // the split's store
    const void* w = is_q ? q_norm : k_norm;
    if (w) {
      float ss = 0.0f;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) ss += xv[j] * xv[j];
      ss = detail::warp_reduce(ss, detail::SumOp{});
      const float inv_rms = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
      const DType w_dt = is_q ? qn_dt : kn_dt;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const int i = lane + 32 * j;
        if (i < D) xv[j] = detail::round_to(out_dt, __fmul_rn(__fmul_rn(xv[j], inv_rms), detail::load1(w, i, w_dt)));
      }
    }
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (lane + 32 * j < D) row[lane + 32 * j] = xv[j];
    __syncwarp();
    void* out = is_q ? q : k;
    const int64_t dst = is_q ? ((static_cast<int64_t>(b) * a.Hq + h) * a.S + s) * D
                             : ((static_cast<int64_t>(b) * a.Hkv + (h - a.Hq)) * a.S + s) * D;
    for (int i = lane; i < half; i += 32) {
      const float x0 = row[i], x1 = row[i + half];
      const float2 r = cs[i];
      const float2 rot = detail::rope_rotate(x0, x1, r);
      detail::store1(out, dst + i, out_dt, rot.x);
      detail::store1(out, dst + i + half, out_dt, rot.y);
    }
    __syncwarp();  // row is rewritten for the next head
  }
}

// Backward: blocks loop over tokens t = blockIdx.x, + gridDim.x, ...; partial: [gridDim.x, 2, D]
// (q norm weight, then k norm weight), written when either norm is present.
__global__ void __launch_bounds__(kQkvThreads)
    qkv_split_rope_backward_kernel(void* d_qkv, DType dqkv_dt, const void* dq, DType dq_dt, const void* dk,
                                   DType dk_dt, const void* dv, DType dv_dt, const void* qkv, DType in_dt,
                                   const int32_t* positions, const float* inv_freq, float scaling, const void* q_norm,
                                   DType qn_dt, const void* k_norm, DType kn_dt, float* partial, QkvArgs a, float eps) {
  __shared__ float2 cs[kMaxHeadDim / 2];
  __shared__ float rows[kQkvWarps][kMaxHeadDim];
  __shared__ float merge[kQkvWarps][2][kMaxHeadDim];
  const int D = a.D, half = D / 2, heads = a.Hq + 2 * a.Hkv;
  const int64_t T = static_cast<int64_t>(a.B) * a.S;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float d_f = static_cast<float>(D);
  float* row = rows[warp];
  float dqw[kPerLane], dkw[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) dqw[j] = dkw[j] = 0.0f;

  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    __syncthreads();  // the previous token's readers of cs are done
    const float pos = static_cast<float>(positions[t]);
    for (int i = threadIdx.x; i < half; i += kQkvThreads) cs[i] = detail::rope_cos_sin(pos, inv_freq[i], scaling);
    __syncthreads();
    const int b = static_cast<int>(t / a.S), s = static_cast<int>(t - static_cast<int64_t>(b) * a.S);
    const int64_t in_row = t * heads * static_cast<int64_t>(D);
    for (int h = warp; h < heads; h += kQkvWarps) {
      const int64_t at = in_row + static_cast<int64_t>(h) * D;
      if (h >= a.Hq + a.Hkv) {  // value head: the gradient passes through
        const int64_t src = ((static_cast<int64_t>(b) * a.Hkv + (h - a.Hq - a.Hkv)) * a.S + s) * D;
        for (int i = lane; i < D; i += 32) detail::store1(d_qkv, at + i, dqkv_dt, detail::load1(dv, src + i, dv_dt));
        continue;
      }
      const bool is_q = h < a.Hq;
      const void* g = is_q ? dq : dk;
      const DType g_dt = is_q ? dq_dt : dk_dt;
      const int64_t src = is_q ? ((static_cast<int64_t>(b) * a.Hq + h) * a.S + s) * D
                               : ((static_cast<int64_t>(b) * a.Hkv + (h - a.Hq)) * a.S + s) * D;
      for (int i = lane; i < D; i += 32) row[i] = detail::load1(g, src + i, g_dt);
      __syncwarp();
      float dz[kPerLane];
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const int i = lane + 32 * j;
        dz[j] = 0.0f;
        if (i < half) {
          const float2 r = cs[i];
          dz[j] = row[i] * r.x + row[i + half] * r.y;
        } else if (i < D) {
          const float2 r = cs[i - half];
          dz[j] = row[i] * r.x - row[i - half] * r.y;
        }
      }
      __syncwarp();  // row is rewritten for the next head
      const void* w = is_q ? q_norm : k_norm;
      if (w) {
        const DType w_dt = is_q ? qn_dt : kn_dt;
        float xv[kPerLane], wv[kPerLane];
        float ss = 0.0f, dot = 0.0f;
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
          const int i = lane + 32 * j;
          xv[j] = i < D ? detail::round_to(g_dt, detail::load1(qkv, at + i, in_dt)) : 0.0f;  // what the forward normed
          wv[j] = i < D ? detail::load1(w, i, w_dt) : 0.0f;
          ss += xv[j] * xv[j];
          dot += dz[j] * wv[j] * xv[j];
        }
        ss = detail::warp_reduce(ss, detail::SumOp{});
        dot = detail::warp_reduce(dot, detail::SumOp{});
        const float r = 1.0f / sqrtf(ss / d_f + eps);
        const float coef = r * r * r * (dot / d_f);
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
          const float part = dz[j] * xv[j] * r;
          if (is_q) dqw[j] += part;
          else dkw[j] += part;
          dz[j] = r * dz[j] * wv[j] - coef * xv[j];
        }
      }
#pragma unroll
      for (int j = 0; j < kPerLane; ++j)
        if (lane + 32 * j < D) detail::store1(d_qkv, at + lane + 32 * j, dqkv_dt, dz[j]);
    }
  }

  if (!partial) return;
  // Merge the warps' partials in warp order; the block writes its row of the partial buffer.
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < D) {
      merge[warp][0][i] = dqw[j];
      merge[warp][1][i] = dkw[j];
    }
  }
  __syncthreads();
  float* out = partial + static_cast<int64_t>(blockIdx.x) * 2 * D;
  for (int i = threadIdx.x; i < 2 * D; i += kQkvThreads) {
    const int which = i / D, col = i - which * D;
    float s = 0.0f;
#pragma unroll
    for (int wp = 0; wp < kQkvWarps; ++wp) s += merge[wp][which][col];
    out[i] = s;
  }
}

struct QkvShape {
  QkvArgs a;
  int64_t T, width;
};

QkvShape qkv_shape(CudaBackend& be, Tensor q, Tensor k, Tensor v, Tensor qkv, Tensor positions, Tensor inv_freq,
                   Tensor q_norm, Tensor k_norm) {
  detail::check_float(be, q);
  detail::check_float(be, k);
  detail::check_float(be, v);
  detail::check_float(be, qkv);
  detail::check_i32(be, positions);
  KILN_ASSERT(q.ndim() == 4 && k.ndim() == 4 && v.shape == k.shape);
  const int64_t B = q.size(0), Hq = q.size(1), S = q.size(2), D = q.size(3), Hkv = k.size(1);
  KILN_ASSERT(k.size(0) == B && k.size(2) == S && k.size(3) == D);
  KILN_ASSERT(D % 2 == 0 && D <= kMaxHeadDim);
  const int64_t T = B * S, width = (Hq + 2 * Hkv) * D;
  KILN_ASSERT(T < (int64_t(1) << 31) && Hq + 2 * Hkv < (int64_t(1) << 20));
  KILN_ASSERT(qkv.ndim() == 2 && qkv.size(0) == T && qkv.size(1) == width);
  KILN_ASSERT(positions.numel() == T);
  KILN_ASSERT(inv_freq.dtype == DType::f32 && inv_freq.numel() == D / 2 && (T == 0 || inv_freq.device == be.device()));
  if (q_norm.data) {
    detail::check_float(be, q_norm);
    KILN_ASSERT(q_norm.numel() == D);
  }
  if (k_norm.data) {
    detail::check_float(be, k_norm);
    KILN_ASSERT(k_norm.numel() == D);
  }
  QkvShape r;
  r.a = QkvArgs{static_cast<int>(B), static_cast<int>(S), static_cast<int>(Hq), static_cast<int>(Hkv), static_cast<int>(D)};
  r.T = T;
  r.width = width;
  return r;
}

}  // namespace

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
  if (has_dw) launch_column_sum(be, dw.ptr<float>(), partial_ptr, blocks, H, H);
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
  launch_column_sum(be, db.ptr<float>(), partial.ptr<float>(), splits, N, N);
}

void qkv_split_rope_forward(CudaBackend& be, Tensor q, Tensor k, Tensor v, Tensor qkv, Tensor positions, Tensor inv_freq,
                            float attention_scaling, Tensor q_norm, Tensor k_norm, float eps) {
  const QkvShape sh = qkv_shape(be, q, k, v, qkv, positions, inv_freq, q_norm, k_norm);
  if (sh.T == 0) return;
  qkv_split_rope_forward_kernel<<<static_cast<unsigned>(sh.T), kQkvThreads, 0, detail::stream_of(be)>>>(
      q.data, q.dtype, k.data, k.dtype, v.data, v.dtype, qkv.data, qkv.dtype, positions.ptr<const int32_t>(),
      inv_freq.ptr<const float>(), attention_scaling, q_norm.data, q_norm.dtype, k_norm.data, k_norm.dtype, sh.a, eps);
  KILN_CUDA_CHECK_LAUNCH();
}

void qkv_split_rope_backward(CudaBackend& be, Tensor d_qkv, Tensor dq_norm, Tensor dk_norm, Tensor dq, Tensor dk,
                             Tensor dv, Tensor qkv, Tensor positions, Tensor inv_freq, float attention_scaling,
                             Tensor q_norm, Tensor k_norm, float eps) {
  const QkvShape sh = qkv_shape(be, dq, dk, dv, qkv, positions, inv_freq, q_norm, k_norm);
  detail::check_float(be, d_qkv);
  KILN_ASSERT(d_qkv.shape == qkv.shape);
  const int64_t D = sh.a.D;
  if (q_norm.data)
    KILN_ASSERT(dq_norm.data && dq_norm.dtype == DType::f32 && dq_norm.numel() == D && dq_norm.device == be.device());
  if (k_norm.data)
    KILN_ASSERT(dk_norm.data && dk_norm.dtype == DType::f32 && dk_norm.numel() == D && dk_norm.device == be.device());
  if (sh.T == 0) return;
  const bool norms = q_norm.data || k_norm.data;
  // With norms each block keeps weight-gradient partials over its tokens (a bounded grid, one partial
  // row per block); without them one block per token, as in the forward, hides the latency of the
  // per-token loop (a bounded grid ran 2.5x slower than the forward on 16384 x 48 heads).
  const int64_t blocks =
      norms ? std::min<int64_t>(sh.T, static_cast<int64_t>(std::max(1, be.multiprocessor_count())) * 8) : sh.T;
  TensorBuffer partial;
  if (norms) partial = scratch_f32(be, blocks * 2 * D);
  float* partial_ptr = norms ? partial.ptr<float>() : nullptr;
  qkv_split_rope_backward_kernel<<<static_cast<unsigned>(blocks), kQkvThreads, 0, detail::stream_of(be)>>>(
      d_qkv.data, d_qkv.dtype, dq.data, dq.dtype, dk.data, dk.dtype, dv.data, dv.dtype, qkv.data, qkv.dtype,
      positions.ptr<const int32_t>(), inv_freq.ptr<const float>(), attention_scaling, q_norm.data, q_norm.dtype,
      k_norm.data, k_norm.dtype, partial_ptr, sh.a, eps);
  KILN_CUDA_CHECK_LAUNCH();
  if (q_norm.data) launch_column_sum(be, dq_norm.ptr<float>(), partial_ptr, blocks, D, 2 * D);
  if (k_norm.data) launch_column_sum(be, dk_norm.ptr<float>(), partial_ptr + D, blocks, D, 2 * D);
}

}  // namespace kiln::cuda
