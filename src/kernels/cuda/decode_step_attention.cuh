// The attention stage of the persistent decode-step kernel (decode_step_internal.cuh), run by its
// consumer warps: one task per (request, KV head, split of the context), tasks dealt round-robin to
// the blocks.
//
// A task first prepares the group's query heads from the raw q/k/v projection (optional per-head
// RMSNorm, rotary embedding: qkv_rope_cache_write's arithmetic, rounded to bf16), and the split
// holding the newest position also the new key and value, which it writes into the cache slot and
// uses from shared memory. Then each lane group (D / 8 lanes, 16 bytes of a key row each) walks keys
// of the split with an online softmax in the exp2 domain, NK keys in flight; lane groups meet through
// shuffles, warps through shared memory, always in a fixed order. A request with one split writes its
// output; otherwise every split leaves (o, m, l) in scratch and the last to arrive (a counter per
// request and KV head) combines them in split order.
#pragma once

#include "kernels/cuda/decode_step_internal.cuh"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/mma_util.cuh"
#include "kernels/paged_kv.h"

namespace kiln::cuda::decode {

// Keys per split of a context of kv_len keys over at most `splits` splits: a multiple of 16, at
// least 64 (shorter splits cost more in combining than they gain in parallelism).
__device__ __forceinline__ int keys_per_split(int kv_len, int splits) {
  const int k = (kv_len + splits - 1) / splits;
  return max(64, (k + 15) / 16 * 16);
}

// Query heads of the group (and, for the writer, the new key and value) into shared memory.
template <int D>
__device__ __forceinline__ void prepare_heads(const Params& p, const LayerPtrs& L, Work& w, int row, int kvh,
                                              bool writer) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int G = p.Hq / p.Hkv;
  const bf16* qkv_row = p.qkv + static_cast<int64_t>(row) * (p.Hq + 2 * p.Hkv) * D;
  const int slot = p.slots[row];
  const float pos = static_cast<float>(p.positions[row]);
  for (int h = warp; h < G + (writer ? 2 : 0); h += kConsumerWarps) {
    const bool is_q = h < G, is_k = h == G;
    const int head = is_q ? kvh * G + h : is_k ? p.Hq + kvh : p.Hq + p.Hkv + kvh;
    float x[D / 32];
#pragma unroll
    for (int j = 0; j < D / 32; ++j) x[j] = ldcg_bf16(qkv_row + head * D + lane + 32 * j);
    float* dst = is_q ? w.attn.q[h] : is_k ? w.attn.k_new : w.attn.v_new;
    const int64_t cache_row = (static_cast<int64_t>(slot) * p.Hkv + kvh) * D;
    if (!is_q && !is_k) {  // the value: straight into the cache
#pragma unroll
      for (int j = 0; j < D / 32; ++j) {
        dst[lane + 32 * j] = x[j];
        if (slot >= 0) L.v_cache[cache_row + lane + 32 * j] = __float2bfloat16_rn(x[j]);
      }
      continue;
    }
    const bf16* nw = is_q ? L.q_norm : L.k_norm;
    if (nw) {
      float ss = 0.0f;
#pragma unroll
      for (int j = 0; j < D / 32; ++j) ss += x[j] * x[j];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      const float inv_rms = 1.0f / sqrtf(ss / static_cast<float>(D) + p.eps);
#pragma unroll
      for (int j = 0; j < D / 32; ++j)
        x[j] = round_bf16(__fmul_rn(__fmul_rn(x[j], inv_rms), __bfloat162float(nw[lane + 32 * j])));
    }
#pragma unroll
    for (int j = 0; j < D / 32; ++j) dst[lane + 32 * j] = x[j];
    __syncwarp();
    for (int i = lane; i < D / 2; i += 32) {  // each pair (i, i + D/2) read and written by one lane
      const float x0 = dst[i], x1 = dst[i + D / 2];
      const float2 r = detail::rope_cos_sin(pos, p.inv_freq[i], p.rope_scaling);
      const float y0 = round_bf16(__fsub_rn(__fmul_rn(x0, r.x), __fmul_rn(x1, r.y)));
      const float y1 = round_bf16(__fadd_rn(__fmul_rn(x1, r.x), __fmul_rn(x0, r.y)));
      dst[i] = y0;
      dst[i + D / 2] = y1;
      if (is_k && slot >= 0) {
        L.k_cache[cache_row + i] = __float2bfloat16_rn(y0);
        L.k_cache[cache_row + i + D / 2] = __float2bfloat16_rn(y1);
      }
    }
  }
}

