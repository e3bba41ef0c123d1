// qkv_rope_cache_write: the attention block's input stage in one pass (semantics in ops.h).
// qkv: [T, (Hq + 2 Hkv) * D] (each row: q heads, k heads, v heads); q_out: [T, Hq, D];
// k_cache, v_cache: [S, Hkv, D]; positions, slots: [T] i32; inv_freq: [D/2] f32;
// q_norm, k_norm: [D] or absent.
// Per head row: optional RMSNorm (y = x * (1/sqrt(mean(x^2) + eps)) * w, rounded to the output
// dtype, as rmsnorm_forward), then rotary embedding with the same cos/sin table and f32 arithmetic
// as rope_forward, stored to q_out or to the key cache slot; value rows are copied to the cache.
// Launch: grid (T, ceil(heads / 8)), a warp per (token, head), so that every head's load, norm and
// store chain runs in parallel (a block per token walking its heads was latency-bound: 10 us per
// layer at B=128); lane i holds elements i, i + 32, ... and computes the (cos, sin) pairs of the
// frequencies it stores, or reads them from the step's table (rope_cos_sin_table: prefill steps,
// where every head of every layer would recompute the same double-precision cos and sin). A
// negative slot skips the token's cache writes (as kv_cache_write does).
// With the step's (cos, sin) table (prefill steps), head dims that are a multiple of 64 (64 to
// 256) take the vector path instead: four threads per (token, head), thread q holding elements
// [32 s + 8 q, + 8) of every 32-wide segment s, so that each of its loads and stores is 16 bytes
// and every rotation pair (i, i + D/2) is its own; the sum of squares is formed in the order of
// the warp-per-head path (lane l = 8 q + e's chain over its segments, then the butterfly over
// lanes 16, 8, 4, 2, 1: across the quad for 16 and 8, within the thread for the rest), so both
// paths write the same bits (and the same as the decode kernels that share head_rms_norm). Under
// Nsight an 8K-token prefill chunk took 3x its bytes' time on the warp path; with the vector path
// the engine's prefill is 1 ms faster at 8K, 2.5 ms at 30K (H100, perf-notes).
// Launched programmatically (programmatic_launch.cuh): it waits for the projection at its start.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/programmatic_launch.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxHeadDim = 256;
constexpr int kPerLane = kMaxHeadDim / 32;

__global__ void __launch_bounds__(kThreads)
    qkv_rope_cache_kernel(void* q_out, DType q_dt, void* k_cache, void* v_cache, DType c_dt, const void* qkv,
                          DType in_dt, const int32_t* positions, const int32_t* slots, const float* inv_freq,
                          float scaling, const float2* cos_sin, const void* q_norm, DType qn_dt, const void* k_norm,
                          DType kn_dt, int Hq, int Hkv, int D, float eps) {
  __shared__ float rows[kWarps][kMaxHeadDim];
  hopper::launch_dependents();  // lets the attention kernel get scheduled under this one
  const int64_t t = blockIdx.x;
  const int half = D / 2;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int heads = Hq + 2 * Hkv;
  const int h = blockIdx.y * kWarps + warp;
  if (h >= heads) {  // waits like every warp, so the grid completes only after the one before it
    hopper::grid_dependency_wait();
    return;
  }
  // The slot and, without the step's table, this lane's rotations (dimensions lane + 32 j) from the
  // step's inputs and the model's frequencies before the wait for the kernel that wrote qkv: the
  // double-precision sincos leaves the path between the projection and the attention. (The table
  // is written by a kernel of the step: read after the wait.)
  const int slot = slots[t];
  float2 cs[kPerLane / 2];
  if (!cos_sin) {
    const float pos = static_cast<float>(positions[t]);
#pragma unroll
    for (int j = 0; j < kPerLane / 2; ++j)
      if (lane + 32 * j < half) cs[j] = detail::rope_cos_sin(pos, inv_freq[lane + 32 * j], scaling);
  }
  hopper::grid_dependency_wait();
  const int64_t in_row = t * static_cast<int64_t>(heads) * D;
  float* row = rows[warp];
  const bool is_q = h < Hq, is_k = !is_q && h < Hq + Hkv;
  float x[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    x[j] = i < D ? detail::load1(qkv, in_row + static_cast<int64_t>(h) * D + i, in_dt) : 0.0f;
  }
  if (!is_q && !is_k) {  // value head: straight into the cache
    if (slot < 0) return;
    const int64_t dst = (static_cast<int64_t>(slot) * Hkv + (h - Hq - Hkv)) * D;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (lane + 32 * j < D) detail::store1(v_cache, dst + lane + 32 * j, c_dt, x[j]);
    return;
  }
  if (!is_q && slot < 0) return;
  const DType out_dt = is_q ? q_dt : c_dt;
  const void* w = is_q ? q_norm : k_norm;
  if (w) detail::head_rms_norm(x, D, lane, w, is_q ? qn_dt : kn_dt, out_dt, eps);
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    if (lane + 32 * j < D) row[lane + 32 * j] = x[j];
  __syncwarp();
  void* out = is_q ? q_out : k_cache;
  const int64_t dst = is_q ? (t * Hq + h) * static_cast<int64_t>(D)
                           : (static_cast<int64_t>(slot) * Hkv + (h - Hq)) * static_cast<int64_t>(D);
#pragma unroll
  for (int j = 0; j < kPerLane / 2; ++j) {
    const int i = lane + 32 * j;
    if (i >= half) break;
    const float x0 = row[i], x1 = row[i + half];
    const float2 r = cos_sin ? cos_sin[t * half + i] : cs[j];
    const float2 rot = detail::rope_rotate(x0, x1, r);
    detail::store1(out, dst + i, out_dt, rot.x);
    detail::store1(out, dst + i + half, out_dt, rot.y);
  }
}

