// The decode-step kernel's parameters and the device parts it shares with no other kernel beside its
// weight ops (decode_step_kernel.cu, which describes the kernel): the page shapes, the layer table,
// the consumers' barrier and sums, and the attention and merge steps. Internal to that file (device
// code; no state).
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/mma_util.cuh"
#include "kernels/decode_step_layout.h"
#include "kernels/paged_kv.h"

namespace kiln::cuda::decode_step {

using T = __nv_bfloat16;

constexpr int kConsumers = 384;  // 12 consumer warps
constexpr int kConsumerWarps = kConsumers / 32;
constexpr int kPageElems = 3072;  // 6 KB pages
// A page: kRows weight rows of kCols columns, one 16-byte vector a consumer thread (row t /
// kThreadsPerRow, columns 8 (t % kThreadsPerRow)..). 768 columns (4 rows) where every width is a
// multiple of 768 (astrai-1b), else 512 (6 rows: llama-1b).
template <int PC>
struct Pages {
  static constexpr int kCols = PC, kThreadsPerRow = PC / 8, kRows = kConsumers / kThreadsPerRow;
  static constexpr int kWarpsPerRow = kThreadsPerRow / 32;
  static_assert(kRows * kCols == kPageElems && kThreadsPerRow % 32 == 0 && kRows % 2 == 0, "page shape");
};
constexpr int kThreads = kConsumers + 32;  // and the producer warp
constexpr int kMaxRingPages = 36;          // 216 KB
constexpr int kUnitBatch = 4;              // units whose rows are summed together (one barrier)
constexpr int kMaxGroup = 8;               // query heads per KV head
constexpr int kMaxLayers = 96;
constexpr int kNormChunks = 2;             // hidden sizes up to 2 x 4 x kConsumers (3072) a norm stages

using decode_layout::kAttn;
using decode_layout::kDown;
using decode_layout::kGateUp;
using decode_layout::kHead;
using decode_layout::kMerge;
using decode_layout::kO;
using decode_layout::kQkv;
using decode_layout::kSteps;
using decode_layout::unit_begin;

struct Layer {
  const T *input_norm, *qkv, *o, *post_norm, *gate_up, *down;
  T *k_cache, *v_cache;
};

// The kernel's parameters (by value: the layer table rides in the parameter space).
struct Params {
  Layer layers[kMaxLayers];
  int L, H, Hq, Hkv, D, I, V, splits, xs_floats, ring_pages;
  const T *embed, *final_norm, *head;
  const int32_t *ids, *positions, *slots, *page_indptr, *page_indices, *last_page_len;
  int32_t page_size;
  const float* inv_freq;
  float rope_scaling, eps, attn_scale;
  float* x;        // [H] the residual stream
  T* q;            // [Hq * D] rotated queries
  T* attn;         // [Hq * D] attention output
  T* act;          // [I] SwiGLU output
  float* part;     // [splits][Hq][D] the splits' unnormalised outputs
  float* part_ml;  // [splits][Hq][2] their (max, sum), log2 domain
  float* logits;   // [V]
  int32_t* token;  // the greedy token, or null
  unsigned long long* best;  // the argmax word (zero between launches)
  unsigned* counters;        // [L * kSteps + 1]: steps done (blocks), then the ticket
  unsigned long long* trace; // null, or [grid][L * kSteps + 1][2] (ops.h: DecodeStepArgs::trace)
};

__device__ __forceinline__ void consumer_sync() { hopper::named_sync(1, kConsumers); }

__device__ __forceinline__ float bf16r(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// The sum of v over the consumer threads, the same on every one (red: kConsumerWarps floats).
__device__ __forceinline__ float consumer_sum(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  consumer_sync();
  float s = 0.0f;
#pragma unroll
  for (int w = 0; w < kConsumerWarps; ++w) s += red[w];
  consumer_sync();
  return s;
}

// The attention of layer l for unit u (KV head, split): the split's keys of the request against the
// G query heads of the KV head, into part / part_ml. sm: the staging area (G*D q, then the warps'
// states).
template <int D>
__device__ __forceinline__ void run_attention(const Params& a, int l, int u, float* sm) {
  constexpr int DL = D / 32;  // dims a lane holds in P V
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int G = a.Hq / a.Hkv, kvh = u / a.splits, split = u % a.splits;
  const int kv_len = paged_kv_len(a.page_indptr, a.last_page_len, a.page_size, 0);
  const int first = a.page_indptr[0];
  const int chunk = ((kv_len + a.splits - 1) / a.splits + 31) / 32 * 32;
  const int k0 = split * chunk, k1 = min(kv_len, k0 + chunk);
  const Layer& y = a.layers[l];
  float* qs = sm;                                   // [G][D], times scale * log2 e
  float* wm = qs + G * D;                           // [warps][G]
  float* wl = wm + kConsumerWarps * kMaxGroup;      // [warps][G]
  float* wo = wl + kConsumerWarps * kMaxGroup;      // [warps][G][D]
  const float qscale = a.attn_scale * 1.4426950408889634f;
#pragma unroll 3  // G * D <= 1024: the loads issued together
  for (int i = tid; i < G * D; i += kConsumers)
    qs[i] = __bfloat162float(__ldcg(a.q + static_cast<int64_t>(kvh) * G * D + i)) * qscale;
  consumer_sync();

  float m[kMaxGroup], lsum[kMaxGroup], o[kMaxGroup][DL];
#pragma unroll
  for (int h = 0; h < kMaxGroup; ++h) {
    m[h] = -INFINITY;
    lsum[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < DL; ++e) o[h][e] = 0.0f;
  }
  const int64_t stride = static_cast<int64_t>(a.Hkv) * D;
  for (int base = k0 + warp * 32; base < k1; base += kConsumerWarps * 32) {
    const int key = base + lane;
    const bool valid = key < k1;
    const int64_t row = valid ? paged_kv_slot(a.page_indices, first, a.page_size, key) : 0;
    // P V reads the round's value rows 8 (D = 64) or 4 keys a batch (this lane's dims of each), the next batch's
    // loads in flight while one is used: one dependent load a key was about 700 cycles a key. The
    // first batch is issued now, under the scores.
    const int n_keys = min(32, k1 - base);
    using VWord = std::conditional_t<DL == 2, uint32_t, uint2>;  // this lane's DL bf16 of a value row
    constexpr int kValueBatch = DL == 2 ? 8 : 4;                  // (registers: no spills at D = 128)
    VWord vb[2][kValueBatch];
    auto load_values = [&](VWord (&dst)[kValueBatch], int j0) {
#pragma unroll
      for (int jj = 0; jj < kValueBatch; ++jj) {
        const int64_t rj = __shfl_sync(0xffffffffu, row, (j0 + jj) & 31);
        const VWord* vp = reinterpret_cast<const VWord*>(y.v_cache + rj * stride + kvh * D + DL * lane);
        if (j0 + jj < n_keys) dst[jj] = __ldcg(vp);
      }
    };
    load_values(vb[0], 0);
    // Scores: this lane's key against the G heads.
    float s[kMaxGroup];
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h) s[h] = 0.0f;
    const T* kp = y.k_cache + row * stride + kvh * D;
#pragma unroll
    for (int half = 0; half < D / 64; ++half) {
      uint4 kv[8];
#pragma unroll
      for (int c = 0; c < 8; ++c) kv[c] = valid ? __ldcg(reinterpret_cast<const uint4*>(kp + half * 64 + c * 8)) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int h = 0; h < kMaxGroup; ++h)
        if (h < G)
#pragma unroll
          for (int c = 0; c < 8; ++c) s[h] += detail::dot_bf16x8_f32(kv[c], qs + h * D + half * 64 + c * 8);
    }
    float p[kMaxGroup];
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h) {
      if (h >= G) continue;
      float mx = valid ? s[h] : -INFINITY;
#pragma unroll
      for (int o2 = 16; o2 > 0; o2 >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o2));
      const float m_new = fmaxf(m[h], mx);  // finite: lane 0's key is valid
      const float alpha = fast_exp2(m[h] - m_new);
      p[h] = valid ? fast_exp2(s[h] - m_new) : 0.0f;
      lsum[h] = lsum[h] * alpha + p[h];
#pragma unroll
      for (int e = 0; e < DL; ++e) o[h][e] *= alpha;
      m[h] = m_new;
    }
    // P V: the lanes over the dims (lane holds dims DL * lane ..), the round's keys in batches.
