// Internal helpers of the CUDA kernels (not part of the op interface).
//   * Element access by runtime dtype: the float formats (f32, bf16, f16) are read and written as
//     f32 through a switch on a kernel argument. The branch is uniform across the grid, so it costs
//     a few instructions per access, and one instantiation per kernel serves every dtype combination
//     (keeps compile time down). Conversions to 16-bit formats round to nearest even, like
//     core/dtype.h.
//   * Vectors of 8 elements (one 16-byte load for bf16/f16, two for f32) at element offsets that are
//     multiples of 8 from a 16-byte-aligned base; kernels take N = 8 (vector) or N = 1 (scalar) as a
//     template argument and the host picks N = 8 when every row length and base pointer allows it.
//   * Warp / block reductions (every thread receives the result).
//   * Launch helpers: the backend's stream, grid sizes for grid-stride loops.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "backend/cuda_backend.h"
#include "core/tensor.h"

namespace kiln::cuda::detail {

// ---------------------------------------------------------------------------------------------
// Host side

inline cudaStream_t stream_of(const CudaBackend& be) { return static_cast<cudaStream_t>(be.stream()); }

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Float tensor on the backend's device.
inline void check_float(const CudaBackend& be, const Tensor& t) {
  KILN_ASSERT(dtype_is_float(t.dtype));
  KILN_ASSERT(t.numel() == 0 || (t.data != nullptr && t.device == be.device()));
}
inline void check_i32(const CudaBackend& be, const Tensor& t) {
  KILN_ASSERT(t.dtype == DType::i32);
  KILN_ASSERT(t.numel() == 0 || (t.data != nullptr && t.device == be.device()));
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks for a grid-stride loop over `work` items with `threads` threads per block: enough to fill
// the GPU several times over, never more than the work needs.
inline unsigned grid_for(const CudaBackend& be, int64_t work, int threads) {
  const int64_t cap = static_cast<int64_t>(std::max(1, be.multiprocessor_count())) * 16;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(ceil_div(work, threads), cap)));
}

// ---------------------------------------------------------------------------------------------
// Device side: element access

__device__ __forceinline__ float load1(const void* p, int64_t i, DType dt) {
  switch (dt) {
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::f16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store1(void* p, int64_t i, DType dt, float v) {
  switch (dt) {
    case DType::bf16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    case DType::f16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

// Rotary (cos, sin) * scaling for one position and frequency, the arithmetic every rope kernel
// shares with the CPU twin: an f32 angle product, cos/sin in double rounded to f32, f32 scaling.
__device__ __forceinline__ float2 rope_cos_sin(float pos, float inv_freq, float scaling) {
  const float angle = __fmul_rn(pos, inv_freq);
  double s, c;
  sincos(static_cast<double>(angle), &s, &c);
  return make_float2(__fmul_rn(static_cast<float>(c), scaling), __fmul_rn(static_cast<float>(s), scaling));
}

// The rotation of the pair (x0, x1) = (x[i], x[i + D/2]) by cs = rope_cos_sin(...): (x0 c - x1 s,
// x1 c + x0 s), each product and sum rounded in f32 (no fused multiply-add), as the CPU twin does.
__device__ __forceinline__ float2 rope_rotate(float x0, float x1, float2 cs) {
  return make_float2(__fsub_rn(__fmul_rn(x0, cs.x), __fmul_rn(x1, cs.y)),
                     __fadd_rn(__fmul_rn(x1, cs.x), __fmul_rn(x0, cs.y)));
}

// v rounded to dt's precision (identity for f32).
__device__ __forceinline__ float round_to(DType dt, float v) {
  switch (dt) {
    case DType::bf16: return __bfloat162float(__float2bfloat16_rn(v));
    case DType::f16: return __half2float(__float2half_rn(v));
    default: return v;
  }
}

// The per-head RMSNorm of the attention input stage (q/k norms, Qwen3), one warp per head row, with
// the arithmetic of rmsnorm_forward: lane l holds elements l + 32 j of the row in x[j] (zeros past
// D); x becomes round_to(out_dt, (x * inv_rms) * w), inv_rms = 1 / sqrt(mean(x^2) + eps). Shared by
// qkv_rope_cache_write and the decode attention kernel that takes the projection's rows, so that
// the two write the same bits.
template <int P>
__device__ __forceinline__ void head_rms_norm(float (&x)[P], int D, int lane, const void* w, DType w_dt, DType out_dt,
                                              float eps) {
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < P; ++j) ss = __fmaf_rn(x[j], x[j], ss);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float inv_rms = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int i = lane + 32 * j;
    if (i < D) x[j] = round_to(out_dt, __fmul_rn(__fmul_rn(x[j], inv_rms), load1(w, i, w_dt)));
  }
}

// Eight bf16 values in one 16-byte word, to and from floats (round to nearest even).
__device__ __forceinline__ void unpack_bf16x8(const uint4& u, float (&v)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(h[k]);
    v[2 * k] = f.x;
    v[2 * k + 1] = f.y;
  }
}
// The dot product of eight bf16 weights (one 16-byte word) with eight f32 values (x: 16-byte
// aligned), summed in order by fused multiply-adds (the decode-step kernel and its probe).
__device__ __forceinline__ float dot_bf16x8_f32(const uint4& w, const float* x) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&w);
  const float4 a = *reinterpret_cast<const float4*>(x), b = *reinterpret_cast<const float4*>(x + 4);
  const float2 w0 = __bfloat1622float2(p[0]), w1 = __bfloat1622float2(p[1]), w2 = __bfloat1622float2(p[2]),
               w3 = __bfloat1622float2(p[3]);
  float s = w0.x * a.x;
  s = fmaf(w0.y, a.y, s);
  s = fmaf(w1.x, a.z, s);
  s = fmaf(w1.y, a.w, s);
  s = fmaf(w2.x, b.x, s);
  s = fmaf(w2.y, b.y, s);
  s = fmaf(w3.x, b.z, s);
  return fmaf(w3.y, b.w, s);
}
__device__ __forceinline__ uint4 pack_bf16x8(const float* v) {
  uint4 u;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
  return u;
}

