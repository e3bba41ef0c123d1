// The small-batch linear layers for one batch row (a single request's decode step) with one warp per
// weight row (fused_linear.cuh):
// y^T = W x^T, where each warp reads whole weight rows in 512-byte runs (lane l the 16-byte chunks
// l, l + 32, ...), dots them with the batch row staged in shared memory, and sums over its lanes by
// shuffles: no tiles, no shared-memory reduction across warps, no block barrier after the staging.
// Measured against the tensor-core kernel in docs/perf-notes.md ("One row on a warp-per-row kernel").
//
// Work: row groups of R weight rows that one epilogue needs together (store / add_residual: one row;
// SwiGLU: the gate row and its up row; q/k/v with rotary: a dimension and its rotation partner D / 2
// further), each cut into passes of CHP chunks per lane (R * CHP = 8: eight 16-byte loads a lane per
// unit); a warp walks its units (its groups strided over the grid, pass by pass) with two units'
// loads in flight in registers; the first two are issued before the programmatic wait. The grid is
// at most two blocks per SM, sized so that every warp has the same number of groups.
//
// Greedy head (ArgmaxOut): the store epilogue of a vocabulary head also keeps, in lane 0 of each
// warp, the largest key (argmax_key) of its logits; the block's largest goes to one 64-bit word by
// atomicMax (the order of arrivals cannot change a maximum), and the block that arrives last (a
// ticket counter) writes the token and zeroes the word and the counter for the next call.
//
// Staging: after the wait every block copies the batch row into shared memory as bf16, a normed row as
// round(x * norm_w) with its sum of squares reduced over the block (the 1 / rms scale is applied to
// the sums, as fused_linear.cu does). Sums are f32 in a fixed order: deterministic, so a replayed graph
// is bit-exact with eager execution.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/fused_linear.cuh"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/mma_util.cuh"
#include "kernels/cuda/programmatic_launch.cuh"
#include "kernels/sampling_math.h"

namespace kiln::cuda::fused {
namespace {

using T = __nv_bfloat16;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int64_t kMaxStageBytes = 40 * 1024;  // under the 48 KB a block has without opting in

__device__ __forceinline__ float dot8(const uint4& w, const uint4& x, float acc) {
  const __nv_bfloat162* a = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&x);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __bfloat1622float2(a[i]), fb = __bfloat1622float2(b[i]);
    acc = fmaf(fa.x, fb.x, acc);
    acc = fmaf(fa.y, fb.y, acc);
  }
  return acc;
}

template <Epilogue kEpi>
constexpr int rows_per_group() {
  return kEpi == Epilogue::swiglu || kEpi == Epilogue::qkv_rope ? 2 : 1;
}

// Weight row r of group g (N rows in all).
template <Epilogue kEpi>
__device__ __forceinline__ int group_row(int g, int r, int N, int D) {
  if constexpr (kEpi == Epilogue::swiglu) return r * (N / 2) + g;
  if constexpr (kEpi == Epilogue::qkv_rope) return (g / (D / 2)) * D + g % (D / 2) + r * (D / 2);
  return g;
}

