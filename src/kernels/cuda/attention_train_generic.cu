// The generic kernels of the CUDA training attention (the design is described at the top of
// attention_train.cu): f32 / f16 / bf16, any even D <= 256, unaligned tensors, and every call on a
// device without wgmma. One warp per query row (forward; dq) or per key row (dk, dv), online
// softmax over keys one at a time, f32 math. Slow; for correctness (the CPU twin is the f32
// reference). The backward's prep kernel (lse2, delta) is in attention_train.cu.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_train_internal.h"
#include "kernels/cuda/kernel_util.cuh"

namespace kiln::cuda::attn_train {
namespace {

constexpr float kLn2 = 0.6931471805599453f;

// ------------------------------------------------------------------------------------------------
// Generic kernels: any even D <= 256 (up to 4 pairs of dims per lane), f32/bf16/f16, f32 math.

constexpr int kGenericThreads = 128;
constexpr int kGenericWarps = kGenericThreads / 32;

template <typename T>
__device__ __forceinline__ void load_row(float2 (&x)[kMaxPairs], const T* row, int pairs, int lane) {
#pragma unroll
  for (int kq = 0; kq < kMaxPairs; ++kq) {
    const int pi = lane + 32 * kq;
    x[kq] = pi < pairs ? load2(row + 2 * pi) : make_float2(0.f, 0.f);
  }
}
__device__ __forceinline__ float warp_dot(const float2 (&a)[kMaxPairs], const float2 (&b)[kMaxPairs]) {
  float s = 0.0f;
#pragma unroll
  for (int kq = 0; kq < kMaxPairs; ++kq) s = fmaf(a[kq].x, b[kq].x, fmaf(a[kq].y, b[kq].y, s));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  return s;
}

// One warp per query row (b, h, i).
template <typename T>
__global__ void __launch_bounds__(kGenericThreads)
    attn_train_fwd_generic_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
                                  const T* __restrict__ k, const T* __restrict__ v, const int* __restrict__ seg, int B,
                                  int Hq, int Hkv, int S, int D, int causal, float sl) {
  const int lane = threadIdx.x & 31;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kGenericWarps + (threadIdx.x >> 5);
  if (p >= static_cast<int64_t>(B) * Hq * S) return;
  const int i = static_cast<int>(p % S);
  const int64_t bh = p / S;
  const int h = static_cast<int>(bh % Hq);
  const int b = static_cast<int>(bh / Hq);
  const int kvh = h / (Hq / Hkv);
  const int pairs = D / 2;
  const int sq = seg ? seg[static_cast<int64_t>(b) * S + i] : 0;
  const int n_keys = (seg && sq < 0) ? 0 : (causal ? i + 1 : S);

  float2 qv[kMaxPairs], acc[kMaxPairs];
  load_row(qv, q + p * D, pairs, lane);
#pragma unroll
  for (int kq = 0; kq < kMaxPairs; ++kq) acc[kq] = make_float2(0.f, 0.f);
  float m = -INFINITY, l = 0.0f;
  const T* kb = k + static_cast<int64_t>(b * Hkv + kvh) * S * D;
  const T* vb = v + static_cast<int64_t>(b * Hkv + kvh) * S * D;
  for (int j = 0; j < n_keys; ++j) {
    if (seg && seg[static_cast<int64_t>(b) * S + j] != sq) continue;
    float2 kv[kMaxPairs];
    load_row(kv, kb + static_cast<int64_t>(j) * D, pairs, lane);
    const float s = warp_dot(qv, kv) * sl;
    const float m_new = fmaxf(m, s);
    const float alpha = exp2f(m - m_new);
    const float pj = exp2f(s - m_new);
    l = l * alpha + pj;
    m = m_new;
    load_row(kv, vb + static_cast<int64_t>(j) * D, pairs, lane);
#pragma unroll
    for (int kq = 0; kq < kMaxPairs; ++kq) {
      acc[kq].x = fmaf(pj, kv[kq].x, acc[kq].x * alpha);
      acc[kq].y = fmaf(pj, kv[kq].y, acc[kq].y * alpha);
    }
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  T* orow = out + ((static_cast<int64_t>(b) * S + i) * Hq + h) * D;
#pragma unroll
  for (int kq = 0; kq < kMaxPairs; ++kq) {
    const int pi = lane + 32 * kq;
    if (pi < pairs) store2(orow + 2 * pi, acc[kq].x * inv, acc[kq].y * inv);
  }
  if (lane == 0) lse[p] = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
}

// dq: one warp per query row (b, h, i).
template <typename T>
__global__ void __launch_bounds__(kGenericThreads)
    attn_train_bwd_dq_generic_kernel(T* __restrict__ dq, const T* __restrict__ q, const T* __restrict__ k,
                                     const T* __restrict__ v, const T* __restrict__ dout,
                                     const float* __restrict__ lse2, const float* __restrict__ delta,
                                     const int* __restrict__ seg, int B, int Hq, int Hkv, int S, int S_pad, int D,
                                     int causal, float sl, float scale) {
  const int lane = threadIdx.x & 31;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kGenericWarps + (threadIdx.x >> 5);
  if (p >= static_cast<int64_t>(B) * Hq * S) return;
  const int i = static_cast<int>(p % S);
  const int64_t bh = p / S;
  const int h = static_cast<int>(bh % Hq);
  const int b = static_cast<int>(bh / Hq);
  const int kvh = h / (Hq / Hkv);
  const int pairs = D / 2;
  const float L2 = lse2[bh * S_pad + i];
  const float dl = delta[bh * S_pad + i];
  const int sq = seg ? seg[static_cast<int64_t>(b) * S + i] : 0;
  const int n_keys = L2 == INFINITY ? 0 : (causal ? i + 1 : S);

  float2 qv[kMaxPairs], dov[kMaxPairs], acc[kMaxPairs];
  load_row(qv, q + p * D, pairs, lane);
  load_row(dov, dout + ((static_cast<int64_t>(b) * S + i) * Hq + h) * D, pairs, lane);
#pragma unroll
  for (int kq = 0; kq < kMaxPairs; ++kq) acc[kq] = make_float2(0.f, 0.f);
  const T* kb = k + static_cast<int64_t>(b * Hkv + kvh) * S * D;
  const T* vb = v + static_cast<int64_t>(b * Hkv + kvh) * S * D;
  for (int j = 0; j < n_keys; ++j) {
    if (seg && seg[static_cast<int64_t>(b) * S + j] != sq) continue;
    float2 kv[kMaxPairs], vv[kMaxPairs];
    load_row(kv, kb + static_cast<int64_t>(j) * D, pairs, lane);
    load_row(vv, vb + static_cast<int64_t>(j) * D, pairs, lane);
    const float pj = exp2f(warp_dot(qv, kv) * sl - L2);
    const float ds = pj * (warp_dot(dov, vv) - dl);
#pragma unroll
    for (int kq = 0; kq < kMaxPairs; ++kq) {
      acc[kq].x = fmaf(ds, kv[kq].x, acc[kq].x);
      acc[kq].y = fmaf(ds, kv[kq].y, acc[kq].y);
    }
  }
  T* dst = dq + p * D;
#pragma unroll
  for (int kq = 0; kq < kMaxPairs; ++kq) {
    const int pi = lane + 32 * kq;
    if (pi < pairs) store2(dst + 2 * pi, acc[kq].x * scale, acc[kq].y * scale);
  }
}

// dk, dv: one warp per key row (b, kvh, j), summing over the G query heads and the queries that see it.
template <typename T>
__global__ void __launch_bounds__(kGenericThreads)
    attn_train_bwd_dkdv_generic_kernel(T* __restrict__ dk, T* __restrict__ dv, const T* __restrict__ q,
                                       const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
                                       const float* __restrict__ lse2, const float* __restrict__ delta,
                                       const int* __restrict__ seg, int B, int Hq, int Hkv, int S, int S_pad, int D,
                                       int causal, float sl, float scale) {
  const int lane = threadIdx.x & 31;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kGenericWarps + (threadIdx.x >> 5);
  if (p >= static_cast<int64_t>(B) * Hkv * S) return;
  const int j = static_cast<int>(p % S);
  const int64_t bk = p / S;
  const int kvh = static_cast<int>(bk % Hkv);
  const int b = static_cast<int>(bk / Hkv);
  const int G = Hq / Hkv;
  const int pairs = D / 2;
  const int sk = seg ? seg[static_cast<int64_t>(b) * S + j] : 0;

  float2 kv[kMaxPairs], vv[kMaxPairs], dka[kMaxPairs], dva[kMaxPairs];
  load_row(kv, k + p * D, pairs, lane);
  load_row(vv, v + p * D, pairs, lane);
#pragma unroll
  for (int kq = 0; kq < kMaxPairs; ++kq) dka[kq] = dva[kq] = make_float2(0.f, 0.f);
  if (!seg || sk >= 0) {
    for (int hi = 0; hi < G; ++hi) {
      const int h = kvh * G + hi;
      const int64_t bh = static_cast<int64_t>(b) * Hq + h;
      for (int i = causal ? j : 0; i < S; ++i) {
        if (seg && seg[static_cast<int64_t>(b) * S + i] != sk) continue;
        const float L2 = lse2[bh * S_pad + i];
        if (L2 == INFINITY) continue;
        float2 qv[kMaxPairs], dov[kMaxPairs];
        load_row(qv, q + (bh * S + i) * D, pairs, lane);
        load_row(dov, dout + ((static_cast<int64_t>(b) * S + i) * Hq + h) * D, pairs, lane);
        const float pij = exp2f(warp_dot(qv, kv) * sl - L2);
        const float ds = pij * (warp_dot(dov, vv) - delta[bh * S_pad + i]);
#pragma unroll
        for (int kq = 0; kq < kMaxPairs; ++kq) {
          dka[kq].x = fmaf(ds, qv[kq].x, dka[kq].x);
          dka[kq].y = fmaf(ds, qv[kq].y, dka[kq].y);
          dva[kq].x = fmaf(pij, dov[kq].x, dva[kq].x);
          dva[kq].y = fmaf(pij, dov[kq].y, dva[kq].y);
        }
      }
    }
  }
#pragma unroll
  for (int kq = 0; kq < kMaxPairs; ++kq) {
    const int pi = lane + 32 * kq;
    if (pi < pairs) {
      store2(dk + p * D + 2 * pi, dka[kq].x * scale, dka[kq].y * scale);
      store2(dv + p * D + 2 * pi, dva[kq].x, dva[kq].y);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Launchers, one instance per dtype.

template <typename T>
void fwd_generic(CudaBackend& be, const Geometry& g, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v,
                 const int* seg, bool causal, float sl) {
  const int64_t rows = static_cast<int64_t>(g.B) * g.Hq * g.S;
  const unsigned blocks = static_cast<unsigned>((rows + kGenericWarps - 1) / kGenericWarps);
  attn_train_fwd_generic_kernel<T><<<blocks, kGenericThreads, 0, detail::stream_of(be)>>>(
      out.ptr<T>(), lse.ptr<float>(), q.ptr<const T>(), k.ptr<const T>(), v.ptr<const T>(), seg, g.B, g.Hq, g.Hkv, g.S,
      g.D, causal ? 1 : 0, sl);
  KILN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void bwd_generic(CudaBackend& be, const Geometry& g, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q,
                 Tensor k, Tensor v, const float* lse2, const float* delta, const int* seg, int S_pad,
                 bool causal, float sl, float scale) {
  cudaStream_t stream = detail::stream_of(be);
  const int64_t q_rows = static_cast<int64_t>(g.B) * g.Hq * g.S;
  attn_train_bwd_dq_generic_kernel<T><<<static_cast<unsigned>((q_rows + kGenericWarps - 1) / kGenericWarps),
                                        kGenericThreads, 0, stream>>>(
      dq.ptr<T>(), q.ptr<const T>(), k.ptr<const T>(), v.ptr<const T>(), dout.ptr<const T>(), lse2, delta, seg, g.B,
      g.Hq, g.Hkv, g.S, S_pad, g.D, causal ? 1 : 0, sl, scale);
  KILN_CUDA_CHECK_LAUNCH();
  const int64_t k_rows = static_cast<int64_t>(g.B) * g.Hkv * g.S;
  attn_train_bwd_dkdv_generic_kernel<T><<<static_cast<unsigned>((k_rows + kGenericWarps - 1) / kGenericWarps),
                                          kGenericThreads, 0, stream>>>(
      dk.ptr<T>(), dv.ptr<T>(), q.ptr<const T>(), k.ptr<const T>(), v.ptr<const T>(), dout.ptr<const T>(), lse2, delta,
      seg, g.B, g.Hq, g.Hkv, g.S, S_pad, g.D, causal ? 1 : 0, sl, scale);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_fwd_generic(CudaBackend& be, const Geometry& g, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v,
                        const int* seg, bool causal, float sl) {
  switch (q.dtype) {
    case DType::f32: return fwd_generic<float>(be, g, out, lse, q, k, v, seg, causal, sl);
    case DType::bf16: return fwd_generic<bf16>(be, g, out, lse, q, k, v, seg, causal, sl);
    case DType::f16: return fwd_generic<__half>(be, g, out, lse, q, k, v, seg, causal, sl);
    default: KILN_ASSERT(false && "attention_train_forward: float tensors only");
  }
}

void launch_bwd_generic(CudaBackend& be, const Geometry& g, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q,
                        Tensor k, Tensor v, const float* lse2, const float* delta, const int* seg, int S_pad,
                        bool causal, float sl, float scale) {
  switch (q.dtype) {
    case DType::f32:
      return bwd_generic<float>(be, g, dq, dk, dv, dout, q, k, v, lse2, delta, seg, S_pad, causal, sl, scale);
    case DType::bf16:
      return bwd_generic<bf16>(be, g, dq, dk, dv, dout, q, k, v, lse2, delta, seg, S_pad, causal, sl, scale);
    case DType::f16:
      return bwd_generic<__half>(be, g, dq, dk, dv, dout, q, k, v, lse2, delta, seg, S_pad, causal, sl, scale);
    default: KILN_ASSERT(false && "attention_train_backward: float tensors only");
  }
}

}  // namespace kiln::cuda::attn_train