// v[0..N) = p[i .. i+N). N == 8 requires i % 8 == 0 and a 16-byte-aligned p.
template <int N>
__device__ __forceinline__ void load_vec(const void* p, int64_t i, DType dt, float (&v)[N]) {
  if constexpr (N == 8) {
    switch (dt) {
      case DType::bf16:
        unpack_bf16x8(*reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p) + i), v);
        break;
      case DType::f16: {
        const uint4 u = *reinterpret_cast<const uint4*>(static_cast<const __half*>(p) + i);
        const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 f = __half22float2(h[k]);
          v[2 * k] = f.x;
          v[2 * k + 1] = f.y;
        }
        break;
      }
      default: {
        const float4* q = reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
        const float4 a = q[0], b = q[1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        break;
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = load1(p, i + k, dt);
  }
}

// p[i .. i+N) = v[0..N) rounded to dt. Same alignment rules as load_vec.
template <int N>
__device__ __forceinline__ void store_vec(void* p, int64_t i, DType dt, const float (&v)[N]) {
  if constexpr (N == 8) {
    switch (dt) {
      case DType::bf16:
        *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p) + i) = pack_bf16x8(v);
        break;
      case DType::f16: {
        uint4 u;
        __half2* h = reinterpret_cast<__half2*>(&u);
#pragma unroll
        for (int k = 0; k < 4; ++k) h[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
        *reinterpret_cast<uint4*>(static_cast<__half*>(p) + i) = u;
        break;
      }
      default: {
        float4* q = reinterpret_cast<float4*>(static_cast<float*>(p) + i);
        q[0] = make_float4(v[0], v[1], v[2], v[3]);
        q[1] = make_float4(v[4], v[5], v[6], v[7]);
        break;
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) store1(p, i + k, dt, v[k]);
  }
}

// ---------------------------------------------------------------------------------------------
// Device side: reductions

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Reduction over the kThreads threads of a block (kThreads a multiple of 32, at most 1024); every
// thread gets the result. `smem` holds 32 values and may be reused by the next call.
template <int kThreads, typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T identity, T* smem) {
  v = warp_reduce(v, op);
  if constexpr (kThreads == 32) {
    return v;
  } else {
    constexpr int kWarps = kThreads / 32;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // earlier readers of smem are done
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = lane < kWarps ? smem[lane] : identity;
    return warp_reduce(v, op);
  }
}

}  // namespace kiln::cuda::detail

// Checks the last launch (configuration errors); asynchronous faults surface at synchronize().
#define KILN_CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