template <bool kNorm, Epilogue kEpi, bool kArgmax>
__global__ void __launch_bounds__(kThreads, 2) rows_kernel(LinearArgs a, RopeOut rope, ArgmaxOut am) {
  constexpr int R = rows_per_group<kEpi>();
  constexpr int CHP = 8 / R;
  extern __shared__ uint4 xs[];  // [K / 8] bf16 chunks of the batch row
  __shared__ float ss_part[kWarps];

  hopper::launch_dependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int K = a.K, K8 = K / 8, N = a.N;
  const T* w = static_cast<const T*>(a.w);
  const int groups = R == 2 ? N / 2 : N;
  const int passes = (K8 + 32 * CHP - 1) / (32 * CHP);
  const int nwarps = gridDim.x * kWarps, first = blockIdx.x * kWarps + warp;
  const int my_groups = first < groups ? (groups - first + nwarps - 1) / nwarps : 0;
  const int units = my_groups * passes;

  auto load = [&](uint4 (&buf)[R][CHP], int u) {
    const int g = first + (u / passes) * nwarps, p = u % passes;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const T* row = w + static_cast<int64_t>(group_row<kEpi>(g, r, N, rope.D)) * K;
#pragma unroll
      for (int c = 0; c < CHP; ++c) {
        const int chunk = (p * CHP + c) * 32 + lane;
        buf[r][c] = chunk < K8 ? ldg_stream(row + static_cast<int64_t>(chunk) * 8) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  uint4 b0[R][CHP], b1[R][CHP];
  if (units > 0) load(b0, 0);
  if (units > 1) load(b1, 1);
  // q/k/v: the target of the warp's first pair, found before the wait (rope_target); later pairs
  // of the warp (more pairs than warps) find theirs in the epilogue.
  RopeTarget first_target;
  if constexpr (kEpi == Epilogue::qkv_rope)
    if (lane == 0 && my_groups > 0) first_target = rope_target(rope, 0, group_row<kEpi>(first, 0, N, rope.D));
  hopper::grid_dependency_wait();

  // The batch row into shared memory (and its sum of squares when normed).
  float ss = 0.0f;
  for (int ch = threadIdx.x; ch < K8; ch += kThreads) {
    if constexpr (kNorm) {
      const float4* px = reinterpret_cast<const float4*>(static_cast<const float*>(a.x) + ch * 8);
      const float4 x0 = px[0], x1 = px[1];
      const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      float nv[8];
      detail::unpack_bf16x8(*reinterpret_cast<const uint4*>(static_cast<const T*>(a.norm_w) + ch * 8), nv);
      float prod[8];
#pragma unroll
      for (int e = 0; e < 8; e += 2) ss += xv[e] * xv[e] + xv[e + 1] * xv[e + 1];
#pragma unroll
      for (int e = 0; e < 8; ++e) prod[e] = xv[e] * nv[e];
      xs[ch] = detail::pack_bf16x8(prod);
    } else {
      xs[ch] = reinterpret_cast<const uint4*>(a.x)[ch];
    }
  }
  if constexpr (kNorm) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) ss_part[warp] = ss;
  }
  __syncthreads();
  float scale = 1.0f;
  if constexpr (kNorm) {
    float v = 0.0f;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) v += ss_part[wi];
    scale = 1.0f / sqrtf(v / static_cast<float>(K) + a.eps);
  }

  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  unsigned long long best = 0;  // kArgmax: lane 0's largest argmax_key (0: none yet)

  // One group's outputs, once its last pass is summed.
  auto finish = [&](int g) {
    float v[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float s = acc[r];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      v[r] = s * scale;
      acc[r] = 0.0f;
    }
    if (lane != 0) return;
    if constexpr (kEpi == Epilogue::qkv_rope) {
      const int f0 = group_row<kEpi>(g, 0, N, rope.D);
      store_qkv_rope(rope, g == first ? first_target : rope_target(rope, 0, f0), 0, f0, v[0], v[1], a.bias, a.b_dt);
    } else {
      const int out_rows = kEpi == Epilogue::swiglu ? N / 2 : N;
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (a.bias) v[r] += detail::load1(a.bias, r * out_rows + g, a.b_dt);
      if constexpr (kEpi == Epilogue::store) {
        detail::store1(a.y, g, a.y_dt, v[0]);
        if constexpr (kArgmax) best = max(best, argmax_key(detail::round_to(a.y_dt, v[0]), g));
      } else if constexpr (kEpi == Epilogue::add_residual) {
        float* res = static_cast<float*>(a.y) + g;
        *res = *res + v[0];
      } else {
        detail::store1(a.y, g, a.y_dt, v[0] / (1.0f + expf(-v[0])) * v[R - 1]);
      }
    }
  };
  auto compute = [&](const uint4 (&buf)[R][CHP], int u) {
    const int p = u % passes;
#pragma unroll
    for (int c = 0; c < CHP; ++c) {
      const int chunk = (p * CHP + c) * 32 + lane;
      // Past the row the weights were loaded as zeros: a zero batch chunk instead of leaving the loop
      // (H100, bench_linear --rows 1, us a layer: gate/up 15.1 against 15.7, down 9.45 against 9.65,
      // o 2.84 against 2.74; the step 3% faster; docs/perf-notes.md, sixteenth session).
      const uint4 xv = chunk < K8 ? xs[chunk] : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = dot8(buf[r][c], xv, acc[r]);
    }
    if (p == passes - 1) finish(first + (u / passes) * nwarps);
  };
  for (int u = 0; u < units; u += 2) {
    compute(b0, u);
    if (u + 2 < units) load(b0, u + 2);
    if (u + 1 >= units) break;
    compute(b1, u + 1);
    if (u + 3 < units) load(b1, u + 3);
  }
  if constexpr (kArgmax) {
    __shared__ unsigned long long warp_best[kWarps];
    if (lane == 0) warp_best[warp] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
#pragma unroll
      for (int wi = 0; wi < kWarps; ++wi) best = max(best, warp_best[wi]);
      atomicMax(am.best, best);
      __threadfence();  // the maximum lands before the ticket
      if (atomicAdd(am.arrived, 1u) == gridDim.x - 1) {
        __threadfence();
        const unsigned long long key = atomicExch(am.best, 0ull);
        *am.arrived = 0;
        *am.token = fused::argmax_token(key);
      }
    }
  }
}