#pragma unroll
    for (int bi = 0; bi < 32 / kValueBatch; ++bi) {
      const int j0 = bi * kValueBatch;
      if (j0 >= n_keys) break;  // uniform over the warp
      if (bi + 1 < 32 / kValueBatch && j0 + kValueBatch < n_keys) load_values(vb[(bi + 1) & 1], j0 + kValueBatch);
#pragma unroll
      for (int jj = 0; jj < kValueBatch; ++jj) {
        const int j = j0 + jj;
        if (j >= n_keys) break;
        float v[DL];
        if constexpr (DL == 2) {
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&vb[bi & 1][jj]));
          v[0] = f.x, v[1] = f.y;
        } else {
          const uint2 w = vb[bi & 1][jj];
          const float2 f0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w.x));
          const float2 f1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w.y));
          v[0] = f0.x, v[1] = f0.y, v[2] = f1.x, v[3] = f1.y;
        }
#pragma unroll
        for (int h = 0; h < kMaxGroup; ++h) {
          if (h >= G) continue;
          const float pj = __shfl_sync(0xffffffffu, p[h], j);
#pragma unroll
          for (int e = 0; e < DL; ++e) o[h][e] = fmaf(pj, v[e], o[h][e]);
        }
      }
    }
  }
  // The warps' states, then the split's: M = max over the warps, sums rescaled to it.
