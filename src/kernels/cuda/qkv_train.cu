// The training attention-input stage, CUDA twins of kernels/cpu/backward.cpp's qkv_split_rope
// (math and shapes in kernels/train_ops.h). Activations f32, bf16 or f16, f32 arithmetic; the
// q/k norm weight gradients are f32 sums accumulated (+=) deterministically: per-block partial rows
// added in a fixed order by detail::column_sum_add (backward.cu).
//
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
  if (norms) partial = empty_for_op(be, Shape{blocks * 2 * D}, DType::f32);
  float* partial_ptr = norms ? partial.ptr<float>() : nullptr;
  qkv_split_rope_backward_kernel<<<static_cast<unsigned>(blocks), kQkvThreads, 0, detail::stream_of(be)>>>(
      d_qkv.data, d_qkv.dtype, dq.data, dq.dtype, dk.data, dk.dtype, dv.data, dv.dtype, qkv.data, qkv.dtype,
      positions.ptr<const int32_t>(), inv_freq.ptr<const float>(), attention_scaling, q_norm.data, q_norm.dtype,
      k_norm.data, k_norm.dtype, partial_ptr, sh.a, eps);
  KILN_CUDA_CHECK_LAUNCH();
  if (q_norm.data) detail::column_sum_add(be, dq_norm.ptr<float>(), partial_ptr, blocks, D, 2 * D);
  if (k_norm.data) detail::column_sum_add(be, dk_norm.ptr<float>(), partial_ptr + D, blocks, D, 2 * D);
}

}  // namespace kiln::cuda