template <bool kNorm, Epilogue kEpi, bool kArgmax = false>
void launch_rows(CudaBackend& be, const LinearArgs& a, const RopeOut& rope, const ArgmaxOut& am = {}) {
  constexpr int R = rows_per_group<kEpi>();
  const int groups = R == 2 ? a.N / 2 : a.N;
  // Groups per warp: as few as two blocks per SM allow, and the same count for every warp.
  const int64_t per_warp = detail::ceil_div(groups, 2LL * kWarps * be.multiprocessor_count());
  const int blocks = static_cast<int>(detail::ceil_div(groups, kWarps * per_warp));
  const size_t smem = static_cast<size_t>(a.K) * sizeof(T);
  detail::launch_programmatic(be, rows_kernel<kNorm, kEpi, kArgmax>,
                              dim3(static_cast<unsigned>(std::max(blocks, 1))), dim3(kThreads), smem, dim3(1), a,
                              rope, am);
}

}  // namespace

bool rows_kernel_valid(int64_t M, int64_t K) { return M == 1 && K > 0 && K % 8 == 0 && K * 2 <= kMaxStageBytes; }

void rows_kernel_launch(CudaBackend& be, Epilogue epi, bool norm, const LinearArgs& a, const RopeOut& rope) {
  KILN_ASSERT(rows_kernel_valid(a.M, a.K));
  if (a.N == 0) return;
  switch (epi) {
    case Epilogue::store:
      return norm ? launch_rows<true, Epilogue::store>(be, a, rope) : launch_rows<false, Epilogue::store>(be, a, rope);
    case Epilogue::add_residual:
      return norm ? launch_rows<true, Epilogue::add_residual>(be, a, rope)
                  : launch_rows<false, Epilogue::add_residual>(be, a, rope);
    case Epilogue::swiglu:
      return norm ? launch_rows<true, Epilogue::swiglu>(be, a, rope) : launch_rows<false, Epilogue::swiglu>(be, a, rope);
    case Epilogue::qkv_rope: KILN_ASSERT(norm); return launch_rows<true, Epilogue::qkv_rope>(be, a, rope);
  }
}

void rows_kernel_argmax_launch(CudaBackend& be, const LinearArgs& a, const ArgmaxOut& am) {
  KILN_ASSERT(rows_kernel_valid(a.M, a.K) && a.N > 0 && am.token && am.best && am.arrived);
  launch_rows<true, Epilogue::store, true>(be, a, {}, am);
}

}  // namespace kiln::cuda::fused
