// The attention input stage's per-head arithmetic (ops.h: qkv_rope_cache_write), shared by the
// qkv_rope_cache kernel (qkv.cu) and the decode attention kernel that fuses the stage
// (attention_decode.cu), so that both produce the same bits.
//
// RMSNorm of a head row (Qwen3's q/k norm) sums x^2 in one fixed order whatever the thread layout:
// chunk j = elements [8j, 8j + 8) summed in element order with fused multiply-adds, then the chunk
// sums combined over the bits of j in the order 2, 3, 4, 0, 1 (a butterfly across lanes when lane j
// holds chunk j; a thread holding chunks j and j + 4 adds those two first, then proceeds alike).
#pragma once

#include "kernels/cuda/kernel_util.cuh"

namespace kiln::cuda::detail {

// Sum of squares of n <= 8 consecutive elements, in order.
__device__ __forceinline__ float chunk_sum_squares(const float* x, int n) {
  float s = 0.0f;
  for (int e = 0; e < n; ++e) s = fmaf(x[e], x[e], s);
  return s;
}

// Sum of squares of a head row of D <= 256 elements in shared memory, by a whole warp (every lane
// gets it), in the fixed order above.
__device__ __forceinline__ float head_sum_squares_warp(const float* row, int D, int lane) {
  const int n = min(8, max(0, D - 8 * lane));
  float s = n > 0 ? chunk_sum_squares(row + 8 * lane, n) : 0.0f;
  s += __shfl_xor_sync(0xffffffffu, s, 4);
  s += __shfl_xor_sync(0xffffffffu, s, 8);
  s += __shfl_xor_sync(0xffffffffu, s, 16);
  s += __shfl_xor_sync(0xffffffffu, s, 1);
  s += __shfl_xor_sync(0xffffffffu, s, 2);
  return s;
}

// 1 / rms of a head row from its sum of squares.
__device__ __forceinline__ float head_inv_rms(float sum_squares, int D, float eps) {
  return 1.0f / sqrtf(sum_squares / static_cast<float>(D) + eps);
}

// A normed element: x / rms * w, rounded to the output dtype (as rmsnorm_forward).
__device__ __forceinline__ float head_norm(float x, float inv_rms, float w, DType out_dt) {
  return round_to(out_dt, __fmul_rn(__fmul_rn(x, inv_rms), w));
}

// Rotary embedding of the pair (x0, x1) = (element i, element i + D/2) with cs = rope_cos_sin(...)
// of frequency i: the values stored at i and i + D/2 (before rounding to the output dtype).
__device__ __forceinline__ float2 rope_pair(float x0, float x1, float2 cs) {
  return make_float2(__fsub_rn(__fmul_rn(x0, cs.x), __fmul_rn(x1, cs.y)),
                     __fadd_rn(__fmul_rn(x1, cs.x), __fmul_rn(x0, cs.y)));
}

// One q or k head by one warp: x holds the raw head row (lane i: elements i, i + 32, ...); the
// optional norm (w: [D] of w_dt, or null) and rotary embedding at `pos`, the results stored to
// dst[offset .. offset + D) in out_dt. `row`: the warp's shared-memory scratch of D floats.
template <int kPerLane>
__device__ __forceinline__ void norm_rope_head_warp(float (&x)[kPerLane], float* row, int D, int lane, const void* w,
                                                    DType w_dt, float eps, float pos, const float* inv_freq,
                                                    float scaling, void* dst, int64_t offset, DType out_dt) {
  if (w) {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (lane + 32 * j < D) row[lane + 32 * j] = x[j];
    __syncwarp();
    const float inv_rms = head_inv_rms(head_sum_squares_warp(row, D, lane), D, eps);
    __syncwarp();  // every lane has read the raw row
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < D) x[j] = head_norm(x[j], inv_rms, load1(w, i, w_dt), out_dt);
    }
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    if (lane + 32 * j < D) row[lane + 32 * j] = x[j];
  __syncwarp();
  const int half = D / 2;
  for (int i = lane; i < half; i += 32) {
    const float2 r = rope_pair(row[i], row[i + half], rope_cos_sin(pos, inv_freq[i], scaling));
    store1(dst, offset + i, out_dt, r.x);
    store1(dst, offset + i + half, out_dt, r.y);
  }
  __syncwarp();  // the row may be reused
}

}  // namespace kiln::cuda::detail