// The last split of a (request, KV head) to arrive: out = the splits' (o, m, l) combined in split
// order. Warp h weighs head h's splits (their loads in parallel, a fixed butterfly for the sum), then
// every thread sums its (head, dimension)'s outputs eight loads at a time.
template <int D>
__device__ void combine_splits(const Params& p, Work& w, const float* part, bf16* out, int active) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, G = p.Hq / p.Hkv;
  float* weight = &w.attn.o[0][0][0];  // [G][kMaxSplits]; the block's own sums are no longer needed
  float* total = &w.attn.o[1][0][0];   // [G]
  if (warp < G) {
    float m[kMaxSplits / 32], l[kMaxSplits / 32], mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kMaxSplits / 32; ++j) {
      const int v = lane + 32 * j;
      const float* ps = part + (static_cast<int64_t>(v) * G + warp) * (D + 2);
      m[j] = v < active ? ldcg_f32(ps + D) : -INFINITY;
      l[j] = v < active ? ldcg_f32(ps + D + 1) : 0.0f;
      mx = fmaxf(mx, m[j]);
    }
    mx = detail::warp_reduce(mx, detail::MaxOp{});
    float lsum = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxSplits / 32; ++j) {
      const float f = m[j] == -INFINITY ? 0.0f : fast_exp2(m[j] - mx);
      weight[warp * kMaxSplits + lane + 32 * j] = f;
      lsum += l[j] * f;
    }
    lsum = detail::warp_reduce(lsum, detail::SumOp{});
    if (lane == 0) total[warp] = lsum;
  }
  consumer_sync();
  for (int i = threadIdx.x; i < G * D; i += kConsumers) {
    const int h = i / D, d = i % D;
    float osum = 0.0f;
    for (int v0 = 0; v0 < active; v0 += 8) {
      float o[8];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        o[j] = v0 + j < active ? ldcg_f32(part + (static_cast<int64_t>(v0 + j) * G + h) * (D + 2) + d) : 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) osum += v0 + j < active ? weight[h * kMaxSplits + v0 + j] * o[j] : 0.0f;
    }
    out[h * D + d] = __float2bfloat16_rn(osum / total[h]);
  }
}

template <int D>
__device__ void attention_stage(const Params& p, const LayerPtrs& L, Work& w) {
  constexpr int LPK = D / 8;                   // lanes per key row
  constexpr int KPW = 32 / LPK;                // lane groups per warp
  constexpr int NG = kConsumerWarps * KPW;     // lane groups per block
  constexpr int NK = 4;                        // keys in flight per lane group
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int c8 = lane % LPK;                   // this lane's 8 dimensions: [8 c8, 8 c8 + 8)
  const int S = p.num_splits, G = p.Hq / p.Hkv;
  const int tasks = p.B * p.Hkv * S;
  for (int task = blockIdx.x; task < tasks; task += p.blocks) {
    const int s = task % S, kvh = (task / S) % p.Hkv, b = task / (S * p.Hkv);
    const int row = p.q_indptr[b];
    if (p.q_indptr[b + 1] - row != 1) continue;  // padding request (no query)
    const int kv_len = paged_kv_len(p.page_indptr, p.last_page_len, p.page_size, b);
    if (kv_len <= 0) continue;
    const int kps = keys_per_split(kv_len, S);
    const int active = (kv_len + kps - 1) / kps;
    if (s >= active) continue;
    const int key_begin = s * kps, key_end = min(kv_len, key_begin + kps);
    const bool writer = s == active - 1;  // holds key kv_len - 1, this step's
    const int first_page = p.page_indptr[b];

    prepare_heads<D>(p, L, w, row, kvh, writer);
    consumer_sync();

    // Queries stay in shared memory (scaled to the exp2 domain): registers go to the accumulators.
    for (int i = threadIdx.x; i < G * D; i += kConsumers) w.attn.q[i / D][i % D] *= p.scale_log2;
    consumer_sync();
    float o[kMaxGroup][8], m[kMaxGroup], l[kMaxGroup];
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h) {
      m[h] = -INFINITY;
      l[h] = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) o[h][e] = 0.0f;
    }
    // The loop bound is the warp's first lane group's (shuffles need the whole warp); a lane group past
    // the split's end sees only masked keys.
    for (int jw = key_begin + warp * KPW; jw < key_end; jw += NG * NK) {
      const int j0 = jw + lane / LPK;
      uint4 kr[NK], vr[NK];
#pragma unroll
      for (int i = 0; i < NK; ++i) {
        const int j = j0 + i * NG;
        if (j >= key_end) {
          kr[i] = vr[i] = make_uint4(0, 0, 0, 0);
        } else if (j == kv_len - 1) {
          kr[i] = detail::pack_bf16x8(w.attn.k_new + c8 * 8);
          vr[i] = detail::pack_bf16x8(w.attn.v_new + c8 * 8);
        } else {
          const int64_t off = (paged_kv_slot(p.page_indices, first_page, p.page_size, j) * p.Hkv + kvh) * D + c8 * 8;
          kr[i] = ldg_stream(L.k_cache + off);
          vr[i] = ldg_stream(L.v_cache + off);
        }
      }
      float sc[NK][kMaxGroup];  // scores, then probabilities
#pragma unroll
      for (int i = 0; i < NK; ++i) {
        float kf[8];
        detail::unpack_bf16x8(kr[i], kf);
        const bool ok = j0 + i * NG < key_end;
#pragma unroll
        for (int h = 0; h < kMaxGroup; ++h) {
          float d = 0.0f;
          if (h < G) {  // uniform
            const float4 qa = *reinterpret_cast<const float4*>(&w.attn.q[h][c8 * 8]);
            const float4 qb = *reinterpret_cast<const float4*>(&w.attn.q[h][c8 * 8 + 4]);
            d = qa.x * kf[0];
            d = fmaf(qa.y, kf[1], d);
            d = fmaf(qa.z, kf[2], d);
            d = fmaf(qa.w, kf[3], d);
            d = fmaf(qb.x, kf[4], d);
            d = fmaf(qb.y, kf[5], d);
            d = fmaf(qb.z, kf[6], d);
            d = fmaf(qb.w, kf[7], d);
#pragma unroll
            for (int off = 1; off < LPK; off <<= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
          }
          sc[i][h] = ok ? d : -INFINITY;
        }
      }
#pragma unroll
      for (int h = 0; h < kMaxGroup; ++h) {
        if (h >= G) break;
        float mx = m[h];
#pragma unroll
        for (int i = 0; i < NK; ++i) mx = fmaxf(mx, sc[i][h]);
        const bool none = mx == -INFINITY;                        // no key yet, none here
        const float corr = none ? 1.0f : fast_exp2(m[h] - mx);  // 2^-inf = 0 on the first keys
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < NK; ++i) {
          sc[i][h] = none ? 0.0f : fast_exp2(sc[i][h] - mx);
          sum += sc[i][h];
        }
        l[h] = l[h] * corr + sum;
#pragma unroll
        for (int e = 0; e < 8; ++e) o[h][e] *= corr;
        m[h] = mx;
      }
#pragma unroll
      for (int i = 0; i < NK; ++i) {
        float vf[8];
        detail::unpack_bf16x8(vr[i], vf);
#pragma unroll
        for (int h = 0; h < kMaxGroup; ++h) {
          if (h >= G) break;
#pragma unroll
          for (int e = 0; e < 8; ++e) o[h][e] = fmaf(sc[i][h], vf[e], o[h][e]);
        }
      }
    }
    // Lane groups of the warp (same c8), then warps through shared memory.
