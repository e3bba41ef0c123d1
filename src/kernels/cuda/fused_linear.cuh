// What the two small-batch linear kernels share (fused_linear.cu: tensor-core tiles of 16 weight rows
// for 2 to 32 batch rows; fused_linear_rows.cu: one warp per weight row for a single batch row):
// the epilogues, where the q/k/v epilogue writes and how. Internal to the CUDA kernels (device code:
// include from .cu files only).
#pragma once

#include <cstdint>

#include "backend/cuda_backend.h"
#include "core/dtype.h"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/sampling_math.h"

namespace kiln::cuda::fused {

enum class Epilogue { store, add_residual, swiglu, qkv_rope };

// Where the qkv_rope epilogue puts the attention block's inputs (ops.h: norm_linear_qkv_rope_forward):
// q [M, Hq, D], the key and value caches [S, Hkv, D] at each row's slot (a negative slot: not
// written), all of dtype dt; the rotation's positions [M] and frequencies [D / 2].
struct RopeOut {
  void* q = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  DType dt = DType::bf16;
  const int32_t* positions = nullptr;
  const int32_t* slots = nullptr;
  const float* inv_freq = nullptr;
  float scaling = 1.0f;
  int Hq = 0, Hkv = 0, D = 0;
};

// Where the qkv_rope epilogue of batch row m writes output f0 (a dimension i < D / 2 of a head) and
// its rotation partner f0 + D / 2, and the rotation's cos / sin: everything but the sums, from the
// step's inputs (positions, slots: written before the step's first kernel) and the model's
// frequencies, so that a kernel finds it before its wait for the kernel that wrote x and the double
// precision sincos and the index loads leave its tail (rope_target). Measured on an H100 with the
// decode attention's input stage and qkv_rope_cache_write doing the same (bench_decode_step, 1K, ms
// per step): astrai-1b B = 1 / 8 / 32 0.986 / 1.154 / 1.749 -> 0.978 / 1.146 / 1.743; qwen3-0.6b
// (q/k norms) B = 1 / 16 0.831 / 1.880 -> 0.819 / 1.846 (docs/perf-notes.md, twenty-second session).
struct RopeTarget {
  int slot = -1;               // the row's cache slot (negative: no cache write)
  float2 cs = {1.0f, 0.0f};    // rope_cos_sin of the row's position and dimension i (q and k heads)
};

__device__ __forceinline__ RopeTarget rope_target(const RopeOut& rope, int m, int f0) {
  const int head = f0 / rope.D, i = f0 % rope.D;
  RopeTarget r;
  r.slot = rope.slots[m];
  if (head < rope.Hq + rope.Hkv)
    r.cs = detail::rope_cos_sin(static_cast<float>(rope.positions[m]), rope.inv_freq[i], rope.scaling);
  return r;
}

// The qkv_rope epilogue of batch row m for output f0 and its partner f0 + D / 2 (target: rope_target
// of the same m and f0), whose (normed) sums are x0 and x1: plus the bias, rounded to the outputs'
// dtype, then rotated in f32 and written to q or the key cache (q and k heads) or copied to the value
// cache (v heads), as qkv_rope_cache_write does; a row with a negative slot writes no cache.
__device__ __forceinline__ void store_qkv_rope(const RopeOut& rope, const RopeTarget& target, int m, int f0, float x0,
                                               float x1, const void* bias, DType b_dt) {
  const int half = rope.D / 2, head = f0 / rope.D, i = f0 % rope.D;
  if (bias) {
    x0 += detail::load1(bias, f0, b_dt);
    x1 += detail::load1(bias, f0 + half, b_dt);
  }
  x0 = detail::round_to(rope.dt, x0);
  x1 = detail::round_to(rope.dt, x1);
  const int slot = target.slot;
  if (head >= rope.Hq + rope.Hkv) {
    if (slot < 0) return;
    const int64_t dst = (static_cast<int64_t>(slot) * rope.Hkv + (head - rope.Hq - rope.Hkv)) * rope.D + i;
    detail::store1(rope.v_cache, dst, rope.dt, x0);
    detail::store1(rope.v_cache, dst + half, rope.dt, x1);
    return;
  }
  const bool is_q = head < rope.Hq;
  if (!is_q && slot < 0) return;
  void* out = is_q ? rope.q : rope.k_cache;
  const int64_t dst = is_q ? (static_cast<int64_t>(m) * rope.Hq + head) * rope.D + i
                           : (static_cast<int64_t>(slot) * rope.Hkv + (head - rope.Hq)) * rope.D + i;
  const float2 rot = detail::rope_rotate(x0, x1, target.cs);
  detail::store1(out, dst, rope.dt, rot.x);
  detail::store1(out, dst + half, rope.dt, rot.y);
}

// One projection's operands: y (epilogue store / swiglu: [M, outputs] of y_dt; add_residual: the f32
// residual [M, N]); x [M, K] (f32 residual rows when normed, else of the weight dtype); w [N, K]
// bf16; norm weights [K] when normed; bias [N] of b_dt or null.
struct LinearArgs {
  void* y = nullptr;
  DType y_dt = DType::bf16;
  const void* x = nullptr;
  const void* w = nullptr;
  const void* norm_w = nullptr;
  const void* bias = nullptr;
  DType b_dt = DType::bf16;
  int M = 0, N = 0, K = 0;
  float eps = 0.0f;
};

// The warp-per-row kernel (fused_linear_rows.cu) takes one row (M == 1) of K % 8 == 0 elements, the row
// in 40 KB of shared memory (K <= 20480); wider rows take the tensor-core kernel.
bool rows_kernel_valid(int64_t M, int64_t K);
void rows_kernel_launch(CudaBackend& be, Epilogue epi, bool norm, const LinearArgs& a, const RopeOut& rope);

// The order of (logit, index) pairs as one integer: larger logits first, then lower indices; NaN
// counts as -inf (the sampler's clean) and -0 as +0, as its greedy rows compare them. The greedy heads
// keep the largest key of their logits (atomicMax) and decode the token from it (argmax_token).
__device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
  v = kiln::sampling::clean(v);
  if (v == 0.0f) v = 0.0f;
  uint32_t u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(u) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
}
__device__ __forceinline__ int32_t argmax_token(unsigned long long key) {
  return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key & 0xFFFFFFFFu));
}

// The normed store epilogue's greedy token (ops.h: norm_linear_argmax_forward): the first index of
// the largest output, as rounded to y's dtype. best and arrived are zero before the launch and after it.
struct ArgmaxOut {
  int32_t* token = nullptr;
  unsigned long long* best = nullptr;
  unsigned int* arrived = nullptr;
};
void rows_kernel_argmax_launch(CudaBackend& be, const LinearArgs& a, const ArgmaxOut& am);

}  // namespace kiln::cuda::fused