#pragma unroll
  for (int h = 0; h < kMaxGroup; ++h) {
    if (h >= G) continue;
    float ls = lsum[h];
#pragma unroll
    for (int o2 = 16; o2 > 0; o2 >>= 1) ls += __shfl_xor_sync(0xffffffffu, ls, o2);
    if (lane == 0) wm[warp * kMaxGroup + h] = m[h], wl[warp * kMaxGroup + h] = ls;
#pragma unroll
    for (int e = 0; e < DL; ++e) wo[(warp * kMaxGroup + h) * D + DL * lane + e] = o[h][e];
  }
  consumer_sync();
  for (int i = tid; i < G * D; i += kConsumers) {
    const int h = i / D, d = i % D;
    float M = -INFINITY;
    for (int w = 0; w < kConsumerWarps; ++w) M = fmaxf(M, wm[w * kMaxGroup + h]);
    float acc = 0.0f, L = 0.0f;
    if (M != -INFINITY)
      for (int w = 0; w < kConsumerWarps; ++w) {
        const float mw = wm[w * kMaxGroup + h];
        if (mw == -INFINITY) continue;
        const float f = fast_exp2(mw - M);
        acc = fmaf(wo[(w * kMaxGroup + h) * D + d], f, acc);
        L = fmaf(wl[w * kMaxGroup + h], f, L);
      }
    const int64_t hq = static_cast<int64_t>(split) * a.Hq + kvh * G + h;
    __stcg(a.part + hq * D + d, acc);
    if (d == 0) {
      __stcg(a.part_ml + 2 * hq, M);
      __stcg(a.part_ml + 2 * hq + 1, L);
    }
  }
  consumer_sync();
}

// The merge of the splits of query head hd into the attention output (bf16). Every global load is
// issued in parallel (a dependent load a split, split after split, costs a round trip each): the
// splits' (m, l) into sm, then thread t sums dim t % D over the splits s = t / D (mod kConsumers / D)
// into sm as well, and the dims' threads add those in order. sm: 2 * splits + kConsumers floats.
__device__ __forceinline__ void run_merge(const Params& a, int hd, float* sm) {
  const int tid = threadIdx.x, S = a.splits, D = a.D;
  float* sm_m = sm;
  float* sm_l = sm + S;
  float* sm_acc = sm + 2 * S;  // [groups][D]
  for (int s = tid; s < S; s += kConsumers) {
    const int64_t hq = static_cast<int64_t>(s) * a.Hq + hd;
    sm_m[s] = __ldcg(a.part_ml + 2 * hq);
    sm_l[s] = __ldcg(a.part_ml + 2 * hq + 1);
  }
  consumer_sync();
  float M = -INFINITY;
  for (int s = 0; s < S; ++s) M = fmaxf(M, sm_m[s]);
  const int groups = kConsumers / D, d = tid % D, g = tid / D;
  if (g < groups) {
    float acc = 0.0f;
#pragma unroll 4
    for (int s = g; s < S; s += groups) {
      const float v = __ldcg(a.part + (static_cast<int64_t>(s) * a.Hq + hd) * D + d);
      if (sm_m[s] != -INFINITY) acc = fmaf(v, fast_exp2(sm_m[s] - M), acc);
    }
    sm_acc[g * D + d] = acc;
  }
  consumer_sync();
  if (tid < D) {
    float acc = 0.0f, L = 0.0f;
    for (int gi = 0; gi < groups; ++gi) acc += sm_acc[gi * D + tid];
    for (int s = 0; s < S; ++s)
      if (sm_m[s] != -INFINITY) L = fmaf(sm_l[s], fast_exp2(sm_m[s] - M), L);
    __stcg(a.attn + static_cast<int64_t>(hd) * D + tid, __float2bfloat16_rn(L > 0.0f ? acc / L : 0.0f));
  }
  consumer_sync();  // sm is reused by the next head
}

}  // namespace kiln::cuda::decode_step