// The vector path: kSegs = D / 32 segments; a block's 256 threads are 64 (token, head) quads; the
// (cos, sin) pairs from the step's table. kNorm: a q or k norm given (a template parameter so that
// the case without, the usual prefill, holds few registers and many threads per SM).
template <int kSegs, bool kNorm>
__global__ void __launch_bounds__(kThreads)
    qkv_rope_cache_vec_kernel(void* q_out, DType q_dt, void* k_cache, void* v_cache, DType c_dt, const void* qkv,
                              DType in_dt, const int32_t* slots, const float2* cos_sin, const void* q_norm,
                              DType qn_dt, const void* k_norm, DType kn_dt, int64_t T, int Hq, int Hkv, float eps) {
  constexpr int D = kSegs * 32, kHalfSegs = kSegs / 2;
  hopper::launch_dependents();  // lets the attention kernel get scheduled under this one
  hopper::grid_dependency_wait();
  const int heads = Hq + 2 * Hkv;
  const int64_t quad = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 4;
  const int q4 = threadIdx.x % 4;
  // Every thread of a quad takes the same branches and whole quads leave together; the shuffles
  // below name the quad's lanes only.
  if (quad >= T * heads) return;
  const int64_t t = quad / heads;
  const int h = static_cast<int>(quad - t * heads);
  const bool is_q = h < Hq, is_k = !is_q && h < Hq + Hkv;
  const int slot = slots[t];
  if (!is_q && slot < 0) return;
  const int64_t in_row = (t * heads + h) * static_cast<int64_t>(D);
  float x[kSegs][8];
#pragma unroll
  for (int s = 0; s < kSegs; ++s) detail::load_vec<8>(qkv, in_row + 32 * s + 8 * q4, in_dt, x[s]);
  if (!is_q && !is_k) {  // value head: straight into the cache
    const int64_t dst = (static_cast<int64_t>(slot) * Hkv + (h - Hq - Hkv)) * D;
#pragma unroll
    for (int s = 0; s < kSegs; ++s) detail::store_vec<8>(v_cache, dst + 32 * s + 8 * q4, c_dt, x[s]);
    return;
  }
  const DType out_dt = is_q ? q_dt : c_dt;
  const void* w = is_q ? q_norm : k_norm;
  if (kNorm && w) {
    // head_rms_norm's arithmetic: lane 8 q + e's chain, then the butterfly 16, 8 (across the quad),
    // 4, 2, 1 (within the thread).
    const unsigned quad_mask = 0xfu << (threadIdx.x % 32 / 4 * 4);
    float ss[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      ss[e] = 0.0f;
#pragma unroll
      for (int s = 0; s < kSegs; ++s) ss[e] = __fmaf_rn(x[s][e], x[s][e], ss[e]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) ss[e] += __shfl_xor_sync(quad_mask, ss[e], 2);
#pragma unroll
    for (int e = 0; e < 8; ++e) ss[e] += __shfl_xor_sync(quad_mask, ss[e], 1);
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) {
      float next[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) next[e] = ss[e] + ss[e ^ o];
#pragma unroll
      for (int e = 0; e < 8; ++e) ss[e] = next[e];
    }
    const float inv_rms = 1.0f / sqrtf(ss[0] / static_cast<float>(D) + eps);
    const DType w_dt = is_q ? qn_dt : kn_dt;
#pragma unroll
    for (int s = 0; s < kSegs; ++s) {
      float wv[8];
      detail::load_vec<8>(w, 32 * s + 8 * q4, w_dt, wv);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[s][e] = detail::round_to(out_dt, __fmul_rn(__fmul_rn(x[s][e], inv_rms), wv[e]));
    }
  }
  void* out = is_q ? q_out : k_cache;
  const int64_t dst = is_q ? (t * Hq + h) * static_cast<int64_t>(D)
                           : (static_cast<int64_t>(slot) * Hkv + (h - Hq)) * static_cast<int64_t>(D);
#pragma unroll
  for (int s = 0; s < kHalfSegs; ++s) {
    const int i0 = 32 * s + 8 * q4;  // pairs i0 .. i0 + 7 with their partners D / 2 further
    float2 r[8];
    const float4* cs = reinterpret_cast<const float4*>(cos_sin + t * (D / 2) + i0);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float4 v = cs[k];
      r[2 * k] = make_float2(v.x, v.y);
      r[2 * k + 1] = make_float2(v.z, v.w);
    }
    float lo[8], hi[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float2 rot = detail::rope_rotate(x[s][e], x[s + kHalfSegs][e], r[e]);
      lo[e] = rot.x;
      hi[e] = rot.y;
    }
    detail::store_vec<8>(out, dst + i0, out_dt, lo);
    detail::store_vec<8>(out, dst + i0 + D / 2, out_dt, hi);
  }
}

}  // namespace