#pragma unroll
    for (int off = LPK; off < 32; off <<= 1) {
#pragma unroll
      for (int h = 0; h < kMaxGroup; ++h) {
        const float mo = __shfl_xor_sync(0xffffffffu, m[h], off);
        const float lo = __shfl_xor_sync(0xffffffffu, l[h], off);
        const float mx = fmaxf(m[h], mo);
        const float f = m[h] == -INFINITY ? 0.0f : fast_exp2(m[h] - mx);
        const float fo = mo == -INFINITY ? 0.0f : fast_exp2(mo - mx);
        l[h] = l[h] * f + lo * fo;
#pragma unroll
        for (int e = 0; e < 8; ++e) o[h][e] = o[h][e] * f + __shfl_xor_sync(0xffffffffu, o[h][e], off) * fo;
        m[h] = mx;
      }
    }
    if (lane < LPK) {
#pragma unroll
      for (int h = 0; h < kMaxGroup; ++h) {
        if (h >= G) break;
#pragma unroll
        for (int e = 0; e < 8; ++e) w.attn.o[warp][h][c8 * 8 + e] = o[h][e];
        if (lane == 0) w.attn.m[warp][h] = m[h], w.attn.l[warp][h] = l[h];
      }
    }
    consumer_sync();
    const int qw = p.Hq * D;
    bf16* out = p.attn + static_cast<int64_t>(row) * qw + kvh * G * D;
    float* part = p.attn_part + (static_cast<int64_t>(b * p.Hkv + kvh) * kMaxSplits) * G * (D + 2);
    for (int i = threadIdx.x; i < G * D; i += kConsumers) {
      const int h = i / D, d = i % D;
      float mx = -INFINITY;
      for (int v = 0; v < kConsumerWarps; ++v) mx = fmaxf(mx, w.attn.m[v][h]);
      float lsum = 0.0f, osum = 0.0f;
      for (int v = 0; v < kConsumerWarps; ++v) {
        const float mv = w.attn.m[v][h];
        const float f = mv == -INFINITY ? 0.0f : fast_exp2(mv - mx);
        lsum += w.attn.l[v][h] * f;
        osum += w.attn.o[v][h][d] * f;
      }
      if (active == 1) {
        out[h * D + d] = __float2bfloat16_rn(osum / lsum);
      } else {
        float* ps = part + (static_cast<int64_t>(s) * G + h) * (D + 2);
        ps[d] = osum;
        if (d == 0) ps[D] = mx, ps[D + 1] = lsum;
      }
    }
    if (active > 1) {
      consumer_sync();
      if (threadIdx.x == 0) {
        fence_acq_rel();
        unsigned* count = p.attn_count + b * p.Hkv + kvh;
        const bool last = atomicAdd(count, 1u) == static_cast<unsigned>(active - 1);
        if (last) *count = 0;  // ready for the next layer
        fence_acq_rel();
        w.flag = last;
      }
      consumer_sync();
      if (w.flag) combine_splits<D>(p, w, part, out, active);
    }
    consumer_sync();  // shared memory free for the next task
  }
}

}  // namespace kiln::cuda::decode