void qkv_rope_cache_write(CudaBackend& be, Tensor q_out, Tensor k_cache, Tensor v_cache, Tensor qkv, Tensor positions,
                          Tensor slots, Tensor inv_freq, float attention_scaling, Tensor q_norm, Tensor k_norm,
                          float eps, Tensor cos_sin) {
  detail::check_float(be, q_out);
  detail::check_float(be, qkv);
  detail::check_float(be, k_cache);
  detail::check_i32(be, positions);
  detail::check_i32(be, slots);
  KILN_ASSERT(q_out.ndim() == 3 && k_cache.ndim() == 3 && v_cache.shape == k_cache.shape && v_cache.dtype == k_cache.dtype);
  const int64_t T = q_out.size(0), Hq = q_out.size(1), D = q_out.size(2), Hkv = k_cache.size(1);
  KILN_ASSERT(qkv.ndim() == 2 && qkv.size(0) == T && qkv.size(1) == (Hq + 2 * Hkv) * D && k_cache.size(2) == D);
  KILN_ASSERT(D % 2 == 0 && D <= kMaxHeadDim && positions.numel() == T && slots.numel() == T);
  KILN_ASSERT(inv_freq.dtype == DType::f32 && inv_freq.numel() == D / 2);
  KILN_ASSERT(!q_norm.data || q_norm.numel() == D);
  KILN_ASSERT(!k_norm.data || k_norm.numel() == D);
  KILN_ASSERT(!cos_sin.data || (cos_sin.device == be.device() && cos_sin.numel() == T * D));
  if (T == 0) return;
  // The vector path only with the step's table (prefill steps, where it was measured): computing
  // eight (cos, sin) pairs a thread would lengthen the chain of a decode step's few tokens, where
  // packing more heads a warp cost 0.1 ms a step before.
  const bool vec = D % 64 == 0 && cos_sin.data && detail::aligned16(cos_sin.data) && detail::aligned16(qkv.data) &&
                   detail::aligned16(q_out.data) && detail::aligned16(k_cache.data) && detail::aligned16(v_cache.data) &&
                   (!q_norm.data || detail::aligned16(q_norm.data)) && (!k_norm.data || detail::aligned16(k_norm.data));
  if (vec) {
    const int64_t threads = T * (Hq + 2 * Hkv) * 4;
    const dim3 grid(static_cast<unsigned>(detail::ceil_div(threads, kThreads)));
    auto launch_with = [&](auto kernel) {
      detail::launch_programmatic(
          be, kernel, grid, dim3(kThreads), 0, 1, q_out.data, q_out.dtype, k_cache.data, v_cache.data, k_cache.dtype,
          qkv.data, qkv.dtype, slots.ptr<const int32_t>(), static_cast<const float2*>(cos_sin.data), q_norm.data,
          q_norm.dtype, k_norm.data, k_norm.dtype, T, static_cast<int>(Hq), static_cast<int>(Hkv), eps);
    };
    auto launch = [&]<int kSegs>() {
      if (q_norm.data || k_norm.data) return launch_with(qkv_rope_cache_vec_kernel<kSegs, true>);
      launch_with(qkv_rope_cache_vec_kernel<kSegs, false>);
    };
    switch (D) {
      case 64: return launch.template operator()<2>();
      case 128: return launch.template operator()<4>();
      case 192: return launch.template operator()<6>();
      default: return launch.template operator()<8>();  // 256 (D <= kMaxHeadDim)
    }
  }
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>((Hq + 2 * Hkv + kWarps - 1) / kWarps));
  detail::launch_programmatic(
      be, qkv_rope_cache_kernel, grid, dim3(kThreads), 0, 1, q_out.data, q_out.dtype, k_cache.data, v_cache.data, k_cache.dtype, qkv.data, qkv.dtype,
      positions.ptr<const int32_t>(), slots.ptr<const int32_t>(), inv_freq.ptr<const float>(), attention_scaling,
      static_cast<const float2*>(cos_sin.data), q_norm.data, q_norm.dtype, k_norm.data, k_norm.dtype,
      static_cast<int>(Hq), static_cast<int>(Hkv), static_cast<int>(D), eps);
}

}  // namespace kiln::cuda
